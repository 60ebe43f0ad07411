"""Healing benchmark: `python -m bench.heal [--entities 2000] [--duplicate-rate 0.05]`.

Builds a story graph in a temporary project (embedded ArcadeDB, written through
`GraphStore.commit_chapter` like the pipeline does): characters, places, items and
factions with relationships and scenes over 20 chapters, where 5% of the entities are
planted duplicates of others (nickname "Bill Turner", first name only "William", typo
"Willaim Turner", title "Dr. William Turner", and typos of places/items), sharing some of
their original's relationships and a similar description. Hard negatives are in too:
near-identical surnames (Reed/Reid), many people per first name, and namesakes with the
same full name and the same friends who meet in one scene.

Then it runs the healing detection (blocked candidates, names + shared relationships +
embeddings from the scripted OpenAI-compatible server) and merges in one transaction per
cluster, and prints the precision and recall of the merges against the planted truth
(pairs of entities merged together), and the time of blocked candidate generation +
scoring against a naive all-pairs comparison with the same scorer on the same data.
Goal: precision 1.0, recall >= 0.9.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import random
import shutil
import string
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from core.llm import LLMGateway
from core.settings import HealingSettings, load_settings
from kg import healing as h
from kg.models import ChapterDelta, Entity, EntitySource, Relationship, SceneDelta
from kg.store import GraphStore
from tests.support.scripted_llm import ScriptedLLM

CHAPTERS = 20
GOAL_PRECISION, GOAL_RECALL = 1.0, 0.9

FIRST = (
    "John William Elizabeth Robert Katherine Thomas Michael James Richard Margaret Samuel Alexander Benjamin "
    "Daniel Edward Henry Nicholas Anthony Christopher Joseph Susan Anna Charles Patricia Victoria Theodore "
    "Matthew Andrew David Stephen Rebecca Abigail Eleanor Frederick Isabella Josephine Lawrence Leonard Peter "
    "Timothy Mara Tobias Ida Oskar Greta Lena Hugo Clara Felix Nora Arthur Edith Silas Ruth Jonah Esther Caleb "
    "Hazel Rowan Iris Ansel Maeve Corin Della Emeric Fenna"
).split()
LAST = (
    "Smith Smyth Reed Reid Vale Vance Turner Tanner Baker Barker Webb Quill Venn Harlow Marsh Fenwick Ashdown "
    "Carrow Dunmore Elstree Farrow Garnet Holloway Ivers Jessop Kell Lorne Mallory Norcott Orme Pryce Quarry "
    "Rook Stroud Thorne Upton Voss Wren Yardley Zell Ashby Brand Colter Drury Emsley Frome Gale Hayle Ingram "
    "Jory Kimber Lark Mercer Nash Oakes Penrose Rudd Sallow Tarrant Usher Varley Winslow"
).split()
TRAITS = "quiet loyal bitter cheerful cunning stubborn gentle restless proud weary reckless careful".split()
JOBS = (
    "fisherman smith weaver sailor healer clerk miller baker soldier priest merchant scholar hunter "
    "carpenter ferryman innkeeper"
).split()
ADJ = (
    "Silver Iron Black White Red Green Grey Golden Old New High Low North South East West Broken Hollow "
    "Salt Storm Amber Ashen Bright Dusk"
).split()
PLACE = "Harbour Keep Hall Mill Bridge Market Tower Gate Abbey Ford Cove Hill Wharf Square Well Garden".split()
THING = "Compass Ring Lantern Blade Map Key Chalice Book Locket Flute Anchor Mirror".split()
GUILD = "Guild Order Company Brotherhood Circle League Watch Council".split()
SOCIAL = ("KNOWS", "FRIEND_OF", "ALLY_OF", "RIVAL_OF", "TRUSTS", "SERVES")
TITLES = ("Dr.", "Captain", "Mr.", "Mrs.", "Sir", "Lady")
NICK_OF: dict[str, list[str]] = defaultdict(list)
for _nick, _formal in h.NICKNAMES.items():
    NICK_OF[_formal].append(_nick)

log = logging.getLogger("skald.bench.heal")


@dataclass
class Ent:
    id: str
    label: str
    name: str
    description: str
    chapter: int
    outline: bool = False
    rels: list[tuple[str, str, str, int]] = field(default_factory=list)  # (type, src, tgt, chapter)


@dataclass
class World:
    entities: dict[str, Ent] = field(default_factory=dict)
    truth: list[set[str]] = field(default_factory=list)  # planted clusters: original + duplicate
    scenes: dict[int, list[list[str]]] = field(default_factory=lambda: defaultdict(list))
    kinds: dict[str, str] = field(default_factory=dict)  # duplicate id -> variant kind
    namesakes: int = 0


def _typo(rng: random.Random, word: str) -> str:
    if len(word) < 4:
        return word + rng.choice("aeiou")
    i = rng.randrange(1, len(word) - 2)
    if rng.random() < 0.5:  # swap two neighbouring letters
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word[:i] + rng.choice(string.ascii_lowercase) + word[i + 1 :]  # one wrong letter


def _variant(rng: random.Random, e: Ent) -> tuple[str, str]:
    """(kind, name) of a duplicate of `e`."""
    if e.label != "Character":
        words = e.name.split()
        j = rng.randrange(len(words))
        words[j] = _typo(rng, words[j])
        return "typo", " ".join(words)
    first, last = e.name.split(" ", 1)
    kinds = ["first-name", "typo", "title"] + (["nickname"] if NICK_OF.get(first.lower()) else [])
    kind = rng.choice(kinds)
    if kind == "nickname":
        return kind, f"{rng.choice(NICK_OF[first.lower()]).capitalize()} {last}"
    if kind == "first-name":
        return kind, first
    if kind == "title":
        return kind, f"{rng.choice(TITLES)} {first} {last}"
    return (
        kind,
        f"{first} {_typo(rng, last)}" if rng.random() < 0.6 else f"{_typo(rng, first)} {last}",
    )


def _paraphrase(rng: random.Random, text: str) -> str:
    words = text.split()
    keep = [w for w in words if rng.random() < 0.7] or words[:2]
    return " ".join(keep)


def build_world(total: int, duplicate_rate: float, seed: int) -> World:
    rng = random.Random(seed)
    world = World()
    n_dups = round(total * duplicate_rate)
    n_orig = total - n_dups
    n_loc, n_item, n_fac = round(n_orig * 0.18), round(n_orig * 0.08), round(n_orig * 0.05)
    namesakes = 10
    n_char = n_orig - n_loc - n_item - n_fac - namesakes

    def add(label: str, name: str, description: str, eid: str | None = None) -> Ent:
        eid = eid or f"{label.lower()}:{len(world.entities):05d}"
        ent = Ent(
            eid,
            label,
            name,
            description,
            chapter=rng.randint(1, CHAPTERS),
            outline=rng.random() < 0.2,
        )
        if ent.outline:
            ent.chapter = 0
        world.entities[eid] = ent
        return ent

    def unique(make: object) -> str:
        while True:
            name = make()  # type: ignore[operator]
            if name not in used:
                used.add(name)
                return name

    used: set[str] = set()
    places = [
        add(
            "Location",
            unique(lambda: f"{rng.choice(ADJ)} {rng.choice(PLACE)}"),
            f"a {rng.choice(TRAITS)} {rng.choice(PLACE).lower()} by the {rng.choice(PLACE).lower()}",
        )
        for _ in range(n_loc)
    ]
    items = [
        add(
            "Item",
            unique(lambda: f"{rng.choice(ADJ)} {rng.choice(THING)}"),
            f"a {rng.choice(TRAITS)} {rng.choice(THING).lower()} of {rng.choice(ADJ).lower()} make",
        )
        for _ in range(n_item)
    ]
    factions = [
        add(
            "Faction",
            unique(lambda: f"The {rng.choice(ADJ)} {rng.choice(GUILD)}"),
            f"a {rng.choice(TRAITS)} {rng.choice(GUILD).lower()}",
        )
        for _ in range(n_fac)
    ]
    people = [
        add(
            "Character",
            unique(lambda: f"{rng.choice(FIRST)} {rng.choice(LAST)}"),
            f"a {rng.choice(TRAITS)} {rng.choice(JOBS)} from {rng.choice(places).name}",
        )
        for _ in range(n_char)
    ]

    def relate(rel_type: str, src: Ent, tgt: Ent) -> None:
        chapter = max(src.chapter, tgt.chapter, 1) + rng.randint(0, 2)
        src.rels.append((rel_type, src.id, tgt.id, min(chapter, CHAPTERS)))

    for p in people:
        relate("LOCATED_IN", p, rng.choice(places))
        for _ in range(rng.randint(1, 3)):
            other = rng.choice(people)
            if other is not p:
                relate(rng.choice(SOCIAL), p, other)
        if rng.random() < 0.5:
            relate("MEMBER_OF", p, rng.choice(factions))
        if rng.random() < 0.4:
            relate("OWNS", p, rng.choice(items))
    for place in places:
        if rng.random() < 0.6:
            other = rng.choice(places)
            if other is not place:
                relate("PART_OF", place, other)
    for item in items:
        relate("LOCATED_IN", item, rng.choice(places))
    for faction in factions:
        relate("LOCATED_IN", faction, rng.choice(places))

    # Namesakes: a second person with the same full name and the same two friends, who
    # meets the first one in a scene (a father and son, say): never one person.
    for p in rng.sample(people, namesakes):
        twin = add(
            "Character", p.name, f"a {rng.choice(TRAITS)} {rng.choice(JOBS)}, {p.name}'s namesake"
        )
        for rel_type, _, tgt, _ in p.rels[:2]:
            relate(rel_type, twin, world.entities[tgt])
        world.scenes[max(p.chapter, twin.chapter, 1)].append([p.id, twin.id])
        world.namesakes += 1

    originals = people[:]
    rng.shuffle(originals)
    n_people_dups, n_place_dups = round(n_dups * 0.85), round(n_dups * 0.10)
    pool = (
        originals[:n_people_dups]
        + rng.sample(places, n_place_dups)
        + rng.sample(items, n_dups - n_people_dups - n_place_dups)
    )
    incident: dict[str, list[tuple[str, str, str, int]]] = defaultdict(list)
    for ent in list(world.entities.values()):
        for rel in ent.rels:
            incident[rel[1]].append(rel)
            incident[rel[2]].append(rel)
    for orig in pool:
        kind, name = _variant(rng, orig)
        roll = rng.random()
        description = (
            orig.description
            if roll < 0.6
            else _paraphrase(rng, orig.description)
            if roll < 0.85
            else ""
        )
        dup = add(orig.label, name, description)
        dup.outline = False
        dup.chapter = max(dup.chapter, 1)
        facts = incident[orig.id]  # what the original does and what is done to it
        copied = rng.sample(facts, k=min(len(facts), rng.choice((1, 2, 2, 3)))) if facts else []
        for rel_type, src, tgt, _ in copied:
            # The duplicate's version of a fact the original also has (told again in another chapter).
            if src == orig.id:
                relate(rel_type, dup, world.entities[tgt])
            else:
                relate(rel_type, world.entities[src], dup)
        if rng.random() < 0.3:
            relate(
                "KNOWS" if dup.label == "Character" else "LOCATED_IN",
                dup,
                rng.choice(people if dup.label == "Character" else places),
            )
        world.truth.append({orig.id, dup.id})
        world.kinds[dup.id] = kind

    # Scenes: people who interact in a chapter are in a scene together (never a person
    # with their own duplicate: that would be the extraction contradicting itself).
    same = {i: next(iter(c - {i})) for c in world.truth for i in c}
    for ent in world.entities.values():
        for rel_type, src, tgt, chapter in ent.rels:
            a, b = world.entities[src], world.entities[tgt]
            if (
                rel_type in SOCIAL
                and a.label == b.label == "Character"
                and same.get(a.id) != b.id
                and rng.random() < 0.5
            ):
                world.scenes[chapter].append([a.id, b.id])
    return world


def commit_world(store: GraphStore, world: World) -> float:
    started = time.perf_counter()
    by_chapter: dict[int, list[Ent]] = defaultdict(list)
    for ent in world.entities.values():
        by_chapter[ent.chapter].append(ent)
    rels_by_chapter: dict[int, list[tuple[str, str, str, int]]] = defaultdict(list)
    for ent in world.entities.values():
        for rel in ent.rels:
            rels_by_chapter[rel[3]].append(rel)
    for chapter in range(CHAPTERS + 1):
        entities = [
            Entity(
                id=e.id,
                label=e.label,
                name=e.name,
                description=e.description,
                first_chapter=chapter,
                sources=[
                    EntitySource(
                        type="outline" if e.outline else "extraction",
                        chapter=chapter,
                        original_name=e.name,
                    )
                ],
            )
            for e in by_chapter.get(chapter, [])
        ]
        relationships = [
            Relationship(source=src, target=tgt, type=t, chapter=c)
            for t, src, tgt, c in rels_by_chapter.get(chapter, [])
        ]
        scenes = [
            SceneDelta(index=i, characters=refs)
            for i, refs in enumerate(world.scenes.get(chapter, []), start=1)
        ]
        store.commit_chapter(
            ChapterDelta(
                chapter=chapter,
                source_type="outline" if chapter == 0 else "extraction",
                entities=entities,
                relationships=relationships,
                scenes=scenes,
            )
        )
    return time.perf_counter() - started


def pairs_of(clusters: list[set[str]]) -> set[frozenset[str]]:
    return {frozenset(p) for c in clusters for p in combinations(sorted(c), 2)}


def _blocking(store: GraphStore, snap: h.HealingSnapshot, cfg: HealingSettings) -> None:
    """Candidate pairs by blocking against all pairs (timed, printed), and what blocking missed."""
    started = time.perf_counter()
    blocked, blocks = h.candidate_pairs(snap)
    blocked_matches = h.score_pairs(snap, blocked, cfg)[0]
    t_blocked = time.perf_counter() - started
    snap_naive = h.load_snapshot(store)  # cold memo, same data
    started = time.perf_counter()
    naive = h.naive_pairs(snap_naive)
    naive_matches = h.score_pairs(snap_naive, naive, cfg)[0]
    t_naive = time.perf_counter() - started
    lost = {(e.a_id, e.b_id) for e in naive_matches} - {(e.a_id, e.b_id) for e in blocked_matches}
    print(
        f"candidates: blocked {len(blocked):,} pairs from {blocks:,} blocks in {t_blocked:.2f}s; "
        f"naive all-pairs {len(naive):,} pairs in {t_naive:.2f}s; ratio {t_naive / t_blocked:.1f}x faster; "
        f"name matches {len(blocked_matches)} vs {len(naive_matches)} (missed by blocking: {len(lost)})"
    )


def _detect_and_merge(
    store: GraphStore,
    snap: h.HealingSnapshot,
    cfg: HealingSettings,
    embed: h.Embedder | None,
    world: World,
) -> tuple[h.DetectionResult, set[frozenset[str]], set[frozenset[str]]]:
    """Detection and one merge transaction a plan (timed, printed): the detection, the pairs
    merged and the planted pairs."""
    started = time.perf_counter()
    detection = h.detect_duplicates(snap, cfg, embed)
    t_detect = time.perf_counter() - started
    started = time.perf_counter()
    results = [
        store.execute_write(h.merge_tx, plan, "2026-01-01T00:00:00+00:00", CHAPTERS)
        for plan in detection.plans
    ]
    t_merge = time.perf_counter() - started
    merged_clusters = [{r.survivor_id, *r.merged_ids} for r in results if r.skipped is None]
    predicted, truth = pairs_of(merged_clusters), pairs_of(world.truth)
    s = detection.stats
    print(
        f"detection: {s.name_matches} name matches, {s.accepted_pairs} accepted, {s.vetoed_pairs} vetoed, "
        f"{s.embedded_entities} entities embedded, {len(detection.plans)} merges planned in {t_detect:.2f}s"
    )
    print(
        f"merge: {len(merged_clusters)} merges ({sum(r.relationships_moved for r in results)} relationships "
        f"moved) in {t_merge:.2f}s, one transaction each; entities now {len(h.load_snapshot(store).entities)}"
    )
    return detection, predicted, truth


def _print_misses(
    world: World,
    detection: h.DetectionResult,
    predicted: set[frozenset[str]],
    truth: set[frozenset[str]],
) -> None:
    """Recall by kind of planted variant, and the first misses and wrong merges."""
    hits = predicted & truth
    missed = [c for c in world.truth if frozenset(c) not in hits]
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in world.truth:
        dup = next(i for i in c if i in world.kinds)
        by_kind[world.kinds[dup]][1] += 1
        by_kind[world.kinds[dup]][0] += frozenset(c) in hits
    print(
        "recall by variant: " + ", ".join(f"{k} {a}/{b}" for k, (a, b) in sorted(by_kind.items()))
    )
    for c in missed[:5]:
        names = " / ".join(repr(world.entities[i].name) for i in sorted(c))
        print(f"  missed: {names}")
    for pair in sorted(predicted - truth, key=sorted)[:5]:
        names = " / ".join(f"{world.entities[i].name!r} ({i})" for i in sorted(pair))
        plan = next(p for p in detection.plans if pair <= {p.survivor_id, *p.merged_ids})
        why = "; ".join(
            f"{e.a_name}~{e.b_name}: name {e.name_score}, shared {e.shared_neighbours}, "
            f"embedding {e.embedding_score}"
            for e in plan.evidence
        )
        print(f"  wrongly merged: {names} [{why}]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.heal", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--entities", type=int, default=2000, help="entities in the graph, duplicates included"
    )
    parser.add_argument(
        "--duplicate-rate", type=float, default=0.05, help="share of planted duplicates"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-embeddings", action="store_true", help="names and relationships only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s | %(message)s")

    world = build_world(args.entities, args.duplicate_rate, args.seed)
    print(
        f"graph: {len(world.entities)} entities ({len(world.truth)} planted duplicates, {world.namesakes} namesake "
        f"pairs who meet), {sum(len(e.rels) for e in world.entities.values())} relationships, "
        f"{sum(len(s) for s in world.scenes.values())} scenes over {CHAPTERS + 1} chapters"
    )
    tmp = Path(tempfile.mkdtemp(prefix="skald-bench-heal-"))
    # Registered before the embedded graph starts, so it runs after the graph's own
    # shutdown hook (atexit is last-in, first-out): the data goes once the server is down.
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    with ScriptedLLM() as llm:
        settings = load_settings(tmp, openai_base_url=llm.base_url, embedding_base_url=llm.base_url)
        store = GraphStore.open(settings)
        gateway = LLMGateway(settings)
        try:
            seconds = commit_world(store, world)
            print(f"commit: {seconds:.1f}s through GraphStore.commit_chapter")
            h.ensure_schema(store)
            snap = h.load_snapshot(store)
            assert len(snap.entities) == args.entities, len(snap.entities)

            cfg = settings.healing
            _blocking(store, snap, cfg)
            embed = (
                None
                if args.no_embeddings
                else (lambda texts: gateway.embed(list(texts), purpose="bench"))
            )
            detection, predicted, truth = _detect_and_merge(store, snap, cfg, embed, world)
            hits = predicted & truth
            precision = len(hits) / len(predicted) if predicted else 1.0
            recall = len(hits) / len(truth) if truth else 1.0
            _print_misses(world, detection, predicted, truth)
            ok = precision >= GOAL_PRECISION and recall >= GOAL_RECALL
            print(
                f"precision {precision:.3f} (goal {GOAL_PRECISION}), recall {recall:.3f} (goal >= {GOAL_RECALL}): "
                f"{'PASS' if ok else 'FAIL'}"
            )
            return 0 if ok else 1
        finally:
            gateway.close()
            store.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
