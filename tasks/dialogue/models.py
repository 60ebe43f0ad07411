"""The dialogue sidecar's boundary models: the requests, their results and the turn trace.

A request is untrusted input (HTTP body, CLI file). Every rule it must meet is a constraint of
these models (a length, a pattern, a range, a strict type, one conditional), so the JSON schema
pydantic derives from them, which the OpenAPI document publishes, states exactly what is
enforced: a request the document allows is accepted, one it forbids is refused with one line
(INVALID_REQUEST). Validation is strict: `true` is not `1`, `"5"` is not `5` (but `5.0` is,
as JSON Schema reads it).

Lengths count characters (Unicode code points), as JSON Schema's `maxLength` does. What JSON
Schema cannot state, the size of a whole body in bytes, is the transport's limit
(`MAX_BODY_BYTES`, HTTP 413), checked on the raw bytes before anything is parsed.

Names and ids (conversation ids, string turn ids, a message's name, id and time, the actor's
speaker) hold at least one visible character and no control character (C0, DEL, C1); model
names hold no whitespace either. Their patterns spell every character class out instead of
using `\\s`, whose meaning differs between Python, Rust (pydantic-core) and ECMA-262 (the
pattern dialect of JSON Schema), so all three read them the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    computed_field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from core.errors import Err, Failure, Ok, Result, first_problem, is_invalid_json
from core.settings import SLOT_NAMES
from kg.dialogue import AppliedAction, ConversationContents, turn_key
from tasks.dialogue.parts import (
    BioPatchResult,
    GateDecision,
    InjectionPacket,
    JudgeSummary,
    TurnState,
    TurnTrace,
)
from tasks.dialogue.parts import IdentityConflict as IdentityConflict  # callers import it here

#: A message's content, in characters.
MAX_MESSAGE_CHARS = 64 * 1024
MAX_MESSAGES = 200
#: A request body, in bytes (JSON Schema cannot state it: HTTP answers 413 above it).
MAX_BODY_BYTES = 320 * 1024
#: The largest integer turn id: the largest integer a JavaScript front end holds exactly.
MAX_TURN_NUMBER = 2**53 - 1

_CONTROL = r"\x00-\x1f\x7f-\x9f"
#: Whitespace in any of the three readings (Python str.isspace, Unicode White_Space, ECMA-262 \s).
_SPACE = r"\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
#: A text that is only what JavaScript's String.prototype.trim removes (the spaces above and
#: the line ends): a chat front end's blank message.
JS_BLANK_PATTERN = rf"^[\t\n\v\f\r{_SPACE}]*$"
#: Not blank, no control character.
NAME_PATTERN = rf"^[^{_CONTROL}]*[^{_CONTROL}{_SPACE}][^{_CONTROL}]*$"
#: No whitespace, no control character.
TOKEN_PATTERN = rf"^[^{_CONTROL}{_SPACE}]+$"
#: A Bolt URI: scheme, host (name, IPv4 or [IPv6]), optional port, optional "/".
BOLT_URI_PATTERN = (
    r"^(bolt|neo4j)(\+s|\+ssc)?://([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]{2,45}\])(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}"
    r"|655[0-2][0-9]|6553[0-5]))?/?$"
)

#: Not blank, no control characters, 1-200 characters.
Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=NAME_PATTERN)]
ConversationId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200, pattern=NAME_PATTERN),
    Field(description="the conversation: 1-200 characters, not blank, no control characters"),
]


def _integral(value: Any) -> Any:
    """A JSON number with no fraction is an integer to JSON Schema (36.0 is 36): strictness
    refuses strings and booleans, not that spelling."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer field: a JSON integer (36, or 36.0), never a string or a boolean.
JsonInt = Annotated[int, Strict(), BeforeValidator(_integral)]

_TURN_ID_RULE = (
    f"must be an integer 0..{MAX_TURN_NUMBER}, or 1-100 characters with a visible one and no "
    "control character"
)


def _one_turn_id_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One reason for a bad turn id instead of one per branch of the union."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError("turn_id", _TURN_ID_RULE) from None


