"""Forgetting a conversation: everything the graph holds of it, in one transaction."""

from __future__ import annotations

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.keys import lock_key
from kg.dialogue.models import TURN_COMMITTED, ConversationContents, LostLockError


def delete_conversation_tx(tx: ManagedTransaction, conversation_id: str) -> None:
    """Delete the conversation's relations, entities, events, milestones, turn records, memory
    rows and head. Its lease (a node keyed by the conversation, not carrying its id) stays."""
    tx.run(dq.DELETE_CONVERSATION_RELS, conversation_id=conversation_id).consume()
    for statement in dq.DELETE_CONVERSATION_NODES:
        tx.run(statement, conversation_id=conversation_id).consume()


def forget_tx(
    tx: ManagedTransaction, conversation_id: str, owner: str
) -> ConversationContents | None:
    """Forget conversation `conversation_id` (the caller holds its lease, which it releases
    afterwards as after any turn): what it held, or None when the graph holds nothing of it.

    Every process's cached recall index of it is reset at its next read: the head it checks
    its cache against is gone (kg.dialogue.memory `cache_is_current`)."""
    held = tx.run(dq.LOCK_HELD, key=lock_key(conversation_id), owner=owner).single()
    if not held or not int(held["held"]):
        raise LostLockError(
            f"conversation {conversation_id!r}: the lock lease expired and was taken over before "
            "it could be forgotten",
            hint="forget it again",
        )
    row = tx.run(
        dq.CONVERSATION_CONTENTS, conversation_id=conversation_id, committed=TURN_COMMITTED
    ).single(strict=True)
    contents = ConversationContents(
        turns=int(row["turns"]),
        memory=int(row["memory"]),
        entities=int(row["entities"]),
        relations=int(row["relations"]),
        milestones=int(row["milestones"]),
    )
    if not int(row["heads"]) and contents == ConversationContents():
        return None
    delete_conversation_tx(tx, conversation_id)
    return contents
