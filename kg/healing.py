"""Graph healing: duplicate detection and merging, graduation, enrichment writes.

Duplicate detection never compares all pairs. Entities are *blocked* by their normalised
name tokens (titles dropped, nicknames mapped to the formal name: Johnny -> john, Bill ->
william) plus a phonetic key of the first token (catches "Jonh" / "John"), per label; only
pairs sharing a block are scored. A pair is scored on

- name similarity: 1.0 for the same canonical tokens ("same", or "nickname" when only the
  nickname table makes them equal), CONTAINMENT_SCORE when one name's tokens are a subset
  of the other's ("contained": "John" in "John Smith"), else difflib's ratio of the
  canonical strings ("similar": typos); the best over names and aliases;
- shared story neighbours: distinct entities both relate to (the relationship overlap);
- description similarity: embedding cosine of the two descriptions (optional, through a
  caller-supplied embedder, only for pairs that passed the name test; the name is not
  embedded again, spec 003 merges on name + summary similarity).

A pair needs name >= settings.name_similarity and one of:
  (a) >= MIN_SHARED_NEIGHBOURS shared neighbours;
  (b) description cosine >= settings.embedding_similarity, plus one shared neighbour when
      the names are only "similar" ("Salt Hill" / "Salt Mill" is two places);
  (c) the same full name or a one-edit typo of it (ratio >= NEAR_IDENTICAL), one shared
      neighbour, and descriptions that do not disagree (cosine >= DESCRIPTION_FLOOR).
It is vetoed, whatever its scores, when the two appear together in one scene (two people
in a scene are two people), are related to each other directly, both come from the
user/outline (the author made two entities on purpose) or carry different numbers
("Deckhand 1" / "Deckhand 2"). An entity whose best match is no better supported than a
match with someone who cannot be the same person is ambiguous: both are refused. Accepted
pairs are joined into clusters greedily, best evidence first, and a join is refused when
any cross pair is vetoed or carries two conflicting full names ("John Smith" vs "John
Baker"), so a first-name-only "John" joins one John, never two.

A cluster is merged in ONE write transaction (`merge_tx`): the survivor (user/outline
entity first, then confirmed, then the most complete name) keeps its id; the others'
names become aliases, their sources are all kept plus one `merge` source each, differing
descriptions and attribute values go to `description_history` / `attribute_history`
attributes, every relationship is re-created on the survivor with its type, properties
and key (a fact already on the survivor for the same chapter is not duplicated), the
EntityName lookups are rebuilt, the merged nodes are deleted and a MergeAudit node
records who, what, why and when.

Note: rolling back (with cascade) a chapter committed *before* a merge restores the
survivor's pre-chapter properties from that change-set, while the merged nodes stay
deleted; re-run healing after such a rollback.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from itertools import combinations
from typing import Any, Literal

import numpy as np
from neo4j import ManagedTransaction
from pydantic import BaseModel, ConfigDict, Field

from core.settings import HealingSettings
from kg import cypher
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.models import Entity, EntitySource
from kg.records import add_revision, canonical_json, entity_from_props, entity_props, name_rows
from kg.store import GraphStore

#: Embedder: texts -> float array of shape (len(texts), dim).
Embedder = Callable[[Sequence[str]], np.ndarray]
NameMatch = Literal["same", "nickname", "contained", "similar"]

# --- Tunables not (yet) in HealingSettings -------------------------------------------------

#: Score of "one name's tokens are a subset of the other's" (John / John Smith): above the
#: default name threshold, so containment alone passes the name test and evidence decides.
CONTAINMENT_SCORE = 0.9
#: Shared story neighbours that corroborate a name match without embeddings.
MIN_SHARED_NEIGHBOURS = 2
#: A "similar" (difflib) name at least this close is one edit in a full name: a typo.
NEAR_IDENTICAL = 0.9
#: Below this description cosine, two descriptions contradict a weakly corroborated match.
DESCRIPTION_FLOOR = 0.7
#: Blocks larger than this carry too little evidence to pair everyone (a very common
#: surname in a huge cast); their members still meet through their other keys.
MAX_BLOCK_SIZE = 400
#: Graduation: confidence = W_CONNECTIVITY * min(1, neighbours / CONNECTIVITY_FULL)
#:   + W_COMPLETENESS * completeness + W_AGE * min(1, chapters since first seen / AGE_FULL),
#: completeness = 0.6 [has description] + 0.2 [has traits] + 0.2 [has attributes or aliases].
W_CONNECTIVITY, W_COMPLETENESS, W_AGE = 0.4, 0.3, 0.3
CONNECTIVITY_FULL = 3
AGE_FULL = 3

CANONICAL_SOURCES = frozenset({"user", "outline"})
HEALER = "heal_graph"

#: Honorifics dropped from character names before comparing ("Dr. William Turner").
TITLES = frozenset(
    "dr doctor mr mrs ms miss mx sir dame lady lord master mistress madam madame prof professor "
    "capt captain col colonel gen general lt lieutenant sgt sergeant rev reverend father sister "
    "brother aunt uncle king queen prince princess duke duchess count countess baron baroness".split()
)
#: Nickname -> formal first name (a small, common English table; extend as needed).
NICKNAMES: dict[str, str] = {
    nick: formal
    for formal, nicks in {
        "john": "johnny jack jackie jon jonny",
        "william": "bill billy will willy willie liam",
        "elizabeth": "liz lizzie lizzy beth betty eliza libby bess",
        "robert": "bob bobby rob robbie bert",
        "katherine": "kate katie kathy cathy kat kitty",
        "thomas": "tom tommy",
        "michael": "mike mikey mick mickey",
        "james": "jim jimmy jamie",
        "richard": "dick rick ricky rich richie",
        "margaret": "maggie meg peggy peg marge greta",
        "samuel": "sam sammy",
        "alexander": "alex sandy xander",
        "benjamin": "ben benny",
        "daniel": "dan danny",
        "edward": "ed eddie ted teddy ned",
        "henry": "harry hal hank",
        "nicholas": "nick nicky",
        "anthony": "tony",
        "christopher": "chris kit",
        "joseph": "joe joey",
        "susan": "sue susie suzy",
        "anna": "annie",
        "charles": "charlie chuck",
        "patricia": "pat patty tricia",
        "jennifer": "jen jenny",
        "victoria": "vicky tori",
        "theodore": "theo",
        "matthew": "matt",
        "andrew": "andy drew",
        "david": "dave davy",
        "stephen": "steve stevie",
        "rebecca": "becky becca",
        "abigail": "abby",
        "eleanor": "ellie nell nora",
        "frederick": "fred freddie",
        "isabella": "bella izzy",
        "josephine": "josie jo",
        "lawrence": "larry",
        "leonard": "leo len lenny",
        "peter": "pete",
        "timothy": "tim timmy",
    }.items()
    for nick in nicks.split()
}


# --- Models at the boundary ----------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PairEvidence(_Model):
    """Why two entities are (or are not) the same, as scored by `detect_duplicates`."""

    a_id: str
    b_id: str
    a_name: str
    b_name: str
    name_score: float
    name_match: NameMatch = "similar"
    shared_neighbours: int = 0
    overlap: float = Field(0.0, description="Jaccard overlap of the story neighbours")
    embedding_score: float | None = None
    veto: str | None = None
    accepted: bool = False
    score: float = Field(0.0, description="combined evidence, orders cluster joins")


class MergePlan(_Model):
    label: str
    survivor_id: str
    survivor_name: str
    merged_ids: list[str]
    merged_names: list[str]
    evidence: list[PairEvidence]

    @property
    def score(self) -> float:
        return max((e.score for e in self.evidence), default=0.0)


class DetectionStats(_Model):
    entities: int
    blocks: int
    candidate_pairs: int
    name_matches: int
    accepted_pairs: int
    vetoed_pairs: int
    embedded_entities: int
    seconds: float


class DetectionResult(_Model):
    plans: list[MergePlan]
    stats: DetectionStats
    vetoed: list[PairEvidence] = Field(default_factory=list)
    latest_chapter: int | None = Field(None, description="newest Chapter node when detection ran")


class MergeResult(_Model):
    survivor_id: str
    name: str
    merged_ids: list[str]
    merged_names: list[str]
    audit_id: str | None = None
    aliases: list[str] = Field(default_factory=list)
    sources: int = 0
    relationships_moved: int = 0
    relationships_deduplicated: int = 0
    relationships_dropped: int = Field(0, description="between merged entities (would be self-loops)")
    skipped: str | None = Field(None, description="why nothing was written")


class Graduation(_Model):
    id: str
    name: str
    confidence: float
    connectivity: float
    completeness: float
    age: float


class EnrichmentTarget(_Model):
    id: str
    name: str
    label: str
    description: str
    relationship_count: int
    relationships: list[str]
    last_chapter: int | None = None


class EnrichmentResult(_Model):
    id: str
    name: str
    relationship_count: int
    summary: str
    facets: list[str] = Field(default_factory=list)
    confidence: float


# --- Names -----------------------------------------------------------------------------------


def canonical_tokens(name: str, label: str, *, nicknames: bool = True) -> tuple[str, ...]:
    """Normalised name tokens; for characters without titles and with nicknames mapped."""
    tokens = vocab.normalize_name(name).split()
    if label == "Character":
        tokens = [t for t in tokens if t not in TITLES] or tokens
        if nicknames:
            tokens = [NICKNAMES.get(t, t) for t in tokens]
    return tuple(tokens)


def token_match(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[float, NameMatch]:
    """(similarity, kind): the same canonical tokens, one name inside the other, or only
    similar strings (difflib ratio: typos, but also "Salt Hill" / "Salt Mill")."""
    if not a or not b:
        return 0.0, "similar"
    if a == b or sorted(a) == sorted(b):
        return 1.0, "same"
    sa, sb = set(a), set(b)
    if sa < sb or sb < sa:
        return CONTAINMENT_SCORE, "contained"
    return SequenceMatcher(None, " ".join(a), " ".join(b), autojunk=False).ratio(), "similar"


def token_similarity(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    return token_match(a, b)[0]


def soundex(token: str) -> str:
    """American Soundex of one token (letters only): a typo-tolerant block key."""
    codes = {**dict.fromkeys("bfpv", "1"), **dict.fromkeys("cgjkqsxz", "2"), **dict.fromkeys("dt", "3"),
             "l": "4", **dict.fromkeys("mn", "5"), "r": "6"}
    letters = [c for c in token if "a" <= c <= "z"]
    if not letters:
        return token
    out, last = letters[0].upper(), codes.get(letters[0], "")
    for c in letters[1:]:
        code = codes.get(c, "")
        if code and code != last:
            out += code
        if c not in "hw":
            last = code
    return (out + "000")[:4]


# --- The snapshot detection works on -----------------------------------------------------------


@dataclass
class HealingSnapshot:
    """What detection, graduation and enrichment read, taken in one read transaction."""

    entities: dict[str, Entity]
    neighbours: dict[str, set[str]] = field(default_factory=dict)
    rel_counts: dict[str, int] = field(default_factory=dict)
    related: set[frozenset[str]] = field(default_factory=set)
    co_scene: dict[frozenset[str], str] = field(default_factory=dict)  # pair -> "chapter c scene s"
    chapters: list[int] = field(default_factory=list)
    _variants: dict[str, list[tuple[str, ...]]] = field(default_factory=dict, repr=False)

    @property
    def latest_chapter(self) -> int | None:
        return max(self.chapters) if self.chapters else None

    def variants(self, eid: str) -> list[tuple[str, ...]]:
        """Canonical token tuples of the entity's name and aliases (memoised: scoring asks often)."""
        found = self._variants.get(eid)
        if found is None:
            e = self.entities[eid]
            found = list(dict.fromkeys(t for t in (canonical_tokens(n, e.label) for n in (e.name, *e.aliases)) if t))
            self._variants[eid] = found
        return found

    def plain_variants(self, eid: str) -> list[tuple[str, ...]]:
        """Like `variants`, without the nickname table."""
        e = self.entities[eid]
        return [canonical_tokens(n, e.label, nicknames=False) for n in (e.name, *e.aliases)]


