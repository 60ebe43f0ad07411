"""A seeded story graph for graph maintenance, written through the real commit path
(`GraphStore.commit_chapter`).

`seed_story` is a clean five-chapter story with planted duplicates and look-alikes:
"John Smith" (outline), "John" (chapter 1) and "Johnny" (chapter 2) are one man who
shares friends and a compass; two different "Anna"s (the baker from the outline, a
sailor with an explicit id from chapter 2) know the same people and meet in one scene.
`plant_qa_problems` adds one instance of every QA problem on top of it.
"""

from __future__ import annotations

from kg import cypher
from kg import vocabulary as vocab
from kg.models import (
    ChapterDelta,
    Entity,
    PropertyUpdate,
    Relationship,
    SceneDelta,
    StatusChange,
)
from kg.store import GraphStore

JOHN_SMITH = "character:john-smith"
JOHN = "character:john"
JOHNNY = "character:johnny"
ANNA_BAKER = "character:anna-baker"
ANNA_SAILOR = "character:anna-sailor"
MARY = "character:mary-reed"
CAPTAIN = "character:old-captain"
EASTPORT = "location:eastport"
COMPASS = "item:silver-compass"


def character(name: str, description: str = "", **extra: object) -> Entity:
    """A Character entity."""
    return Entity.model_validate(
        {"label": "Character", "name": name, "description": description, **extra}
    )


def seed_story(store: GraphStore) -> None:
    for delta in story_deltas():
        store.commit_chapter(delta)


def story_deltas() -> list[ChapterDelta]:
    """The chapters of `seed_story`, 0 (the outline) to 4."""
    return [
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                character(
                    "John Smith",
                    "A fisherman of Eastport who lost his boat",
                    traits=["stubborn"],
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                character("Anna", "The baker of Eastport", id=ANNA_BAKER),
                character("Mary Reed", "The harbour master", traits=["brave"]),
                character("Old Captain", "A retired sea captain"),
                Entity(label="Location", name="Eastport", description="A fishing town"),
                Entity(label="Location", name="Old Pier", description="A rotting pier"),
                Entity(
                    label="Event", name="Autumn Storm", description="The storm that sank the boats"
                ),
            ],
            relationships=[
                Relationship(source="John Smith", target="Mary Reed", type="FRIEND_OF"),
                Relationship(source="John Smith", target="Eastport", type="LOCATED_IN"),
                Relationship(source=ANNA_BAKER, target="Eastport", type="LOCATED_IN"),
                Relationship(source="Mary Reed", target="Eastport", type="LOCATED_IN"),
                Relationship(source="Old Pier", target="Eastport", type="PART_OF"),
                Relationship(source="Old Captain", target="Eastport", type="LOCATED_IN"),
            ],
        ),
        ChapterDelta(
            chapter=1,
            entities=[
                character("John", "A fisherman"),
                Entity(label="Item", name="Silver Compass", description="An heirloom compass"),
            ],
            relationships=[
                Relationship(
                    source="John", target="Mary Reed", type="FRIEND_OF", description="old friends"
                ),
                Relationship(source="John", target="Eastport", type="LOCATED_IN"),
                Relationship(source="John", target="Silver Compass", type="OWNS"),
                Relationship(source="Mary Reed", target="Autumn Storm", type="PARTICIPATES_IN"),
            ],
            scenes=[
                SceneDelta(
                    index=1,
                    title="At the harbour",
                    characters=["John", "Mary Reed"],
                    location="Eastport",
                )
            ],
        ),
        ChapterDelta(
            chapter=2,
            entities=[
                character(
                    "Johnny", "A young fisherman with a silver compass", attributes={"age": 34}
                ),
                character("Anna", "A sailor from the north", id=ANNA_SAILOR),
            ],
            relationships=[
                Relationship(source="Johnny", target="Silver Compass", type="OWNS"),
                Relationship(source="Johnny", target="Mary Reed", type="FRIEND_OF"),
                Relationship(source=ANNA_SAILOR, target="Eastport", type="LOCATED_IN"),
                Relationship(source=ANNA_SAILOR, target="Mary Reed", type="KNOWS"),
                Relationship(source=ANNA_BAKER, target="Mary Reed", type="KNOWS"),
            ],
            scenes=[
                # The two Annas meet: by id, the only unambiguous way to list two namesakes.
                SceneDelta(
                    index=1,
                    title="Two Annas",
                    characters=[ANNA_BAKER, ANNA_SAILOR],
                    location="Old Pier",
                ),
                SceneDelta(
                    index=2,
                    title="The compass",
                    characters=["Johnny", "Mary Reed"],
                    location="Eastport",
                ),
            ],
        ),
        ChapterDelta(
            chapter=3,
            relationships=[
                Relationship(source="Old Captain", target="Autumn Storm", type="PARTICIPATES_IN")
            ],
            status_changes=[StatusChange(entity="Old Captain", status="dead")],
            scenes=[
                SceneDelta(
                    index=1,
                    title="The captain's last night",
                    characters=["Old Captain", "Mary Reed"],
                    location="Old Pier",
                )
            ],
        ),
        ChapterDelta(
            chapter=4,
            relationships=[Relationship(source="Mary Reed", target="Old Pier", type="TRAVELS_TO")],
            scenes=[
                SceneDelta(
                    index=1,
                    title="Mourning",
                    characters=["Mary Reed", "John Smith"],
                    location="Old Pier",
                )
            ],
        ),
    ]


def plant_qa_problems(store: GraphStore) -> None:
    """One of each QA problem, chapters 5-6, on top of `seed_story`."""
    store.commit_chapter(
        ChapterDelta(
            chapter=5,
            entities=[
                Entity(label="Item", name="Lost Letter", description="A letter nobody sent"),
                Entity(label="Event", name="Harbour Ball", description="The midsummer ball"),
                *(character(f"Deckhand {n}", "A deckhand") for n in range(1, 13)),
            ],
            relationships=[
                # dead character acting: the captain died in chapter 3
                Relationship(source="Old Captain", target="Old Pier", type="TRAVELS_TO"),
                # a relationship dated in a chapter that does not exist
                Relationship(source="Mary Reed", target="Silver Compass", type="SEEKS", chapter=9),
                # an event dated before its first appearance (the ball first appears in chapter 5)
                Relationship(
                    source="Mary Reed", target="Harbour Ball", type="PARTICIPATES_IN", chapter=2
                ),
            ],
            property_updates=[
                PropertyUpdate(entity="Mary Reed", changes={"traits": ["brave", "Cowardly"]})
            ],
            scenes=[
                SceneDelta(
                    index=1,
                    title="A ghost",
                    characters=["Old Captain", "Mary Reed", "Ghost Sailor"],
                    location="Old Pier",
                ),
            ],
        )
    )
    # A lookup that points to nothing: the letter's node removed behind the store's back.
    store.write(cypher.delete_nodes(vocab.ENTITY), ids=["item:lost-letter"])
    # A relationship to an incomplete node, as an untrusted import could bring in.
    exported = store.export_data()
    mary = next(n for n in exported["nodes"] if n["properties"].get("id") == MARY)
    stub = {
        "ref": "Character:Entity/character:stub",
        "labels": ["Character", "Entity"],
        "properties": {"id": "character:stub", "label": "Character"},
    }
    store.import_data(
        {
            "format": exported["format"],
            "version": exported["version"],
            "nodes": [mary, stub],
            "relationships": [
                {
                    "type": "KNOWS",
                    "start": stub["ref"],
                    "end": mary["ref"],
                    "properties": {"key": "knows:5:stub", "chapter": 5},
                }
            ],
        },
        merge=True,
    )
