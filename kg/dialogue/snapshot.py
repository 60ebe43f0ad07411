"""What the retriever reads for one turn, in one read transaction."""

from __future__ import annotations

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.memory import memory_since_tx
from kg.dialogue.models import REL_ACTIVE, ConversationSnapshot
from kg.dialogue.records import dialogue_entity, dialogue_milestone, dialogue_relation


def snapshot_tx(
    tx: ManagedTransaction,
    conversation_id: str,
    after_seq: int,
    anchor_key: str | None,
    entity_limit: int,
    relation_limit: int,
    milestone_limit: int,
) -> ConversationSnapshot:
    head, reset, new_turns = memory_since_tx(tx, conversation_id, after_seq, anchor_key, None)
    entities = [
        dialogue_entity(r["props"])
        for r in tx.run(dq.ENTITIES, conversation_id=conversation_id, limit=entity_limit)
    ]
    relations = [
        dialogue_relation(r.data())
        for r in tx.run(
            dq.ACTIVE_RELATIONS,
            conversation_id=conversation_id,
            active=REL_ACTIVE,
            limit=relation_limit,
        )
    ]
    milestones = [
        dialogue_milestone(r["props"])
        for r in tx.run(
            dq.RECENT_MILESTONES, conversation_id=conversation_id, limit=milestone_limit
        )
    ]
    return ConversationSnapshot(
        entities=entities,
        relations=relations,
        milestones=milestones,
        new_turns=new_turns,
        turn_count=head,
        max_seq=head,
        reset=reset,
    )
