"""Amendments: writes made after a change-set was committed (healing's merges, enrichments and
graduations), recorded on the newest change-set in the same transaction, so that rolling that
change-set back undoes them first, newest first, and a rollback stays exact.

A chapter's maintenance (healing after chapter N) thus belongs to chapter N: `python -m kg
rollback --chapter N` gives back the graph from before chapter N was committed, whatever
healing did since. An amendment holds what the write created (nodes by id, relationships by
key), the previous property maps of the nodes it changed, and the labels and properties of
the nodes and relationships it deleted, so the undo can put them back. `amendments_sha`
chains the digests of a change-set's amendments: the history fingerprint (kg.store) tells a
graph that healing changed from one it did not.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from neo4j import ManagedTransaction
from pydantic import BaseModel, Field

from kg import cypher
from kg import vocabulary as vocab
from kg.commit.ops import GraphOps, grouped
from kg.models import RollbackResult
from kg.records import (
    canonical_json,
    decode_props,
    decode_undo,
    encode_props,
    encode_undo,
    name_rows,
    needs_current,
)


class DeletedRel(BaseModel):
    type: str
    src: tuple[str, str]  # (lookup label, id)
    tgt: tuple[str, str]
    props: dict[str, Any]  # encoded (kg.records.encode_props)


class Amendment(BaseModel):
    """The undo record of one write made after the newest change-set."""

    created_nodes: list[tuple[str, str]] = Field(
        default_factory=list, description="(lookup label, id)"
    )
    updated_nodes: list[tuple[str, str, dict[str, Any]]] = Field(
        default_factory=list, description="(lookup label, id, previous properties, encoded)"
    )
    deleted_nodes: list[tuple[list[str], dict[str, Any]]] = Field(
        default_factory=list, description="(labels, properties, encoded)"
    )
    created_rels: list[tuple[str, str]] = Field(default_factory=list, description="(type, key)")
    deleted_rels: list[DeletedRel] = Field(default_factory=list)

    def updated(
        self, label: str, node_id: str, before: dict[str, Any], after: dict[str, Any]
    ) -> None:
        self.updated_nodes.append((label, node_id, encode_undo(before, after)))

    def deleted(self, labels: list[str], props: dict[str, Any]) -> None:
        self.deleted_nodes.append((sorted(labels), encode_props(props)))

    def deleted_rel(
        self, rel_type: str, src: tuple[str, str], tgt: tuple[str, str], props: dict[str, Any]
    ) -> None:
        self.deleted_rels.append(
            DeletedRel(type=rel_type, src=src, tgt=tgt, props=encode_props(props))
        )

    def empty(self) -> bool:
        return not (
            self.created_nodes
            or self.updated_nodes
            or self.deleted_nodes
            or self.created_rels
            or self.deleted_rels
        )


def amend_newest(tx: ManagedTransaction, amendment: Amendment) -> int | None:
    """Record `amendment` on the newest change-set; its key, or None when the graph has none
    (nothing to roll back to, so nothing to record)."""
    if amendment.empty():
        return None
    rows = [r.data() for r in tx.run(cypher.READ_NEWEST_CHANGESET)]
    if not rows:
        return None
    newest = rows[0]
    history = json.loads(newest["amendments_json"] or "[]")
    entry = json.loads(canonical_json(amendment.model_dump(mode="json")))
    history.append(entry)
    digest = hashlib.sha256(
        f"{newest['amendments_sha'] or ''}|{canonical_json(entry)}".encode()
    ).hexdigest()[:16]
    tx.run(
        cypher.AMEND_CHANGESET,
        chapter=newest["chapter"],
        amendments=canonical_json(history),
        sha=digest,
    ).consume()
    return int(newest["chapter"])


def undo_amendments(
    tx: ManagedTransaction, changeset: dict[str, Any], ops: GraphOps, result: RollbackResult
) -> None:
    """Undo a change-set's amendments, newest first (before the change-set itself is undone)."""
    for entry in reversed(json.loads(changeset.get("amendments_json") or "[]")):
        _undo_one(tx, Amendment.model_validate(entry), ops, result)


def _undo_one(
    tx: ManagedTransaction, amendment: Amendment, ops: GraphOps, result: RollbackResult
) -> None:
    # What the write created goes first: a moved relationship keeps the key of the one it replaced.
    for rel_type, group in grouped(amendment.created_rels, lambda r: r[0]).items():
        ops.delete_rels(tx, rel_type, [key for _, key in group])
    for label, group in grouped(amendment.created_nodes, lambda n: n[0]).items():
        ops.delete_nodes(tx, label, [node_id for _, node_id in group])
    recreated = [(labels, decode_props(props)) for labels, props in amendment.deleted_nodes]
    for labels, group in grouped(recreated, lambda n: tuple(n[0])).items():
        ops.create_nodes(tx, labels, [{"props": props} for _, props in group])
    for group_key, rels in grouped(
        amendment.deleted_rels, lambda r: (r.type, r.src[0], r.tgt[0])
    ).items():
        ops.create_rels(
            tx,
            group_key,
            [{"src": r.src[1], "tgt": r.tgt[1], "props": decode_props(r.props)} for r in rels],
        )
    cut: dict[str, list[str]] = defaultdict(list)
    for label, node_id, props in amendment.updated_nodes:
        if needs_current(props):
            cut[label].append(node_id)
    current = {
        (label, node_id): props
        for label, ids in cut.items()
        for node_id, props in ops.read_nodes(tx, label, ids).items()
    }
    restored = [
        (label, node_id, decode_undo(props, current.get((label, node_id))))
        for label, node_id, props in amendment.updated_nodes
    ]
    for label, group in grouped(restored, lambda n: n[0]).items():
        ops.restore_nodes(
            tx, label, [{"id": node_id, "props": props} for _, node_id, props in group]
        )
    # EntityName lookups are derived from the entities' properties: rebuild them for every
    # entity the write touched.
    entities = [props for labels, props in recreated if vocab.ENTITY in labels]
    entities += [props for label, _, props in restored if label == vocab.ENTITY]
    touched = sorted(
        {p["id"] for p in entities}
        | {i for label, i in amendment.created_nodes if label == vocab.ENTITY}
    )
    if touched:
        ops.delete_names_of(tx, touched)
        names = [row for props in entities for row in name_rows(props)]
        if names:
            ops.create_names(tx, names)
    result.deleted_nodes += len(amendment.created_nodes)
    result.deleted_relationships += len(amendment.created_rels)
    result.restored_nodes += len(amendment.updated_nodes) + len(amendment.deleted_nodes)
    result.restored_relationships += len(amendment.deleted_rels)
