"""A long book for the scripted OpenAI-compatible server: the story generator the
100-chapter benchmark (bench/long_book.py) and the 12-chapter test (tests/flows/test_long_story.py)
share.

`LongStory(chapters)` plans a whole book up front, deterministically, and grows its world the
way a real book does: four characters of the story bible, a new character every third chapter
and a new place every fifth (inside an older one), an item every tenth, people who recur (the
recent ones more often), relationships that deepen or sour with each meeting and now and then
turn (a betrayal), injuries and recoveries, deaths (a dead character is only mourned after),
and a character written two ways now and then ("Bill Turner" for William Turner, "Captain
Hugo Marsh" for Hugo Marsh), so healing has duplicates to merge.

`install(llm)` scripts every request the novel pipeline makes for it: the character sheets,
the global, act and chapter outlines (in as many requests as the acts need), the outline's
relationships, each chapter's outline refresh and scene plan, each scene's draft (naming its
planned characters and setting), each extraction (only what the scene says, every fact with
the sentence of the scene that states it, as tests/flows/test_grounding_e2e.py expects), quality
scores that accept the chapter, chapter summaries and healing's enrichments.

Run it on its own (the benchmark does, so its CPU is not the novel process's):

    python -m tests.support.long_story --chapters 100 [--port 0]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any

from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
    scripted_prose,
)

PREMISE = (
    "A lighthouse keeper on a storm-bound coast keeps a ledger of everyone the sea takes back."
)
TITLE = "The Ledger of the Tides"

BIBLE = (
    {
        "name": "Mara Quill",
        "role": "protagonist",
        "description": "The keeper of Gull Rock lighthouse.",
        "traits": ["stubborn", "brave"],
        "motivation": "keep every ship off the rocks",
        "backstory": "Her sister drowned off the point ten years ago.",
        "voice": "Clipped, salty sentences.",
    },
    {
        "name": "Tobias Venn",
        "role": "supporting",
        "description": "The ferryman of Saltmarsh Harbour.",
        "traits": ["kind", "patient"],
        "motivation": "protect Mara",
        "backstory": "Grew up on the mainland.",
        "voice": "Slow and gentle, full of tide lore.",
    },
    {
        "name": "Ilse Harrow",
        "role": "supporting",
        "description": "Mara's cousin, the harbour's archivist.",
        "traits": ["curious", "careful"],
        "motivation": "find out what the ledger means",
        "backstory": "Left the coast and came back.",
        "voice": "Quick questions, dry jokes.",
    },
    {
        "name": "Corin Ashdown",
        "role": "antagonist",
        "description": "The wrecker who owns the salvage yards.",
        "traits": ["cunning", "proud"],
        "motivation": "own the coast",
        "backstory": "Made his fortune on wrecks.",
        "voice": "Soft and courteous, never hurried.",
    },
)
FIRST_PLACES = (
    ("Gull Rock Lighthouse", "A lighthouse on a reef at the end of the point."),
    ("Saltmarsh Harbour", "A fishing harbour behind a shingle bar."),
    ("Kestrel Abbey", "A ruined abbey on the cliffs above the harbour."),
    ("Fennick Market", "A covered market where the salvage is sold."),
)
FIRST_RELATIONSHIPS = (
    ("Mara Quill", "Tobias Venn", "FRIEND_OF", "Old friends."),
    ("Mara Quill", "Ilse Harrow", "FAMILY_OF", "Cousins."),
    ("Corin Ashdown", "Mara Quill", "ENEMY_OF", "He wants her light dark."),
    ("Mara Quill", "Gull Rock Lighthouse", "LOCATED_IN", "She keeps it."),
)
# New people: distinct first and last names (no two alike, so healing has only the planted
# variants to merge); the nickname-able first names get a nickname variant, the rest a title.
FIRST_NAMES = (
    "William Hugo Margaret Oskar Thomas Greta Robert Silas Katherine Ansel Edward Maeve Samuel Della Henry "
    "Emeric Elizabeth Fenna Benjamin Jonah Abigail Caleb Daniel Esther Peter Rowan Josephine Clara Anthony "
    "Hazel Lawrence Ruth Victoria Felix Nicholas Edith Timothy Iris Leonard Nora"
).split()
LAST_NAMES = (
    "Turner Marsh Pryce Lorne Fenwick Dunmore Holloway Garnet Jessop Mallory Norcott Quarry Stroud Thorne "
    "Upton Yardley Ashby Colter Drury Emsley Frome Ingram Kimber Penrose Sallow Tarrant Usher Varley Winslow "
    "Oakes Mercer Brand Rook Elstree Carrow Harlow Wren Voss Calloway Bramwell"
).split()
NICKNAME_OF = {
    "William": "Bill",
    "Margaret": "Meg",
    "Thomas": "Tom",
    "Robert": "Bob",
    "Katherine": "Kate",
    "Edward": "Ned",
    "Samuel": "Sam",
    "Henry": "Harry",
    "Elizabeth": "Beth",
    "Benjamin": "Ben",
    "Abigail": "Abby",
    "Daniel": "Dan",
    "Peter": "Pete",
    "Josephine": "Josie",
    "Anthony": "Tony",
    "Lawrence": "Larry",
    "Victoria": "Vicky",
    "Nicholas": "Nick",
    "Timothy": "Tim",
    "Leonard": "Len",
}
TITLES = ("Captain", "Doctor", "Sergeant", "Reverend")
JOBS = (
    "net mender",
    "smuggler",
    "customs officer",
    "chandler",
    "diver",
    "boatwright",
    "curate",
    "pilot",
    "rope maker",
    "salvager",
    "cooper",
    "schoolteacher",
    "lamp trimmer",
    "harbourmaster",
    "fish wife",
    "cartographer",
)
TRAITS = (
    "loyal",
    "restless",
    "quiet",
    "cheerful",
    "weary",
    "gentle",
    "bitter",
    "careful",
    "reckless",
    "proud",
    "shrewd",
    "wry",
    "anxious",
    "devout",
    "stern",
    "playful",
)
PLACE_WORDS = (
    "Amber",
    "Hollow",
    "Heron",
    "Copper",
    "Lantern",
    "Rook",
    "Iron",
    "Willow",
    "Pike",
    "Slate",
    "Otter",
    "Cinder",
    "Marrow",
    "Bell",
    "Crane",
    "Gannet",
    "Juniper",
    "Larch",
    "Moth",
    "Pewter",
    "Quince",
    "Rowan",
    "Sorrel",
    "Tansy",
    "Umber",
    "Vetch",
    "Wicker",
    "Yarrow",
    "Alder",
    "Bracken",
)
PLACE_KINDS = (
    "Wharf",
    "Keep",
    "Mill",
    "Bridge",
    "Tower",
    "Gate",
    "Ford",
    "Cove",
    "Hill",
    "Square",
    "Well",
    "Garden",
    "Yard",
    "Chapel",
    "Stair",
)
ITEMS = (
    "Compass",
    "Lantern",
    "Chart",
    "Locket",
    "Telescope",
    "Ledger",
    "Anchor",
    "Bell",
    "Key",
    "Flute",
    "Mirror",
    "Sextant",
)
# Chapter titles use none of the words names are made of (grounding never takes a title for a name).
TITLE_WORDS = (
    "Salt",
    "Ash",
    "Ember",
    "Brine",
    "Frost",
    "Tide",
    "Smoke",
    "Glass",
    "Rust",
    "Thorn",
    "Fog",
    "Spray",
)
SCENERY = (
    "Rain hammered the gallery glass while gulls wheeled over the reef.",
    "The lamp room smelled of paraffin, brass polish and old rope.",
    "Fog swallowed the ferry bell and the tide crept over the slipway.",
    "A storm lantern swung above the chart table, throwing long shadows.",
    "Morning sun lit the cliffs and the kelp beds glittered below.",
    "Snow dusted the rooftops and the generator coughed awake.",
    "Waves boomed in the sea caves beneath the northern stairs.",
    "The wind dropped and the whole coast held its breath.",
)
WARM = ("KNOWS", "FRIEND_OF", "ALLY_OF")
COLD = ("KNOWS", "RIVAL_OF", "ENEMY_OF")
#: Meetings of a pair before its relationship moves one step along its ladder.
MEETINGS_PER_STEP = 3
RELATION_WORDS = {
    "KNOWS": "nodded to",
    "FRIEND_OF": "laughed with",
    "ALLY_OF": "stood beside",
    "RIVAL_OF": "argued with",
    "ENEMY_OF": "threatened",
    "FAMILY_OF": "embraced",
}


@dataclass
class Person:
    name: str
    description: str
    traits: tuple[str, ...]
    first_chapter: int
    main: bool = False
    variant: str = ""
    died: int | None = None
    variant_used: bool = False


@dataclass(frozen=True)
class Place:
    name: str
    description: str
    parent: str | None
    first_chapter: int


@dataclass
class PlannedScene:
    chapter: int
    number: int
    title: str
    pov: str
    place: str
    cast: list[str]  # names as this scene writes them (pov first)
    relations: list[tuple[str, str, str]] = field(default_factory=list)  # (source, type, target)
    traits: list[tuple[str, str]] = field(default_factory=list)
    statuses: list[tuple[str, str]] = field(default_factory=list)
    mourned: list[str] = field(default_factory=list)
    part_of: tuple[str, str] | None = None
    item: str | None = None
    descriptions: dict[str, str] = field(default_factory=dict)  # written name -> description

    def met(self) -> str:
        """The scene's first sentence: who is there, and where."""
        others = self.cast[1:]
        return (
            f"{self.pov} met {_joined(others)} at {self.place}"
            if others
            else f"{self.pov} waited at {self.place}"
        )

    def text(self) -> str:
        """The scene's prose: every planned character and the setting named, every fact in its own sentence."""
        lines = [self.met() + "."]
        for source, kind, target in self.relations:
            if kind != "LOCATED_IN":
                lines.append(_relation_sentence(source, kind, target))
        lines += [f"{who} was {trait} as ever." for who, trait in self.traits]
        if self.part_of:
            lines.append(f"{self.part_of[0]} lay within {self.part_of[1]}.")
        if self.item:
            lines.append(f"{self.pov} carried the {self.item} everywhere now.")
        lines += [_status_sentence(who, status, self.place) for who, status in self.statuses]
        lines += [f"{self.pov} mourned {who} in silence." for who in self.mourned]
        lines.append(SCENERY[(self.chapter * 3 + self.number) % len(SCENERY)])
        lines.append(scripted_prose(self.chapter * 10 + self.number))
        return " ".join(lines)

    def extraction(self, text: str) -> dict[str, Any]:
        """What a careful model extracts from `text`: every fact with its own sentence as the quote."""
        entities: list[dict[str, Any]] = []
        trait_of = dict(self.traits)
        for name in self.cast:
            entity: dict[str, Any] = {
                "name": name,
                "kind": "Character",
                "description": self.descriptions.get(name, ""),
            }
            if name in trait_of:
                entity["traits"] = [
                    {"trait": trait_of[name], "quote": f"{name} was {trait_of[name]} as ever"}
                ]
            entities.append(entity)
        entities.append(
            {
                "name": self.place,
                "kind": "Location",
                "description": self.descriptions.get(self.place, ""),
            }
        )
        if self.part_of:
            entities.append(
                {
                    "name": self.part_of[1],
                    "kind": "Location",
                    "description": self.descriptions.get(self.part_of[1], ""),
                    "quote": f"{self.part_of[0]} lay within {self.part_of[1]}",
                }
            )
        if self.item:
            entities.append(
                {
                    "name": self.item,
                    "kind": "Item",
                    "description": f"An old brass {self.item.split()[-1].lower()}.",
                    "quote": f"{self.pov} carried the {self.item} everywhere now",
                }
            )
        for who in self.mourned:
            entities.append(
                {
                    "name": who,
                    "kind": "Character",
                    "presence": "mentioned",
                    "description": self.descriptions.get(who, ""),
                    "quote": f"{self.pov} mourned {who} in silence",
                }
            )
        relationships = []
        for source, kind, target in self.relations:
            quote = (
                self.met()
                if kind == "LOCATED_IN"
                else _relation_sentence(source, kind, target).rstrip(".")
            )
            relationships.append({"source": source, "target": target, "type": kind, "quote": quote})
        if self.part_of:
            relationships.append(
                {
                    "source": self.part_of[0],
                    "target": self.part_of[1],
                    "type": "PART_OF",
                    "quote": f"{self.part_of[0]} lay within {self.part_of[1]}",
                }
            )
        if self.item:
            relationships.append(
                {
                    "source": self.pov,
                    "target": self.item,
                    "type": "OWNS",
                    "quote": f"{self.pov} carried the {self.item} everywhere now",
                }
            )
        statuses = [
            {
                "name": who,
                "status": status,
                "quote": _status_sentence(who, status, self.place).rstrip("."),
            }
            for who, status in self.statuses
        ]
        return quoting_extraction(text, entities, relationships, statuses)

    def detail(self) -> dict[str, Any]:
        beats = [f"{self.pov} meets {name}" for name in self.cast[1:]] or [
            f"{self.pov} keeps watch"
        ]
        return {
            "title": self.title,
            "pov": self.pov,
            "setting": self.place,
            "characters": list(self.cast),
            "beats": beats,
        }


