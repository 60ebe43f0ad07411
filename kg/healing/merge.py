"""The merge transaction: a cluster is merged in ONE write transaction (`merge_tx`).

The survivor keeps its id; the others' names become aliases, their sources are all kept plus
one `merge` source each, differing descriptions and attribute values go to
`description_history` / `attribute_history` attributes (`merged_entity`, a pure function),
every relationship is re-created on the survivor with its type, properties and key (a fact
already on the survivor for the same chapter is not duplicated), the EntityName lookups are
rebuilt, the merged nodes are deleted and a MergeAudit node records who, what, why and when.

"When" is story time, never the wall clock (issue 33: the same inputs and LLM answers write
the same graph export): `created_at` is the caller's story stamp (tasks/healing.py:
"after chapter N, change-set S"), `chapter` the chapter the merge ran after, and the audit
id is derived from the merge plan itself (chapter, survivor and merged ids), so healing the
same graph at another moment, or again after a crash, writes the same audit.

The transaction records its undo on the newest change-set (kg.commit.amendments): rolling
that change-set back puts the merged nodes and their relationships back and the survivor as
it was, so a rollback past a merge is exact.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neo4j import ManagedTransaction

from kg import cypher
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.commit.amendments import Amendment, amend_newest
from kg.healing.models import AttachedRel, MergePlan, MergeResult, PairEvidence
from kg.healing.node_writes import HEALER, node_props
from kg.models import Entity, EntitySource, StatusInterval
from kg.ports import GraphReader
from kg.records import (
    canonical_json,
    entity_from_props,
    max_present,
    min_present,
    name_rows,
    unique,
)


def merged_entity(
    survivor: Entity,
    others: Sequence[Entity],
    *,
    created_at: str,
    confidence: float | None = None,
    chapter: int | None = None,
) -> Entity:
    """The survivor after absorbing `others`: nothing they knew is dropped (pure function)."""
    aliases = list(survivor.aliases)
    known = _Knowledge.of(survivor)
    traits = list(survivor.traits)
    sources = list(survivor.sources)
    intervals = list(survivor.status_intervals)
    first, last = survivor.first_chapter, survivor.last_chapter
    provisional = bool(survivor.is_provisional)
    raw_label = survivor.raw_label
    for other in others:
        aliases += [other.name, *other.aliases]
        known.absorb(other)
        traits += other.traits
        sources += [s for s in other.sources if s not in sources]
        sources.append(
            EntitySource(
                type="merge",
                chapter=chapter,
                original_name=other.name,
                created_by=HEALER,
                created_at=created_at,
                confidence=None if confidence is None else max(0.0, min(1.0, confidence)),
            )
        )
        known.absorb_statuses(intervals, other)
        first, last = min_present(first, other.first_chapter), max_present(last, other.last_chapter)
        provisional = provisional and bool(other.is_provisional)
        raw_label = raw_label or other.raw_label
    return survivor.model_copy(
        update={
            "aliases": unique(a for a in aliases if a != survivor.name),
            "description": known.description,
            "traits": unique(traits),
            "attributes": known.merged_attributes(),
            "sources": sources,
            "is_provisional": provisional,
            "raw_label": raw_label,
            "first_chapter": first,
            "last_chapter": last,
            "status_intervals": sorted(intervals, key=lambda i: (i.from_chapter, i.status)),
        }
    )


_HISTORIES = ("description_history", "attribute_history")


@dataclass
class _Knowledge:
    """The survivor's description and attributes while it absorbs others, with the history of
    every value it did not take (another description, a clashing attribute or status)."""

    description: str
    attributes: dict[str, Any]
    description_history: list[str]
    attribute_history: list[str]

    @classmethod
    def of(cls, survivor: Entity) -> _Knowledge:
        history = survivor.attributes
        return cls(
            description=survivor.description,
            attributes={k: v for k, v in history.items() if k not in _HISTORIES},
            description_history=[str(x) for x in _as_list(history.get("description_history"))],
            attribute_history=[str(x) for x in _as_list(history.get("attribute_history"))],
        )

    def absorb(self, other: Entity) -> None:
        """Another's description (kept as history unless the survivor has none) and its
        attributes (new keys taken, clashing values kept as history)."""
        if other.description and other.description != self.description:
            if not self.description:
                self.description = other.description
            elif other.description not in self.description_history:
                self.description_history.append(other.description)
        for key, value in other.attributes.items():
            if key in _HISTORIES:
                target = (
                    self.description_history
                    if key == "description_history"
                    else self.attribute_history
                )
                target += [str(x) for x in _as_list(value) if str(x) not in target]
            elif key not in self.attributes:
                self.attributes[key] = value
            elif self.attributes[key] != value:
                self.attribute_history.append(
                    canonical_json({"key": key, "value": value, "from": other.id})
                )

    def absorb_statuses(self, intervals: list[StatusInterval], other: Entity) -> None:
        """Another's status intervals into `intervals`; one that clashes with an interval
        from the same chapter is kept as history."""
        for interval in other.status_intervals:
            clash = next((i for i in intervals if i.from_chapter == interval.from_chapter), None)
            if clash is None:
                intervals.append(interval)
            elif clash != interval:
                self.attribute_history.append(
                    canonical_json(
                        {
                            "key": "status",
                            "value": interval.model_dump(mode="json"),
                            "from": other.id,
                        }
                    )
                )

    def merged_attributes(self) -> dict[str, Any]:
        attributes = dict(self.attributes)
        if self.description_history:
            attributes["description_history"] = self.description_history
        if self.attribute_history:
            attributes["attribute_history"] = self.attribute_history
        return attributes


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _lookup_label(labels: Sequence[str]) -> str | None:
    for label in (vocab.ENTITY, vocab.CHAPTER, vocab.SCENE):
        if label in labels:
            return label
    return None


def merge_audit_id(plan: MergePlan, chapter: int) -> str:
    """The MergeAudit id: a digest of what was merged into what, after which chapter (no clock)."""
    ids = [plan.survivor_id, *plan.merged_ids]
    return "merge:" + hashlib.sha256(canonical_json([chapter, ids]).encode()).hexdigest()[:16]


def merge_tx(
    tx: ManagedTransaction, plan: MergePlan, created_at: str, chapter: int = 0
) -> MergeResult:
    """Merge `plan.merged_ids` into the survivor; one transaction (see the module docstring).
    `created_at` is a story stamp (which chapter and change-set the merge amends), not a time."""
    ids = [plan.survivor_id, *plan.merged_ids]
    result = MergeResult(
        survivor_id=plan.survivor_id,
        name=plan.survivor_name,
        merged_ids=plan.merged_ids,
        merged_names=plan.merged_names,
    )
    locked = tx.run(mq.LOCK_ENTITIES, ids=ids).data()
    nodes = {r["id"]: r["props"] for r in locked}
    labels = {r["id"]: list(r["labels"]) for r in locked}
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
    merged = merged_entity(
        survivor, others, created_at=created_at, confidence=plan.score, chapter=chapter
    )
    props = node_props(nodes[plan.survivor_id], merged, chapter)
    tx.run(mq.REPLACE_ENTITIES, rows=[{"id": plan.survivor_id, "props": props}]).consume()
    undo = Amendment()
    undo.updated(vocab.ENTITY, plan.survivor_id, nodes[plan.survivor_id], props)

    _move_relationships(tx, plan, undo, result)

    tx.run(cypher.DELETE_NAMES_OF, ids=ids).consume()
    tx.run(cypher.CREATE_NAMES, rows=name_rows(props)).consume()
    tx.run(cypher.delete_nodes(vocab.ENTITY), ids=plan.merged_ids).consume()
    for merged_id in plan.merged_ids:
        undo.deleted(labels[merged_id], nodes[merged_id])

    audit_id = _write_audit(tx, plan, merged, entities, result, created_at, chapter)
    undo.created_nodes.append((vocab.MERGE_AUDIT, audit_id))
    amend_newest(tx, undo)
    result.audit_id = audit_id
    result.name = merged.name
    result.aliases = merged.aliases
    result.sources = len(merged.sources)
    return result


def _move_relationships(
    tx: ManagedTransaction, plan: MergePlan, undo: Amendment, result: MergeResult
) -> None:
    """The merged entities' relationships moved to the survivor, each fact once (the set of
    facts the survivor has grows across the whole loop); those between the merged and the
    survivor, or to an end with no entity label, dropped. Counts go to `result`."""
    ids = [plan.survivor_id, *plan.merged_ids]
    rels = [AttachedRel.model_validate(r.data()) for r in tx.run(mq.RELS_OF, ids=ids)]
    inside = set(ids)
    _record_deleted_rels(undo, rels, set(plan.merged_ids))
    # A fact is (type, direction, other end, chapter): the survivor keeps one copy of each.
    have = {r.fact for r in rels if r.id == plan.survivor_id}
    creates: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rels:
        if r.id == plan.survivor_id:
            continue
        if r.other in inside:
            result.relationships_dropped += 1
            continue
        other_label = _lookup_label(r.other_labels)
        if other_label is None or r.other is None:
            result.relationships_dropped += 1
            continue
        fact = r.fact
        if fact in have:
            result.relationships_deduplicated += 1
            continue
        have.add(fact)
        if r.outgoing:
            group, row = (
                (r.type, vocab.ENTITY, other_label),
                {"src": plan.survivor_id, "tgt": r.other},
            )
        else:
            group, row = (
                (r.type, other_label, vocab.ENTITY),
                {"src": r.other, "tgt": plan.survivor_id},
            )
        # Same properties, key included: rolling back the chapter that made the fact removes it.
        creates[group].append({**row, "props": r.props})
        undo.created_rels.append((r.type, r.props["key"]))
        result.relationships_moved += 1
    for (rel_type, src_label, tgt_label), rows in sorted(creates.items()):
        tx.run(cypher.create_rels(rel_type, src_label, tgt_label), rows=rows).consume()


def _write_audit(
    tx: ManagedTransaction,
    plan: MergePlan,
    merged: Entity,
    entities: dict[str, Entity],
    result: MergeResult,
    created_at: str,
    chapter: int,
) -> str:
    """The merge's audit node (who was merged into whom, why, what moved); its id."""
    audit_id = merge_audit_id(plan, chapter)
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
            "chapter": chapter,
            "created_by": HEALER,
            "relationships_moved": result.relationships_moved,
            "relationships_deduplicated": result.relationships_deduplicated,
        },
    ).consume()
    return audit_id


