"""The parts a dialogue turn's result carries: the states it passed (`TurnState`) and its trace,
the injection packet, the judge's summary, the commit gate's decision, the bio patches.

Output models only (what the sidecar answers, never what it is sent), so none is strict;
`tasks.dialogue.models` holds the requests and the results that carry these parts.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kg.dialogue import BioPatchWrite


class TurnState(StrEnum):
    RECEIVED = "RECEIVED"
    RETRIEVING = "RETRIEVING"
    INJECTING = "INJECTING"
    ACTING = "ACTING"
    EXTRACTING = "EXTRACTING"
    JUDGING = "JUDGING"
    HISTORIANING = "HISTORIANING"
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"


class StateStamp(BaseModel):
    state: TurnState
    at: datetime
    elapsed_ms: float


class SlotTrace(BaseModel):
    slot: str
    tier: str
    model: str | None = None
    route: Literal["request", "settings", "tier", "none"] = "tier"
    latency_ms: float = 0.0
    llm_calls: int = 0
    llm_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class GateDecision(BaseModel):
    passed: bool
    reasons: list[str] = Field(default_factory=list)
    actions: int = 0
    identity_conflicts: int = 0
    nothing_new: bool = Field(
        False,
        description="blocked only because the turn holds no relation action: nothing new for the graph "
        "(the turn's text is remembered); not a failure",
    )


class TurnTrace(BaseModel):
    trace_id: str
    key: str | None = None
    attempt: Literal["commit", "retry"] = "commit"
    states: list[StateStamp] = Field(default_factory=list)
    slots: list[SlotTrace] = Field(default_factory=list)
    total_ms: float = 0.0
    llm_ms: float = Field(
        0.0, description="wall time with at least one LLM call of the turn in flight"
    )
    overhead_ms: float = Field(0.0, description="total_ms - llm_ms: the turn's own (non-LLM) time")
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replay_of: str | None = Field(
        None, description="trace id of the original commit (idempotent hits)"
    )
    facts_dropped: int = Field(
        0, description="extracted facts refused by grounding (no evidence in the turn)"
    )
    dropped: list[str] = Field(
        default_factory=list, description="the first refused facts, each with why"
    )


class InjectionSection(BaseModel):
    name: str
    budget_tokens: int
    used_tokens: int
    items_in: int
    items_kept: int


class InjectionPacket(BaseModel):
    """The memory block the front end puts into its next prompt."""

    text: str
    token_budget: int
    used_tokens: int
    sections: list[InjectionSection] = Field(default_factory=list)
    entity_ids: list[str] = Field(default_factory=list)
    relation_ids: list[str] = Field(default_factory=list)
    recalled_turns: list[str] = Field(default_factory=list)


class IdentityConflict(BaseModel):
    """A name bound to two different entities: the graph binds it to one, this turn to another
    (or to another kind of thing), each side with its facts. Only a conflict with evidence on
    both sides blocks a commit."""

    entity: str
    conflicts_with: str = ""
    reason: str = ""
    source: Literal["rule", "judge"] = "judge"
    name: str = Field("", description="the name bound twice")
    graph_evidence: list[str] = Field(
        default_factory=list, description="what the graph holds for the name"
    )
    turn_evidence: list[str] = Field(
        default_factory=list, description="the words of this turn that bind it"
    )

    @property
    def has_evidence(self) -> bool:
        return bool(self.graph_evidence) and bool(self.turn_evidence)


class Contradiction(BaseModel):
    statement: str
    contradicts: str = ""
    severity: Literal["low", "medium", "high"] = "low"


class JudgeSummary(BaseModel):
    identity_conflicts: list[IdentityConflict] = Field(default_factory=list)
    contradictions: list[Contradiction] = Field(default_factory=list)
    dismissed: list[str] = Field(
        default_factory=list,
        description="identity conflicts the model reported that the graph cannot show, with why",
    )


class BioPatchResult(BioPatchWrite):
    # The patch as written, echoed in the turn's result: a stored result read back keeps
    # ignoring keys it does not know (the written model forbids them), and the API documents
    # the quote in its own words. No docstring: it would enter the OpenAPI document.
    model_config = ConfigDict(extra="ignore")

    quote: str = Field("", description="the words of the turn that state it (its evidence)")
