"""The transaction functions: `commit_chapter_tx` writes a planned chapter and its ChangeSet,
`rollback_tx` replays change-sets backwards (both for `session.execute_write`)."""

from __future__ import annotations

import json
import time
from typing import Any

from neo4j import ManagedTransaction

from kg import vocabulary as vocab
from kg.commit import history
from kg.commit.amendments import undo_amendments
from kg.commit.ids import changeset_id
from kg.commit.ops import GraphOps, grouped
from kg.commit.planner import ChapterPlanner, NodeWrite, RelWrite
from kg.errors import ChapterConflictError, ChapterNotCommittedError, RollbackOrderError
from kg.models import ChapterDelta, CommitResult, RollbackResult
from kg.records import (
    canonical_json,
    decode_props,
    decode_undo,
    encode_props,
    encode_undo,
    name_rows,
    needs_current,
    same_value,
)


def _diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Changed and added keys with their new values; removed keys map to None."""
    changes = {k: v for k, v in after.items() if k not in before or not same_value(before[k], v)}
    changes.update({k: None for k in before if k not in after})
    return changes


def commit_chapter_tx(
    tx: ManagedTransaction,
    delta: ChapterDelta,
    *,
    replace: bool = False,
    ops: GraphOps | None = None,
    lock_reads: bool = True,
) -> CommitResult:
    """Write a chapter delta and its change-set; see the module docstring.

    `lock_reads` takes write locks on the nodes read as pre-state (needed on Neo4j, whose
    reads are read-committed); ArcadeDB's optimistic commit-time version check already
    rejects a transaction whose read nodes changed meanwhile, so the store turns it off there.
    """
    ops = ops or GraphOps()
    started = time.perf_counter()
    delta_hash = delta.delta_hash()
    key = delta.changeset_key
    current = history.by_chapter(tx, key)
    replaced = False
    if current is not None:
        if current["delta_hash"] == delta_hash:
            props = ops.read_changeset_props(tx, [key])[key]
            return CommitResult(
                chapter=delta.chapter,
                seq=current["seq"],
                delta_hash=delta_hash,
                noop=True,
                resolved=json.loads(props.get("resolved_json", "{}")),
                seconds=time.perf_counter() - started,
            )
        if not replace:
            raise ChapterConflictError(
                f"chapter {key} is already committed with a different delta",
                hint="roll it back first (python -m kg rollback --chapter N) or commit with replace=True",
            )
        rollback_tx(tx, key, cascade=False, ops=ops)
        replaced = True
    newest = history.newest(tx)
    seq = (newest["seq"] if newest else 0) + 1
    chain = history.chain_sha(history.fingerprint_before(tx, None), key, delta_hash)

    planner = ChapterPlanner(tx, delta, ops, lock_reads=lock_reads)
    nodes, rels, names_delete, names_create = planner.plan()

    created, updated, new_rels, changed_rels = _write_plan(
        tx, ops, nodes, rels, names_delete, names_create
    )
    provisional = sorted(
        n.id for n in created if n.lookup == vocab.ENTITY and n.props.get("is_provisional")
    )
    ops.create_changeset(
        tx,
        _changeset_props(
            key,
            seq,
            delta_hash,
            chain,
            (created, updated, new_rels, changed_rels),
            planner.resolved,
        ),
    )
    return CommitResult(
        chapter=delta.chapter,
        seq=seq,
        delta_hash=delta_hash,
        replaced=replaced,
        created_nodes=len(created),
        updated_nodes=len(updated),
        created_relationships=len(new_rels),
        updated_relationships=len(changed_rels),
        resolved=planner.resolved,
        provisional_ids=provisional,
        seconds=time.perf_counter() - started,
    )


def _write_plan(
    tx: ManagedTransaction,
    ops: GraphOps,
    nodes: list[NodeWrite],
    rels: list[RelWrite],
    names_delete: list[dict[str, Any]],
    names_create: list[dict[str, Any]],
) -> tuple[list[NodeWrite], list[NodeWrite], list[RelWrite], list[RelWrite]]:
    """The planned writes, batched by label and type, in the order the change-set's undo
    assumes (nodes, names, relationships): (created nodes, updated nodes, new relationships,
    changed relationships)."""
    created = [n for n in nodes if n.before is None]
    updated = [n for n in nodes if n.before is not None]
    for labels, group in grouped(created, lambda n: n.labels).items():
        ops.create_nodes(tx, labels, [{"props": n.props} for n in group])
    for lookup, group in grouped(updated, lambda n: n.lookup).items():
        # Only the difference travels: most touched nodes just get a new last_chapter.
        ops.update_nodes(
            tx, lookup, [{"id": n.id, "changes": _diff(n.before or {}, n.props)} for n in group]
        )
    if names_delete:
        ops.delete_names(tx, names_delete)
    if names_create:
        ops.create_names(tx, names_create)
    new_rels = [r for r in rels if r.before is None]
    changed_rels = [r for r in rels if r.before is not None]
    for group_key, group in grouped(new_rels, lambda r: (r.type, r.src[0], r.tgt[0])).items():
        ops.create_rels(
            tx, group_key, [{"src": r.src[1], "tgt": r.tgt[1], "props": r.props} for r in group]
        )
    for group_key, group in grouped(changed_rels, lambda r: (r.type, r.src[0], r.tgt[0])).items():
        rows = [{"src": r.src[1], "tgt": r.tgt[1], "key": r.key, "props": r.props} for r in group]
        ops.update_rels(tx, group_key, rows)
    return created, updated, new_rels, changed_rels


def _changeset_props(
    key: int,
    seq: int,
    delta_hash: str,
    chain: str,
    writes: tuple[list[NodeWrite], list[NodeWrite], list[RelWrite], list[RelWrite]],
    resolved: dict[str, str],
) -> dict[str, Any]:
    """The change-set node's properties: what the commit wrote, with each node's and
    relationship's before-state, for an exact rollback."""
    created, updated, new_rels, changed_rels = writes
    return {
        "id": changeset_id(key),
        "chapter": key,
        "seq": seq,
        "delta_hash": delta_hash,
        "chain_sha": chain,
        "created_nodes_json": canonical_json([[n.lookup, n.id] for n in created]),
        "updated_nodes_json": canonical_json(
            [[n.lookup, n.id, encode_undo(n.before or {}, n.props)] for n in updated]
        ),
        "created_rels_json": canonical_json([[r.type, r.key] for r in new_rels]),
        "updated_rels_json": canonical_json(
            [
                [
                    r.type,
                    r.src[0],
                    r.src[1],
                    r.tgt[0],
                    r.tgt[1],
                    r.key,
                    encode_props(r.before or {}),
                ]
                for r in changed_rels
            ]
        ),
        "resolved_json": canonical_json(resolved),
        "created_node_count": len(created),
        "updated_node_count": len(updated),
        "created_rel_count": len(new_rels),
        "updated_rel_count": len(changed_rels),
    }


