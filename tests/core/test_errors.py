"""core.errors: `classify` for every kind of failure the product meets (each true case beside the
look-alike that must not be taken for it), the Ok/Err results, the one formatter of pydantic
errors, and Prefect's retry condition reading `classify`."""

from __future__ import annotations

import httpx
import neo4j.exceptions as nx
import openai
import pytest
from prefect.states import Completed, Failed
from pydantic import BaseModel, ValidationError

from core.errors import (
    ConfigError,
    ContentIntegrityError,
    EmbeddedGraphError,
    EmbeddedLLMError,
    Err,
    Failure,
    GraphOwnerGoneError,
    GraphReadError,
    GraphUnavailableError,
    GraphWriteError,
    InvalidInputError,
    LLMBadOutputError,
    LLMFatalError,
    LLMTimeoutError,
    LLMUnavailableError,
    Ok,
    classify,
    first_problem,
    llm_retry_kind,
)
from kg.dialogue import RewindRefusedError
from kg.errors import GraphQueryError
from tasks.dialogue.models import failed_kind
from tasks.dialogue.slots import TurnTimeoutError
from tasks.policy import retry_transient_only

_REQUEST = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def _status_error(
    cls: type[openai.APIStatusError], status: int, message: str = "boom", code: str | None = None
) -> openai.APIStatusError:
    body = {"message": message, "code": code}
    return cls(message, response=httpx.Response(status, request=_REQUEST), body=body)


# --- timeouts: a type, never a message -------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        LLMTimeoutError("LLM endpoint x unavailable after 3 attempts: request timed out"),
        TurnTimeoutError("turn c:1 passed its 300s deadline before COMMITTING"),
        TimeoutError(),
        openai.APITimeoutError(request=_REQUEST),
    ],
    ids=["llm", "turn-deadline", "builtin", "openai"],
)
def test_a_timeout_is_a_timeout(exc: BaseException) -> None:
    assert classify(exc).kind == "timeout"
    assert classify(exc).retryable


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("the request timed out"),
        LLMUnavailableError("LLM endpoint x unavailable: the upstream said 'timed out' once"),
        LLMBadOutputError("LLM returned invalid output: field 'timed out' missing"),
        RuntimeError("deadline passed"),
    ],
    ids=["value-error", "unavailable", "bad-output", "runtime-error"],
)
def test_timed_out_in_a_message_is_not_a_timeout(exc: BaseException) -> None:
    assert classify(exc).kind != "timeout"


# --- every kind, as the product meets it ------------------------------------------------------

_TIMEOUT_AGAIN = Failure("timeout", retryable=True, transient=True)
_LLM_AGAIN, _LLM_LATER = Failure("llm", True, True), Failure("llm", True, False)
_GRAPH_AGAIN, _GRAPH_LATER = Failure("graph", True, True), Failure("graph", True, False)
_INVALID, _INTERNAL = Failure("invalid", False, False), Failure("internal", False, False)


class _Sheet(BaseModel):
    name: str
    age: int


def _invalid(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Sheet.model_validate(data)
    return caught.value


@pytest.mark.parametrize(
    ("exc", "failure"),
    [
        # A timed-out request may answer next time, but the gateway's attempts each waited the
        # whole timeout already; the same turn would run as long again.
        (LLMTimeoutError("timed out"), Failure("timeout", retryable=True, transient=False)),
        (TurnTimeoutError("deadline"), Failure("timeout", retryable=True, transient=False)),
        (LLMUnavailableError("down"), _LLM_AGAIN),
        (LLMFatalError("HTTP 401"), Failure("llm", retryable=False, transient=False)),
        # Bad output: the gateway retried it with feedback already, so no automatic retry; a client
        # sending the turn again may get a different answer, so it stays retryable for the client.
        (LLMBadOutputError("bad json"), _LLM_LATER),
        (EmbeddedLLMError("llama-server not ready"), _LLM_LATER),
        (GraphUnavailableError("unreachable"), _GRAPH_AGAIN),
        (GraphOwnerGoneError("owner exited"), _GRAPH_AGAIN),
        (GraphWriteError("rolled back"), _GRAPH_LATER),
        (GraphQueryError("read failed"), _GRAPH_LATER),
        (RewindRefusedError("no stored write"), _GRAPH_LATER),
        (EmbeddedGraphError("arcadedb did not start"), _GRAPH_LATER),
        (nx.ServiceUnavailable("gone"), _GRAPH_AGAIN),
        (nx.SessionExpired("gone"), _GRAPH_AGAIN),
        (nx.CypherSyntaxError("bad"), _INTERNAL),  # the server refuses the statement: our bug
        (InvalidInputError("bad flag"), _INVALID),
        (ConfigError("bad setting"), _INVALID),
        (_invalid({"name": "A"}), _INVALID),
        (ContentIntegrityError("sha mismatch"), _INTERNAL),
        (KeyError("x"), _INTERNAL),
        (TimeoutError(), _TIMEOUT_AGAIN),  # a bare timeout: nobody waited it out yet
        # A bare connection failure is unexpected (our clients wrap theirs) but may pass.
        (ConnectionRefusedError(), Failure("internal", retryable=True, transient=True)),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_classify(exc: BaseException, failure: Failure) -> None:
    assert classify(exc) == failure


def test_an_llm_timeout_is_still_an_unavailable_llm_for_whoever_catches_that() -> None:
    assert isinstance(LLMTimeoutError("x"), LLMUnavailableError)
    assert isinstance(GraphQueryError("x"), GraphReadError)


def test_the_sidecar_calls_invalid_input_inside_a_turn_internal() -> None:
    # The request was validated before the turn began: invalid input in one is the product's.
    assert failed_kind(classify(InvalidInputError("x"))) == "internal"
    assert failed_kind(classify(LLMTimeoutError("x"))) == "timeout"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_status_error(openai.InternalServerError, 500), "transient"),
        (_status_error(openai.InternalServerError, 500, "input is too large to process"), "fatal"),
        (_status_error(openai.RateLimitError, 429), "rate_limited"),
        (_status_error(openai.RateLimitError, 429, code="insufficient_quota"), "fatal"),
        (_status_error(openai.AuthenticationError, 401), "fatal"),
        (_status_error(openai.ConflictError, 409), "transient"),
        (openai.APIConnectionError(request=_REQUEST), "transient"),
    ],
    ids=["500", "500-too-large", "429", "429-quota", "401", "409", "connection"],
)
def test_openai_errors_follow_the_gateways_mapping(exc: openai.OpenAIError, kind: str) -> None:
    assert llm_retry_kind(exc) == kind
    failure = classify(exc)
    assert failure.kind == "llm"
    assert failure.retryable is failure.transient is (kind != "fatal")