def _key_index(entities: dict[str, Entity]) -> dict[str, set[str]]:
    index: dict[str, set[str]] = defaultdict(set)
    for eid, e in entities.items():
        for name in (e.name, *e.aliases):
            index[vocab.name_key(name)].add(eid)
    return index


def resolve_scene_refs(refs: Iterable[str], entities: dict[str, Entity], keys: dict[str, set[str]]) -> list[set[str]]:
    """Entity ids each scene reference may mean: an id, else every entity with that name/alias.

    A name listed twice in one scene ("Anna", "Anna") therefore yields two entries that
    each hold every Anna: two different Annas were there.
    """
    return [{ref} if ref in entities else set(keys.get(vocab.name_key(ref), ())) for ref in refs]


def _snapshot_tx(tx: ManagedTransaction) -> HealingSnapshot:
    entities: dict[str, Entity] = {}
    for row in tx.run(mq.ALL_ENTITIES):
        entity = entity_from_props(row["props"])
        assert entity.id is not None
        entities[entity.id] = entity
    snap = HealingSnapshot(entities=entities)
    neighbours: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for row in tx.run(mq.STORY_EDGES):
        src, tgt = row["src"], row["tgt"]
        counts[src] += 1
        counts[tgt] += 1
        if src != tgt:
            neighbours[src].add(tgt)
            neighbours[tgt].add(src)
            snap.related.add(frozenset((src, tgt)))
    snap.neighbours, snap.rel_counts = dict(neighbours), dict(counts)
    keys = _key_index(entities)
    for row in tx.run(mq.SCENES):
        where = f"chapter {row['chapter']} scene {row['scene']}"
        resolved = resolve_scene_refs(row["characters"] or [], entities, keys)
        for left, right in combinations(resolved, 2):
            for x in left:
                for y in right:
                    if x != y:
                        snap.co_scene.setdefault(frozenset((x, y)), where)
    snap.chapters = sorted(int(r["number"]) for r in tx.run(mq.CHAPTER_NUMBERS) if r["number"] is not None)
    return snap