#: A turn id: an integer, or a name (not blank, no control characters). 7 and "7" are the same turn.
TurnId = Annotated[
    Annotated[int, Strict(), Field(ge=0, le=MAX_TURN_NUMBER), BeforeValidator(_integral)]
    | Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=NAME_PATTERN)],
    WrapValidator(_one_turn_id_error),
    Field(description=f'{_TURN_ID_RULE.removeprefix("must be ")}; 7 and "7" name the same turn'),
]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=TOKEN_PATTERN)]


class _Request(BaseModel):
    """Request models: unknown fields are refused and types are strict (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True)


ErrorCode = Literal["INVALID_REQUEST", "IN_PROGRESS", "ROLLED_BACK"]
#: Why a call did not succeed, finer than the code (and what the HTTP status is chosen from):
#: malformed 400, too_large 413, forbidden 403 (refused by the server's policy), conflict 409,
#: busy 409, gate 200, timeout/llm/graph 503 when retryable, internal 500 (a bug).
ErrorKind = Literal[
    "malformed",
    "too_large",
    "forbidden",
    "conflict",
    "busy",
    "gate",
    "timeout",
    "llm",
    "graph",
    "internal",
]
InvalidKind = Literal["malformed", "too_large", "forbidden", "conflict"]
FailedKind = Literal["timeout", "llm", "graph", "internal"]


def failed_kind(failure: Failure) -> FailedKind:
    """The error_kind of a turn or memory query that failed as `failure` (core.errors.classify):
    its kind, except that invalid input is the product's own error by then (the request was
    validated before the work began), so `internal`."""
    return "internal" if failure.kind == "invalid" else failure.kind


class ChatMessage(_Request):
    """One chat message; `name` is the speaker, `message_id` a front-end/source reference."""

    role: Literal["user", "assistant", "system"]
    content: str = Field(
        max_length=MAX_MESSAGE_CHARS, description=f"at most {MAX_MESSAGE_CHARS} characters"
    )
    name: Name | None = Field(None, description="the speaker (default: the role)")
    message_id: Name | None = None
    time: Name | None = Field(
        None,
        description='when it was said: free text ("1:56 pm on 8 May, 2023", ISO 8601) or Unix '
        "time in seconds or milliseconds",
    )

    @property
    def speaker(self) -> str:
        return self.name or self.role

    def line(self) -> str:
        return f"{self.speaker}: {self.content}"


class DbConfig(_Request):
    """`config.db`: the graph a front end asks for. Honoured only when the server runs with
    `--allow-request-db`; otherwise a request naming another graph than the served one, or
    carrying a password, is refused with 403."""

    uri: str | None = Field(
        None,
        max_length=300,
        pattern=BOLT_URI_PATTERN,
        description="bolt:// or neo4j:// (+s, +ssc) URI: host, optional port",
    )
    username: Name | None = None
    password: SecretStr | None = Field(None, max_length=500)
    database: Name | None = None

    def is_empty(self) -> bool:
        return (
            self.uri is None
            and self.username is None
            and self.password is None
            and self.database is None
        )


def _no_override(slot: str) -> Any:
    def check(value: Any) -> Any:
        if value is not None:
            raise ValueError(
                f"cannot apply: the {slot} makes no chat call (graph and hybrid recall with the server's "
                "embedding model); remove it"
            )
        return value

    return BeforeValidator(check)


_NO_CHAT = "must be null: this slot makes no chat call, so no model applies"


class SlotModels(_Request):
    """`config.models.<slot>`: per-request model overrides (unknown slots are refused). An
    override that would change nothing is refused too, rather than silently ignored."""

    retriever: Annotated[None, _no_override("retriever")] = Field(None, description=_NO_CHAT)
    injector: Annotated[None, _no_override("injector")] = Field(None, description=_NO_CHAT)
    actor: ModelName | None = Field(None, description="only with config.actor.mode 'generate'")
    extractor: ModelName | None = None
    judge: ModelName | None = None
    historian: ModelName | None = None

    def as_dict(self) -> dict[str, str]:
        return {slot: m for slot in SLOT_NAMES if (m := getattr(self, slot)) is not None}


class ActorConfig(_Request):
    mode: Literal["recorded", "generate"] = Field(
        "recorded",
        description="recorded: the turn's messages are final; generate: the actor writes the reply",
    )
    speaker: Name | None = Field(None, description="who the actor plays (generate)")
    max_words: JsonInt = Field(80, ge=5, le=1000)


#: JSON Schema for TurnConfig's one cross-field rule (the model validator below enforces it).
_ACTOR_MODEL_RULE: dict[str, Any] = {
    "if": {
        "required": ["actor"],
        "properties": {
            "actor": {"required": ["mode"], "properties": {"mode": {"const": "generate"}}}
        },
    },
    "then": {},
    "else": {"properties": {"models": {"properties": {"actor": {"type": "null"}}}}},
}


class TurnConfig(_Request):
    """`config`. One rule spans two fields: `models.actor` needs `actor.mode` "generate"."""

    model_config = ConfigDict(json_schema_extra=_ACTOR_MODEL_RULE)

    db: DbConfig | None = None
    models: SlotModels = Field(default_factory=SlotModels)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    token_budget: JsonInt = Field(
        1024, ge=64, le=32_768, description="tokens for the injection_packet"
    )
    recall_k: JsonInt = Field(5, ge=0, le=50, description="earlier turns recalled by hybrid search")
    require_actions: bool = Field(
        True, description="commit gate: block turns with no relation action"
    )

    @model_validator(mode="after")
    def _actor_model_needs_generate(self) -> Self:
        if self.models.actor is not None and self.actor.mode != "generate":
            raise ValueError(
                "config.models.actor cannot apply: config.actor.mode is 'recorded' (the turn's messages are "
                "final, no model is called); remove it or set config.actor.mode to 'generate'"
            )
        return self


class TurnCommitRequest(_Request):
    """`POST /api/kg-sidecar/turn/commit`: one turn of a conversation.

    `messages` are this turn's new messages (oldest first); `window` is the chat before them,
    context only. The idempotency key is `conversation_id:turn_id`; the payload it guards is
    `messages` plus `config.actor` (model choices and budgets may change between retries).
    """

    conversation_id: ConversationId
    turn_id: TurnId
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    window: list[ChatMessage] = Field(default_factory=list, max_length=MAX_MESSAGES)
    config: TurnConfig = Field(default_factory=TurnConfig)
    transcript: bool = Field(
        False,
        description="the messages were said earlier (a chat log ingested or replayed turn by "
        "turn): a message without a time stays undated instead of dated when committed, and "
        "the days it names through the day said ('yesterday') name none",
    )

    @property
    def turn(self) -> str:
        return str(self.turn_id)

    @property
    def key(self) -> str:
        return turn_key(self.conversation_id, self.turn)

    def ids(self) -> dict[str, str]:
        """Key, conversation id and turn id, as TurnResult and the graph's TurnWrite name them."""
        return {"key": self.key, "conversation_id": self.conversation_id, "turn_id": self.turn}

    def payload_canonical(self, as_conversation: str | None = None) -> str:
        """What the idempotency check compares (canonical JSON). `as_conversation`: the id to
        hash it with instead (a turn of a renamed conversation was hashed with its old id)."""
        data = {
            "conversation_id": as_conversation or self.conversation_id,
            "turn_id": self.turn,
            "messages": [m.model_dump(mode="json") for m in self.messages],
            "actor": self.config.actor.model_dump(mode="json"),
        }
        return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# --- Results (their parts: tasks.dialogue.parts) ---------------------------------------------


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

    @computed_field(
        description="the commit gate held the turn back only because it holds no relation action: "
        "its text is remembered, nothing new reached the graph (state stays ROLLED_BACK, code "
        "ROLLED_BACK, as before); front ends show it as `nothing new`, not as a failure"
    )
    def nothing_new(self) -> bool:
        return not self.committed and self.gate is not None and self.gate.nothing_new

    @classmethod
    def invalid(
        cls,
        reason: str,
        *,
        key: str | None = None,
        kind: InvalidKind = "malformed",
    ) -> TurnResult:
        return cls(
            ok=False,
            state=TurnState.RECEIVED,
            code="INVALID_REQUEST",
            error_kind=kind,
            reason=reason,
            key=key,
        )


