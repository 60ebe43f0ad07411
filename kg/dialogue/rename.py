"""Renaming a conversation (its chat was renamed) or copying it (its chat was branched):
everything the graph holds of it moves, or is copied, to the new id in one transaction, as if
its turns had been committed under that id.

A chat front end names a conversation by its chat (SillyTavern: the chat file's name), so a
renamed chat is another id, and so is a branch. Without these the front end would write every
turn again, with every slot's LLM call (and a rename would leave the memory under the old id).

The turn records and memory rows are re-keyed in place, or copied: their text, vectors and
positions do not depend on the id. The facts do: relation, event and milestone ids are made
from the turn's key. So, as a rewind does, the committed turns' stored writes, re-keyed, are
re-applied in order under the new id (`apply_facts` is deterministic); a rename first deletes
the old id's facts. A turn's payload hash was computed with the id it was sent under; its
record keeps that id (`payload_conversation_id`), so the same turn sent again under the new id
is still a duplicate, not a conflict."""

from __future__ import annotations

import json
from typing import Any

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.forget import conversation_contents
from kg.dialogue.keys import position_key, turn_key
from kg.dialogue.lease import require_lease
from kg.dialogue.models import (
    TURN_COMMITTED,
    ConversationContents,
    RenameRefusedError,
    TurnWrite,
)
from kg.dialogue.records import no_nulls
from kg.dialogue.turn_commit import STORED_WRITE_EXCLUDES, apply_facts


def _rekeyed_write(write_json: str | None, new_id: str, turn_id: str) -> str | None:
    """A turn's stored write as a commit under `new_id` would have stored it (turn_commit)."""
    if not write_json:
        return write_json
    stored = TurnWrite.model_validate({"committed_at": "", **json.loads(write_json)})
    rekeyed = stored.model_copy(
        update={"conversation_id": new_id, "key": turn_key(new_id, turn_id)}
    )
    return rekeyed.model_dump_json(exclude=STORED_WRITE_EXCLUDES)


def rename_tx(
    tx: ManagedTransaction, old_id: str, new_id: str, owner: str
) -> ConversationContents | None:
    """Move conversation `old_id` to `new_id` (`carry_tx`)."""
    return carry_tx(tx, old_id, new_id, owner, move=True)


def copy_tx(
    tx: ManagedTransaction, old_id: str, new_id: str, owner: str
) -> ConversationContents | None:
    """Copy conversation `old_id` to `new_id`, leaving it as it was (`carry_tx`)."""
    return carry_tx(tx, old_id, new_id, owner, move=False)


def carry_tx(
    tx: ManagedTransaction, old_id: str, new_id: str, owner: str, *, move: bool
) -> ConversationContents | None:
    """Move (`move`) or copy conversation `old_id` to `new_id` (the caller holds both leases,
    and releases them afterwards as after any turn): what was carried, or None when the graph
    holds nothing of `old_id`.

    Refused (RenameRefusedError) when `new_id` already holds memory (and `old_id` does), or
    when a committed turn has no stored write (committed before rewinds existed): nothing is
    changed then. Every process's cached recall index of either id is reset at its next read
    (the head it checks its cache against is gone or new)."""
    doing = "the rename" if move else "the copy"
    for conversation_id in (old_id, new_id):
        require_lease(tx, conversation_id, owner, doing=doing, hint="send it again")
    carried = conversation_contents(tx, old_id)
    if carried is None:
        # Nothing to carry, whatever the new id holds: a call sent again after it landed.
        return None
    if conversation_contents(tx, new_id) is not None:
        raise RenameRefusedError(
            f"conversation {new_id!r} already holds memory; it cannot take {old_id!r}'s",
            hint="forget it first, or use another id",
        )
    turns = [r.data() for r in tx.run(dq.RENAME_TURN_ROWS, conversation_id=old_id)]
    missing = [t["turn_id"] for t in turns if t["status"] == TURN_COMMITTED and not t["write_json"]]
    if missing:
        raise RenameRefusedError(
            f"conversation {old_id!r}: turn {missing[0]} was committed before renames and "
            "copies were possible (no stored write); this conversation cannot be carried over",
            hint="keep its id, or forget it",
        )
    memory = [r.data() for r in tx.run(dq.RENAME_MEMORY_ROWS, conversation_id=old_id)]
    for t in turns:
        t["new_key"] = turn_key(new_id, str(t["turn_id"]))
        t["new_write"] = _rekeyed_write(t["write_json"], new_id, str(t["turn_id"]))
    for m in memory:
        m["new_key"] = turn_key(new_id, str(m["turn_id"]))
        m["new_position_key"] = position_key(new_id, int(m["seq"]))
    if move:
        _move_records(tx, old_id, new_id, turns, memory)
    else:
        _copy_records(tx, old_id, new_id, turns, memory)
    for turn in turns:
        if turn["status"] == TURN_COMMITTED:
            stored_write = {"committed_at": "", **json.loads(turn["new_write"])}
            apply_facts(tx, TurnWrite.model_validate(stored_write), int(turn["seq"]))
    return carried


def _move_records(
    tx: ManagedTransaction,
    old_id: str,
    new_id: str,
    turns: list[dict[str, Any]],
    memory: list[dict[str, Any]],
) -> None:
    """The old id's facts deleted; its turn records, memory rows and head re-keyed in place."""
    for statement in (dq.DELETE_CONVERSATION_RELS, *dq.DELETE_CONVERSATION_FACTS):
        tx.run(statement, conversation_id=old_id).consume()
    rows = [{"old_key": t["key"], "key": t["new_key"], "write_json": t["new_write"]} for t in turns]
    tx.run(dq.RENAME_TURN_RECORDS, rows=rows, old_id=old_id, new_id=new_id).consume()
    memory_rows = [
        {"old_key": m["key"], "key": m["new_key"], "position_key": m["new_position_key"]}
        for m in memory
    ]
    tx.run(dq.RENAME_MEMORY, rows=memory_rows, new_id=new_id).consume()
    tx.run(dq.RENAME_HEAD, old_id=old_id, new_id=new_id).consume()


def _copy_records(
    tx: ManagedTransaction,
    old_id: str,
    new_id: str,
    turns: list[dict[str, Any]],
    memory: list[dict[str, Any]],
) -> None:
    """Copies of the old id's turn records, memory rows and head under the new id (the same
    properties, re-keyed)."""
    turn_rows = [
        {
            "props": no_nulls(
                {
                    **t["props"],
                    "key": t["new_key"],
                    "conversation_id": new_id,
                    "write_json": t["new_write"],
                    "payload_conversation_id": t["props"].get("payload_conversation_id", old_id),
                }
            )
        }
        for t in turns
    ]
    tx.run(dq.COPY_TURN_RECORDS, rows=turn_rows).consume()
    memory_rows = [
        {
            "props": {
                **m["props"],
                "key": m["new_key"],
                "position_key": m["new_position_key"],
                "conversation_id": new_id,
            }
        }
        for m in memory
    ]
    tx.run(dq.COPY_MEMORY, rows=memory_rows).consume()
    head = tx.run(dq.HEAD_PROPS, old_id=old_id).single()
    if head is not None:
        tx.run(dq.CREATE_HEAD, props={**head["props"], "conversation_id": new_id}).consume()