def load_snapshot(store: GraphStore) -> HealingSnapshot:
    return store.execute_read(_snapshot_tx)


def ensure_schema(store: GraphStore) -> None:
    """Constraints/indexes maintenance needs beyond kg/schema.py (idempotent)."""
    for statement in mq.SCHEMA:
        store.write(statement)


# --- Candidate generation ------------------------------------------------------------------


def block_keys(snap: HealingSnapshot, eid: str) -> set[str]:
    label = snap.entities[eid].label
    keys: set[str] = set()
    for tokens in snap.variants(eid):
        keys.update(f"{label}|t|{t}" for t in tokens if len(t) > 1)
        keys.add(f"{label}|s|{soundex(tokens[0])}")
    return keys


def candidate_pairs(snap: HealingSnapshot) -> tuple[set[tuple[str, str]], int]:
    """Pairs sharing a block (and a label); returns (pairs, number of blocks)."""
    blocks: dict[str, list[str]] = defaultdict(list)
    for eid in snap.entities:
        for key in block_keys(snap, eid):
            blocks[key].append(eid)
    pairs: set[tuple[str, str]] = set()
    for members in blocks.values():
        if 1 < len(members) <= MAX_BLOCK_SIZE:
            ordered = sorted(members)
            pairs.update(combinations(ordered, 2))
    return pairs, len(blocks)