M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
#: What a pattern means, for the one-line reason (the pattern itself is in the schema).
_PATTERN_RULES = {
    NAME_PATTERN: "must hold a visible character and no control character",
    TOKEN_PATTERN: "must hold no whitespace and no control character",
    BOLT_URI_PATTERN: "must be a bolt:// or neo4j:// URI (+s or +ssc allowed): a host and an optional port",
}


def validation_reason(exc: ValidationError) -> str:
    """One line naming the first bad field (and how many more there are). A secret's value is
    never shown."""
    problem = first_problem(exc, "request", skip="function-")  # validator names are no fields
    msg = problem.message.removeprefix("Value error, ")
    if problem.type == "string_pattern_mismatch":
        msg = _PATTERN_RULES.get(str((problem.detail.get("ctx") or {}).get("pattern")), msg)
    shown = "" if "password" in problem.place.split(".") else problem.got()
    return f"invalid request field {problem.place}: {msg}{shown}{problem.and_more()}"


def parse_model(model: type[M], raw: bytes | str | dict[str, Any]) -> Result[M, InvalidKind]:
    """Ok(the validated `model`), or Err(a one-line reason, the kind of problem)."""
    if isinstance(raw, bytes | bytearray):
        if len(raw) > MAX_BODY_BYTES:
            return Err(
                f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}", "too_large"
            )
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return Err(f"request body is not valid UTF-8 (byte {exc.start})", "malformed")
    try:
        if isinstance(raw, str):
            return Ok(model.model_validate_json(raw))
        return Ok(model.model_validate(raw))
    except ValidationError as exc:
        if is_invalid_json(exc):
            return Err(
                f"request body is not valid JSON: {first_problem(exc, 'request').message}",
                "malformed",
            )
        return Err(validation_reason(exc), "malformed")