@dataclass
class PlannedChapter:
    number: int
    title: str
    pov: str
    setting: str
    scenes: list[PlannedScene]

    @property
    def summary(self) -> str:
        people = list(dict.fromkeys(name for scene in self.scenes for name in scene.cast[1:]))
        return f"{self.pov} meets {_joined(people) or 'no one'} at {self.setting}."

    @property
    def beats(self) -> list[str]:
        return [f"{scene.pov} at {scene.place}" for scene in self.scenes][:4]

    def outline(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "title": self.title,
            "summary": self.summary,
            "pov": self.pov,
            "setting": self.setting,
            "key_beats": self.beats,
        }


def _joined(names: list[str]) -> str:
    return (
        names[0]
        if len(names) == 1
        else ", ".join(names[:-1]) + f" and {names[-1]}"
        if names
        else ""
    )


def _relation_sentence(source: str, kind: str, target: str) -> str:
    return f"{source} {RELATION_WORDS.get(kind, 'spoke with')} {target}."


def _status_sentence(who: str, status: str, place: str) -> str:
    return {
        "dead": f"{who} died at {place} before dawn.",
        "injured": f"{who} was injured in the fall.",
        "alive": f"{who} was well again and walking.",
    }.get(status, f"{who} was {status}.")


def _stable(*key: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


class LongStory:
    """A whole book planned up front (see the module docstring); deterministic for (chapters, scenes, seed)."""

    def __init__(self, chapters: int, scenes: int = 2, seed: int = 7) -> None:
        if chapters < 1 or scenes < 1:
            raise ValueError("a book needs at least one chapter of at least one scene")
        self.chapter_count, self.scene_count = chapters, scenes
        self.rng = random.Random(seed)
        self.people: dict[str, Person] = {
            c["name"]: Person(c["name"], str(c["description"]), tuple(c["traits"]), 0, main=True)
            for c in BIBLE
        }
        self.places: dict[str, Place] = {
            name: Place(name, description, None, 0) for name, description in FIRST_PLACES
        }
        self.items: list[str] = []
        self.meetings: dict[tuple[str, str], int] = {}
        self.turned: set[tuple[str, str]] = set()  # pairs a betrayal turned cold
        self.appearances: dict[str, int] = {}
        self.injured: dict[str, int] = {}  # name -> chapter of the injury
        self.chapters = [self._plan_chapter(n) for n in range(1, chapters + 1)]

    # --- planning ---------------------------------------------------------------------------

    def alive(self, chapter: int, *, main: bool | None = None) -> list[Person]:
        return [
            p
            for p in self.people.values()
            if p.first_chapter < chapter
            and (p.died is None or p.died >= chapter)
            and (main is None or p.main == main)
        ]

    def _new_person(self, chapter: int) -> Person:
        index = len(self.people) - len(BIBLE)
        first, last = FIRST_NAMES[index % len(FIRST_NAMES)], LAST_NAMES[index % len(LAST_NAMES)]
        if index >= len(FIRST_NAMES):
            last = f"{last}-{LAST_NAMES[(index * 7 + 3) % len(LAST_NAMES)]}"
        name = f"{first} {last}"
        job = JOBS[index % len(JOBS)]
        variant = (
            f"{NICKNAME_OF[first]} {last}"
            if first in NICKNAME_OF
            else f"{TITLES[index % len(TITLES)]} {name}"
        )
        traits = (TRAITS[index % len(TRAITS)], TRAITS[(index + 5) % len(TRAITS)])
        person = Person(name, f"A {job} of the coast.", traits, chapter, variant=variant)
        self.people[name] = person
        return person

    def _new_place(self, chapter: int) -> Place:
        index = len(self.places) - len(FIRST_PLACES)
        name = f"{PLACE_WORDS[index % len(PLACE_WORDS)]} {PLACE_KINDS[index % len(PLACE_KINDS)]}"
        older = sorted(self.places)
        parent = older[_stable("parent", index) % len(older)]
        place = Place(
            name,
            f"A {PLACE_KINDS[index % len(PLACE_KINDS)].lower()} by the water.",
            parent,
            chapter,
        )
        self.places[name] = place
        return place

    def _relation(self, pov: str, other: str) -> str:
        pair = (pov, other) if pov < other else (other, pov)
        if {pov, other} == {"Mara Quill", "Ilse Harrow"}:
            return "FAMILY_OF"
        count = self.meetings.get(pair, 0)
        self.meetings[pair] = count + 1
        antagonist = "Corin Ashdown" in pair
        ladder = (
            COLD if antagonist or pair in self.turned or _stable("mood", pair) % 3 == 0 else WARM
        )
        if pair in self.turned:
            return "ENEMY_OF"
        return ladder[min(len(ladder) - 1, count // MEETINGS_PER_STEP)]

    def _pick(
        self, candidates: list[Person], chapter: int, taken: set[str], k: int
    ) -> list[Person]:
        """k people, the recently introduced ones more likely (a book's newer threads are hotter)."""
        pool = [p for p in candidates if p.name not in taken]
        chosen: list[Person] = []
        while pool and len(chosen) < k:
            weights = [
                1.0 + 6.0 / (1 + max(0, chapter - p.first_chapter) / 4) if not p.main else 3.0
                for p in pool
            ]
            person = self.rng.choices(pool, weights=weights, k=1)[0]
            pool.remove(person)
            chosen.append(person)
        return chosen

    def _plan_chapter(self, n: int) -> PlannedChapter:
        mains = self.alive(n, main=True)
        pov = next((p for p in mains if p.name == "Mara Quill"), mains[0]).name
        if n % 4 == 0:
            pov = [p.name for p in mains if p.name != "Corin Ashdown"][
                (n // 4) % max(1, len(mains) - 1)
            ]
        newcomer = self._new_person(n) if n % 3 == 1 else None
        new_place = self._new_place(n) if n % 5 == 2 else None
        item = (
            f"{PLACE_WORDS[(len(self.items) * 7) % len(PLACE_WORDS)]} {ITEMS[len(self.items) % len(ITEMS)]}"
            if n % 10 == 3
            else None
        )
        if item:
            self.items.append(item)
        # Deaths: a side character every twelfth chapter (from chapter 6), the antagonist at 80%.
        dying: Person | None = None
        if n >= 20 and n == int(self.chapter_count * 0.8):
            dying = self.people["Corin Ashdown"]
        elif n % 12 == 6:
            old = [p for p in self.alive(n, main=False) if n - p.first_chapter >= 5]
            dying = old[_stable("death", n) % len(old)] if old else None
        # A name written two ways: a side character met again under their other name.
        variant: Person | None = None
        if n % 7 == 2 and n >= 9:
            unused = [p for p in self.alive(n, main=False) if not p.variant_used and p is not dying]
            variant = unused[_stable("variant", n) % len(unused)] if unused else None
            if variant:
                variant.variant_used = True
        if n % 9 == 5:  # a betrayal: a warm pair turns cold for good
            warm = sorted(
                pair
                for pair, count in self.meetings.items()
                if count >= MEETINGS_PER_STEP
                and pair not in self.turned
                and "Corin Ashdown" not in pair
                and {"Mara Quill", "Ilse Harrow"} != set(pair)
            )
            if warm:
                self.turned.add(warm[_stable("turn", n) % len(warm)])
        mourned = [
            p.name
            for p in self.people.values()
            if p.died is not None and p.died < n and n - p.died in (1, 9)
        ]
        places = sorted(self.places)
        setting = new_place.name if new_place else places[_stable("setting", n) % len(places)]
        scenes: list[PlannedScene] = []
        taken: set[str] = {pov}
        for number in range(1, self.scene_count + 1):
            place = setting if number == 1 else places[_stable("place", n, number) % len(places)]
            forced = [
                p
                for p in (
                    newcomer if number == 1 else None,
                    variant if number == 1 else None,
                    dying if number == self.scene_count else None,
                )
                if p is not None
            ]
            others = [p for p in forced if p.name not in taken]
            want = 1 + _stable("size", n, number) % 2
            candidates = [
                p
                for p in self.alive(n)
                if p.name != pov and p is not dying and p is not variant and p is not newcomer
            ]
            others += self._pick(
                candidates, n, taken | {p.name for p in others}, max(0, want - len(others))
            )
            taken |= {p.name for p in others}
            written = {p.name: (p.variant if p is variant else p.name) for p in others}
            cast = [pov, *(written[p.name] for p in others)]
            scene = PlannedScene(
                chapter=n,
                number=number,
                title=f"{place} at {('dawn', 'dusk', 'noon')[number % 3]}",
                pov=pov,
                place=place,
                cast=cast,
            )
            scene.descriptions = {
                written.get(p.name, p.name): p.description for p in [*others, self.people[pov]]
            }
            scene.descriptions[place] = self.places[place].description
            for person in others:
                scene.relations.append(
                    (pov, self._relation(pov, person.name), written[person.name])
                )
            for name in cast:
                scene.relations.append((name, "LOCATED_IN", place))
            for person in [self.people[pov], *others]:
                seen = self.appearances.get(person.name, 0)
                self.appearances[person.name] = seen + 1
                if seen % 5 == 0:
                    scene.traits.append(
                        (written.get(person.name, person.name), person.traits[(seen // 5) % 2])
                    )
            if number == 1 and new_place is not None and new_place.parent:
                scene.part_of = (new_place.name, new_place.parent)
                scene.descriptions[new_place.parent] = self.places[new_place.parent].description
            if number == 1 and item:
                scene.item = item
            if dying is not None and number == self.scene_count:
                scene.statuses.append((dying.name, "dead"))
            injured = [p for p in others if p.main and p.name not in self.injured]
            if n % 11 == 3 and number == 1 and injured:
                self.injured[injured[0].name] = n
                scene.statuses.append((injured[0].name, "injured"))
            for name, since in list(self.injured.items()):
                if n - since == 3 and name in cast:
                    scene.statuses.append((name, "alive"))
            if number == 1:
                scene.mourned = [m for m in mourned if m not in cast]
                for m in scene.mourned:
                    scene.descriptions[m] = self.people[m].description
            scenes.append(scene)
        if dying is not None:
            dying.died = n
        title = f"{TITLE_WORDS[n % len(TITLE_WORDS)]} and {TITLE_WORDS[(n // len(TITLE_WORDS) + n + 1) % len(TITLE_WORDS)]}"
        return PlannedChapter(
            number=n, title=f"{title} {_roman(n)}", pov=pov, setting=setting, scenes=scenes
        )

    # --- what the book holds, for tests -------------------------------------------------------

    def chapter(self, number: int) -> PlannedChapter:
        return self.chapters[number - 1]

    def variants(self, up_to: int | None = None) -> dict[str, str]:
        """Written variant -> the person's name, for variants used in chapters <= up_to."""
        found = {}
        for chapter in self.chapters[: up_to or self.chapter_count]:
            for scene in chapter.scenes:
                for name in scene.cast:
                    for person in self.people.values():
                        if person.variant and name == person.variant:
                            found[name] = person.name
        return found

    def deaths(self, up_to: int | None = None) -> dict[str, int]:
        limit = up_to or self.chapter_count
        return {
            p.name: p.died for p in self.people.values() if p.died is not None and p.died <= limit
        }

    def introduced(self, up_to: int | None = None) -> list[str]:
        limit = up_to or self.chapter_count
        return [p.name for p in self.people.values() if 0 < p.first_chapter <= limit]

    # --- answers ------------------------------------------------------------------------------

    def install(self, llm: ScriptedLLM) -> ScriptedLLM:
        llm.on(schema="CharacterSheets", respond={"characters": [dict(c) for c in BIBLE]})
        llm.on(schema="GlobalOutline", respond=self._global_outline)
        llm.on(schema="ActOutline", respond=self._act_outline)
        llm.on(schema="ChapterOutlines", respond=self._chapter_outlines)
        llm.on(
            schema="OutlineRelationships",
            respond={
                "relationships": [
                    {"source": s, "target": t, "type": k, "description": d}
                    for s, t, k, d in FIRST_RELATIONSHIPS
                ],
                "locations": [{"name": n, "description": d} for n, d in FIRST_PLACES],
            },
        )
        llm.on(schema="ChapterOutlineRefresh", respond=self._refresh)
        llm.on(schema="ScenePlan", respond=self._scene_plan)
        llm.on(schema="SceneExtraction", respond=self._extract)
        llm.on(
            schema="QualityScores",
            respond={
                "coherence": 0.9,
                "prose_quality": 0.9,
                "plot_advancement": 0.9,
                "pacing": 0.9,
                "tone_consistency": 0.9,
                "feedback": "Good.",
            },
        )
        llm.on(schema="ChapterSummary", respond=self._summary)
        llm.on(schema="EntityEnrichment", respond=self._enrichment)
        llm.on(schema=None, contains="Write the scene", respond=self._draft)
        return llm

    def _global_outline(self, request: ScriptedRequest) -> dict[str, Any]:
        acts = int(_find(r"in (\d+) acts", request.text) or 1)
        return {
            "title": TITLE,
            "logline": "A keeper's ledger of the drowned starts to write itself.",
            "setting": "A storm-bound coast",
            "themes": ["grief", "greed"],
            "acts": [
                {"number": i, "summary": f"Act {i} of the ledger."} for i in range(1, acts + 1)
            ],
        }

    def _act_outline(self, request: ScriptedRequest) -> dict[str, Any]:
        first, last = (
            int(_find(r"chapters (\d+) to", request.text) or 1),
            int(_find(r"to (\d+)\.", request.text) or 1),
        )
        return {
            "summary": f"Chapters {first} to {last}: the coast fills with strangers.",
            "key_events": [
                self.chapter(n).summary for n in range(first, min(last, self.chapter_count) + 1)
            ][:12],
        }

    def _chapter_outlines(self, request: ScriptedRequest) -> dict[str, Any]:
        first = int(_find(r"Outline chapters (\d+) to", request.text) or 1)
        last = int(_find(r"Outline chapters \d+ to (\d+)", request.text) or first)
        numbers = range(first, min(last, self.chapter_count) + 1)
        return {"chapters": [self.chapter(n).outline() for n in numbers][:60]}

    def _refresh(self, request: ScriptedRequest) -> dict[str, Any]:
        number = int(_find(r"Outline chapter (\d+):", request.text) or 1)
        outline = self.chapter(min(number, self.chapter_count)).outline()
        return {k: v for k, v in outline.items() if k != "number"}

    def _scene_plan(self, request: ScriptedRequest) -> dict[str, Any]:
        number = int(_find(r"^Chapter (\d+):", request.text) or 1)
        wanted = int(_find(r"Plan exactly (\d+) scenes", request.text) or self.scene_count)
        scenes = self.chapter(number).scenes
        return {"scenes": [scenes[min(i, len(scenes) - 1)].detail() for i in range(wanted)]}

    def _scene(self, chapter: int, number: int) -> PlannedScene:
        scenes = self.chapter(chapter).scenes
        return scenes[min(number, len(scenes)) - 1]

    def _draft(self, request: ScriptedRequest) -> str:
        chapter, number = (
            int(x) for x in re.findall(r"Chapter (\d+), scene (\d+) of", request.text)[0]
        )
        return self._scene(chapter, number).text()

    def _extract(self, request: ScriptedRequest) -> dict[str, Any]:
        number, chapter = (
            int(x) for x in re.findall(r"Scene (\d+) of chapter (\d+)", request.text)[0]
        )
        return self._scene(chapter, number).extraction(scene_text_of(request))

    def _summary(self, request: ScriptedRequest) -> dict[str, Any]:
        number = int(_find(r"^Chapter (\d+):", request.last_user) or 1)
        chapter = self.chapter(number)
        events = [
            f"{s.pov} and {_joined(s.cast[1:]) or 'the sea'} at {s.place}" for s in chapter.scenes
        ]
        deaths = [
            f"{who} died" for s in chapter.scenes for who, status in s.statuses if status == "dead"
        ]
        return {
            "summary": f"{chapter.summary} {' '.join(d + '.' for d in deaths)}".strip(),
            "key_events": (events + deaths)[:12],
        }

    def _enrichment(self, request: ScriptedRequest) -> dict[str, Any]:
        name = _find(r"Entity: (.+?) \(", request.text) or "Someone"
        return {
            "summary": f"{name} is part of the coast's story. The ledger knows the name.",
            "facets": ["coast"],
            "confidence": 0.8,
        }


def _find(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text, re.MULTILINE)
    return found.group(1) if found else None


def _roman(number: int) -> str:
    """Chapter titles stay unique however long the book (every title word repeats eventually)."""
    out = []
    for value, letters in (
        (100, "C"),
        (90, "XC"),
        (50, "L"),
        (40, "XL"),
        (10, "X"),
        (9, "IX"),
        (5, "V"),
        (4, "IV"),
        (1, "I"),
    ):
        while number >= value:
            out.append(letters)
            number -= value
    return "".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.long_story",
        description="Serve the scripted long book over the OpenAI-compatible API.",
    )
    parser.add_argument("--chapters", type=int, default=100)
    parser.add_argument("--scenes", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    story = LongStory(args.chapters, args.scenes)
    with ScriptedLLM(port=args.port) as server:
        story.install(server)
        server.serve_until_interrupted()


if __name__ == "__main__":
    main()