def naive_pairs(snap: HealingSnapshot) -> set[tuple[str, str]]:
    """Every same-label pair: the all-pairs baseline the benchmark compares against."""
    by_label: dict[str, list[str]] = defaultdict(list)
    for eid, e in snap.entities.items():
        by_label[e.label].append(eid)
    return {pair for ids in by_label.values() for pair in combinations(sorted(ids), 2)}


def name_match(snap: HealingSnapshot, a: str, b: str) -> tuple[float, NameMatch]:
    """Best match over both entities' names and aliases (an exact kind wins a tie). "same"
    only when the names agree without the nickname table: "Nora Venn" and "Eleanor Venn"
    may be one woman or two sisters, so a nickname match is weaker evidence."""
    order = {"same": 3, "nickname": 2, "contained": 1, "similar": 0}
    matches = [token_match(x, y) for x in snap.variants(a) for y in snap.variants(b)]
    score, kind = max(matches, key=lambda m: (m[0], order[m[1]]), default=(0.0, "similar"))
    if kind == "same":
        plain_a, plain_b = snap.plain_variants(a), snap.plain_variants(b)
        if not any(sorted(x) == sorted(y) for x in plain_a for y in plain_b):
            kind = "nickname"
    return score, kind


def name_score(snap: HealingSnapshot, a: str, b: str) -> float:
    return name_match(snap, a, b)[0]


def _canonical(e: Entity) -> bool:
    return any(s.type in CANONICAL_SOURCES for s in e.sources)


_ROMAN = frozenset("ii iii iv vi vii viii ix xi xii xiii xiv xv".split())


def _numbers(tokens: tuple[str, ...]) -> set[str]:
    return {t for t in tokens if t.isdigit() or t in _ROMAN}


def veto_reason(snap: HealingSnapshot, a: str, b: str) -> str | None:
    """Why `a` and `b` can never be one entity, or None."""
    pair = frozenset((a, b))
    if pair in snap.co_scene:
        return f"appear together in {snap.co_scene[pair]}"
    if pair in snap.related:
        return "related to each other"
    ea, eb = snap.entities[a], snap.entities[b]
    if ea.label != eb.label:
        return "different labels"
    if _canonical(ea) and _canonical(eb):
        return "both given by the user/outline"
    # "Deckhand 1" / "Deckhand 2", "Henry VII" / "Henry VIII": numbered names are distinct.
    numbers_a, numbers_b = _numbers(canonical_tokens(ea.name, ea.label)), _numbers(canonical_tokens(eb.name, eb.label))
    if numbers_a and numbers_b and numbers_a != numbers_b:
        return "different numbers in their names"
    return None


def names_conflict(snap: HealingSnapshot, a: str, b: str, threshold: float) -> bool:
    """Two different full names ("John Smith" / "John Baker") cannot share a cluster."""
    full_a = len(canonical_tokens(snap.entities[a].name, snap.entities[a].label)) > 1
    full_b = len(canonical_tokens(snap.entities[b].name, snap.entities[b].label)) > 1
    return full_a and full_b and name_score(snap, a, b) < threshold