def parse_or_invalid(
    model: type[M], raw: bytes | str | dict[str, Any], invalid: Callable[..., R]
) -> M | R:
    """The validated `model`, or `invalid(reason, kind=...)`: the caller's result type saying
    INVALID_REQUEST with a one-line reason."""
    parsed = parse_model(model, raw)
    return parsed.value if isinstance(parsed, Ok) else invalid(parsed.reason, kind=parsed.kind)


def parse_request(raw: bytes | str | dict[str, Any]) -> TurnCommitRequest | TurnResult:
    """A validated request, or an INVALID_REQUEST result with a one-line reason."""
    return parse_or_invalid(TurnCommitRequest, raw, TurnResult.invalid)


# --- Memory before the reply, rewinds ----------------------------------------------------------


class PendingTurn(_Request):
    """A turn the front end is still writing (a queued commit, replace or rewind): what its
    memory will say once the write lands."""

    turn_id: TurnId
    # Not MAX_MESSAGE_CHARS: a turn's text is all its messages, and the body's limit bounds it.
    text: str | None = Field(
        None,
        max_length=MAX_BODY_BYTES,
        description="the turn's text as memory will hold it (`speaker: content` lines, the `text` of "
        "GET .../turns); null: the turn is being removed (a delete, or a swipe being generated), or "
        "its text is not sent (too long for the body): memory recalls none of its text until its "
        "write lands",
    )


class MemoryQueryRequest(_Request):
    """`POST /api/kg-sidecar/memory/query`: a turn commit's body without `turn_id`: the PENDING
    messages (the user's message the model has not answered yet). Nothing is written.

    `pending_turns`: turns with writes still queued at the front end. A remembered turn listed
    there is recalled only if its remembered text is the `text` given (so a query during a
    pending edit never injects the turn's old text), and the milestones and relations it
    started are left out until its write lands."""

    conversation_id: ConversationId
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    window: list[ChatMessage] = Field(default_factory=list, max_length=MAX_MESSAGES)
    config: TurnConfig = Field(default_factory=TurnConfig)
    pending_turns: list[PendingTurn] = Field(default_factory=list, max_length=MAX_MESSAGES)

    def stale_turns(self) -> dict[str, str | None]:
        """turn id -> the text memory will hold (None: removed)."""
        return {str(p.turn_id): p.text for p in self.pending_turns}

    @classmethod
    def parse(cls, raw: bytes | str | dict[str, Any]) -> MemoryQueryRequest | MemoryQueryResult:
        return parse_or_invalid(cls, raw, MemoryQueryResult.invalid)


