"""The read behind a conversation's lorebook: everything the graph currently holds about a
conversation, in one read transaction and a stable order.

- entities (current bio and traits, names and aliases) by first appearance;
- every relation, active or ended, with the positions of its start and latest change;
- milestones in turn order;
- the stated facts of each committed turn still remembered (a replaced or rewound turn's
  facts are gone with it), with the turn's speaker.

None when the graph has no such conversation (no conversation head): an unknown id, or one
whose memory was rewound away entirely.
"""

from __future__ import annotations

from typing import Any

from neo4j import ManagedTransaction
from pydantic import Field

from kg.dialogue import cypher as dq
from kg.dialogue.models import DialogueEntity, DialogueMilestone, DialogueRelation, _Model
from kg.dialogue.records import dialogue_entity, dialogue_milestone, dialogue_relation


class LoreEntity(DialogueEntity):
    first_seq: int = Field(
        0, description="the conversation position of the turn that first named it"
    )


class LoreRelation(DialogueRelation):
    since_seq: int = Field(0, description="the position of the turn that started it")
    updated_seq: int = Field(0, description="the position of the turn that changed it last")


class StatedFacts(_Model):
    """The facts one committed turn stated."""

    seq: int
    turn_id: str
    speaker: str = ""
    facts: list[str] = Field(default_factory=list)


class ConversationLore(_Model):
    conversation_id: str
    entities: list[LoreEntity] = Field(default_factory=list)
    relations: list[LoreRelation] = Field(default_factory=list)
    milestones: list[DialogueMilestone] = Field(default_factory=list)
    stated: list[StatedFacts] = Field(default_factory=list)


def _seq(props: dict[str, Any], name: str) -> int:
    return int(props.get(name) or 0)


def lore_tx(tx: ManagedTransaction, conversation_id: str) -> ConversationLore | None:
    if tx.run(dq.CONVERSATION_HEAD, conversation_id=conversation_id).single() is None:
        return None
    entities = [
        LoreEntity(
            **dialogue_entity(r["props"]).model_dump(), first_seq=_seq(r["props"], "first_seq")
        )
        for r in tx.run(dq.LORE_ENTITIES, conversation_id=conversation_id).data()
    ]
    relations = [
        LoreRelation(
            **dialogue_relation(r).model_dump(),
            since_seq=_seq(r["props"], "since_seq"),
            updated_seq=_seq(r["props"], "updated_seq"),
        )
        for r in tx.run(dq.LORE_RELATIONS, conversation_id=conversation_id).data()
    ]
    milestones = [
        dialogue_milestone(r["props"])
        for r in tx.run(dq.LORE_MILESTONES, conversation_id=conversation_id).data()
    ]
    stated = [
        StatedFacts(
            seq=int(r["seq"] or 0),
            turn_id=str(r["turn_id"]),
            speaker=r["speaker"] or "",
            facts=[str(f) for f in r["facts"] or []],
        )
        for r in tx.run(dq.LORE_STATED_FACTS, conversation_id=conversation_id).data()
        if r["facts"]
    ]
    return ConversationLore(
        conversation_id=conversation_id,
        entities=entities,
        relations=relations,
        milestones=milestones,
        stated=stated,
    )
