"""The one commit transaction of a turn: fence on the lease, idempotency, then entities,
relation actions with their events, bio patches, milestones, and the turn record last.

Few round trips, because on ArcadeDB the process's graph writes run one at a time (the
sidecar's `serialize_writes`) and every statement of a commit is time the other conversations
wait: the fence's and idempotency's reads share the first statement, the events, milestones,
memory row and turn record the last (measured in bench/sidecar_load.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from neo4j import ManagedTransaction

from kg import vocabulary as vocab
from kg.dialogue import cypher as dq
from kg.dialogue.keys import lock_key
from kg.dialogue.memory import mark_committed_tx, memory_props
from kg.dialogue.models import (
    EVOLVE_BASE_WEIGHT,
    REL_ACTIVE,
    REL_ENDED,
    TURN_COMMITTED,
    AppliedAction,
    CommitOutcome,
    LostLockError,
    RelationActionWrite,
    TurnWrite,
)
from kg.dialogue.records import ActiveRelation, no_nulls, stored_turn


def _clamp(value: float) -> float:
    return round(min(1.0, max(0.0, value)), 6)


def _apply_action(
    tx: ManagedTransaction,
    write: TurnWrite,
    seq: int,
    index: int,
    action: RelationActionWrite,
) -> AppliedAction:
    """One relation action of the turn (EVOLVE, REPLACE, DELETE), applied to the pair's
    active relations."""
    edit = _RelationEdit(tx, write, seq, index, action)
    if action.action == "EVOLVE":
        return edit.evolve()
    if action.action == "REPLACE":
        return edit.replace()
    return edit.delete()


class _RelationEdit:
    """One relation action inside the turn's transaction: its pair, its turn's stamp, and
    the reads and writes its three kinds share."""

    def __init__(
        self,
        tx: ManagedTransaction,
        write: TurnWrite,
        seq: int,
        index: int,
        action: RelationActionWrite,
    ) -> None:
        self.tx, self.write, self.seq, self.index, self.action = tx, write, seq, index, action
        self.pair = {
            "conversation_id": write.conversation_id,
            "source_id": action.source_id,
            "target_id": action.target_id,
        }
        self.stamp = {"turn_id": write.turn_id, "seq": seq}

    def active(self, rel_type: str | None) -> list[ActiveRelation]:
        found = self.tx.run(dq.FIND_ACTIVE_RELATIONS, **self.pair, type=rel_type, active=REL_ACTIVE)
        return [ActiveRelation.model_validate(r.data()) for r in found]

    def create(self, rel_type: str, weight: float) -> str:
        write, seq = self.write, self.seq
        rel_id = f"{write.key}#r{self.index}"
        props = no_nulls(
            {
                "rel_id": rel_id,
                "conversation_id": write.conversation_id,
                "type": rel_type,
                "raw_type": self.action.raw_type,
                "weight": weight,
                "status": REL_ACTIVE,
                "since_turn": write.turn_id,
                "since_seq": seq,
                "updated_turn": write.turn_id,
                "updated_seq": seq,
            }
        )
        self.tx.run(dq.CREATE_RELATION, **self.pair, props=props).consume()
        return rel_id

    def set_weight(self, rel_id: str, weight: float) -> None:
        self.tx.run(
            dq.SET_RELATION_WEIGHT, **self.pair, **self.stamp, rel_id=rel_id, weight=weight
        ).consume()

    def end(self, rel_id: str) -> None:
        self.tx.run(
            dq.END_RELATION, **self.pair, **self.stamp, rel_id=rel_id, ended=REL_ENDED
        ).consume()

    def evolve(self) -> AppliedAction:
        """The active relation's weight moved by the delta; or a new one from the base weight."""
        action = self.action
        ends = {"source_id": action.source_id, "target_id": action.target_id}
        found = self.active(action.type)
        if found:
            before = found[0].weight_or_zero
            after = _clamp(before + action.weight_delta)
            self.set_weight(found[0].rel_id, after)
            return AppliedAction(
                action="EVOLVE",
                **ends,
                from_type=action.type,
                to_type=action.type,
                rel_id=found[0].rel_id,
                weight_before=before,
                weight_after=after,
            )
        after = _clamp(EVOLVE_BASE_WEIGHT + action.weight_delta)
        return AppliedAction(
            action="EVOLVE",
            **ends,
            to_type=action.type,
            rel_id=self.create(action.type, after),
            weight_after=after,
            note="created",
        )

    def replace(self) -> AppliedAction:
        """The pair's active relations of the old type (any, without one) ended; the new type
        active at the given weight."""
        action = self.action
        ended = [r for r in self.active(action.from_type) if r.type != action.type]
        for rel in ended:
            self.end(rel.rel_id)
        already = self.active(action.type)
        weight = _clamp(action.weight)
        if already:
            rel_id = already[0].rel_id
            self.set_weight(rel_id, weight)
        else:
            rel_id = self.create(action.type, weight)
        return AppliedAction(
            action="REPLACE",
            source_id=action.source_id,
            target_id=action.target_id,
            from_type=ended[0].type if ended else action.from_type,
            to_type=action.type,
            rel_id=rel_id,
            weight_before=ended[0].weight_or_zero if ended else None,
            weight_after=weight,
            note="" if ended else "nothing to replace; new relation started",
        )

    def delete(self) -> AppliedAction:
        """Every active relation of the type ended; none is not applied."""
        action = self.action
        ends = {"source_id": action.source_id, "target_id": action.target_id}
        found = self.active(action.type)
        if not found:
            return AppliedAction(
                action="DELETE",
                **ends,
                from_type=action.type,
                applied=False,
                note="no active relation of this type",
            )
        for rel in found:
            self.end(rel.rel_id)
        return AppliedAction(
            action="DELETE",
            **ends,
            from_type=action.type,
            rel_id=found[0].rel_id,
            weight_before=found[0].weight_or_zero,
            weight_after=0.0,
        )