def entity_text(e: Entity) -> str | None:
    """What is embedded: the description (spec 003 merges on name + summary similarity;
    the name is scored on its own, so embedding it again would double-count it)."""
    return f"{e.label}: {e.description.strip()}" if e.description.strip() else None


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def score_pairs(
    snap: HealingSnapshot,
    pairs: Iterable[tuple[str, str]],
    settings: HealingSettings,
    embed: Embedder | None = None,
) -> tuple[list[PairEvidence], int]:
    """Evidence for every pair passing the name test; returns (evidence, entities embedded)."""
    evidence: list[PairEvidence] = []
    for a, b in pairs:
        score, kind = name_match(snap, a, b)
        if score < settings.name_similarity:
            continue
        na, nb = snap.neighbours.get(a, set()) - {b}, snap.neighbours.get(b, set()) - {a}
        shared = len(na & nb)
        overlap = shared / len(na | nb) if na and nb else 0.0  # Jaccard: more shared, more overlap
        evidence.append(
            PairEvidence(
                a_id=a, b_id=b, a_name=snap.entities[a].name, b_name=snap.entities[b].name,
                name_score=round(score, 4), name_match=kind, shared_neighbours=shared, overlap=round(overlap, 4),
                veto=veto_reason(snap, a, b),
            )
        )
    embedded = 0
    if embed is not None:
        texts = {i: entity_text(snap.entities[i]) for ev in evidence if ev.veto is None for i in (ev.a_id, ev.b_id)}
        ids = sorted(i for i, text in texts.items() if text)
        if ids:
            vectors = _unit_rows(np.asarray(embed([texts[i] for i in ids]), dtype=np.float32))
            row = {eid: n for n, eid in enumerate(ids)}
            embedded = len(ids)
            for ev in evidence:
                if ev.veto is None and ev.a_id in row and ev.b_id in row:
                    ev.embedding_score = round(float(vectors[row[ev.a_id]] @ vectors[row[ev.b_id]]), 4)
    for ev in evidence:
        # An embedding (of name + description) corroborates an exact or contained name on its
        # own; a merely similar name ("Salt Hill" / "Salt Mill") also needs a shared neighbour.
        similar_text = ev.embedding_score is not None and ev.embedding_score >= settings.embedding_similarity
        # The same full name ("Dr. Samuel Ashdown" / "Samuel Ashdown") or a one-letter typo of
        # it ("Hwzel Marsh") is strong evidence: one shared neighbour corroborates it unless
        # the descriptions say otherwise.
        full = min(len(snap.variants(ev.a_id)[0]), len(snap.variants(ev.b_id)[0])) > 1
        near_same = full and (ev.name_match == "same" or (ev.name_match == "similar" and ev.name_score >= NEAR_IDENTICAL))
        described_alike = ev.embedding_score is None or ev.embedding_score >= DESCRIPTION_FLOOR
        corroborated = (
            ev.shared_neighbours >= MIN_SHARED_NEIGHBOURS
            or (similar_text and (ev.name_match != "similar" or ev.shared_neighbours >= 1))
            or (near_same and ev.shared_neighbours >= 1 and described_alike)
        )
        ev.accepted = ev.veto is None and corroborated
        ev.score = round(0.5 * ev.name_score + 0.3 * ev.overlap + 0.2 * max(ev.embedding_score or 0.0, 0.0), 4)
    return evidence, embedded


def _survivor_rank(snap: HealingSnapshot, eid: str) -> tuple[Any, ...]:
    e = snap.entities[eid]
    return (
        any(s.type == "user" for s in e.sources),
        any(s.type == "outline" for s in e.sources),
        not e.is_provisional,
        len(canonical_tokens(e.name, e.label)),
        snap.rel_counts.get(eid, 0),
        len(e.sources),
        len(e.name),
        # Deterministic last resort: the smaller id wins (negated for max()).
        tuple(-ord(c) for c in eid),
    )


def _incompatible(snap: HealingSnapshot, x: str, y: str, settings: HealingSettings) -> bool:
    return veto_reason(snap, x, y) is not None or names_conflict(snap, x, y, settings.name_similarity)


def drop_ambiguous(snap: HealingSnapshot, accepted: list[PairEvidence], settings: HealingSettings) -> list[PairEvidence]:
    """Refuse an entity's matches when its best one is not better supported than a match
    with someone who cannot be the same (a "Maeve" whose friends are also those of two
    namesake Maeve Garnets): guessing would merge the wrong person. The refused pairs get
    a `veto` saying so and stay in the report."""
    edges: dict[str, list[tuple[PairEvidence, str]]] = defaultdict(list)
    for ev in accepted:
        edges[ev.a_id].append((ev, ev.b_id))
        edges[ev.b_id].append((ev, ev.a_id))
    refused: dict[int, str] = {}
    for node, mine in sorted(edges.items()):
        if len(mine) < 2:
            continue
        mine.sort(key=lambda t: (-t[0].shared_neighbours, -t[0].score, t[1]))
        best, partner = mine[0]
        for ev, other in mine[1:]:
            if ev.shared_neighbours >= best.shared_neighbours and _incompatible(snap, partner, other, settings):
                name = snap.entities[node].name
                refused[id(best)] = refused[id(ev)] = f"ambiguous: {name!r} matches two different entities"
    for ev in accepted:
        if id(ev) in refused:
            ev.accepted, ev.veto = False, refused[id(ev)]
    return [ev for ev in accepted if ev.accepted]


def cluster_pairs(snap: HealingSnapshot, accepted: list[PairEvidence], settings: HealingSettings) -> list[list[str]]:
    """Greedy constrained clustering, best evidence first (see the module docstring)."""
    parent: dict[str, str] = {}
    members: dict[str, list[str]] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        members.setdefault(x, [x])
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for ev in sorted(accepted, key=lambda e: (-e.score, -e.shared_neighbours, e.a_id, e.b_id)):
        ra, rb = find(ev.a_id), find(ev.b_id)
        if ra == rb:
            continue
        if any(_incompatible(snap, x, y, settings) for x in members[ra] for y in members[rb]):
            continue
        parent[rb] = ra
        members[ra] += members.pop(rb)
    return [sorted(group) for group in members.values() if len(group) > 1]


