"""Episodic memory: every turn's text as a KGMemory row at a position in its conversation,
appended exactly once and read back by position (index lookups only).

A row's vector records the model that made it (`embedded_by`): vectors of two models are not
comparable, so a reader uses only its own model's, and `replace_vectors_tx` re-embeds rows in
place (their positions and texts unchanged), bumping the conversation's `vectors_epoch` so every
reader's cache of the old vectors is reset (`cache_is_current`)."""

from __future__ import annotations

import hashlib
from typing import Any

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.keys import position_key
from kg.dialogue.models import MemoryRow, VectorWrite
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
        embedded_by=props.get("embedded_by") or "",
        committed=bool(props.get("committed")),
    )


def anchor_token(key: str, text: str, vectors_epoch: int = 0) -> str:
    """What proves a reader's cached row at a position is still the row there: its key AND its
    text. A replaced last turn comes back at the same position under the same key (an edit or a
    swipe), so the key alone would keep the old text cached in every other reader. And the
    conversation's vector epoch: re-embedded rows keep their keys and texts."""
    token = f"{key}#{hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}"
    return f"{token}@{vectors_epoch}" if vectors_epoch else token


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
    epoch = int(head_row["vectors_epoch"] or 0) if head_row else 0
    reset = False
    if after_seq > 0:
        at = tx.run(dq.MEMORY_AT, position_key=position_key(conversation_id, after_seq)).single()
        if not cache_is_current(
            after_seq,
            anchor_key,
            head,
            None if at is None else at["key"],
            None if at is None else at["text"],
            epoch,
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
    after_seq: int,
    anchor_key: str | None,
    head: int,
    at_key: str | None,
    at_text: str | None,
    vectors_epoch: int = 0,
) -> bool:
    """Whether a reader's cache up to `after_seq` (`anchor_key`: see `anchor_token`) is still this
    conversation's memory, given the row now at that position (`at_key`, `at_text`; None: none),
    the memory head and the vector epoch. Position 0 (nothing cached) always is. A bare key is
    accepted as an anchor only while the rows were never re-embedded."""
    if after_seq <= 0:
        return True
    accepted = {anchor_token(at_key or "", at_text or "", vectors_epoch)}
    if not vectors_epoch:
        accepted.add(at_key or "")
    return at_key is not None and anchor_key in accepted and after_seq <= head


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
            "embedded_by": row.embedded_by or None,
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


def replace_vectors_tx(
    tx: ManagedTransaction,
    conversation_id: str,
    rows: list[VectorWrite],
    embedded_by: str,
    new_epoch: bool,
) -> int:
    """Give remembered rows new vectors from model `embedded_by` (rows whose text changed since,
    or already from that model, are left alone); `new_epoch`: then start a new vector epoch (a
    re-embedding's last batch: one epoch per run, so readers reset once, and a run killed before
    its last batch leaves the epoch to the run that finishes). Returns how many rows changed."""
    changed = tx.run(
        dq.MEMORY_SET_VECTORS,
        conversation_id=conversation_id,
        embedded_by=embedded_by,
        rows=[row.model_dump() for row in rows],
    ).single()
    if new_epoch:
        tx.run(dq.VECTORS_EPOCH_BUMP, conversation_id=conversation_id).consume()
    return int(changed["changed"]) if changed else 0
