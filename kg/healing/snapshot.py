"""The snapshot healing works on: every entity, its story neighbours and relationship
counts, the pairs that share a scene, taken in ONE read transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import combinations

from neo4j import ManagedTransaction

from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.healing.names import canonical_tokens
from kg.models import Entity
from kg.records import entity_from_props
from kg.store import GraphStore


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


def key_index(entities: dict[str, Entity]) -> dict[str, set[str]]:
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
    keys = key_index(entities)
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
