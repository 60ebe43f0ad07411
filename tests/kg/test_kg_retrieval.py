"""Retrieval "as of chapter N" against the session graph."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from core.settings import Settings
from kg import retrieval
from kg.models import (
    ChapterDelta,
    Entity,
    EntitySource,
    PropertyUpdate,
    Relationship,
    SceneDelta,
    StatusChange,
)
from kg.store import GraphStore

OUTLINE = EntitySource(type="outline", chapter=0)
OLD_MODEL, NEW_MODEL = "http://old.example/v1|model-a", "local|all-MiniLM-L6-v2-int8|8199be6f"


def story() -> list[ChapterDelta]:
    return [
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                Entity(
                    label="Character",
                    name="Aragorn",
                    aliases=["Strider"],
                    sources=[OUTLINE],
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                Entity(
                    label="Character",
                    name="Boromir",
                    sources=[OUTLINE],
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                Entity(label="Character", name="Frodo", sources=[OUTLINE]),
                Entity(label="Location", name="Middle-earth", sources=[OUTLINE]),
                Entity(
                    label="Location",
                    name="Rivendell",
                    description="Elven refuge",
                    sources=[OUTLINE],
                ),
                Entity(label="Location", name="Moria", sources=[OUTLINE]),
            ],
            relationships=[
                Relationship(source="Rivendell", target="Middle-earth", type="part of"),
                Relationship(source="Moria", target="Middle-earth", type="part of"),
            ],
        ),
        ChapterDelta(
            chapter=1,
            title="The Council",
            summary="The council meets in Rivendell.",
            # Chapter 1's vectors come from another embedding model than chapter 2's: only a
            # read that names a model tells them apart (the other tests name none).
            embedding=[1.0, 0.0, 0.0],
            embedded_by=OLD_MODEL,
            scenes=[
                SceneDelta(
                    index=1,
                    title="Arrival",
                    summary="Frodo arrives.",
                    embedding=[1.0, 0.0, 0.0],
                    embedded_by=OLD_MODEL,
                ),
                SceneDelta(
                    index=2,
                    title="Debate",
                    summary="They argue.",
                    embedding=[0.0, 1.0, 0.0],
                    embedded_by=OLD_MODEL,
                ),
            ],
            entities=[Entity(label="Event", name="Council of Elrond")],
            relationships=[
                Relationship(source="Frodo", target="Rivendell", type="located in"),
                Relationship(source="Aragorn", target="Rivendell", type="located in"),
                Relationship(source="Aragorn", target="Boromir", type="friend of"),
                Relationship(source="Council of Elrond", target="Rivendell", type="took place in"),
                Relationship(source="Frodo", target="Council of Elrond", type="attends"),
            ],
        ),
        ChapterDelta(
            chapter=2,
            title="The Mines",
            summary="Into Moria; Boromir falls.",
            embedding=[0.0, 0.0, 1.0],
            embedded_by=NEW_MODEL,
            scenes=[
                SceneDelta(
                    index=1,
                    title="Gate",
                    summary="The gate opens.",
                    embedding=[0.0, 0.0, 1.0],
                    embedded_by=NEW_MODEL,
                ),
                SceneDelta(
                    index=2,
                    title="Bridge",
                    summary="The bridge.",
                    embedding=[0.7, 0.7, 0.0],
                    embedded_by=NEW_MODEL,
                ),
            ],
            relationships=[
                Relationship(source="Strider", target="Moria", type="located in"),
                Relationship(source="Aragorn", target="Boromir", type="distrusts"),
            ],
            status_changes=[StatusChange(entity="Boromir", status="dead")],
            property_updates=[
                PropertyUpdate(
                    entity="Frodo", changes={"description": "Wounded by a blade.", "scar": True}
                )
            ],
            entities=[
                Entity(
                    label="Character", name="Frodo", aliases=["Mr. Underhill"], traits=["stubborn"]
                )
            ],
        ),
        ChapterDelta(
            chapter=3,
            title="Names",
            property_updates=[PropertyUpdate(entity="Moria", changes={"name": "Khazad-dum"})],
        ),
    ]


@pytest.fixture(scope="module")
def store(graph_settings: Settings) -> Iterator[GraphStore]:
    graph = GraphStore.open(graph_settings)
    graph.wipe()
    for delta in story():
        graph.commit_chapter(delta)
    yield graph
    graph.close()


def test_profiles_as_of_a_chapter(store: GraphStore) -> None:
    profiles = retrieval.character_profiles(
        store, as_of_chapter=1, names=["Strider", "Boromir", "Nobody"]
    )
    by_name = {p.entity.name: p for p in profiles}
    assert set(by_name) == {"Aragorn", "Boromir"}
    assert by_name["Boromir"].status == "alive"
    aragorn = {(r.type, r.direction, r.other_name) for r in by_name["Aragorn"].relationships}
    assert aragorn == {("FRIEND_OF", "out", "Boromir"), ("LOCATED_IN", "out", "Rivendell")}

    later = {
        p.entity.name: p
        for p in retrieval.character_profiles(store, as_of_chapter=2, names=["Aragorn", "Boromir"])
    }
    assert later["Boromir"].status == "dead"
    assert [
        (r.type, r.chapter) for r in later["Aragorn"].relationships if r.other_name == "Boromir"
    ] == [
        ("DISTRUSTS", 2),
        ("FRIEND_OF", 1),
    ]
    assert (
        retrieval.character_profiles(store, as_of_chapter=0, ids=["event:council-of-elrond"]) == []
    )


def test_entity_content_is_read_as_of_the_chapter(store: GraphStore) -> None:
    # Chapter 2 changed Frodo; drafting chapter 2 (as of 1) must still see the old Frodo,
    # so a re-run after later chapters were committed builds the very same context.
    (before,) = retrieval.character_profiles(store, as_of_chapter=1, names=["Frodo"])
    (after,) = retrieval.character_profiles(store, as_of_chapter=2, names=["Frodo"])
    assert (before.entity.description, before.entity.attributes, before.entity.traits) == (
        "",
        {},
        [],
    )
    assert before.entity.aliases == [] and before.entity.last_chapter == 1
    assert [s.chapter for s in before.entity.sources] == [0]
    assert (after.entity.description, after.entity.attributes) == (
        "Wounded by a blade.",
        {"scar": True},
    )
    assert after.entity.traits == ["stubborn"] and after.entity.aliases == ["Mr. Underhill"]
    assert [s.chapter for s in after.entity.sources] == [0, 2]
    assert retrieval.resolve_names(store, ["Mr. Underhill"], as_of_chapter=1) == {
        "Mr. Underhill": None
    }
    assert retrieval.resolve_names(store, ["Mr. Underhill"], as_of_chapter=2) == {
        "Mr. Underhill": "character:frodo"
    }
    current = store.get_entity("character:frodo")
    assert current is not None and current.model_dump() == after.entity.model_dump()


def test_relationship_views_show_names_as_of_the_chapter(store: GraphStore) -> None:
    def moria_name(as_of: int) -> set[str]:
        views = retrieval.relationships_as_of(store, "character:aragorn", as_of_chapter=as_of)
        return {v.other_name for v in views if v.other_id == "location:moria"}

    assert moria_name(2) == {"Moria"} and moria_name(3) == {"Khazad-dum"}
    # the old name still resolves (it became an alias), now and as of earlier chapters
    assert retrieval.resolve_names(store, ["Moria"]) == {"Moria": "location:moria"}
    assert retrieval.resolve_names(store, ["Khazad-dum"], as_of_chapter=2) == {"Khazad-dum": None}


def test_recent_summaries(store: GraphStore) -> None:
    assert [s.chapter for s in retrieval.recent_summaries(store, as_of_chapter=2, k=1)] == [2]
    summaries = retrieval.recent_summaries(store, as_of_chapter=2, k=5)
    assert [(s.chapter, s.title) for s in summaries] == [(1, "The Council"), (2, "The Mines")]
    store.set_chapter_summary(2, "Gandalf falls at the bridge.", ["bridge"])
    assert (
        retrieval.recent_summaries(store, as_of_chapter=2, k=1)[0].summary
        == "Gandalf falls at the bridge."
    )


def test_location_context_follows_moves(store: GraphStore) -> None:
    before = retrieval.location_context(store, "rivendell", as_of_chapter=1)
    assert before is not None
    assert [e.name for e in before.occupants] == ["Aragorn", "Frodo"]
    assert [e.name for e in before.events] == ["Council of Elrond"]
    assert [e.name for e in before.parents] == ["Middle-earth"]
    after = retrieval.location_context(store, "location:rivendell", as_of_chapter=2)
    assert after is not None and [e.name for e in after.occupants] == ["Frodo"]
    world = retrieval.location_context(store, "Middle-earth", as_of_chapter=2)
    assert world is not None and [e.name for e in world.children] == ["Moria", "Rivendell"]
    assert retrieval.location_context(store, "Atlantis", as_of_chapter=2) is None


def test_entities_named_in_a_scene_plan(store: GraphStore) -> None:
    found = retrieval.entities_by_name(
        store, ["strider", "Nobody", "Council of Elrond"], as_of_chapter=0
    )
    assert found["strider"] is not None and found["strider"].name == "Aragorn"
    assert found["Nobody"] is None and found["Council of Elrond"] is None  # first seen in chapter 1
    assert retrieval.resolve_names(store, ["Rivendell"], label="Character") == {"Rivendell": None}


def test_vector_similarity_over_scenes_and_chapters(store: GraphStore) -> None:
    hits = retrieval.similar_scenes(store, [1.0, 0.0, 0.0], k=2, as_of_chapter=2)
    assert [h.id for h in hits] == ["scene:1:1", "scene:2:2"]
    assert math.isclose(hits[0].score, 1.0) and math.isclose(
        hits[1].score, 0.7 / math.hypot(0.7, 0.7)
    )
    assert {
        h.chapter for h in retrieval.similar_scenes(store, [0.0, 0.0, 1.0], k=5, as_of_chapter=1)
    } == {1}
    assert [
        h.chapter for h in retrieval.similar_chapters(store, [0.0, 0.1, 1.0], k=1, as_of_chapter=2)
    ] == [2]
    assert (
        retrieval.similar_scenes(store, [1.0, 0.0], k=3, as_of_chapter=2) == []
    )  # other dimension


def test_scene_context_gathers_everything_for_drafting(store: GraphStore) -> None:
    context = retrieval.scene_context(
        store,
        chapter=3,
        characters=["Strider", "Frodo", "Nobody"],
        location="Moria",
        embedding=[0.0, 0.0, 1.0],
    )
    assert context.as_of_chapter == 2
    assert [p.entity.name for p in context.characters] == ["Aragorn", "Frodo"]
    assert context.unresolved_names == ["Nobody"]
    assert context.location is not None and [e.name for e in context.location.occupants] == [
        "Aragorn"
    ]
    assert [s.chapter for s in context.recent_summaries] == [1, 2]
    assert context.similar_scenes[0].id == "scene:2:1"


def test_consistency_facts_for_validation(store: GraphStore) -> None:
    facts = retrieval.consistency_facts(store, ["Boromir", "Strider", "Frodo"], as_of_chapter=2)
    assert facts.statuses == {"boromir": ("dead", 2), "strider": ("alive", 0)}
    assert facts.relationships[("strider", "boromir")] == ("DISTRUSTS", 2)
    assert [(c, i) for c, i, _ in facts.scene_embeddings] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    early = retrieval.consistency_facts(store, ["Boromir", "Strider"], as_of_chapter=1)
    assert early.statuses["boromir"] == ("alive", 0)
    assert early.relationships[("strider", "boromir")] == ("FRIEND_OF", 1)


def test_a_vector_another_embedding_model_made_is_never_compared(store: GraphStore) -> None:
    """Chapter 1's vectors are OLD_MODEL's; a query embedded by NEW_MODEL is compared with
    chapter 2's only. The look-alikes: a read naming no model (every other test here) compares
    them all, and a read naming OLD_MODEL finds chapter 1's."""
    query = [1.0, 0.0, 0.0]  # chapter 1's Arrival scene exactly
    new = retrieval.similar_scenes(store, query, k=4, as_of_chapter=2, embedded_by=NEW_MODEL)
    assert [h.id for h in new] == ["scene:2:2", "scene:2:1"]
    old = retrieval.similar_scenes(store, query, k=1, as_of_chapter=2, embedded_by=OLD_MODEL)
    assert [h.id for h in old] == ["scene:1:1"]
    assert [
        h.chapter
        for h in retrieval.similar_chapters(
            store, query, k=2, as_of_chapter=2, embedded_by=NEW_MODEL
        )
    ] == [2]
    facts = retrieval.consistency_facts(store, [], as_of_chapter=2, embedded_by=NEW_MODEL)
    assert [(c, i) for c, i, _ in facts.scene_embeddings] == [(2, 1), (2, 2)]
    # The hybrid retrieval (the drafting path): no word of the query in any scene, so only
    # vectors can find one, and the old model's nearest is not among them.
    for model, first in ((NEW_MODEL, "scene:2:2"), (None, "scene:1:1")):
        context = retrieval.scene_context(
            store, chapter=3, embedding=query, query="xyzzy", k_similar=1, embedded_by=model
        )
        assert [s.id for s in context.similar_scenes] == [first], model
    # Its words still find an old scene.
    context = retrieval.scene_context(
        store, chapter=3, embedding=query, query="Frodo arrives", k_similar=4, embedded_by=NEW_MODEL
    )
    assert "scene:1:1" in [s.id for s in context.similar_scenes]


