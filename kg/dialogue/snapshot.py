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

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.keys import position_key
from kg.dialogue.memory import cache_is_current, memory_row, memory_rows_tx
from kg.dialogue.models import REL_ACTIVE, ConversationSnapshot
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
    record = tx.run(
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
    head = int(record["memory_seq"] or 0)
    if cache_is_current(after_seq, anchor_key, head, record["at_key"], record["at_text"]):
        reset = False
        read = sorted((memory_row(p) for p in record["rows"]), key=lambda row: row.seq)
        new_turns = [row for row in read if row.seq <= head]
        new_turns += memory_rows_tx(tx, conversation_id, after_seq + SNAPSHOT_ROWS + 1, head)
    else:
        # The reader's cache is from another life of this conversation: resend everything.
        reset = True
        new_turns = memory_rows_tx(tx, conversation_id, 1, head)
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
    )


# The statement's ORDER BY, restored here: a collected list's order is not promised.
def _entity_order(props: dict[str, Any]) -> tuple[int, str]:
    return (-int(props.get("last_seq") or 0), str(props.get("entity_id") or ""))


def _relation_order(row: dict[str, Any]) -> tuple[float, str]:
    props = row["props"]
    return (-float(props.get("weight") or 0.0), str(props.get("rel_id") or ""))


def _milestone_order(props: dict[str, Any]) -> tuple[int, str]:
    return (int(props.get("seq") or 0), str(props.get("milestone_id") or ""))  # both descending