# --- Prefect's retry condition ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (LLMUnavailableError("down"), True),
        (LLMTimeoutError("timed out"), False),  # each of the gateway's attempts waited it out
        (GraphUnavailableError("unreachable"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (LLMBadOutputError("bad json"), False),
        (GraphWriteError("rolled back"), False),
        (LLMFatalError("HTTP 401"), False),
        (ValueError("the request timed out"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_prefect_retries_only_transient_failures(exc: BaseException, retried: bool) -> None:
    assert retry_transient_only(None, None, Failed(data=exc)) is retried


def test_prefect_does_not_retry_a_success() -> None:
    assert retry_transient_only(None, None, Completed(data=1)) is False


# --- results and the formatter ------------------------------------------------------------------


def test_ok_and_err_are_frozen_values_a_match_tells_apart() -> None:
    def describe(result: Ok[int] | Err[str]) -> str:
        match result:
            case Ok(value):
                return f"ok {value}"
            case Err(reason, kind):
                return f"{kind}: {reason}"
        return "neither"

    assert describe(Ok(3)) == "ok 3"
    assert describe(Err("too big", "too_large")) == "too_large: too big"
    assert Ok(3) == Ok(3) and Ok(3) != Err("3", "x")
    with pytest.raises(AttributeError):
        Ok(3).value = 4  # type: ignore[misc]


def test_first_problem_names_the_place_and_counts_the_rest() -> None:
    problem = first_problem(_invalid({"name": "A", "age": "old"}), "sheet")
    assert (problem.place, problem.type, problem.more) == ("age", "int_parsing", 0)
    assert problem.got() == " (got 'old')" and problem.and_more() == ""
    missing = first_problem(_invalid({}), "sheet")
    assert (missing.place, missing.type, missing.more) == ("name", "missing", 1)
    assert missing.got() == "" and missing.and_more() == "; and 1 more problem(s)"
    assert missing.and_more("") == "; and 1 more"
    whole = first_problem(_invalid("not a dict"), "sheet")
    assert whole.place == "sheet"
    assert first_problem(_invalid({"name": "A", "age": "x" * 100}), "sheet").got().endswith("...)")


def test_a_full_disk_is_found_behind_the_wrappers_and_nothing_else_is_taken_for_one() -> None:
    import errno

    from core.errors import disk_full

    full = OSError(errno.ENOSPC, "No space left on device", "/book/exports/codex.html")
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("Flow run encountered an exception") from exc
    except RuntimeError as wrapped:
        assert disk_full(wrapped) is full
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    try:
        try:
            raise quota
        except OSError:
            raise ValueError("while handling it") from None  # context kept, cause suppressed
    except ValueError as handled:
        assert disk_full(handled) is quota
    # The look-alikes: another OSError, and a message that only says so.
    assert disk_full(PermissionError(errno.EACCES, "Permission denied", "/book")) is None
    assert disk_full(OSError("[Errno 28] No space left on device")) is None
    assert disk_full(RuntimeError("No space left on device")) is None


def test_a_command_that_fills_the_disk_ends_in_one_line_and_other_failures_stay_loud(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import errno

    from core.cli import run_main

    def fills_the_disk(argv: object) -> int:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/book/chapters/chapter_003.md")
        except OSError as exc:
            raise RuntimeError("Flow run encountered an exception") from exc

    with pytest.raises(SystemExit) as exited:
        run_main(fills_the_disk, "novel", [])
    assert exited.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "novel: error: no space left on device writing /book/chapters/chapter_003.md: free some "
        "space on that disk, then run the same command again (what finished is kept; what was "
        "being written is written again)"
    ]

    def denied(argv: object) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", "/book")

    with pytest.raises(PermissionError):  # not a full disk: a traceback, as any bug
        run_main(denied, "novel", [])