#: (seq, applied actions) -> (the result a replay returns, the commit's trace), both JSON.
#: What a turn record's `write_json` leaves out (what a rewind or a rename re-applies needs none
#: of it: the memory row and vectors stay on KGMemory).
STORED_WRITE_EXCLUDES = frozenset({"memory", "embedding", "committed_at"})

ResultBuilder = Callable[[int, list[AppliedAction]], tuple[str, str]]


def commit_tx(
    tx: ManagedTransaction, write: TurnWrite, owner: str, build_result: ResultBuilder
) -> CommitOutcome:
    """The turn's one transaction, in few round trips: COMMIT_OPEN (fence, idempotency, the
    counters' state), the seq, the facts (entities, actions, bio patches), CREATE_TURN_RECORDS."""
    # 1. Fence: our lease must still exist; deleting it here also releases it atomically. The
    # same statement reads what steps 2 and 3 need (the turn's record, the turn counter, its
    # memory row).
    opened = tx.run(
        dq.COMMIT_OPEN,
        lock_key=lock_key(write.conversation_id),
        owner=owner,
        key=write.key,
        conversation_id=write.conversation_id,
    ).single()
    if opened is None or not int(opened["released"]):
        raise LostLockError(
            f"conversation {write.conversation_id!r}: the lock lease expired and was taken over "
            "before the turn could commit",
            hint="retry the turn; raise the lease if turns take this long",
        )
    # 2. Idempotency: the key may have been committed by an earlier holder.
    if opened["props"] is not None:
        stored = stored_turn(opened["props"])
        status: Literal["duplicate", "conflict"] = (
            "duplicate" if stored.payload_hash == write.payload_hash else "conflict"
        )
        return CommitOutcome(status=status, seq=stored.seq, stored=stored)
    # The memory row: appended with the turn, or (remembered before, e.g. blocked by the gate)
    # marked committed, as remember_tx does.
    memory = write.memory
    append_memory = memory is not None and not opened["remembered"]
    if memory is not None and opened["remembered"] and memory.committed:
        mark_committed_tx(tx, memory)
    seq, memory_last = next_turn_seq(
        tx, write.conversation_id, turn_seq=opened["turn_seq"], memory_count=int(append_memory)
    )
    applied, events, milestones = apply_changes(tx, write, seq)
    result_json, trace_json = build_result(seq, applied)
    # 7. The turn record last: it carries the result the caller gets on a replay.
    props = no_nulls(
        {
            "key": write.key,
            "conversation_id": write.conversation_id,
            "turn_id": write.turn_id,
            "seq": seq,
            "status": TURN_COMMITTED,
            "payload_hash": write.payload_hash,
            "speaker": write.speaker,
            "text": write.text,
            "source_refs": write.source_refs,
            "facts": write.facts,
            "events": write.events,
            "embedding": write.embedding,
            "committed_at": write.committed_at,
            "committed_by": owner,
            "result_json": result_json,
            "trace_json": trace_json,
            # What a rewind re-applies (the memory row and vectors stay on KGMemory).
            "write_json": write.model_dump_json(exclude=STORED_WRITE_EXCLUDES),
        }
    )
    memory_rows = (
        [memory_props(memory, int(memory_last))] if memory is not None and append_memory else []
    )
    tx.run(
        dq.CREATE_TURN_RECORDS,
        props=props,
        events=events,
        milestones=milestones,
        memory=memory_rows,
    ).consume()
    return CommitOutcome(status="committed", seq=seq, applied=applied)


