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


def _status_error(cls: type[openai.APIStatusError], status: int, message: str = "boom", code: str | None = None
                  ) -> openai.APIStatusError:
    body = {"message": message, "code": code}
    return cls(message, response=httpx.Response(status, request=_REQUEST), body=body)


# --- timeouts: a type, never a message -------------------------------------------------------


@pytest.mark.parametrize("exc", [
    LLMTimeoutError("LLM endpoint x unavailable after 3 attempts: request timed out"),
    TurnTimeoutError("turn c:1 passed its 300s deadline before COMMITTING"),
    TimeoutError(),
    openai.APITimeoutError(request=_REQUEST),
], ids=["llm", "turn-deadline", "builtin", "openai"])
def test_a_timeout_is_a_timeout(exc: BaseException) -> None:
    assert classify(exc).kind == "timeout"
    assert classify(exc).retryable


@pytest.mark.parametrize("exc", [
    ValueError("the request timed out"),
    LLMUnavailableError("LLM endpoint x unavailable: the upstream said 'timed out' once"),
    LLMBadOutputError("LLM returned invalid output: field 'timed out' missing"),
    RuntimeError("deadline passed"),
], ids=["value-error", "unavailable", "bad-output", "runtime-error"])
def test_timed_out_in_a_message_is_not_a_timeout(exc: BaseException) -> None:
    assert classify(exc).kind != "timeout"


def test_a_turn_deadline_is_not_retried_automatically_but_an_llm_timeout_is() -> None:
    # The same turn would run as long again; a timed-out request may well answer next time.
    assert classify(TurnTimeoutError("deadline")) == Failure("timeout", retryable=True, transient=False)
    assert classify(LLMTimeoutError("timed out")) == Failure("timeout", retryable=True, transient=True)


# --- the LLM ------------------------------------------------------------------------------------


def test_llm_failures() -> None:
    assert classify(LLMUnavailableError("down")) == Failure("llm", retryable=True, transient=True)
    assert classify(LLMFatalError("HTTP 401")) == Failure("llm", retryable=False, transient=False)
    # Bad output: the gateway retried it with feedback already, so no automatic retry; a client
    # sending the turn again may get a different answer, so it stays retryable for the client.
    assert classify(LLMBadOutputError("bad json")) == Failure("llm", retryable=True, transient=False)
    assert classify(EmbeddedLLMError("llama-server not ready")) == Failure("llm", retryable=True, transient=False)
    # An LLM timeout is still an unavailable LLM for whoever catches that.
    assert isinstance(LLMTimeoutError("x"), LLMUnavailableError)


@pytest.mark.parametrize(("exc", "kind"), [
    (_status_error(openai.InternalServerError, 500), "transient"),
    (_status_error(openai.InternalServerError, 500, "input is too large to process"), "fatal"),
    (_status_error(openai.RateLimitError, 429), "rate_limited"),
    (_status_error(openai.RateLimitError, 429, code="insufficient_quota"), "fatal"),
    (_status_error(openai.AuthenticationError, 401), "fatal"),
    (_status_error(openai.ConflictError, 409), "transient"),
    (openai.APIConnectionError(request=_REQUEST), "transient"),
], ids=["500", "500-too-large", "429", "429-quota", "401", "409", "connection"])
def test_openai_errors_follow_the_gateways_mapping(exc: openai.OpenAIError, kind: str) -> None:
    assert llm_retry_kind(exc) == kind
    failure = classify(exc)
    assert failure.kind == "llm"
    assert failure.retryable is failure.transient is (kind != "fatal")


# --- the graph ----------------------------------------------------------------------------------


def test_graph_failures() -> None:
    assert classify(GraphUnavailableError("unreachable")) == Failure("graph", retryable=True, transient=True)
    assert classify(GraphOwnerGoneError("owner exited")) == Failure("graph", retryable=True, transient=True)
    assert classify(GraphWriteError("rolled back")) == Failure("graph", retryable=True, transient=False)
    assert classify(GraphQueryError("read failed")) == Failure("graph", retryable=True, transient=False)
    assert isinstance(GraphQueryError("x"), GraphReadError)
    assert classify(RewindRefusedError("no stored write")).kind == "graph"
    assert classify(EmbeddedGraphError("arcadedb did not start")) == Failure("graph", retryable=True, transient=False)


def test_neo4j_driver_errors() -> None:
    assert classify(nx.ServiceUnavailable("gone")) == Failure("graph", retryable=True, transient=True)
    assert classify(nx.SessionExpired("gone")) == Failure("graph", retryable=True, transient=True)
    # A statement the server refuses is the product's bug, the same every time.
    assert classify(nx.CypherSyntaxError("bad")) == Failure("internal", retryable=False, transient=False)


# --- input, and what nobody expected --------------------------------------------------------------


class _Sheet(BaseModel):
    name: str
    age: int


def _invalid(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Sheet.model_validate(data)
    return caught.value


def test_invalid_input() -> None:
    for exc in (InvalidInputError("bad flag"), ConfigError("bad setting"), _invalid({"name": "A"})):
        assert classify(exc) == Failure("invalid", retryable=False, transient=False)
    # The sidecar validated the request before the turn began: invalid input in one is ours.
    assert failed_kind(classify(InvalidInputError("x"))) == "internal"
    assert failed_kind(classify(LLMTimeoutError("x"))) == "timeout"


def test_the_unexpected_is_internal() -> None:
    assert classify(ContentIntegrityError("sha mismatch")) == Failure("internal", retryable=False, transient=False)
    assert classify(KeyError("x")) == Failure("internal", retryable=False, transient=False)
    # A bare connection failure is unexpected (our clients wrap theirs) but may pass.
    assert classify(ConnectionRefusedError()) == Failure("internal", retryable=True, transient=True)


# --- Prefect's retry condition ------------------------------------------------------------------


@pytest.mark.parametrize(("exc", "retried"), [
    (LLMUnavailableError("down"), True),
    (LLMTimeoutError("timed out"), True),
    (GraphUnavailableError("unreachable"), True),
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (LLMBadOutputError("bad json"), False),
    (GraphWriteError("rolled back"), False),
    (LLMFatalError("HTTP 401"), False),
    (ValueError("the request timed out"), False),
], ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value))
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
