"""Node and relationship property maps -> the models (and the one rule for writing maps)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from kg import vocabulary as vocab
from kg.dialogue.models import (
    REL_ACTIVE,
    DialogueEntity,
    DialogueMilestone,
    DialogueRelation,
    StoredTurn,
)


def no_nulls(props: dict[str, Any]) -> dict[str, Any]:
    # A null property is no property in Cypher: leave them out so SET n = $props is exact.
    return {k: v for k, v in props.items() if v is not None}


def turn_identity(props: dict[str, Any]) -> dict[str, Any]:
    """Key, conversation, turn id and position: what a turn record and a memory row share."""
    return {
        "key": props["key"],
        "conversation_id": props.get("conversation_id", ""),
        "turn_id": str(props.get("turn_id", "")),
        "seq": int(props.get("seq") or 0),
    }


def stored_turn(props: dict[str, Any]) -> StoredTurn:
    return StoredTurn(
        **turn_identity(props),
        payload_hash=props.get("payload_hash", ""),
        status=props.get("status", ""),
        result_json=props.get("result_json", ""),
        trace_json=props.get("trace_json", ""),
        payload_conversation_id=props.get("payload_conversation_id"),
    )


def dialogue_entity(props: dict[str, Any]) -> DialogueEntity:
    return DialogueEntity(
        entity_id=props["entity_id"],
        name=props.get("name") or props["entity_id"],
        kind=props.get("kind") or vocab.FALLBACK_LABEL,
        aliases=list(props.get("aliases") or []),
        bio_summary=props.get("bio_summary") or "",
        bio_traits=list(props.get("bio_traits") or []),
        first_turn=props.get("first_turn"),
        last_turn=props.get("last_turn"),
        mentions=int(props.get("mentions") or 0),
    )


def dialogue_relation(row: dict[str, Any]) -> DialogueRelation:
    props = row["props"]
    return DialogueRelation(
        rel_id=props["rel_id"],
        source_id=row["source_id"],
        source_name=row["source_name"] or row["source_id"],
        target_id=row["target_id"],
        target_name=row["target_name"] or row["target_id"],
        type=props.get("type", vocab.RELATES_TO),
        raw_type=props.get("raw_type"),
        weight=float(props.get("weight") or 0.0),
        status=props.get("status", REL_ACTIVE),
        since_turn=props.get("since_turn"),
        ended_turn=props.get("ended_turn"),
    )


def dialogue_milestone(props: dict[str, Any]) -> DialogueMilestone:
    return DialogueMilestone(
        milestone_id=props["milestone_id"],
        turn_id=str(props.get("turn_id", "")),
        seq=int(props.get("seq") or 0),
        text=props.get("text", ""),
        importance=float(props.get("importance") or 0.0),
        entity_ids=list(props.get("entity_ids") or []),
        quote=str(props.get("quote") or ""),
    )


class ActiveRelation(BaseModel):
    """A row of FIND_ACTIVE_RELATIONS: an active relation of a pair, as a turn's action reads it."""

    model_config = ConfigDict(frozen=True)

    rel_id: str
    type: str
    weight: float | None = None

    @property
    def weight_or_zero(self) -> float:
        return float(self.weight or 0.0)