def rollback_tx(
    tx: ManagedTransaction, chapter: int, *, cascade: bool = False, ops: GraphOps | None = None
) -> RollbackResult:
    """Undo the commit of `chapter` (and, with cascade, every commit made after it)."""
    ops = ops or GraphOps()
    started = time.perf_counter()
    changesets = ops.read_changesets(tx)
    target = next((c for c in changesets if c["chapter"] == chapter), None)
    if target is None:
        committed = ", ".join(str(c["chapter"]) for c in changesets) or "none"
        raise ChapterNotCommittedError(
            f"chapter {chapter} has no committed change-set to roll back (committed: {committed})"
        )
    later = [c for c in changesets if c["seq"] > target["seq"]]
    if later and not cascade:
        names = ", ".join(str(c["chapter"]) for c in sorted(later, key=lambda c: c["seq"]))
        raise RollbackOrderError(
            f"cannot roll back chapter {chapter}: chapter(s) {names} were committed after it",
            hint="roll those back first (newest first) or pass cascade=True / --cascade",
        )
    order = [c["chapter"] for c in sorted([target, *later], key=lambda c: c["seq"], reverse=True)]
    props_by_chapter = ops.read_changeset_props(tx, order)
    result = RollbackResult(chapters=order)
    for number in order:
        _undo(tx, props_by_chapter[number], ops, result)
    result.seconds = time.perf_counter() - started
    return result


def _undo(
    tx: ManagedTransaction, changeset: dict[str, Any], ops: GraphOps, result: RollbackResult
) -> None:
    undo_amendments(tx, changeset, ops, result)  # what healing did after the commit goes first
    created_nodes: list[list[str]] = json.loads(changeset["created_nodes_json"])
    updated_nodes: list[list[Any]] = json.loads(changeset["updated_nodes_json"])
    created_rels: list[list[str]] = json.loads(changeset["created_rels_json"])
    updated_rels: list[list[Any]] = json.loads(changeset["updated_rels_json"])

    for rel_type, group in grouped(created_rels, lambda r: r[0]).items():
        ops.delete_rels(tx, rel_type, [key for _, key in group])
    for (rel_type, src_label, tgt_label), group in grouped(
        updated_rels, lambda r: (r[0], r[1], r[3])
    ).items():
        rows = [{"src": r[2], "tgt": r[4], "key": r[5], "props": decode_props(r[6])} for r in group]
        ops.update_rels(tx, (rel_type, src_label, tgt_label), rows)

    # EntityName lookup nodes are derived from entity properties: drop them for every
    # entity this commit touched and rebuild them from the restored properties.
    touched = [nid for label, nid, *_ in (*created_nodes, *updated_nodes) if label == vocab.ENTITY]
    if touched:
        ops.delete_names_of(tx, touched)
    for label, group in grouped(created_nodes, lambda n: n[0]).items():
        ops.delete_nodes(tx, label, [nid for _, nid in group])
    restored: list[dict[str, Any]] = []
    for label, group in grouped(updated_nodes, lambda n: n[0]).items():
        cut = [nid for _, nid, props in group if needs_current(props)]
        current = ops.read_nodes(tx, label, cut) if cut else {}
        rows = [
            {"id": nid, "props": decode_undo(props, current.get(nid))} for _, nid, props in group
        ]
        ops.restore_nodes(tx, label, rows)
        if label == vocab.ENTITY:
            restored += [row["props"] for row in rows]
    names = [row for props in restored for row in name_rows(props)]
    if names:
        ops.create_names(tx, names)
    ops.delete_changeset(tx, changeset["chapter"])

    result.deleted_nodes += len(created_nodes)
    result.restored_nodes += len(updated_nodes)
    result.deleted_relationships += len(created_rels)
    result.restored_relationships += len(updated_rels)
