"""Forgetting a conversation: everything the graph holds of it, in one transaction."""

from __future__ import annotations

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.lease import require_lease
from kg.dialogue.models import TURN_COMMITTED, ConversationContents


def delete_conversation_tx(tx: ManagedTransaction, conversation_id: str) -> None:
    """Delete the conversation's relations, entities, events, milestones, turn records, memory
    rows and head. Its lease (a node keyed by the conversation, not carrying its id) stays."""
    tx.run(dq.DELETE_CONVERSATION_RELS, conversation_id=conversation_id).consume()
    for statement in dq.DELETE_CONVERSATION_NODES:
        tx.run(statement, conversation_id=conversation_id).consume()


def conversation_contents(
    tx: ManagedTransaction, conversation_id: str
) -> ConversationContents | None:
    """What the graph holds of the conversation, or None when it holds nothing (not even a head)."""
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
    return contents


def forget_tx(
    tx: ManagedTransaction, conversation_id: str, owner: str
) -> ConversationContents | None:
    """Forget conversation `conversation_id` (the caller holds its lease, which it releases
    afterwards as after any turn): what it held, or None when the graph holds nothing of it.

    Every process's cached recall index of it is reset at its next read: the head it checks
    its cache against is gone (kg.dialogue.memory `cache_is_current`)."""
    require_lease(tx, conversation_id, owner, doing="the forget", hint="forget it again")
    contents = conversation_contents(tx, conversation_id)
    if contents is None:
        return None
    delete_conversation_tx(tx, conversation_id)
    return contents
