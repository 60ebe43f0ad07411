"""The snapshot healing works on: every entity (or the ones asked for), its story neighbours
and relationship counts, the pairs that share a scene, taken in ONE read transaction.

The relationships and scenes come from the story mirror (kg.mirror, kept current from the
change-sets first), not from a scan of the graph: a healing run reads the entities, and only
those it needs (graduation the provisional ones, enrichment the busy ones)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import combinations

from neo4j import ManagedTransaction

from kg import cypher
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.healing.names import canonical_tokens
from kg.mirror import MirroredReader, StoryMirror, mirror_of
from kg.models import Entity
from kg.ports import GraphReader
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
            found = list(
                dict.fromkeys(
                    t for t in (canonical_tokens(n, e.label) for n in (e.name, *e.aliases)) if t
                )
            )
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


def resolve_scene_refs(
    refs: Iterable[str], entities: dict[str, Entity], keys: dict[str, set[str]]
) -> list[set[str]]:
    """Entity ids each scene reference may mean: an id, else every entity with that name/alias.

    A name listed twice in one scene ("Anna", "Anna") therefore yields two entries that
    each hold every Anna: two different Annas were there.
    """
    return [{ref} if ref in entities else set(keys.get(vocab.name_key(ref), ())) for ref in refs]


def _snapshot_tx(
    tx: ManagedTransaction, mirror: StoryMirror, ids: list[str] | None
) -> HealingSnapshot:
    mirror.refresh(tx)
    entities: dict[str, Entity] = {}
    rows = (
        tx.run(mq.ALL_ENTITIES)
        if ids is None
        else tx.run(cypher.read_nodes(vocab.ENTITY), ids=sorted(set(ids)))
    )
    for row in rows:
        entity = entity_from_props(row["props"])
        assert entity.id is not None
        entities[entity.id] = entity
    snap = HealingSnapshot(entities=entities)
    neighbours: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for edge in mirror.all_edges():
        src, tgt = edge.src, edge.tgt
        counts[src] += 1
        counts[tgt] += 1
        if src != tgt:
            neighbours[src].add(tgt)
            neighbours[tgt].add(src)
            snap.related.add(frozenset((src, tgt)))
    snap.neighbours, snap.rel_counts = dict(neighbours), dict(counts)
    if ids is None:  # who met whom needs every name to resolve the scenes' references
        keys = key_index(entities)
        for scene in mirror.scenes_as_of(10**9):
            where = f"chapter {scene.chapter} scene {scene.scene if scene.scene >= 0 else None}"
            resolved = resolve_scene_refs(scene.characters, entities, keys)
            for left, right in combinations(resolved, 2):
                for x in left:
                    for y in right:
                        if x != y:
                            snap.co_scene.setdefault(frozenset((x, y)), where)
    latest = [r["latest"] for r in tx.run(cypher.LATEST_CHAPTER)]
    snap.chapters = [int(latest[0])] if latest and latest[0] is not None else []
    return snap


def load_snapshot(store: MirroredReader, ids: list[str] | None = None) -> HealingSnapshot:
    """The snapshot of every entity, or of the entities `ids` (relationships and counts of all)."""
    return store.execute_read(_snapshot_tx, mirror_of(store), ids)


def provisional_ids(store: GraphReader) -> list[str]:
    return [r["id"] for r in store.read(mq.PROVISIONAL_IDS)]


def ensure_schema(store: GraphStore) -> None:
    """Constraints/indexes maintenance needs beyond kg/schema.py (idempotent)."""
    for statement in mq.SCHEMA:
        store.write(statement)