class RecalledTurnOut(BaseModel):
    key: str
    turn_id: str
    seq: int
    speaker: str
    text: str
    when: str = ""
    event_dates: list[str] = Field(
        default_factory=list,
        description="what the time expressions in the text mean, "
        'resolved against `when`: "yesterday = Sunday 7 May 2023"',
    )
    facts: list[str] = Field(default_factory=list)
    source_refs: list[str] = Field(default_factory=list)
    committed: bool = False
    score: float


class MemoryQueryResult(BaseModel):
    ok: bool
    code: Literal["INVALID_REQUEST", "UNAVAILABLE"] | None = None
    error_kind: ErrorKind | None = None
    reason: str | None = None
    retryable: bool = False
    conversation_id: str | None = None
    injection_packet: InjectionPacket | None = None
    recalled: list[RecalledTurnOut] = Field(default_factory=list)
    stored_turns: int = 0
    held_back: list[str] = Field(
        default_factory=list,
        description="turn ids whose remembered text was not recalled: a pending write "
        "changes it (see `pending_turns`)",
    )
    elapsed_ms: float = 0.0

    @classmethod
    def invalid(cls, reason: str, *, kind: InvalidKind = "malformed") -> MemoryQueryResult:
        return cls(ok=False, code="INVALID_REQUEST", error_kind=kind, reason=reason)


class RewindRequest(_Request):
    """`POST /api/kg-sidecar/conversation/rewind`: remove turn `before_turn` and every later one."""

    conversation_id: ConversationId
    before_turn: TurnId

    @property
    def key(self) -> str:
        return turn_key(self.conversation_id, str(self.before_turn))


class _ConversationCallResult(BaseModel):
    """The answer to a call on a whole conversation (a rewind, a forget): how it went."""

    ok: bool
    code: ErrorCode | None = None
    error_kind: ErrorKind | None = None
    reason: str | None = None
    retryable: bool = False
    conversation_id: str


class RewindResult(_ConversationCallResult):
    """What a rewind removed."""

    before_turn: str
    found: bool = Field(False, description="the turn was remembered (False: nothing to rewind)")
    removed_turns: list[str] = Field(
        default_factory=list, description="turn ids whose facts were removed"
    )
    removed_memory: int = Field(
        0, description="remembered turns removed (committed or gate-blocked)"
    )
    replayed_turns: int = Field(
        0, description="earlier committed turns re-applied to rebuild the facts"
    )


class ForgetRequest(_Request):
    """`POST /api/kg-sidecar/conversation/forget`: remove everything memory holds of a
    conversation (the chat was deleted)."""

    conversation_id: ConversationId


class ForgetResult(_ConversationCallResult):
    """What forgetting a conversation removed."""

    found: bool = Field(
        False, description="memory held the conversation (False: nothing to forget)"
    )
    removed: ConversationContents = Field(default_factory=ConversationContents)


class _CarryRequest(_Request):
    conversation_id: ConversationId
    #: The id it goes to (the same id: nothing to carry).
    new_conversation_id: ConversationId


class RenameRequest(_CarryRequest):
    """`POST /api/kg-sidecar/conversation/rename`: move everything memory holds of a
    conversation to another id (the chat was renamed)."""


class CopyRequest(_CarryRequest):
    """`POST /api/kg-sidecar/conversation/copy`: copy everything memory holds of a
    conversation to another id (the chat was branched), leaving it as it was."""


class _CarryResult(_ConversationCallResult):
    new_conversation_id: str
    found: bool = Field(
        False,
        description="memory held the conversation and it was carried over (False: nothing to "
        "carry over, or the same id)",
    )


