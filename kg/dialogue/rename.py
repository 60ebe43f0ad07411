"""Renaming a conversation (its chat was renamed): everything the graph holds of it moves to the
new id in one transaction, as if its turns had been committed under that id.

A chat front end names a conversation by its chat (SillyTavern: the chat file's name), so a
renamed chat is another id. Without this its memory would stay under the old id and the front
end would write every turn again, with every slot's LLM call.

The turn records and memory rows are re-keyed in place (their text, vectors and positions do
not depend on the id). The facts do: relation, event and milestone ids are made from the turn's
key. So, as a rewind does, the facts are deleted and the committed turns' stored writes, re-keyed,
are re-applied in order (`apply_facts` is deterministic). A turn's payload hash was computed
with the id it was sent under; its record keeps that id (`payload_conversation_id`), so the same
turn sent again under the new id is still a duplicate, not a conflict."""

from __future__ import annotations

import json

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
    """Move conversation `old_id` to `new_id` (the caller holds both leases, and releases them
    afterwards as after any turn): what moved, or None when the graph holds nothing of `old_id`.

    Refused (RenameRefusedError) when `new_id` already holds memory (and `old_id` does), or when a committed turn has
    no stored write (committed before rewinds existed): nothing is changed then. Every
    process's cached recall index of either id is reset at its next read (the head it checks
    its cache against is gone or new)."""
    for conversation_id in (old_id, new_id):
        require_lease(tx, conversation_id, owner, doing="the rename", hint="rename it again")
    moved = conversation_contents(tx, old_id)
    if moved is None:
        # Nothing to move, whatever the new id holds: a rename sent again after it landed.
        return None
    if conversation_contents(tx, new_id) is not None:
        raise RenameRefusedError(
            f"conversation {new_id!r} already holds memory; it cannot take {old_id!r}'s",
            hint="forget it first, or rename to another id",
        )
    turns = [r.data() for r in tx.run(dq.RENAME_TURN_ROWS, conversation_id=old_id)]
    committed = [t for t in turns if t["status"] == TURN_COMMITTED]
    missing = [t["turn_id"] for t in committed if not t["write_json"]]
    if missing:
        raise RenameRefusedError(
            f"conversation {old_id!r}: turn {missing[0]} was committed before renames were "
            "possible (no stored write); this conversation cannot be renamed",
            hint="keep its id, or forget it",
        )
    memory = [r.data() for r in tx.run(dq.RENAME_MEMORY_ROWS, conversation_id=old_id)]
    for statement in (dq.DELETE_CONVERSATION_RELS, *dq.DELETE_CONVERSATION_FACTS):
        tx.run(statement, conversation_id=old_id).consume()
    rows = [
        {
            "old_key": t["key"],
            "key": turn_key(new_id, str(t["turn_id"])),
            "write_json": _rekeyed_write(t["write_json"], new_id, str(t["turn_id"])),
        }
        for t in turns
    ]
    tx.run(dq.RENAME_TURN_RECORDS, rows=rows, old_id=old_id, new_id=new_id).consume()
    memory_rows = [
        {
            "old_key": m["key"],
            "key": turn_key(new_id, str(m["turn_id"])),
            "position_key": position_key(new_id, int(m["seq"])),
        }
        for m in memory
    ]
    tx.run(dq.RENAME_MEMORY, rows=memory_rows, new_id=new_id).consume()
    tx.run(dq.RENAME_HEAD, old_id=old_id, new_id=new_id).consume()
    for turn, row in zip(turns, rows, strict=True):
        if turn["status"] == TURN_COMMITTED:
            stored_write = {"committed_at": "", **json.loads(row["write_json"])}
            apply_facts(tx, TurnWrite.model_validate(stored_write), int(turn["seq"]))
    return moved