def apply_facts(tx: ManagedTransaction, write: TurnWrite, seq: int) -> list[AppliedAction]:
    """Steps 3-6 of a commit: entities, relation actions with their events, bio patches,
    milestones. Deterministic given the graph state, so a rewind can re-apply kept turns."""
    applied, events, milestones = apply_changes(tx, write, seq)
    if events:
        tx.run(dq.CREATE_EVENTS, rows=events).consume()
    if milestones:
        tx.run(dq.CREATE_MILESTONES, rows=milestones).consume()
    return applied


def apply_changes(
    tx: ManagedTransaction, write: TurnWrite, seq: int
) -> tuple[list[AppliedAction], list[dict[str, Any]], list[dict[str, Any]]]:
    """`apply_facts` without its two creates: (applied actions, the relation event rows, the
    milestone rows), for the caller to create (a commit does it in its last statement). The
    rows are new nodes nothing here reads, so writing them later changes no outcome."""
    # 3. Entities first: every action, patch and milestone refers to them.
    if write.entities:
        rows = [
            {
                "conversation_id": write.conversation_id,
                "entity_id": e.entity_id,
                "name": e.name,
                "name_key": vocab.name_key(e.name),
                "kind": e.kind,
                "aliases": e.aliases,
                "turn_id": write.turn_id,
                "seq": seq,
            }
            for e in write.entities
        ]
        tx.run(dq.UPSERT_ENTITIES, rows=rows).consume()
    # 4. Relation actions in order (a later action may build on an earlier one), each logged.
    applied: list[AppliedAction] = []
    events: list[dict[str, Any]] = []
    for index, action in enumerate(write.actions):
        result = _apply_action(tx, write, seq, index, action)
        if result.applied:
            result.event_id = f"{write.key}#e{index}"
            events.append(_event_row(write, seq, index, action, result))
        applied.append(result)
    # 5. Bio patches, in order, in one statement (a row sees the rows before it: a second
    # patch to an entity builds on the first, as when they were sent one by one).
    if write.bio_patches:
        rows = [
            {
                "entity_id": p.entity_id,
                "summary": p.summary,
                "add": p.traits_add,
                "remove": p.traits_remove,
            }
            for p in write.bio_patches
        ]
        tx.run(
            dq.PATCH_BIOS, conversation_id=write.conversation_id, rows=rows, turn_id=write.turn_id
        ).consume()
    # 6. Milestones (their rows).
    return applied, events, _milestone_rows(write, seq)


def _event_row(
    write: TurnWrite, seq: int, index: int, action: RelationActionWrite, result: AppliedAction
) -> dict[str, Any]:
    """The logged event of an applied relation action (its node's properties)."""
    return no_nulls(
        {
            "event_id": result.event_id,
            "conversation_id": write.conversation_id,
            "turn_id": write.turn_id,
            "turn_key": write.key,
            "seq": seq,
            "index": index,
            "rel_id": result.rel_id,
            "action": result.action,
            "source_id": result.source_id,
            "target_id": result.target_id,
            "from_type": result.from_type,
            "to_type": result.to_type,
            "weight_before": result.weight_before,
            "weight_after": result.weight_after,
            "reason": action.reason,
            "quote": action.quote or None,
        }
    )


def _milestone_rows(write: TurnWrite, seq: int) -> list[dict[str, Any]]:
    """The milestone nodes' properties, numbered in the turn."""
    return [
        {
            "milestone_id": f"{write.key}#m{i}",
            "conversation_id": write.conversation_id,
            "turn_id": write.turn_id,
            "turn_key": write.key,
            "seq": seq,
            "text": m.text,
            "importance": m.importance,
            "entity_ids": m.entity_ids,
            **({"quote": m.quote} if m.quote else {}),
        }
        for i, m in enumerate(write.milestones)
    ]


def next_turn_seq(
    tx: ManagedTransaction, conversation_id: str, *, turn_seq: int | None, memory_count: int = 0
) -> tuple[int, int | None]:
    """(the turn's seq, the last of `memory_count` memory positions claimed with it, else the
    memory head); `turn_seq` is the counter as the caller read it."""
    floor = 0
    if turn_seq is None:
        # First commit since the counter exists: a graph from before it may hold turns
        # already (one scan in the conversation's life, never again).
        stats = tx.run(dq.TURN_STATS, conversation_id=conversation_id).single()
        floor = int(stats["max_seq"]) if stats and stats["max_seq"] is not None else 0
    row = tx.run(
        dq.TURN_AND_MEMORY_SEQ_NEXT,
        conversation_id=conversation_id,
        floor=floor,
        memory_count=memory_count,
    ).single()
    assert row is not None  # MERGE returns its one row
    return int(row["seq"]), row["memory_last"]