class RenameResult(_CarryResult):
    """What renaming a conversation moved."""

    moved: ConversationContents = Field(default_factory=ConversationContents)


class CopyResult(_CarryResult):
    """What copying a conversation copied."""

    copied: ConversationContents = Field(default_factory=ConversationContents)


class ImportTurn(_Request):
    """One turn of a chat's history: its messages, as a commit would send them, and the session
    it belongs to when the history is divided into sessions."""

    turn_id: TurnId
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    session: Name | None = Field(
        None,
        description="the session of the chat the turn belongs to ('3', 'the first evening'): "
        "recall takes the turns of one session as one exchange, as `flows.dialogue ingest` "
        "takes a recorded dialogue's sessions; without it, the turns said on one day",
    )


class ImportRequest(_Request):
    """`POST /api/kg-sidecar/conversation/import`: turns of a chat's history remembered in bulk,
    as text (no LLM slot runs: no facts, as `flows.dialogue ingest` does with a chat's file),
    appended in the order given after what memory holds. A turn memory holds already is left
    as it is; a turn id given twice is imported once."""

    conversation_id: ConversationId
    turns: list[ImportTurn] = Field(min_length=1, max_length=MAX_MESSAGES)


class ImportResult(_ConversationCallResult):
    """What an import remembered."""

    added: list[str] = Field(
        default_factory=list, description="turn ids remembered by this call, in order"
    )
    already: list[str] = Field(
        default_factory=list,
        description="turn ids memory held already (left as they were: GET .../turns gives "
        "their text)",
    )


#: A call on a whole conversation (a rewind, a forget, a rename, a copy, an import), and its answer.
CallRequest = TypeVar(
    "CallRequest", RewindRequest, ForgetRequest, RenameRequest, CopyRequest, ImportRequest
)
CallResult = TypeVar(
    "CallResult", RewindResult, ForgetResult, RenameResult, CopyResult, ImportResult
)


def refused_call(
    result: type[CallResult], reason: str, kind: InvalidKind, ids: dict[str, Any] | None = None
) -> CallResult:
    """The INVALID_REQUEST answer of a call on a conversation, naming what the request named."""
    named = {
        name: str((ids or {}).get(name, ""))
        for name in ("conversation_id", "before_turn", "new_conversation_id")
    }
    return result.model_validate(
        {
            "ok": False,
            "code": "INVALID_REQUEST",
            "error_kind": kind,
            "reason": reason,
            **{name: value for name, value in named.items() if name in result.model_fields},
        }
    )


def _parse_call(
    request: type[CallRequest], result: type[CallResult], raw: bytes | str | dict[str, Any]
) -> CallRequest | CallResult:
    parsed = parse_model(request, raw)
    if isinstance(parsed, Ok):
        return parsed.value
    return refused_call(result, parsed.reason, parsed.kind, raw if isinstance(raw, dict) else None)


def parse_forget(raw: bytes | str | dict[str, Any]) -> ForgetRequest | ForgetResult:
    """A validated forget request, or an INVALID_REQUEST result with a one-line reason."""
    return _parse_call(ForgetRequest, ForgetResult, raw)


def parse_rename(raw: bytes | str | dict[str, Any]) -> RenameRequest | RenameResult:
    """A validated rename request, or an INVALID_REQUEST result with a one-line reason."""
    return _parse_call(RenameRequest, RenameResult, raw)


def parse_copy(raw: bytes | str | dict[str, Any]) -> CopyRequest | CopyResult:
    """A validated copy request, or an INVALID_REQUEST result with a one-line reason."""
    return _parse_call(CopyRequest, CopyResult, raw)


def parse_rewind(raw: bytes | str | dict[str, Any]) -> RewindRequest | RewindResult:
    """A validated rewind request, or an INVALID_REQUEST result with a one-line reason."""
    return _parse_call(RewindRequest, RewindResult, raw)


def parse_import(raw: bytes | str | dict[str, Any]) -> ImportRequest | ImportResult:
    """A validated import request, or an INVALID_REQUEST result with a one-line reason."""
    return _parse_call(ImportRequest, ImportResult, raw)