def detect_duplicates(
    snap: HealingSnapshot,
    settings: HealingSettings,
    embed: Embedder | None = None,
    *,
    pairs: set[tuple[str, str]] | None = None,
) -> DetectionResult:
    """Merge plans for the snapshot (blocked candidates unless `pairs` is given)."""
    started = time.perf_counter()
    blocks = 0
    if pairs is None:
        pairs, blocks = candidate_pairs(snap)
    evidence, embedded = score_pairs(snap, sorted(pairs), settings, embed)
    accepted = drop_ambiguous(snap, [ev for ev in evidence if ev.accepted], settings)
    plans: list[MergePlan] = []
    for group in cluster_pairs(snap, accepted, settings):
        survivor = max(group, key=lambda eid: _survivor_rank(snap, eid))
        merged = sorted(eid for eid in group if eid != survivor)
        inside = set(group)
        plans.append(
            MergePlan(
                label=snap.entities[survivor].label,
                survivor_id=survivor,
                survivor_name=snap.entities[survivor].name,
                merged_ids=merged,
                merged_names=[snap.entities[m].name for m in merged],
                evidence=[ev for ev in accepted if ev.a_id in inside and ev.b_id in inside],
            )
        )
    plans.sort(key=lambda p: p.survivor_id)
    vetoed = [ev for ev in evidence if ev.veto is not None]
    stats = DetectionStats(
        entities=len(snap.entities), blocks=blocks, candidate_pairs=len(pairs), name_matches=len(evidence),
        accepted_pairs=len(accepted), vetoed_pairs=len(vetoed), embedded_entities=embedded,
        seconds=round(time.perf_counter() - started, 4),
    )
    return DetectionResult(plans=plans, stats=stats, vetoed=vetoed, latest_chapter=snap.latest_chapter)


# --- Merging -----------------------------------------------------------------------------------