def test_scene_context_with_the_scene_text_uses_the_hybrid_retrieval(store: GraphStore) -> None:
    # By vector alone the Arrival scene is nearest; the scene text names the bridge, and the
    # lexical side of the shared hybrid retrieval (core.recall) brings the Bridge scene first.
    vector_only = retrieval.scene_context(store, chapter=3, embedding=[1.0, 0.0, 0.0], k_similar=1)
    assert [s.id for s in vector_only.similar_scenes] == ["scene:1:1"]
    hybrid = retrieval.scene_context(
        store, chapter=3, embedding=[1.0, 0.0, 0.0], query="On the bridge", k_similar=1
    )
    assert [(s.id, s.chapter, s.scene, s.title) for s in hybrid.similar_scenes] == [
        ("scene:2:2", 2, 2, "Bridge")
    ]
    # Without a vector (embeddings failed) the words alone still find the scene, as of the chapter.
    lexical = retrieval.scene_context(store, chapter=3, query="the gate opens", k_similar=1)
    assert [s.id for s in lexical.similar_scenes] == ["scene:2:1"]
    # Drafting chapter 2 sees chapter 1 only, where no scene mentions a gate.
    assert (
        retrieval.scene_context(
            store, chapter=2, query="the gate opens", k_similar=3
        ).similar_scenes
        == []
    )
