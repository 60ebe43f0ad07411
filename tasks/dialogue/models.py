"""The dialogue sidecar's boundary models: the turn-commit request, its result and trace.

A request is untrusted input (HTTP body, CLI file): every field is typed and bounded, and
anything else is rejected with one line (INVALID_REQUEST). Sizes are checked in UTF-8
bytes, which is what is stored and sent on.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    StringConstraints,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)

from core.settings import SLOT_NAMES, bolt_uri
from kg.dialogue import AppliedAction

MAX_MESSAGE_BYTES = 64 * 1024
MAX_REQUEST_BYTES = 256 * 1024
MAX_MESSAGES = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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


ErrorCode = Literal["INVALID_REQUEST", "IN_PROGRESS", "ROLLED_BACK"]
#: Why a turn did not commit, finer than the code (and what the HTTP status is chosen from).
ErrorKind = Literal[
    "malformed", "too_large", "conflict", "busy", "gate", "timeout", "llm", "graph", "internal"
]


def _utf8_bytes(value: str, what: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        # A JSON "\ud800" escape decodes to a lone surrogate: not text any store accepts.
        raise ValueError(f"{what} is not valid UTF-8 text (lone surrogate)") from None


def _check_id(value: str, what: str) -> str:
    if not value.strip():
        raise ValueError(f"{what} must not be blank")
    if _CONTROL.search(value):
        raise ValueError(f"{what} must not contain control characters")
    _utf8_bytes(value, what)
    return value


ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^\S+$")]
#: The conversation id every request carries: bounded, not blank, no control characters.
ConversationId = Annotated[
    str, StringConstraints(min_length=1, max_length=200), AfterValidator(lambda v: _check_id(v, "conversation_id"))
]


class ChatMessage(BaseModel):
    """One chat message; `name` is the speaker, `message_id` a front-end/source reference."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant", "system"]
    content: str = Field(max_length=MAX_MESSAGE_BYTES)
    name: str | None = Field(None, max_length=200)
    message_id: str | None = Field(None, max_length=200)
    time: str | None = Field(None, max_length=200, description="when it was said, free text")

    @field_validator("content")
    @classmethod
    def _content_size(cls, value: str) -> str:
        size = _utf8_bytes(value, "message content")
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"message content is {size} bytes; the limit is {MAX_MESSAGE_BYTES}")
        return value

    @field_validator("name", "message_id", "time")
    @classmethod
    def _short_text(cls, value: str | None) -> str | None:
        return None if value is None else _check_id(value, "message name/id/time")

    @property
    def speaker(self) -> str:
        return self.name or self.role

    def line(self) -> str:
        return f"{self.speaker}: {self.content}"


class DbConfig(BaseModel):
    """`config.db`: the graph a front end asks for (honoured only when the server allows it)."""

    model_config = ConfigDict(extra="forbid")

    uri: str | None = Field(None, max_length=500)
    username: str | None = Field(None, max_length=200)
    password: SecretStr | None = Field(None, max_length=500)
    database: str | None = Field(None, max_length=200)

    @field_validator("uri")
    @classmethod
    def _bolt(cls, value: str | None) -> str | None:
        return bolt_uri(value)


class SlotModels(BaseModel):
    """`config.models.<slot>`: per-request model overrides (unknown slots are rejected)."""

    model_config = ConfigDict(extra="forbid")

    retriever: ModelName | None = None
    injector: ModelName | None = None
    actor: ModelName | None = None
    extractor: ModelName | None = None
    judge: ModelName | None = None
    historian: ModelName | None = None

    def as_dict(self) -> dict[str, str]:
        return {slot: m for slot in SLOT_NAMES if (m := getattr(self, slot)) is not None}


class ActorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["recorded", "generate"] = Field(
        "recorded",
        description="recorded: the turn's messages are final; generate: the actor writes the reply",
    )
    speaker: str | None = Field(None, max_length=200, description="who the actor plays (generate)")
    max_words: int = Field(80, ge=5, le=1000)


class TurnConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db: DbConfig | None = None
    models: SlotModels = Field(default_factory=SlotModels)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    token_budget: int = Field(1024, ge=64, le=32_768, description="tokens for the injection_packet")
    recall_k: int = Field(5, ge=0, le=50, description="earlier turns recalled by vector search")
    require_actions: bool = Field(True, description="commit gate: block turns with no relation action")


class _ChatPayload(BaseModel):
    """What the requests carrying a conversation's messages share: their total size check."""

    if TYPE_CHECKING:  # fields of the subclasses, declared there (field order is the API's)
        messages: list[ChatMessage]
        window: list[ChatMessage]

    @model_validator(mode="after")
    def _total_size(self) -> Self:
        total = sum(len(m.content.encode("utf-8")) for m in (*self.window, *self.messages))
        if total > MAX_REQUEST_BYTES:
            raise ValueError(f"messages total {total} bytes; the limit is {MAX_REQUEST_BYTES} per request")
        return self


class TurnCommitRequest(_ChatPayload):
    """`POST /api/kg-sidecar/turn/commit`: one turn of a conversation.

    `messages` are this turn's new messages (oldest first); `window` is the chat before them,
    context only. The idempotency key is `conversation_id:turn_id`; the payload it guards is
    `messages` plus `config.actor` (model choices and budgets may change between retries).
    """

    model_config = ConfigDict(extra="forbid")

    conversation_id: ConversationId
    turn_id: StrictInt | Annotated[str, StringConstraints(min_length=1, max_length=100)]
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    window: list[ChatMessage] = Field(default_factory=list, max_length=MAX_MESSAGES)
    config: TurnConfig = Field(default_factory=TurnConfig)

    @field_validator("turn_id")
    @classmethod
    def _turn(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 0:
                raise ValueError("turn_id must be >= 0")
            return value
        return _check_id(value, "turn_id")

    @property
    def turn(self) -> str:
        return str(self.turn_id)

    @property
    def key(self) -> str:
        return f"{self.conversation_id}:{self.turn}"

    def ids(self) -> dict[str, str]:
        """Key, conversation id and turn id, as TurnResult and the graph's TurnWrite name them."""
        return {"key": self.key, "conversation_id": self.conversation_id, "turn_id": self.turn}

    def payload_canonical(self) -> str:
        """What the idempotency check compares (canonical JSON)."""
        data = {
            "conversation_id": self.conversation_id,
            "turn_id": self.turn,
            "messages": [m.model_dump(mode="json") for m in self.messages],
            "actor": self.config.actor.model_dump(mode="json"),
        }
        return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# --- Results and traces ----------------------------------------------------------------------


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
        False, description="blocked only because the turn holds no relation action: nothing new for the graph "
        "(the turn's text is remembered); not a failure"
    )


class TurnTrace(BaseModel):
    trace_id: str
    key: str | None = None
    attempt: Literal["commit", "retry"] = "commit"
    states: list[StateStamp] = Field(default_factory=list)
    slots: list[SlotTrace] = Field(default_factory=list)
    total_ms: float = 0.0
    llm_ms: float = Field(0.0, description="wall time with at least one LLM call of the turn in flight")
    overhead_ms: float = Field(0.0, description="total_ms - llm_ms: the turn's own (non-LLM) time")
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replay_of: str | None = Field(None, description="trace id of the original commit (idempotent hits)")
    facts_dropped: int = Field(0, description="extracted facts refused by grounding (no evidence in the turn)")
    dropped: list[str] = Field(default_factory=list, description="the first refused facts, each with why")


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
    graph_evidence: list[str] = Field(default_factory=list, description="what the graph holds for the name")
    turn_evidence: list[str] = Field(default_factory=list, description="the words of this turn that bind it")

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
        default_factory=list, description="identity conflicts the model reported that the graph cannot show, with why"
    )


class BioPatchResult(BaseModel):
    entity_id: str
    summary: str | None = None
    traits_add: list[str] = Field(default_factory=list)
    traits_remove: list[str] = Field(default_factory=list)
    quote: str = Field("", description="the words of the turn that state it (its evidence)")