def _unique(items: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def _opt_min(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _opt_max(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def merged_entity(survivor: Entity, others: Sequence[Entity], *, created_at: str, confidence: float | None = None,
                  chapter: int | None = None) -> Entity:
    """The survivor after absorbing `others`: nothing they knew is dropped (pure function)."""
    aliases = list(survivor.aliases)
    description = survivor.description
    description_history = [str(x) for x in _as_list(survivor.attributes.get("description_history"))]
    attribute_history = [str(x) for x in _as_list(survivor.attributes.get("attribute_history"))]
    attributes = {k: v for k, v in survivor.attributes.items() if k not in ("description_history", "attribute_history")}
    traits = list(survivor.traits)
    sources = list(survivor.sources)
    intervals = list(survivor.status_intervals)
    first, last = survivor.first_chapter, survivor.last_chapter
    provisional = bool(survivor.is_provisional)
    raw_label = survivor.raw_label
    for other in others:
        aliases += [other.name, *other.aliases]
        if other.description and other.description != description:
            if not description:
                description = other.description
            elif other.description not in description_history:
                description_history.append(other.description)
        for key, value in other.attributes.items():
            if key in ("description_history", "attribute_history"):
                target = description_history if key == "description_history" else attribute_history
                target += [str(x) for x in _as_list(value) if str(x) not in target]
            elif key not in attributes:
                attributes[key] = value
            elif attributes[key] != value:
                attribute_history.append(canonical_json({"key": key, "value": value, "from": other.id}))
        traits += other.traits
        sources += [s for s in other.sources if s not in sources]
        sources.append(
            EntitySource(type="merge", chapter=chapter, original_name=other.name, created_by=HEALER,
                         created_at=created_at, confidence=None if confidence is None else max(0.0, min(1.0, confidence)))
        )
        for interval in other.status_intervals:
            clash = next((i for i in intervals if i.from_chapter == interval.from_chapter), None)
            if clash is None:
                intervals.append(interval)
            elif clash != interval:
                attribute_history.append(
                    canonical_json({"key": "status", "value": interval.model_dump(mode="json"), "from": other.id})
                )
        first, last = _opt_min(first, other.first_chapter), _opt_max(last, other.last_chapter)
        provisional = provisional and bool(other.is_provisional)
        raw_label = raw_label or other.raw_label
    if description_history:
        attributes["description_history"] = description_history
    if attribute_history:
        attributes["attribute_history"] = attribute_history
    return survivor.model_copy(
        update={
            "aliases": _unique(a for a in aliases if a != survivor.name),
            "description": description,
            "traits": _unique(traits),
            "attributes": attributes,
            "sources": sources,
            "is_provisional": provisional,
            "raw_label": raw_label,
            "first_chapter": first,
            "last_chapter": last,
            "status_intervals": sorted(intervals, key=lambda i: (i.from_chapter, i.status)),
        }
    )


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _node_props(before: dict[str, Any], entity: Entity, chapter: int) -> dict[str, Any]:
    """Full property map: entity_props, any property other code put on the node, and a
    revision entry tagged with the latest chapter (so "as of" an earlier chapter, views
    show the entity as it was before healing touched it)."""
    props = entity_props(entity)
    managed = set(props) | {"raw_label", "first_chapter", "last_chapter"}
    props.update({k: v for k, v in before.items() if k not in managed})
    return add_revision(before, props, chapter)


def _lookup_label(labels: list[str]) -> str | None:
    for label in (vocab.ENTITY, vocab.CHAPTER, vocab.SCENE):
        if label in labels:
            return label
    return None


def merge_tx(tx: ManagedTransaction, plan: MergePlan, created_at: str, chapter: int = 0) -> MergeResult:
    """Merge `plan.merged_ids` into the survivor; one transaction (see the module docstring)."""
    ids = [plan.survivor_id, *plan.merged_ids]
    result = MergeResult(survivor_id=plan.survivor_id, name=plan.survivor_name, merged_ids=plan.merged_ids,
                         merged_names=plan.merged_names)
    nodes = {r["id"]: r["props"] for r in tx.run(mq.LOCK_ENTITIES, ids=ids)}
    missing = [i for i in ids if i not in nodes]
    if missing:
        # The graph moved on since detection (another merge, a rollback): do nothing.
        result.skipped = f"entities no longer exist: {', '.join(missing)}"
        return result
    entities = {i: entity_from_props(nodes[i]) for i in ids}
    if len({e.label for e in entities.values()}) != 1:
        result.skipped = "entities no longer share a label"
        return result
    survivor = entities[plan.survivor_id]
    others = [entities[i] for i in plan.merged_ids]
    merged = merged_entity(survivor, others, created_at=created_at, confidence=plan.score, chapter=chapter)
    props = _node_props(nodes[plan.survivor_id], merged, chapter)
    tx.run(mq.REPLACE_ENTITIES, rows=[{"id": plan.survivor_id, "props": props}]).consume()

    rels = [r.data() for r in tx.run(mq.RELS_OF, ids=ids)]
    inside = set(ids)
    # A fact is (type, direction, other end, chapter): the survivor keeps one copy of each.
    have = {(r["type"], r["outgoing"], r["other"], r["props"].get("chapter")) for r in rels if r["id"] == plan.survivor_id}
    creates: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rels:
        if r["id"] == plan.survivor_id:
            continue
        if r["other"] in inside:
            result.relationships_dropped += 1
            continue
        other_label = _lookup_label(r["other_labels"])
        if other_label is None or r["other"] is None:
            result.relationships_dropped += 1
            continue
        fact = (r["type"], r["outgoing"], r["other"], r["props"].get("chapter"))
        if fact in have:
            result.relationships_deduplicated += 1
            continue
        have.add(fact)
        if r["outgoing"]:
            group, row = (r["type"], vocab.ENTITY, other_label), {"src": plan.survivor_id, "tgt": r["other"]}
        else:
            group, row = (r["type"], other_label, vocab.ENTITY), {"src": r["other"], "tgt": plan.survivor_id}
        # Same properties, key included: rolling back the chapter that made the fact removes it.
        creates[group].append({**row, "props": r["props"]})
        result.relationships_moved += 1
    for (rel_type, src_label, tgt_label), rows in sorted(creates.items()):
        tx.run(cypher.create_rels(rel_type, src_label, tgt_label), rows=rows).consume()

    tx.run(cypher.DELETE_NAMES_OF, ids=ids).consume()
    tx.run(cypher.CREATE_NAMES, rows=name_rows(props)).consume()
    tx.run(cypher.delete_nodes(vocab.ENTITY), ids=plan.merged_ids).consume()

    digest = hashlib.sha256(canonical_json([created_at, ids]).encode()).hexdigest()[:16]
    audit_id = f"merge:{digest}"
    tx.run(
        mq.CREATE_MERGE_AUDIT,
        props={
            "id": audit_id,
            "survivor_id": plan.survivor_id,
            "survivor_name": merged.name,
            "merged_ids": plan.merged_ids,
            "merged_names": [entities[i].name for i in plan.merged_ids],
            "label": plan.label,
            "reason": "; ".join(_reason(ev) for ev in plan.evidence),
            "evidence_json": canonical_json([ev.model_dump(mode="json") for ev in plan.evidence]),
            "created_at": created_at,
            "created_by": HEALER,
            "relationships_moved": result.relationships_moved,
            "relationships_deduplicated": result.relationships_deduplicated,
        },
    ).consume()
    result.audit_id = audit_id
    result.name = merged.name
    result.aliases = merged.aliases
    result.sources = len(merged.sources)
    return result


def _reason(ev: PairEvidence) -> str:
    emb = "" if ev.embedding_score is None else f", embedding {ev.embedding_score:.2f}"
    return f"{ev.a_name!r}~{ev.b_name!r}: name {ev.name_score:.2f}, {ev.shared_neighbours} shared neighbours{emb}"


def merge_audits(store: GraphStore) -> list[dict[str, Any]]:
    rows = store.read(mq.MERGE_AUDITS)
    audits = [r["props"] for r in rows]
    for audit in audits:
        audit["evidence"] = json.loads(audit.pop("evidence_json", "[]"))
    return audits


# --- Graduation ----------------------------------------------------------------------------------


def graduation_score(snap: HealingSnapshot, eid: str) -> Graduation:
    """Confidence that a provisional entity is real (formula: see the constants above)."""
    e = snap.entities[eid]
    connectivity = min(1.0, len(snap.neighbours.get(eid, ())) / CONNECTIVITY_FULL)
    completeness = (
        0.6 * bool(e.description.strip()) + 0.2 * bool(e.traits) + 0.2 * bool(e.attributes or e.aliases)
    )
    latest = snap.latest_chapter
    if e.first_chapter is None or latest is None:
        age = 0.0
    else:
        age = min(1.0, max(0, latest - e.first_chapter + 1) / AGE_FULL)
    confidence = W_CONNECTIVITY * connectivity + W_COMPLETENESS * completeness + W_AGE * age
    return Graduation(id=eid, name=e.name, confidence=round(confidence, 4), connectivity=round(connectivity, 4),
                      completeness=round(completeness, 4), age=round(age, 4))


def graduation_candidates(snap: HealingSnapshot, settings: HealingSettings) -> list[Graduation]:
    scores = [graduation_score(snap, eid) for eid, e in sorted(snap.entities.items()) if e.is_provisional]
    return [g for g in scores if g.confidence >= settings.graduation_confidence]


def graduate_tx(tx: ManagedTransaction, graduations: list[Graduation], chapter: int = 0) -> list[Graduation]:
    """Confirm the entities (still provisional ones only); returns those changed."""
    by_id = {g.id: g for g in graduations}
    rows, done = [], []
    for row in tx.run(mq.LOCK_ENTITIES, ids=sorted(by_id)):
        before = row["props"]
        if not before.get("is_provisional"):
            continue
        entity = entity_from_props(before)
        grad = by_id[row["id"]]
        entity = entity.model_copy(
            update={"is_provisional": False, "attributes": {**entity.attributes, "graduation_confidence": grad.confidence}}
        )
        rows.append({"id": row["id"], "props": _node_props(before, entity, chapter)})
        done.append(grad)
    if rows:
        tx.run(mq.REPLACE_ENTITIES, rows=rows).consume()
    return done


# --- Enrichment ------------------------------------------------------------------------------------


def enrichment_targets(store: GraphStore, snap: HealingSnapshot, settings: HealingSettings,
                       *, max_relationships: int = 40) -> list[EnrichmentTarget]:
    """Entities whose story-relationship count reached the threshold and were not enriched
    at this size: never enriched, or grown by another threshold's worth of relationships
    since (so an active entity is re-enriched in steps, not on every run)."""
    threshold = settings.enrichment_edge_threshold
    targets = []
    for eid, count in sorted(snap.rel_counts.items()):
        e = snap.entities.get(eid)
        if e is None or count < threshold:
            continue
        done = e.attributes.get("enriched_edge_count")
        if isinstance(done, int | float) and count < done + threshold:
            continue
        lines = []
        for r in store.read(mq.STORY_RELS_OF, id=eid, limit=max_relationships):
            where = f" (chapter {r['chapter']})" if r["chapter"] is not None else ""
            what = f": {r['description']}" if r["description"] else ""
            if r["outgoing"]:
                lines.append(f"{e.name} {r['type']} {r['other']}{where}{what}")
            else:
                lines.append(f"{r['other']} {r['type']} {e.name}{where}{what}")
        targets.append(
            EnrichmentTarget(id=eid, name=e.name, label=e.label, description=e.description, relationship_count=count,
                             relationships=lines, last_chapter=e.last_chapter)
        )
    return targets


def enrich_tx(tx: ManagedTransaction, result: EnrichmentResult, created_at: str, chapter: int = 0) -> bool:
    """Store an enrichment: attributes + an `enrichment` source; only adds, never removes."""
    rows = tx.run(mq.LOCK_ENTITIES, ids=[result.id]).data()
    if not rows:
        return False
    before = rows[0]["props"]
    entity = entity_from_props(before)
    attributes = {
        **entity.attributes,
        "enrichment_summary": result.summary,
        "enrichment_facets": list(result.facets),
        "enrichment_confidence": round(result.confidence, 4),
        "enriched_edge_count": result.relationship_count,
    }
    source = EntitySource(type="enrichment", chapter=chapter, created_at=created_at, created_by=HEALER,
                          confidence=result.confidence)
    entity = entity.model_copy(
        update={
            "attributes": attributes,
            "sources": [*entity.sources, source],
            "description": entity.description or result.summary,
        }
    )
    tx.run(mq.REPLACE_ENTITIES, rows=[{"id": result.id, "props": _node_props(before, entity, chapter)}]).consume()
    return True

