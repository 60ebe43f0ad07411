"""The project's exception hierarchy, the one place that classifies a failure, and the one
formatter of pydantic validation errors.

Every error a user can meet carries a one-line message that says what went wrong and
what to do; entry points print that line and exit non-zero (see core.cli).

`classify(exc) -> Failure` decides, for any exception the product meets (its own SkaldError
types, the `openai` client's, the `neo4j` driver's, TimeoutError and ConnectionError, pydantic's
ValidationError), what kind of failure it is and whether trying again can help. The sidecar's
turn and memory answers, the HTTP API's statuses, Prefect's retry condition and the LLM
gateway's own retry loop all read it; none matches words in a message. A failure whose kind
was once a message is a type here (an LLM request that timed out raises LLMTimeoutError). The
gateway's finer reading of an `openai` error (`llm_retry_kind`: transient, rate_limited, fatal)
is here too, so that `classify` and the gateway read one mapping: core.llm imports this module,
so the mapping could not stay in core.llm.failures without an import circle. Libraries are not
imported to classify (see `_foreign_failure`).

Functions that can fail in an expected way without raising return `Ok(value) | Err(reason)`
(frozen dataclasses; `match` or `isinstance` on them), so the caller cannot take the reason for
the value.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails


class SkaldError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message} ({hint})")


class ConfigError(SkaldError):
    """A setting is malformed or missing."""

    exit_code = 2


class InvalidInputError(SkaldError):
    """A command-line argument or request is invalid."""

    exit_code = 2


class ProjectBusyError(SkaldError):
    """Another process is writing this project (core.project_lock): try again after it ends."""

    exit_code = 3


class ContentIntegrityError(SkaldError):
    """A stored artifact does not match its recorded size or SHA-256."""


class GraphUnavailableError(SkaldError):
    """The graph database cannot be reached."""


class GraphOwnerGoneError(GraphUnavailableError):
    """The process that served the embedded graph exited while this one was using it."""


class GraphWriteError(SkaldError):
    """A graph transaction failed; nothing from it was kept."""


class GraphReadError(SkaldError):
    """A graph read failed (bad data or a server-side error)."""


class LLMError(SkaldError):
    """Base for LLM gateway failures."""


class LLMUnavailableError(LLMError):
    """Every candidate endpoint failed with transient errors until attempts ran out."""


class LLMTimeoutError(LLMUnavailableError):
    """As LLMUnavailableError, and the last attempt's request timed out."""


class LLMFatalError(LLMError):
    """A failure that retrying cannot fix (auth, unknown model, context too long)."""


class LLMBadOutputError(LLMError):
    """The model kept returning output that does not validate against the schema."""


class ExportError(SkaldError):
    """A book file (EPUB, DOCX) could not be made from the manuscript."""


class EmbeddedServiceError(SkaldError):
    """An embedded default service (graph or LLM) failed to start."""


class EmbeddedGraphError(EmbeddedServiceError):
    """The embedded graph server (ArcadeDB) failed to start."""


class EmbeddedLLMError(EmbeddedServiceError):
    """The embedded LLM server (llama-server) failed to start or is not installed."""


class DeadlineError(SkaldError):
    """Work ran past the deadline it was given (a turn, or one of its slots)."""


# --- What a failure is: one decision for the whole product ------------------------------------

FailureKind = Literal["timeout", "llm", "graph", "invalid", "internal"]
#: How the LLM gateway's retry loop treats an `openai` error: back off and retry; wait what a
#: 429's Retry-After asks; or raise at once (see core.llm.failures for the one-line errors).
LLMRetryKind = Literal["transient", "rate_limited", "fatal"]


class Failure(NamedTuple):
    """What went wrong, as every caller needs to know it.

    kind: what failed: a deadline passed (timeout), the LLM (llm), the graph (graph), the
        input or the configuration (invalid), or anything the product did not expect (internal).
    retryable: sending the same request again may succeed (what a sidecar answer and an HTTP
        error body say). An LLM that kept answering badly is retryable: the model may answer
        differently next time.
    transient: the cause passes by itself, so an automatic retry after a wait is worth it
        (Prefect's task retries, the gateway's backoff). Narrower than retryable: bad LLM output
        was already retried with feedback by the gateway, and a failed graph write is as likely
        to fail again as not, so neither is retried automatically.
    """

    kind: FailureKind
    retryable: bool
    transient: bool