class TurnResult(BaseModel):
    """What every entry point returns for a turn (HTTP body, CLI output, regression rows)."""

    ok: bool
    state: TurnState
    committed: bool = False
    code: ErrorCode | None = None
    error_kind: ErrorKind | None = None
    reason: str | None = None
    retryable: bool = False
    timed_out: bool = False
    idempotent_hit: bool = False
    conversation_id: str | None = None
    turn_id: str | None = None
    key: str | None = None
    seq: int | None = None
    injection_packet: InjectionPacket | None = None
    reply: str | None = None
    entities: list[str] = Field(default_factory=list)
    actions: list[AppliedAction] = Field(default_factory=list)
    bio_patches: list[BioPatchResult] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list)
    milestones: list[str] = Field(default_factory=list)
    facts: list[str] = Field(default_factory=list)
    judge: JudgeSummary | None = None
    gate: GateDecision | None = None
    trace: TurnTrace | None = None

    @computed_field(description="the commit gate held the turn back only because it holds no relation action: "
                    "its text is remembered, nothing new reached the graph (state stays ROLLED_BACK, code "
                    "ROLLED_BACK, as before); front ends show it as `nothing new`, not as a failure")
    def nothing_new(self) -> bool:
        return not self.committed and self.gate is not None and self.gate.nothing_new

    @classmethod
    def invalid(
        cls,
        reason: str,
        *,
        key: str | None = None,
        kind: Literal["malformed", "too_large", "conflict"] = "malformed",
    ) -> TurnResult:
        return cls(
            ok=False, state=TurnState.RECEIVED, code="INVALID_REQUEST", error_kind=kind, reason=reason, key=key
        )


