"""What the retriever reads for one turn: one statement (`SNAPSHOT`), in one read transaction.

A statement's round trip (the driver's and the server's work per statement) costs more than the
index lookups it makes, and under load every statement waits for the CPU again: at 16 busy
conversations the old six statements took ~30 ms of a memory query's ~50 (bench.sidecar_load).
So the head, the reader's cache check, the next `SNAPSHOT_ROWS` memory rows, the entities,
relations and milestones are one statement; only a reader further behind (a cold cache, a reset)
reads the rest of the rows by position (kg.dialogue.memory), in the same transaction.
"""

from __future__ import annotations

from typing import Any

from neo4j import ManagedTransaction, Record, Session

from kg.dialogue import cypher as dq
from kg.dialogue.keys import position_key
from kg.dialogue.memory import cache_is_current, memory_row, memory_rows_tx
from kg.dialogue.models import REL_ACTIVE, ConversationSnapshot, MemoryRow
from kg.dialogue.records import dialogue_entity, dialogue_milestone, dialogue_relation

#: Memory rows past the reader's position that the snapshot statement reads: a chat's reader is
#: one or two turns behind; one further behind pages the rest.
SNAPSHOT_ROWS = 16


def snapshot_tx(
    tx: ManagedTransaction,
    conversation_id: str,
    after_seq: int,
    anchor_key: str | None,
    entity_limit: int,
    relation_limit: int,
    milestone_limit: int,
) -> ConversationSnapshot:
    record = _snapshot_record(
        tx, conversation_id, after_seq, entity_limit, relation_limit, milestone_limit
    )
    head = int(record["memory_seq"] or 0)
    if _cache_is_current(record, after_seq, anchor_key):
        more = memory_rows_tx(tx, conversation_id, after_seq + SNAPSHOT_ROWS + 1, head)
        return _snapshot(record, reset=False, more_rows=more)
    # The reader's cache is from another life of this conversation: resend everything.
    return _snapshot(record, reset=True, more_rows=memory_rows_tx(tx, conversation_id, 1, head))


def snapshot_in_one_statement(
    session: Session,
    conversation_id: str,
    after_seq: int,
    anchor_key: str | None,
    entity_limit: int,
    relation_limit: int,
    milestone_limit: int,
) -> ConversationSnapshot | None:
    """The snapshot of a reader at most `SNAPSHOT_ROWS` behind, whose cache is current: the
    statement as an auto-commit transaction, one round trip instead of three (BEGIN, the
    statement, COMMIT). Each round trip wakes the graph's niced Bolt thread again, which under
    load waits for a core each time. None when the reader needs more (a reset, or rows past
    the statement's): those are read in one transaction (`snapshot_tx`), for one consistent
    view."""
    record = _snapshot_record(
        session, conversation_id, after_seq, entity_limit, relation_limit, milestone_limit
    )
    head = int(record["memory_seq"] or 0)
    if head > after_seq + SNAPSHOT_ROWS or not _cache_is_current(record, after_seq, anchor_key):
        return None
    return _snapshot(record, reset=False, more_rows=[])


def _cache_is_current(record: Record, after_seq: int, anchor_key: str | None) -> bool:
    """kg.dialogue.memory `cache_is_current` on what the statement read."""
    return cache_is_current(
        after_seq,
        anchor_key,
        int(record["memory_seq"] or 0),
        record["at_key"],
        record["at_text"],
        int(record["vectors_epoch"] or 0),
    )


def _snapshot_record(
    runner: ManagedTransaction | Session,
    conversation_id: str,
    after_seq: int,
    entity_limit: int,
    relation_limit: int,
    milestone_limit: int,
) -> Record:
    record: Record = runner.run(
        dq.SNAPSHOT,
        conversation_id=conversation_id,
        at_key=position_key(conversation_id, after_seq) if after_seq > 0 else "",
        position_keys=[
            position_key(conversation_id, seq)
            for seq in range(after_seq + 1, after_seq + SNAPSHOT_ROWS + 1)
        ],
        active=REL_ACTIVE,
        entity_limit=entity_limit,
        relation_limit=relation_limit,
        milestone_limit=milestone_limit,
    ).single(strict=True)
    return record


def _snapshot(record: Record, *, reset: bool, more_rows: list[MemoryRow]) -> ConversationSnapshot:
    """The snapshot from the statement's record; `more_rows`: the rows past its own (for a
    reset, every row: the statement's are then not read)."""
    head = int(record["memory_seq"] or 0)
    if reset:
        new_turns = more_rows
    else:
        read = sorted((memory_row(p) for p in record["rows"]), key=lambda row: row.seq)
        new_turns = [row for row in read if row.seq <= head] + more_rows
    return ConversationSnapshot(
        entities=[
            dialogue_entity(props) for props in sorted(record["entities"], key=_entity_order)
        ],
        relations=[
            dialogue_relation(row) for row in sorted(record["relations"], key=_relation_order)
        ],
        milestones=[
            dialogue_milestone(props)
            for props in sorted(record["milestones"], key=_milestone_order, reverse=True)
        ],
        new_turns=new_turns,
        turn_count=head,
        max_seq=head,
        reset=reset,
        vectors_epoch=int(record["vectors_epoch"] or 0),
    )


# The statement's ORDER BY, restored here: a collected list's order is not promised.
def _entity_order(props: dict[str, Any]) -> tuple[int, str]:
    return (-int(props.get("last_seq") or 0), str(props.get("entity_id") or ""))


def _relation_order(row: dict[str, Any]) -> tuple[float, str]:
    props = row["props"]
    return (-float(props.get("weight") or 0.0), str(props.get("rel_id") or ""))


def _milestone_order(props: dict[str, Any]) -> tuple[int, str]:
    return (int(props.get("seq") or 0), str(props.get("milestone_id") or ""))  # both descending
