"""The HTTP API's own models: the read-back pages, search, health and the error body.

The turn, rewind and memory-query bodies and results are the service's boundary models
(tasks.dialogue.models): the CLI and the regression batch use them too. What is here exists for
HTTP only: the paged read-back of a conversation, the search answer, the health report, the
body of the answers no service call produced (401, a bad query or path parameter, 500), and the
constrained path and query parameters.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path, Query
from pydantic import BaseModel, Field

from tasks.dialogue.models import NAME_PATTERN, RecalledTurnOut


class ApiError(BaseModel):
    """An answer no service call produced: a missing or wrong token (401), a bad path or query
    parameter (400), a conversation the graph does not hold (404, the lorebook), an unavailable
    graph or LLM on a read (503), a bug (500)."""

    code: Literal["UNAUTHORIZED", "INVALID_REQUEST", "NOT_FOUND", "UNAVAILABLE", "INTERNAL"]
    reason: str = Field(description="one line")
    retryable: bool = False


class HealthReport(BaseModel):
    status: Literal["ok", "degraded"]
    graph: str = Field(description="the graph served")
    rolled_back_turns: int = Field(description="turns rolled back since start")
    conversation_locks: int = Field(description="per-conversation locks held in memory")
    turns_without_usable_vectors: int = Field(
        0,
        description="turns of the conversations cached in memory whose vectors another "
        "embedding model made, recalled by their words only: `python -m flows.dialogue "
        "reembed` gives them the model's in use",
    )
    graph_write_lock: dict[str, float] = Field(
        default_factory=dict,
        description="the serialised graph writes since start (on ArcadeDB): acquired, "
        "waited_s, held_s; the held seconds per turn bound the turns per second",
    )
    yielded_to_queries: dict[str, float] = Field(
        default_factory=dict,
        description="turns' background steps that found a memory query in flight and waited for "
        "it since start: yields, waited_s, timed_out (gave up after --yield-to-queries-ms)",
    )
    llm: str | None = Field(None, description="deep=true: the LLM endpoint that answered")
    llm_error: str | None = Field(
        None, description="deep=true: why the LLM endpoint did not answer"
    )


#: The conversation in a read-back path: the rules of a request's conversation_id. A "/" in it
#: is part of the id (the route's parameter spans segments).
PathConversationId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        pattern=NAME_PATTERN,
        description="the conversation: 1-200 characters, not blank, no control characters",
    ),
]
Offset = Annotated[int, Query(ge=0, le=10_000_000, description="items to skip")]
Limit = Annotated[int, Query(ge=1, le=500, description="items per page")]
SearchText = Annotated[str, Query(min_length=1, max_length=2000, description="what to look for")]
SearchK = Annotated[int, Query(ge=1, le=50, description="turns to recall")]


# --- Read-back (paged) ---------------------------------------------------------------------------


class PageInfo(BaseModel):
    offset: int
    limit: int
    total: int


class EntityOut(BaseModel):
    entity_id: str
    name: str
    kind: str
    aliases: list[str] = Field(default_factory=list)
    bio_summary: str = ""
    bio_traits: list[str] = Field(default_factory=list)
    first_turn: str | None = None
    last_turn: str | None = None
    mentions: int = 0


class RelationEventOut(BaseModel):
    event_id: str
    turn_id: str
    seq: int
    action: str
    from_type: str | None = None
    to_type: str | None = None
    weight_before: float | None = None
    weight_after: float | None = None
    reason: str = ""
    quote: str = Field(
        "", description="the words of the turn that state this change (its evidence)"
    )


class RelationOut(BaseModel):
    rel_id: str
    source_id: str
    source_name: str
    target_id: str
    target_name: str
    type: str
    weight: float
    status: str
    since_turn: str | None = None
    ended_turn: str | None = None
    quote: str = Field(
        "", description="the evidence of the relation's latest change: words of that turn"
    )
    events: list[RelationEventOut] = Field(
        default_factory=list, description="the relation's mutation log, oldest first"
    )


class MilestoneOut(BaseModel):
    milestone_id: str
    turn_id: str
    seq: int
    text: str
    importance: float = 0.5
    entity_ids: list[str] = Field(default_factory=list)
    quote: str = Field("", description="the words of the turn that state it (its evidence)")


class TurnOut(BaseModel):
    key: str
    turn_id: str
    seq: int = Field(description="position in the conversation's memory")
    speaker: str = ""
    text: str
    when: str = ""
    committed: bool = Field(False, description="the turn's facts passed the commit gate")
    facts: list[str] = Field(default_factory=list)


class ConversationOut(BaseModel):
    conversation_id: str
    remembered_turns: int = Field(
        description="turns memory holds (committed, gate-blocked or ingested)"
    )


class ConversationPage(BaseModel):
    page: PageInfo
    items: list[ConversationOut]


class EntityPage(BaseModel):
    conversation_id: str
    page: PageInfo
    items: list[EntityOut]


class RelationPage(BaseModel):
    conversation_id: str
    page: PageInfo
    items: list[RelationOut]


class MilestonePage(BaseModel):
    conversation_id: str
    page: PageInfo
    items: list[MilestoneOut]


class TurnPage(BaseModel):
    conversation_id: str
    page: PageInfo
    items: list[TurnOut]


class SearchResult(BaseModel):
    conversation_id: str
    query: str
    turns: list[RecalledTurnOut] = Field(
        default_factory=list, description="hybrid recall, best first"
    )
    entities: list[EntityOut] = Field(
        default_factory=list, description="entities whose name or alias matches"
    )
    milestones: list[MilestoneOut] = Field(
        default_factory=list, description="milestones containing the query words"
    )