def validation_reason(exc: ValidationError) -> str:
    """One line naming the first bad field (and how many more there are)."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "request"
    msg = str(first["msg"]).removeprefix("Value error, ")
    value = first.get("input")
    shown = ""
    if isinstance(value, str | int | float | bool) and first["type"] not in ("missing",):
        text = repr(value)
        shown = f" (got {text[:60]}{'...' if len(text) > 60 else ''})"
    more = f"; and {len(errors) - 1} more problem(s)" if len(errors) > 1 else ""
    return f"invalid request field {loc}: {msg}{shown}{more}"


def parse_request(raw: bytes | str | dict[str, Any]) -> TurnCommitRequest | TurnResult:
    """A validated request, or an INVALID_REQUEST result with a one-line reason."""
    if isinstance(raw, bytes | bytearray):
        if len(raw) > MAX_REQUEST_BYTES + 64 * 1024:  # room for JSON structure around the text
            return TurnResult.invalid(
                f"request body is {len(raw)} bytes; the limit is {MAX_REQUEST_BYTES} bytes of messages",
                kind="too_large",
            )
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return TurnResult.invalid(f"request body is not valid UTF-8 (byte {exc.start})")
    try:
        if isinstance(raw, str):
            return TurnCommitRequest.model_validate_json(raw)
        return TurnCommitRequest.model_validate(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return TurnResult.invalid(f"request body is not valid JSON: {exc.errors()[0]['msg']}")
        return TurnResult.invalid(validation_reason(exc))


# --- Memory before the reply, rewinds ----------------------------------------------------------


class PendingTurn(BaseModel):
    """A turn the front end is still writing (a queued commit, replace or rewind): what its
    memory will say once the write lands."""

    model_config = ConfigDict(extra="forbid")

    turn_id: StrictInt | Annotated[str, StringConstraints(min_length=1, max_length=100)]
    text: str | None = Field(
        None, max_length=MAX_REQUEST_BYTES,
        description="the turn's text as memory will hold it (`speaker: content` lines, the `text` of "
        "GET .../turns); null: the turn is being removed (a delete, or a swipe being generated)",
    )


class MemoryQueryRequest(_ChatPayload):
    """`POST /api/kg-sidecar/memory/query`: a turn commit's body without `turn_id`: the PENDING
    messages (the user's message the model has not answered yet). Nothing is written.

    `pending_turns`: turns with writes still queued at the front end. A remembered turn listed
    there is recalled only if its remembered text is the `text` given (so a query during a
    pending edit never injects the turn's old text), and the milestones and relations it
    started are left out until its write lands."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: ConversationId
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    window: list[ChatMessage] = Field(default_factory=list, max_length=MAX_MESSAGES)
    config: TurnConfig = Field(default_factory=TurnConfig)
    pending_turns: list[PendingTurn] = Field(default_factory=list, max_length=MAX_MESSAGES)

    @model_validator(mode="after")
    def _pending_size(self) -> Self:
        total = sum(len((p.text or "").encode("utf-8")) for p in self.pending_turns)
        total += sum(len(m.content.encode("utf-8")) for m in (*self.window, *self.messages))
        if total > MAX_REQUEST_BYTES:
            raise ValueError(f"messages and pending turns total {total} bytes; the limit is {MAX_REQUEST_BYTES}")
        return self

    def stale_turns(self) -> dict[str, str | None]:
        """turn id -> the text memory will hold (None: removed)."""
        return {str(p.turn_id): p.text for p in self.pending_turns}

    @classmethod
    def parse(cls, raw: bytes | str | dict[str, Any]) -> MemoryQueryRequest | MemoryQueryResult:
        parsed = _parse_model(cls, raw)
        return MemoryQueryResult.invalid(parsed) if isinstance(parsed, str) else parsed


class RecalledTurnOut(BaseModel):
    key: str
    turn_id: str
    seq: int
    speaker: str
    text: str
    when: str = ""
    facts: list[str] = Field(default_factory=list)
    source_refs: list[str] = Field(default_factory=list)
    committed: bool = False
    score: float


class MemoryQueryResult(BaseModel):
    ok: bool
    code: Literal["INVALID_REQUEST", "UNAVAILABLE"] | None = None
    reason: str | None = None
    retryable: bool = False
    conversation_id: str | None = None
    injection_packet: InjectionPacket | None = None
    recalled: list[RecalledTurnOut] = Field(default_factory=list)
    stored_turns: int = 0
    held_back: list[str] = Field(
        default_factory=list, description="turn ids whose remembered text was not recalled: a pending write "
        "changes it (see `pending_turns`)"
    )
    elapsed_ms: float = 0.0

    @classmethod
    def invalid(cls, reason: str) -> MemoryQueryResult:
        return cls(ok=False, code="INVALID_REQUEST", reason=reason)


class RewindResult(BaseModel):
    """`POST /api/kg-sidecar/conversation/rewind`: what a rewind removed."""

    ok: bool
    code: ErrorCode | None = None
    reason: str | None = None
    retryable: bool = False
    conversation_id: str
    before_turn: str
    found: bool = Field(False, description="the turn was remembered (False: nothing to rewind)")
    removed_turns: list[str] = Field(default_factory=list, description="turn ids whose facts were removed")
    removed_memory: int = Field(0, description="remembered turns removed (committed or gate-blocked)")
    replayed_turns: int = Field(0, description="earlier committed turns re-applied to rebuild the facts")


class RewindRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: ConversationId
    before_turn: StrictInt | Annotated[str, StringConstraints(min_length=1, max_length=100)]


def _parse_model(model: type[Any], raw: bytes | str | dict[str, Any]) -> Any:
    """A validated `model`, or a one-line reason why not."""
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"request body is not valid UTF-8 (byte {exc.start})"
    try:
        if isinstance(raw, str):
            return model.model_validate_json(raw)
        return model.model_validate(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return f"request body is not valid JSON: {exc.errors()[0]['msg']}"
        return validation_reason(exc)


def parse_rewind(raw: bytes | str | dict[str, Any]) -> RewindRequest | str:
    parsed: RewindRequest | str = _parse_model(RewindRequest, raw)
    return parsed


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
    quote: str = Field("", description="the words of the turn that state this change (its evidence)")


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
    quote: str = Field("", description="the evidence of the relation's latest change: words of that turn")
    events: list[RelationEventOut] = Field(default_factory=list, description="the relation's mutation log, oldest first")


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
    turns: list[RecalledTurnOut] = Field(default_factory=list, description="hybrid recall, best first")
    entities: list[EntityOut] = Field(default_factory=list, description="entities whose name or alias matches")
    milestones: list[MilestoneOut] = Field(default_factory=list, description="milestones containing the query words")