def _record_deleted_rels(undo: Amendment, rels: list[AttachedRel], merged: set[str]) -> None:
    """Every relationship of a merged node goes with it (DETACH DELETE): keep each once, with both ends."""
    seen: set[tuple[str, str]] = set()
    for r in rels:
        if r.id not in merged or r.other is None:
            continue
        other = _lookup_label(r.other_labels)
        key = r.props.get("key")
        if other is None or key is None or (r.type, key) in seen:
            continue
        seen.add((r.type, key))
        here, there = (vocab.ENTITY, r.id), (other, r.other)
        undo.deleted_rel(
            r.type,
            here if r.outgoing else there,
            there if r.outgoing else here,
            r.props,
        )


def _reason(ev: PairEvidence) -> str:
    emb = "" if ev.embedding_score is None else f", embedding {ev.embedding_score:.2f}"
    return f"{ev.a_name!r}~{ev.b_name!r}: name {ev.name_score:.2f}, {ev.shared_neighbours} shared neighbours{emb}"


def merge_audits(store: GraphReader) -> list[dict[str, Any]]:
    rows = store.read(mq.MERGE_AUDITS)
    audits = [r["props"] for r in rows]
    for audit in audits:
        audit["evidence"] = json.loads(audit.pop("evidence_json", "[]"))
    return audits
