"""Episodic memory: every turn's text as a KGMemory row at a position in its conversation,
appended exactly once and read back by position (index lookups only)."""

from __future__ import annotations

import hashlib
from typing import Any

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.keys import position_key
from kg.dialogue.models import MemoryRow
from kg.dialogue.records import no_nulls, turn_identity

#: Memory rows read per statement when a reader catches up (one index lookup each).
MEMORY_PAGE = 2000


def memory_row(props: dict[str, Any]) -> MemoryRow:
    return MemoryRow(
        **turn_identity(props),
        speaker=props.get("speaker") or "",
        text=props.get("text") or "",
        extra=props.get("extra") or "",
        when=props.get("when") or "",
        group=props.get("group") or "",
        source_refs=list(props.get("source_refs") or []),
        facts=list(props.get("facts") or []),
        embedding=[float(x) for x in (props.get("embedding") or [])],
        committed=bool(props.get("committed")),
    )


def anchor_token(key: str, text: str) -> str:
    """What proves a reader's cached row at a position is still the row there: its key AND its
    text. A replaced last turn comes back at the same position under the same key (an edit or a
    swipe), so the key alone would keep the old text cached in every other reader."""
    return f"{key}#{hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}"


def memory_since_tx(
    tx: ManagedTransaction,
    conversation_id: str,
    after_seq: int,
    anchor_key: str | None,
    limit: int | None,
) -> tuple[int, bool, list[MemoryRow]]:
    """(memory head, reset, rows after `after_seq`): index lookups by position only. `anchor_key`
    is the `anchor_token` of the row the caller holds at `after_seq` (a bare key is accepted too)."""
    head_row = tx.run(dq.CONVERSATION_HEAD, conversation_id=conversation_id).single()
    head = int(head_row["memory_seq"] or 0) if head_row else 0
    reset = False
    if after_seq > 0:
        at = tx.run(dq.MEMORY_AT, position_key=position_key(conversation_id, after_seq)).single()
        if not cache_is_current(
            after_seq,
            anchor_key,
            head,
            None if at is None else at["key"],
            None if at is None else at["text"],
        ):
            # The caller's cache is from another life of this conversation: resend everything.
            after_seq, reset = 0, True
    last = head if limit is None else min(head, after_seq + limit)
    return head, reset, memory_rows_tx(tx, conversation_id, after_seq + 1, last)


def memory_rows_tx(
    tx: ManagedTransaction, conversation_id: str, first: int, last: int
) -> list[MemoryRow]:
    """The rows at positions `first`..`last`, in position order, `MEMORY_PAGE` lookups a statement."""
    rows: list[MemoryRow] = []
    for start in range(first, last + 1, MEMORY_PAGE):
        keys = [
            position_key(conversation_id, s)
            for s in range(start, min(last, start + MEMORY_PAGE - 1) + 1)
        ]
        rows += [memory_row(r["props"]) for r in tx.run(dq.MEMORY_ROWS, position_keys=keys)]
    return rows


def cache_is_current(
    after_seq: int, anchor_key: str | None, head: int, at_key: str | None, at_text: str | None
) -> bool:
    """Whether a reader's cache up to `after_seq` (`anchor_key`: see `anchor_token`) is still this
    conversation's memory, given the row now at that position (`at_key`, `at_text`; None: none)
    and the memory head. Position 0 (nothing cached) always is."""
    if after_seq <= 0:
        return True
    return (
        at_key is not None
        and anchor_key in (anchor_token(at_key, at_text or ""), at_key)
        and after_seq <= head
    )


def memory_props(row: MemoryRow, seq: int) -> dict[str, Any]:
    return no_nulls(
        {
            "key": row.key,
            "conversation_id": row.conversation_id,
            "turn_id": row.turn_id,
            "seq": seq,
            "position_key": position_key(row.conversation_id, seq),
            "speaker": row.speaker,
            "text": row.text,
            "extra": row.extra,
            "when": row.when,
            "group": row.group,
            "source_refs": row.source_refs,
            "facts": row.facts,
            "embedding": row.embedding,
            "committed": row.committed,
        }
    )


def remember_tx(tx: ManagedTransaction, conversation_id: str, rows: list[MemoryRow]) -> int:
    """Append the rows whose key is not remembered yet (exactly once: a key is unique, and a
    row and its position are written in one transaction); a committed row already
    remembered is marked committed. Returns how many rows were appended."""
    if not rows:
        return 0
    present = {r["key"] for r in tx.run(dq.MEMORY_KEYS_PRESENT, keys=[row.key for row in rows])}
    for row in rows:
        if row.key in present and row.committed:
            mark_committed_tx(tx, row)
    fresh = list({row.key: row for row in rows if row.key not in present}.values())
    if not fresh:
        return 0
    claimed = tx.run(dq.MEMORY_CLAIM, conversation_id=conversation_id, count=len(fresh)).single()
    first = int(claimed["last"]) - len(fresh) + 1  # type: ignore[index]
    tx.run(
        dq.MEMORY_CREATE, rows=[memory_props(row, first + i) for i, row in enumerate(fresh)]
    ).consume()
    return len(fresh)


def mark_committed_tx(tx: ManagedTransaction, row: MemoryRow) -> None:
    """A row remembered before its turn committed (blocked by the gate, rolled back) gets the
    committed turn's facts."""
    tx.run(dq.MEMORY_MARK_COMMITTED, key=row.key, extra=row.extra, facts=row.facts).consume()
