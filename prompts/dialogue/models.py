"""Output models of the dialogue sidecar's LLM slots, one per template.

Each model is sent to the model as a strict JSON schema (core.llm), so every field is
required on the wire; the slot code normalises and grounds what comes back (kg vocabulary,
known entities) before anything reaches the graph.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RelationVerb = Literal["EVOLVE", "REPLACE", "DELETE"]
QUOTE = "the words of the NEW messages that state this, copied exactly (one sentence or less)"


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DialogueEntityOut(_Out):
    name: str = Field(min_length=1, max_length=200)
    kind: str = Field(
        "Character", max_length=60, description="Character, Location, Item, Event, Faction, Concept"
    )
    aliases: list[str] = Field(default_factory=list, max_length=10)
    quote: str = Field("", max_length=300, description=QUOTE)


class RelationActionOut(_Out):
    action: RelationVerb = Field(
        description="EVOLVE: strengthen/weaken (create if missing); REPLACE: the relation "
        "changes type; DELETE: the relation ended"
    )
    source: str = Field(min_length=1, max_length=200)
    target: str = Field(min_length=1, max_length=200)
    type: str = Field(
        min_length=1,
        max_length=80,
        description="UPPER_SNAKE_CASE relation type (the new type for REPLACE)",
    )
    from_type: str | None = Field(
        None, max_length=80, description="REPLACE only: the type being replaced"
    )
    weight_delta: float = Field(
        0.1, ge=-1.0, le=1.0, description="EVOLVE: change of strength in [-1, 1]"
    )
    weight: float = Field(0.5, ge=0.0, le=1.0, description="REPLACE: strength of the new relation")
    reason: str = Field("", max_length=300)
    quote: str = Field("", max_length=300, description=QUOTE)


class BioPatchOut(_Out):
    entity: str = Field(min_length=1, max_length=200)
    summary: str | None = Field(None, max_length=600, description="new one-paragraph bio, or null")
    traits_add: list[str] = Field(default_factory=list, max_length=10)
    traits_remove: list[str] = Field(default_factory=list, max_length=10)
    quote: str = Field("", max_length=300, description=QUOTE)


class TurnExtraction(_Out):
    """extractor.j2"""

    entities: list[DialogueEntityOut] = Field(default_factory=list, max_length=30)
    actions: list[RelationActionOut] = Field(default_factory=list, max_length=20)
    bio_patches: list[BioPatchOut] = Field(default_factory=list, max_length=10)
    facts: list[str] = Field(
        default_factory=list, max_length=10, description="short standalone facts stated this turn"
    )


class IdentityConflictOut(_Out):
    entity: str = Field(min_length=1, max_length=200)
    conflicts_with: str = Field("", max_length=200)
    reason: str = Field("", max_length=300)


class ContradictionOut(_Out):
    statement: str = Field(min_length=1, max_length=400)
    contradicts: str = Field("", max_length=400)
    severity: Literal["low", "medium", "high"] = "low"


class JudgeVerdict(_Out):
    """judge.j2"""

    identity_conflicts: list[IdentityConflictOut] = Field(default_factory=list, max_length=10)
    contradictions: list[ContradictionOut] = Field(default_factory=list, max_length=10)


class MilestoneOut(_Out):
    text: str = Field(min_length=1, max_length=400)
    entities: list[str] = Field(default_factory=list, max_length=10)
    importance: float = Field(0.5, ge=0.0, le=1.0)
    quote: str = Field("", max_length=300, description=QUOTE)


class HistorianReport(_Out):
    """historian.j2"""

    events: list[str] = Field(default_factory=list, max_length=10)
    milestones: list[MilestoneOut] = Field(default_factory=list, max_length=5)