_TOO_LARGE = re.compile(r"too large to process|exceeds the available context size", re.IGNORECASE)


def clip_line(text: str, limit: int = 240) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def api_detail(exc: BaseException) -> str:
    """An `openai` error's message from the server (the body's `message`), on one line."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return clip_line(body["message"])
    return clip_line(getattr(exc, "message", None) or str(exc))


def llm_retry_kind(exc: BaseException) -> LLMRetryKind:
    """How the gateway retries an `openai` error: transient (timeouts, connection errors, 5xx,
    408/409), rate_limited (429) or fatal (401/403/404/400, an exhausted quota, an input over
    llama-server's batch)."""
    import openai  # only the gateway meets these, and it has imported openai already

    if isinstance(exc, openai.RateLimitError):
        # An exhausted quota is also a 429, but waiting will not refill it.
        return "fatal" if exc.code == "insufficient_quota" else "rate_limited"
    if isinstance(exc, openai.APIStatusError) and _TOO_LARGE.search(api_detail(exc)):
        return "fatal"  # llama-server's HTTP 500 for an input over its batch: the same every time
    if isinstance(exc, openai.APIConnectionError | openai.InternalServerError):
        return "transient"  # APITimeoutError is an APIConnectionError
    if isinstance(exc, openai.APIStatusError):
        return "transient" if exc.status_code >= 500 or exc.status_code in (408, 409) else "fatal"
    if isinstance(exc, openai.APIResponseValidationError):
        return "transient"
    return "fatal"


_TIMEOUT = Failure("timeout", retryable=True, transient=True)
_INTERNAL = Failure("internal", retryable=False, transient=False)
_INVALID = Failure("invalid", retryable=False, transient=False)
# The project's own types, most specific first: the first that `exc` is an instance of decides.
_OWN: tuple[tuple[type[SkaldError], Failure], ...] = (
    # Retryable by whoever asked, but not automatically: the gateway has waited out the timeout
    # on each of its attempts already, and a task retried twice over would wait three times as
    # long (24 minutes on the defaults) before the one line that says to raise the timeout.
    (LLMTimeoutError, Failure("timeout", retryable=True, transient=False)),
    # A turn past its deadline would run as long again: not retried automatically.
    (DeadlineError, Failure("timeout", retryable=True, transient=False)),
    (LLMFatalError, Failure("llm", retryable=False, transient=False)),
    (LLMUnavailableError, Failure("llm", retryable=True, transient=True)),
    (LLMError, Failure("llm", retryable=True, transient=False)),  # bad output
    # A server that did not start may be up next time (the API has always answered it 503).
    (EmbeddedLLMError, Failure("llm", retryable=True, transient=False)),
    (EmbeddedGraphError, Failure("graph", retryable=True, transient=False)),
    (GraphUnavailableError, Failure("graph", retryable=True, transient=True)),
    (GraphWriteError, Failure("graph", retryable=True, transient=False)),
    (GraphReadError, Failure("graph", retryable=True, transient=False)),
    (ConfigError, _INVALID),
    (InvalidInputError, _INVALID),
)


def classify(exc: BaseException) -> Failure:
    """The kind of failure `exc` is and whether trying again can help (see Failure)."""
    if isinstance(exc, SkaldError):
        return next((failure for kind, failure in _OWN if isinstance(exc, kind)), _INTERNAL)
    foreign = _foreign_failure(exc)
    if foreign is not None:
        return foreign
    if isinstance(exc, TimeoutError):
        return _TIMEOUT
    if isinstance(exc, ConnectionError):
        # A client that names neither service (the gateway and the graph store wrap their own):
        # unexpected here, but the next attempt may well connect.
        return Failure("internal", retryable=True, transient=True)
    return _INTERNAL


def _foreign_failure(exc: BaseException) -> Failure | None:
    """A library's exception: an instance of a library's type exists only once that library is
    imported, so only the libraries already in `sys.modules` are asked (none is imported here)."""
    openai = sys.modules.get("openai")
    if openai is not None and isinstance(exc, openai.OpenAIError):
        if isinstance(exc, openai.APITimeoutError):
            return _TIMEOUT
        again = llm_retry_kind(exc) != "fatal"
        return Failure("llm", retryable=again, transient=again)
    neo4j = sys.modules.get("neo4j.exceptions")
    if neo4j is not None and isinstance(exc, neo4j.Neo4jError | neo4j.DriverError):
        if isinstance(exc, neo4j.ServiceUnavailable | neo4j.SessionExpired | neo4j.TransientError):
            return Failure("graph", retryable=True, transient=True)
        if isinstance(exc, neo4j.ClientError):
            return _INTERNAL  # the statement itself is wrong: a bug, the same every time
        return Failure("graph", retryable=True, transient=False)
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        return _INVALID
    return None


#: A full disk or an exhausted quota: the machine's state, not the input's or the code's.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(exc: BaseException) -> OSError | None:
    """The full disk (or exhausted quota) behind `exc`: itself, or what it was raised from or
    while handling (Prefect and our own wrappers keep it there); None when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL:
            return current
        current = current.__cause__ or current.__context__
    return None


def disk_full_line(full: OSError) -> str:
    """What a command says when the disk filled: what, where, and that nothing is lost."""
    where = f" writing {full.filename}" if full.filename else ""
    return (
        f"{os.strerror(full.errno or errno.ENOSPC).lower()}{where}: free some space on that "
        "disk, then run the same command again (what finished is kept; what was being written "
        "is written again)"
    )


# --- Results: an expected failure as a value ---------------------------------------------------

T = TypeVar("T")
K = TypeVar("K", bound=str)


@dataclass(frozen=True, slots=True)
class Ok(Generic[T]):
    """A function's value, where it could instead have returned an Err."""

    value: T


@dataclass(frozen=True, slots=True)
class Err(Generic[K]):
    """Why a function returned no value: a one-line `reason` and its `kind` (the finer code the
    caller answers with, e.g. the sidecar's error_kind)."""

    reason: str
    kind: K


Result: TypeAlias = Ok[T] | Err[K]


# --- Pydantic validation errors as one line ----------------------------------------------------


class ValidationProblem(NamedTuple):
    """The first problem of a pydantic ValidationError: the parts every one-line message about
    it is made of. Each message (a setting, a request field, a bible file's entry) words them
    its own way; these are what they all read."""

    place: str  # the dotted path (`characters.0.name`), or the root's name for the whole value
    message: str  # pydantic's msg
    type: str  # pydantic's error type: missing, extra_forbidden, string_pattern_mismatch, ...
    detail: ErrorDetails  # the whole error, for what only one message needs (loc, ctx)
    more: int  # how many problems follow it

    def got(self, limit: int = 60) -> str:
        """` (got 'value')` for a scalar input (cut at `limit` characters), "" otherwise or when
        the value is missing."""
        value = self.detail.get("input")
        if not isinstance(value, str | int | float | bool) or self.type == "missing":
            return ""
        text = repr(value)
        return f" (got {text[:limit]}{'...' if len(text) > limit else ''})"

    def and_more(self, unit: str = " problem(s)") -> str:
        """`; and N more problem(s)` (`unit` after "more") when other problems follow, else ""."""
        return f"; and {self.more} more{unit}" if self.more else ""


def error_location(error: ErrorDetails, root: str, *, skip: str | None = None) -> str:
    """A validation error's place as a dotted path (`characters.0.name`), or `root` when the
    error is about the whole value; parts starting with `skip` (validator names) are left out."""
    parts = [str(part) for part in error["loc"]]
    if skip is not None:
        parts = [part for part in parts if not part.startswith(skip)]
    return ".".join(parts) or root


class ErrorList(Protocol):
    """What a validation error is read through: pydantic's ValidationError, FastAPI's
    RequestValidationError (non-empty lists only: `errors()[0]` is the one shown)."""

    def errors(self) -> Sequence[Any]: ...


def first_problem(exc: ErrorList, root: str, *, skip: str | None = None) -> ValidationProblem:
    """The first of a validation error's problems, and how many follow it."""
    errors = exc.errors()
    first = errors[0]
    return ValidationProblem(
        error_location(first, root, skip=skip),
        str(first["msg"]),
        first["type"],
        first,
        len(errors) - 1,
    )


def is_invalid_json(exc: ErrorList) -> bool:
    """Whether a validation error says its input was not JSON at all (pydantic's json_invalid)."""
    return any(error["type"] == "json_invalid" for error in exc.errors())


def first_error(exc: ValidationError, root: str) -> tuple[str, str]:
    """The first of a validation error's problems as (dotted place, message)."""
    problem = first_problem(exc, root)
    return problem.place, problem.message
