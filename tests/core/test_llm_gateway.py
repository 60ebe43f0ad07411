"""LLMGateway behaviour against the scripted OpenAI-compatible server, over real HTTP."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import polars as pl
import pytest
from pydantic import BaseModel, Field, SecretStr

from core.errors import (
    LLMBadOutputError,
    LLMFatalError,
    LLMTimeoutError,
    LLMUnavailableError,
    classify,
)
from core.llm import (
    LOCAL_CHARS_PER_TOKEN,
    LOCAL_MAX_ITEMS,
    LOCAL_MAX_STRING_CHARS,
    LOCAL_MIN_STRING_CHARS,
    CallRecord,
    LLMGateway,
    RetryPolicy,
    bounded_response_format_for,
    repair_json,
    response_format_for,
    summarize_records,
)
from core.llm.failures import fatal_error, retry_after_s
from core.llm.records import CALL_RECORD_SCHEMA, CallStats, write_parquet
from core.llm.routing import Endpoint, Router, Target
from core.llm.sampling import request_seed
from core.llm_server import LOCAL_CHAT_ARGS, LOCAL_CHAT_MODEL, LOCAL_CHAT_SLOTS
from core.settings import RunLimits, Settings
from tests.conftest import REPO_ROOT
from tests.support.scripted_llm import ScriptedLLM, hashed_embedding, instance_from_schema

FAST = RetryPolicy(backoff_base_s=0.005, backoff_max_s=0.05)
PROMPT = [
    {"role": "system", "content": "You plan scenes."},
    {"role": "user", "content": "Plan the opening scene."},
]


class Tone(StrEnum):
    grim = "grim"
    hopeful = "hopeful"


class Beat(BaseModel):
    summary: str = Field(min_length=3)
    intensity: float = Field(ge=0.0, le=1.0)


class SceneCard(BaseModel):
    title: str
    tone: Tone
    beats: list[Beat] = Field(min_length=1)
    pov: str | None = None
    word_target: int = Field(ge=100, le=5000)


class Place(BaseModel):
    name: str
    kind: Tone | None = None
    children: list[Place] = Field(default_factory=list)  # recursive: the depth guard must stop


class World(BaseModel):
    places: list[Place]
    capital: Place | None
    weights: dict[str, float] = Field(default_factory=dict)
    rank: int = Field(gt=0, lt=10)


def _settings(
    server: ScriptedLLM, *, tiers: dict[str, Any] | None = None, **limits: Any
) -> Settings:
    values: dict[str, Any] = {
        "openai_base_url": server.base_url,
        "embedding_base_url": server.base_url,
        "limits": RunLimits(**limits),
    }
    if tiers is not None:
        values["tiers"] = tiers
    return Settings(**values)


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


@pytest.fixture
def server() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as scripted:
        yield scripted


# --------------------------------------------------------------------------- acceptance
def test_acceptance_100_structured_calls_under_30pct_transient_and_30pct_bad_json() -> None:
    with ScriptedLLM(timeout_sleep_s=1.5, retry_after="0.02") as server:
        server.fault_rates(
            {
                # 30% transient
                "http_500": 0.12,
                "timeout": 0.06,
                "http_429": 0.12,
                # 30% bad JSON
                "malformed_json": 0.10,
                "truncated_json": 0.10,
                "schema_invalid": 0.10,
            },
            seed=20240611,
        )
        # 60% of attempts fail, so the budget is the maximum RunLimits allows.
        settings = _settings(server, llm_max_attempts=20, llm_timeout_s=1.0)
        gateway = LLMGateway(settings, retry=FAST)
        started = time.perf_counter()
        results = [
            gateway.structured("medium", PROMPT, SceneCard, purpose=f"acceptance-{i}")
            for i in range(100)
        ]
        elapsed = time.perf_counter() - started

    assert len(results) == 100
    assert all(isinstance(r, SceneCard) for r in results)
    records = gateway.records
    assert [r.outcome for r in records] == ["ok"] * 100
    totals = {
        "attempts": sum(r.attempts for r in records),
        "retries_transient": sum(r.retries_transient for r in records),
        "retries_rate_limited": sum(r.retries_rate_limited for r in records),
        "retries_bad_output": sum(r.retries_bad_output for r in records),
    }
    print(
        f"\n[acceptance] 100 calls ok in {elapsed:.1f}s; {totals}; "
        f"faults injected by the server: {dict(server.faults_injected)}"
    )
    assert totals["retries_transient"] > 0
    assert totals["retries_rate_limited"] > 0
    assert totals["retries_bad_output"] > 0
    assert server.faults_injected["timeout"] > 0
    assert totals["attempts"] == server.request_count


# --------------------------------------------------------------------------- fatal errors
def test_http_401_is_fatal_at_once_with_one_line() -> None:
    with ScriptedLLM(require_api_key="sk-right") as server:
        settings = _settings(server).model_copy(update={"openai_api_key": SecretStr("sk-wrong")})
        gateway = LLMGateway(settings, retry=FAST)
        with pytest.raises(LLMFatalError) as caught:
            gateway.structured("large", PROMPT, SceneCard, purpose="plan")
        assert server.request_count == 1  # no retry
    message = _one_line(caught.value)
    assert "HTTP 401" in message and server.base_url in message and "OPENAI_API_KEY" in message
    assert gateway.records[-1].outcome == "fatal"
    assert gateway.records[-1].attempts == 1


def test_http_404_unknown_model_is_fatal(server: ScriptedLLM) -> None:
    server.fail_next("http_404_model")
    gateway = LLMGateway(_settings(server), retry=FAST)
    with pytest.raises(LLMFatalError) as caught:
        gateway.text("small", PROMPT, purpose="probe")
    assert server.request_count == 1
    message = _one_line(caught.value)
    assert "HTTP 404" in message and "gpt-4o-mini" in message


def test_unreachable_endpoint_is_unavailable_with_hint() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(
        openai_base_url=f"http://127.0.0.1:{port}/v1", limits=RunLimits(llm_max_attempts=2)
    )
    gateway = LLMGateway(settings, retry=FAST)
    with pytest.raises(LLMUnavailableError) as caught:
        gateway.structured("small", PROMPT, SceneCard)
    message = _one_line(caught.value)
    assert f"127.0.0.1:{port}" in message and "is the server running" in message
    assert gateway.records[-1].outcome == "unavailable"
    assert gateway.records[-1].retries_transient == 1


def test_a_request_that_timed_out_raises_the_timeout_type() -> None:
    # The server answers a "timeout" fault only after 2 s; the client gives up after 0.2 s.
    with ScriptedLLM(timeout_sleep_s=2.0) as server:
        gateway = LLMGateway(_settings(server, llm_max_attempts=1, llm_timeout_s=0.2), retry=FAST)
        server.fail_next("timeout")
        with pytest.raises(LLMTimeoutError) as caught:
            gateway.text("small", PROMPT, purpose="probe")
        assert classify(caught.value).kind == "timeout"
        # The server was running: the line says how long was waited and which setting gives more.
        assert "each attempt heard nothing from the model for 0.2 s" in str(caught.value)
        assert "SKALD_LIMITS__LLM_TIMEOUT_S" in str(caught.value)
        assert "is the server running" not in str(caught.value)
        # The look-alike: unavailable for another reason is no timeout.
        server.fail_next("http_500")
        with pytest.raises(LLMUnavailableError) as other:
            gateway.text("small", PROMPT, purpose="probe")
        assert not isinstance(other.value, LLMTimeoutError)
        assert classify(other.value).kind == "llm"
        assert "is the server running" in str(other.value)
        assert "LLM_TIMEOUT_S" not in str(other.value)


def test_a_model_that_keeps_talking_longer_than_the_timeout_is_not_cut_off_when_streamed() -> None:
    # A slow model: 20 pieces of content, 0.25 s apart (about 6 s in all), under a timeout of 3 s.
    with ScriptedLLM() as server:
        server.stream_gap_s, server.stream_pieces = 0.25, 20
        server.on(schema="SceneCard", respond=_CARD)
        streamed = LLMGateway(_settings(server, llm_max_attempts=1, llm_timeout_s=3.0), retry=FAST)
        card = streamed.structured("small", PROMPT, SceneCard)
        assert card == SceneCard.model_validate(_CARD)
        body = server.requests[-1].body
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        record = streamed.records[-1]
        assert (record.attempts, record.outcome) == (1, "ok")
        # The token counts come from the stream's last chunk, as a whole answer's do.
        assert (record.prompt_tokens, record.completion_tokens) == _usage_of_whole_answer(server)
        # The look-alike: the same model asked for a whole answer, which comes as late as the
        # stream's last chunk, times out.
        whole = LLMGateway(
            _settings(server, llm_max_attempts=1, llm_timeout_s=3.0, llm_stream=False), retry=FAST
        )
        with pytest.raises(LLMTimeoutError) as caught:
            whole.structured("small", PROMPT, SceneCard)
        assert "each attempt waited 3 s for a whole answer" in str(caught.value)
        assert "stream" not in server.requests[-1].body
        # Streamed or not, a request carries the same seed: the answer does not depend on it.
        assert server.requests[-1].body["seed"] == body["seed"]


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_stream_that_falls_silent_times_out_and_is_asked_again(caller: str) -> None:
    # The first chunk of content, then 30 s of silence: the client stops waiting after 0.5 s.
    with ScriptedLLM(timeout_sleep_s=30.0) as server:
        server.on(schema="SceneCard", respond=_CARD)
        server.fail_next("stream_stall")
        gateway = LLMGateway(_settings(server, llm_max_attempts=2, llm_timeout_s=0.5), retry=FAST)
        if caller == "sync":
            card = gateway.structured("small", PROMPT, SceneCard)
        else:
            card = asyncio.run(gateway.astructured("small", PROMPT, SceneCard))
        assert card == SceneCard.model_validate(_CARD)
        record = gateway.records[-1]
        assert (record.attempts, record.retries_transient, record.outcome) == (2, 1, "ok")
        assert server.faults_injected["stream_stall"] == 1
        # Every attempt silent: the timeout's own error and hint, not "is the server running?".
        server.fail_next("stream_stall", n=2)
        with pytest.raises(LLMTimeoutError) as caught:
            gateway.structured("small", PROMPT, SceneCard)
        assert "heard nothing from the model for 0.5 s" in str(caught.value)


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_a_stream_cut_before_its_finish_reason_is_asked_again_not_taken_as_the_answer(
    caller: str,
) -> None:
    # Prose has no schema to fail: a stream whose body ends properly after its first piece would
    # pass for a whole (short) scene.
    with ScriptedLLM() as server:
        server.stream_pieces = 4
        server.on(contains="Write the scene", respond="The storm broke over the lighthouse.")
        server.fail_next("stream_cut")
        gateway = LLMGateway(_settings(server, llm_max_attempts=2), retry=FAST)
        prompt = [{"role": "user", "content": "Write the scene."}]
        if caller == "sync":
            text = gateway.text("small", prompt)
        else:
            text = asyncio.run(gateway.atext("small", prompt))
        assert text == "The storm broke over the lighthouse."
        record = gateway.records[-1]
        assert (record.attempts, record.retries_transient, record.outcome) == (2, 1, "ok")
        assert server.faults_injected["stream_cut"] == 1
        # Cut on every attempt: the call fails, naming the cut and the setting for a server that
        # never sends a finish reason.
        server.fail_next("stream_cut", n=2)
        with pytest.raises(LLMUnavailableError) as caught:
            gateway.text("small", prompt)
        assert "ended without a finish reason" in str(caught.value)
        assert "llm_stream = false" in str(caught.value)
        # The look-alike: a whole stream, whose last chunk (the token counts) holds no choice at
        # all, is the answer at the first attempt.
        assert gateway.text("small", prompt) == "The storm broke over the lighthouse."
        assert gateway.records[-1].attempts == 1
        assert server.requests[-1].body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_streamed_answers_keep_their_connection_alive(caller: str) -> None:
    # The openai package's sync streams stop reading at [DONE], short of the body's end, and
    # closed that way a connection cannot be kept: each call would open a new one (a TCP and
    # TLS handshake against a remote API).
    with ScriptedLLM() as server:
        server.on(schema="SceneCard", respond=_CARD)
        gateway = LLMGateway(_settings(server), retry=FAST)

        async def five() -> None:
            for _ in range(5):
                await gateway.astructured("small", PROMPT, SceneCard)

        if caller == "sync":
            for _ in range(5):
                gateway.structured("small", PROMPT, SceneCard)
        else:
            asyncio.run(five())
        assert [r.body["stream"] for r in server.requests] == [True] * 5
        assert [r.outcome for r in gateway.records] == ["ok"] * 5
        assert server.connections == 1
        # The look-alike: a stream that stalls before [DONE] is closed as it is (its connection
        # lost), and the attempt after it, on a new connection, is answered.
        server.fail_next("stream_stall")
        stalled = LLMGateway(_settings(server, llm_max_attempts=2, llm_timeout_s=0.5), retry=FAST)
        stalled.structured("small", PROMPT, SceneCard)
        assert (stalled.records[-1].attempts, stalled.records[-1].retries_transient) == (2, 1)
        assert server.connections == 3  # the stalled one's, and the next attempt's


@pytest.mark.parametrize("caller", ["sync", "async"])
def test_requests_queued_for_a_one_slot_server_wait_in_skald_where_the_timeout_does_not_count(
    caller: str,
) -> None:
    # A server with one slot, each answer streamed over about 3 s in 10 pieces 0.25 s apart, a
    # timeout of 2 s, and two requests sent at once: the second waits about 3 s for the slot.
    def two_at_once(gateway: LLMGateway) -> list[Any]:
        if caller == "async":

            async def both() -> list[Any]:
                calls = [gateway.astructured("small", PROMPT, SceneCard) for _ in range(2)]
                return await asyncio.gather(*calls, return_exceptions=True)

            return asyncio.run(both())
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(gateway.structured, "small", PROMPT, SceneCard) for _ in "ab"]
            return [f.exception() or f.result() for f in futures]

    with ScriptedLLM() as server:
        server.one_slot = True
        server.stream_gap_s, server.stream_pieces = 0.25, 10
        server.on(schema="SceneCard", respond=_CARD)
        limits = {"llm_max_attempts": 1, "llm_timeout_s": 2.0}
        gated = LLMGateway(_settings(server, llm_slots=1, **limits), retry=FAST)
        assert two_at_once(gated) == [SceneCard.model_validate(_CARD)] * 2
        assert server.max_in_flight == 1  # the second waited in the gateway, not on the server
        # The look-alike: no limit, so the second waits in the server's queue, in silence.
        server.max_in_flight = 0
        outcomes = two_at_once(LLMGateway(_settings(server, **limits), retry=FAST))
        assert server.max_in_flight == 2
        assert sorted(type(o).__name__ for o in outcomes) == ["LLMTimeoutError", "SceneCard"]


def test_the_embedded_server_is_sent_one_chat_request_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The embedded server's address, without starting it.
    monkeypatch.setattr(
        "core.llm_server.local_llm_endpoint", lambda _s: ("http://127.0.0.1:9/v1", "local")
    )

    def slots_free(endpoint: Endpoint) -> int | None:
        with endpoint.serving():  # one held, as a request in flight holds it
            if endpoint._slots is None:
                return None
            free = 0
            while endpoint._slots.acquire(blocking=False):
                free += 1
            for _ in range(free):
                endpoint._slots.release()
            return free

    local, _model = Router(Settings(openai_base_url=None)).default_endpoint()
    assert LOCAL_CHAT_ARGS[-2:] == ("-np", str(LOCAL_CHAT_SLOTS)) and slots_free(local) == 0
    # The look-alike: a user's endpoint has no limit unless the settings give one.
    user = Settings(openai_base_url="http://127.0.0.1:8/v1")
    assert slots_free(Router(user).default_endpoint()[0]) is None
    limited = user.model_copy(update={"limits": RunLimits(llm_slots=3)})
    assert slots_free(Router(limited).default_endpoint()[0]) == 2


def test_a_server_that_cannot_stream_stops_the_call_with_the_setting_that_turns_streaming_off() -> (
    None
):
    with ScriptedLLM() as server:
        server.streams = False  # a proxy that buffers the answer and sends it whole
        server.on(schema="SceneCard", respond=_CARD)
        gateway = LLMGateway(_settings(server, llm_max_attempts=3), retry=FAST)
        with pytest.raises(LLMFatalError) as caught:
            gateway.structured("small", PROMPT, SceneCard)
        assert "cannot stream answers" in _one_line(caught.value)
        assert "SKALD_LIMITS__LLM_STREAM=false" in _one_line(caught.value)
        assert server.request_count == 1  # asking again would not change it
        # The look-alike: the same server with streaming off answers.
        whole = LLMGateway(_settings(server, llm_stream=False), retry=FAST)
        assert whole.structured("small", PROMPT, SceneCard) == SceneCard.model_validate(_CARD)


def test_a_400_about_streaming_names_the_setting_and_another_400_does_not() -> None:
    target = Target("m", Endpoint("http://127.0.0.1:9/v1", "k", 1.0))

    def bad_request(message: str) -> openai.BadRequestError:
        response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1:9/v1"))
        body = {"message": message, "type": "invalid_request_error"}
        return openai.BadRequestError(message, response=response, body=body)  # type: ignore[arg-type]

    streaming = fatal_error(
        bad_request("Unrecognized request argument supplied: stream_options"), target, "small", ""
    )
    assert "cannot stream answers" in str(streaming) and "LLM_STREAM" in str(streaming)
    other = fatal_error(bad_request("temperature must be at most 2"), target, "small", "")
    assert "stream" not in str(other).lower() and "retrying will not help" in str(other)


_CARD: dict[str, Any] = {
    "title": "The Ferry at Dusk",
    "tone": "grim",
    "beats": [{"summary": "Ilse boards the last ferry alone.", "intensity": 0.4}],
    "word_target": 900,
}


def _usage_of_whole_answer(server: ScriptedLLM) -> tuple[int, int]:
    """The token counts the server gives its last request answered whole, at once."""
    body = {k: v for k, v in server.requests[-1].body.items() if not k.startswith("stream")}
    gap, server.stream_gap_s = server.stream_gap_s, 0.0
    try:
        response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)
    finally:
        server.stream_gap_s = gap
    usage = response.json()["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def test_preflight_check_and_labels() -> None:
    with ScriptedLLM(require_api_key="sk-right") as server:
        good = _settings(server).model_copy(update={"openai_api_key": SecretStr("sk-right")})
        gateway = LLMGateway(good, retry=FAST)
        label = gateway.check_endpoint("large")
        assert label == gateway.endpoint_label("large") == f"{server.base_url} (gpt-4o-mini)"
        assert gateway.embedding_endpoint_label() == f"{server.base_url} (text-embedding-3-small)"
        bad = LLMGateway(good.model_copy(update={"openai_api_key": SecretStr("sk-bad")}))
        with pytest.raises(LLMFatalError, match="HTTP 401"):
            bad.check_endpoint("large")
        assert server.counts_by_path["/v1/models"] == 2
    with pytest.raises(LLMUnavailableError, match="is the server running"):
        LLMGateway(good).check_endpoint("small")  # the server is gone now


# --------------------------------------------------------------------------- output repair
def test_near_json_is_repaired_without_a_retry(server: ScriptedLLM) -> None:
    server.fail_next("near_json")
    gateway = LLMGateway(_settings(server), retry=FAST)
    card = gateway.structured("small", PROMPT, SceneCard)
    assert isinstance(card, SceneCard)
    assert server.request_count == 1
    assert gateway.records[-1].retries_bad_output == 0


def test_repair_json_handles_fences_prose_commas_and_smart_quotes() -> None:
    fenced = 'Sure!\n```json\n{"a": [1, 2,], "b": "x, ]",}\n```\nAnything else?'
    assert repair_json(fenced) == '{"a": [1, 2], "b": "x, ]"}'
    assert repair_json("\u201ca\u201d: 1") is None
    assert repair_json('{\u201ca\u201d: \u201csay "hi"\u201d}') == '{"a": "say \\"hi\\""}'
    assert repair_json("no json here") is None


class Ledger(BaseModel):
    code: str = Field(max_length=8)
    essay: str = Field(min_length=LOCAL_MAX_STRING_CHARS + 50)
    notes: list[str] = Field(min_length=LOCAL_MAX_ITEMS + 2)
    tags: list[str] = Field(max_length=2)
    tone: Tone
    score: float = Field(ge=0.0, le=1.0)
    delta: float = Field(ge=-1.0, le=1.0)
    ratio: float = Field(ge=0.0)
    count: int = Field(ge=0, le=9)


def test_bounded_schema_closes_every_string_and_list_for_the_tiny_local_model() -> None:
    bounded = bounded_response_format_for(Ledger, 1024)["json_schema"]["schema"]
    props = bounded["properties"]
    assert props["code"]["maxLength"] == 8  # a tighter bound is kept
    assert props["essay"]["maxLength"] == LOCAL_MAX_STRING_CHARS + 50  # never below the minimum
    assert props["notes"]["maxItems"] == LOCAL_MAX_ITEMS + 2
    assert props["notes"]["items"]["maxLength"] == LOCAL_MAX_STRING_CHARS
    assert props["tags"]["maxItems"] == 2
    assert "maxLength" not in str(bounded["$defs"]["Tone"])  # enums are already bounded
    # printable ASCII only: an escape or emoji would cost several tokens per character
    assert props["code"]["pattern"] == r"^[\x20\x21\x23-\x5b\x5d-\x7e]{0,8}$"
    assert re.fullmatch(props["essay"]["pattern"], "x" * (LOCAL_MAX_STRING_CHARS + 50))
    assert not re.fullmatch(
        props["essay"]["pattern"], "x" * LOCAL_MAX_STRING_CHARS
    )  # below minLength
    assert not re.fullmatch(props["code"]["pattern"], "caf\u00e9") and not re.fullmatch(
        props["code"]["pattern"], 'a"b'
    )
    # floats with both bounds become grammar-enforceable steps; the rest is left alone
    assert props["score"]["enum"][:3] == [0.0, 0.05, 0.1] and props["score"]["enum"][-1] == 1.0
    assert len(props["score"]["enum"]) == 21 and all(
        0.0 <= v <= 1.0 for v in props["score"]["enum"]
    )
    assert (
        props["delta"]["enum"][0] == -1.0
        and props["delta"]["enum"][10] == 0.0
        and props["delta"]["enum"][-1] == 1.0
    )
    assert "enum" not in props["ratio"] and "enum" not in props["count"]
    card = bounded_response_format_for(SceneCard, 1024)["json_schema"]["schema"]
    assert card["properties"]["title"]["maxLength"] == LOCAL_MAX_STRING_CHARS
    assert card["properties"]["beats"]["maxItems"] == LOCAL_MAX_ITEMS
    # the strict format sent to real endpoints is untouched
    assert "maxLength" not in str(
        response_format_for(SceneCard)["json_schema"]["schema"]["properties"]["title"]
    )


def _longest_instance(node: Any, root: dict[str, Any]) -> Any:
    """The longest JSON value a bounded schema admits (every string and list at its cap)."""
    if "$ref" in node:
        return _longest_instance(root["$defs"][node["$ref"].rsplit("/", 1)[1]], root)
    if "anyOf" in node:
        return max(
            (_longest_instance(b, root) for b in node["anyOf"]), key=lambda v: len(json.dumps(v))
        )
    if "enum" in node:
        return max(node["enum"], key=lambda v: len(json.dumps(v)))
    kind = node.get("type")
    if kind == "object":
        return {k: _longest_instance(v, root) for k, v in node["properties"].items()}
    if kind == "array":
        return [_longest_instance(node["items"], root)] * node["maxItems"]
    if kind == "string":
        return "x" * node["maxLength"]
    return 123456


def test_bounded_string_caps_shrink_so_the_longest_answer_fits_the_token_cap() -> None:
    from prompts.knowledge.models import SceneExtraction

    tight = bounded_response_format_for(SceneExtraction, 1024)["json_schema"]["schema"]
    roomy = bounded_response_format_for(SceneExtraction, 8192)["json_schema"]["schema"]
    longest = json.dumps(_longest_instance(tight, tight), indent=2)
    assert len(longest) <= 1024 * LOCAL_CHARS_PER_TOKEN  # it fits, even indented
    assert len(json.dumps(_longest_instance(roomy, roomy), indent=2)) > 1024 * LOCAL_CHARS_PER_TOKEN
    caps = {
        n["maxLength"]
        for n in tight["$defs"]["ExtractedEntity"]["properties"].values()
        if "maxLength" in n
    }
    assert caps and max(caps) < LOCAL_MAX_STRING_CHARS
    assert (
        roomy["$defs"]["ExtractedEntity"]["properties"]["name"]["maxLength"]
        == LOCAL_MAX_STRING_CHARS
    )


def test_a_cut_off_answer_of_the_tiny_local_model_is_asked_again_under_a_tighter_grammar(
    server: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import core.llm_server
    from prompts.knowledge.models import SceneExtraction

    # Only the process launcher is replaced: the HTTP calls go to the scripted server.
    monkeypatch.setattr(
        core.llm_server, "local_llm_endpoint", lambda settings: (server.base_url, LOCAL_CHAT_MODEL)
    )
    settings = Settings(openai_base_url=None, limits=RunLimits(), local_max_tokens=1024)
    server.fail_next("truncated_json", n=2)
    LLMGateway(settings, retry=FAST).structured("small", PROMPT, SceneExtraction)
    schemas = [r.body["response_format"]["json_schema"]["schema"] for r in server.requests]
    longest = [len(json.dumps(_longest_instance(s, s))) for s in schemas]
    assert len(longest) == 3 and longest[0] > longest[1] > longest[2]  # tighter after each cut-off
    assert [r.body["max_tokens"] for r in server.requests] == [1024] * 3  # not more room
    names = [s["$defs"]["ExtractedEntity"]["properties"]["name"] for s in schemas]
    assert all(
        n["maxLength"] >= LOCAL_MIN_STRING_CHARS for n in names
    )  # fewer items, not garbled names
    assert [s["properties"]["entities"]["maxItems"] for s in schemas][-1] < LOCAL_MAX_ITEMS


def test_bad_output_is_retried_with_the_validation_error(server: ScriptedLLM) -> None:
    server.fail_next("schema_invalid")
    gateway = LLMGateway(_settings(server), retry=FAST)
    gateway.structured("small", PROMPT, SceneCard)
    retry_messages = server.requests[1].messages
    assert retry_messages[: len(PROMPT)] == PROMPT
    assert retry_messages[-2] == {"role": "assistant", "content": "{}"}
    feedback = retry_messages[-1]["content"]
    assert feedback.startswith("Your previous answer was invalid: title: Field required")
    assert gateway.records[-1].retries_bad_output == 1


def test_every_chat_request_carries_a_seed_made_from_the_request_itself(
    server: ScriptedLLM,
) -> None:
    def seeds(settings: Settings, *calls: dict[str, Any], fail: str | None = None) -> list[Any]:
        server.reset()
        if fail is not None:
            server.fail_next(fail)
        gateway = LLMGateway(settings, retry=FAST)
        for call in calls:
            gateway.text("narrative", PROMPT, anti_repetition=True, **call)
        return [r.body.get("seed") for r in server.requests]

    settings = _settings(server)
    first = seeds(settings, {})
    assert len(first) == 1 and isinstance(first[0], int) and 0 <= first[0] < 2**31
    # Another gateway (another run, another process) sends the same request the same seed;
    # another take of the same prompt, another prompt or another base seed gets another one.
    again, take, other_prompt = seeds(settings, {}, {"sample": 1}, {"max_tokens": 300})
    assert again == first[0] and len({again, take, other_prompt}) == 3
    assert seeds(_settings(server).model_copy(update={"llm_seed": 7}), {}) != first
    # A request asked again after a failure that gave no answer keeps its seed: the answer
    # does not depend on the crash history.
    assert seeds(settings, {}, fail="http_500") == [first[0], first[0]]
    # "off" sends none.
    assert seeds(_settings(server).model_copy(update={"llm_seed": None}), {}) == [None]


def test_a_bad_answer_asked_again_gets_another_seed(server: ScriptedLLM) -> None:
    server.fail_next("schema_invalid")
    LLMGateway(_settings(server), retry=FAST).structured("small", PROMPT, SceneCard)
    first, second = (r.body["seed"] for r in server.requests)
    assert first != second
    # The look-alike: an answer cut off and asked again with more room is a new request too,
    # and a seed is a function of the request, so no two attempts of one call share one.
    server.reset()
    server.fail_next("truncated_json")
    LLMGateway(_settings(server), retry=FAST).structured("small", PROMPT, SceneCard)
    assert len({r.body["seed"] for r in server.requests}) == 2


def test_the_embedded_server_is_asked_not_to_reuse_a_cached_prompt_when_seeded(
    server: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import core.llm_server

    # Only the process launcher is replaced: the HTTP calls go to the scripted server.
    monkeypatch.setattr(
        core.llm_server, "local_llm_endpoint", lambda settings: (server.base_url, LOCAL_CHAT_MODEL)
    )
    for seed in (0, None):
        embedded = Settings(openai_base_url=None, limits=RunLimits(), llm_seed=seed)
        LLMGateway(embedded, retry=FAST).text("narrative", PROMPT, anti_repetition=True)
    LLMGateway(_settings(server), retry=FAST).text("narrative", PROMPT, anti_repetition=True)
    seeded, unseeded, configured = (r.body for r in server.requests)
    assert seeded["cache_prompt"] is False and "seed" in seeded
    assert seeded["repeat_penalty"] == 1.15  # merged with the anti-repetition fields
    # The look-alikes: no seed, nothing to reproduce, so the cache stays on; and a configured
    # endpoint may reject a field it does not know.
    assert "cache_prompt" not in unseeded and "seed" not in unseeded
    assert "cache_prompt" not in configured and "seed" in configured


def test_a_request_seed_is_the_same_under_another_hash_seed() -> None:
    body = {"model": "m", "messages": PROMPT, "temperature": 0.8, "extra_body": {"b": 1, "a": 2}}
    here = request_seed(0, body, sample=2, bad_answers=1)
    code = (
        "import json, sys; from core.llm.sampling import request_seed; "
        "print(request_seed(0, json.loads(sys.argv[1]), sample=2, bad_answers=1))"
    )
    for hash_seed in ("1", "2"):
        there = subprocess.run(
            [sys.executable, "-c", code, json.dumps(body)],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert there == str(here)


def test_truncated_answer_is_reasked_with_more_room(server: ScriptedLLM) -> None:
    server.fail_next("truncated_json")
    gateway = LLMGateway(_settings(server), retry=FAST)
    gateway.structured("small", PROMPT, SceneCard, max_tokens=400)
    first, second = server.requests
    assert first.body["max_tokens"] == 400
    assert second.body["max_tokens"] == 600
    assert second.messages == PROMPT  # same question, no feedback needed


def test_a_runs_call_log_is_saved_as_it_goes_and_a_refusing_disk_only_warns(
    server: ScriptedLLM, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = LLMGateway(_settings(server), run_id="run-7", retry=FAST)
    assert gateway.save_records(tmp_path) is None  # nothing called yet: no empty file
    assert not list(tmp_path.iterdir())
    gateway.structured("small", PROMPT, SceneCard, purpose="warm-up")
    assert gateway.save_records(tmp_path) == tmp_path / "llm-calls-run-7.parquet"
    # Many threads saving at once (a batch saves from whichever sees a dialogue end): each
    # write is whole, none trips on another's ".partial" file.
    with ThreadPoolExecutor(max_workers=8) as pool:
        saved = list(pool.map(lambda _: gateway.save_records(tmp_path), range(32)))
    assert saved == [tmp_path / "llm-calls-run-7.parquet"] * 32
    assert pl.read_parquet(tmp_path / "llm-calls-run-7.parquet").height == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm-calls-run-7.parquet"]

    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="skald.llm"):
        assert gateway.save_records(blocked / "logs") is None
    assert "could not write the LLM call log" in caplog.text


def test_exhausted_bad_output_raises_and_records_go_to_parquet(
    server: ScriptedLLM, tmp_path: Path
) -> None:
    gateway = LLMGateway(_settings(server, llm_max_attempts=3), run_id="run-42", retry=FAST)
    assert gateway.structured("small", PROMPT, SceneCard, purpose="warm-up")
    server.on(schema="SceneCard", respond={"title": 7, "tone": "silly"})
    with pytest.raises(LLMBadOutputError) as caught:
        gateway.structured("small", PROMPT, SceneCard, purpose="scene-plan")
    message = _one_line(caught.value)
    assert "tier small" in message and "gpt-4o-mini" in message and "scene-plan" in message
    assert "tone" in message
    assert server.request_count == 1 + 3

    path = gateway.write_records(tmp_path / "llm")
    assert path == tmp_path / "llm" / "llm-calls-run-42.parquet"
    frame = pl.read_parquet(path)
    assert frame.height == 2
    assert frame["outcome"].to_list() == ["ok", "bad_output"]
    assert frame["retries_bad_output"].to_list() == [0, 2]
    assert frame["schema_name"].to_list() == ["SceneCard", "SceneCard"]
    assert all(t > 0 for t in frame["prompt_tokens"].to_list())
    CallRecord.model_validate(frame.row(1, named=True))

    summary = summarize_records(tmp_path / "llm")
    assert summary.columns[:4] == ["tier", "model", "calls", "ok_rate"]
    row = summary.row(0, named=True)
    assert (row["tier"], row["model"], row["calls"], row["ok_rate"]) == (
        "small",
        "gpt-4o-mini",
        2,
        0.5,
    )
    assert row["retries_bad_output"] == 2 and row["p95_latency_ms"] >= row["p50_latency_ms"]
    assert summarize_records(frame).equals(summary)
    print("\n", summary)


# --------------------------------------------------------------------------- transient errors
def test_retry_after_seconds_is_honoured(server: ScriptedLLM) -> None:
    server.retry_after = "0.4"
    server.fail_next("http_429")
    gateway = LLMGateway(_settings(server), retry=FAST)
    started = time.perf_counter()
    gateway.structured("small", PROMPT, SceneCard)
    assert time.perf_counter() - started >= 0.4
    assert server.request_count == 2
    assert gateway.records[-1].retries_rate_limited == 1


def test_retry_after_http_date_is_honoured(server: ScriptedLLM) -> None:
    # HTTP dates have 1 s resolution: "now + 2 s" is between 1 and 2 s away when it is written.
    # The clock starts before the date is made, so time lost to a loaded machine can only add.
    started = time.perf_counter()
    when = datetime.now(UTC) + timedelta(seconds=2)
    server.retry_after = email.utils.format_datetime(when, usegmt=True)
    server.fail_next("http_429")
    gateway = LLMGateway(_settings(server), retry=FAST)
    gateway.text("small", PROMPT)
    assert time.perf_counter() - started >= 1.0
    assert gateway.records[-1].retries_rate_limited == 1


def test_retry_after_http_date_is_read_as_the_wait_until_that_date() -> None:
    def rate_limited(when: datetime) -> openai.RateLimitError:
        response = httpx.Response(
            429,
            headers={"retry-after": email.utils.format_datetime(when, usegmt=True)},
            request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"),
        )
        return openai.RateLimitError("rate limited", response=response, body=None)

    in_an_hour = rate_limited(datetime.now(UTC) + timedelta(hours=1))
    # At most the hour asked (time only passes after the date is made), and far more than a
    # date misread as "now" or as a number of seconds would give.
    delay = retry_after_s(in_an_hour, cap=7200.0)
    assert delay is not None and 1800.0 < delay <= 3600.0
    assert retry_after_s(in_an_hour, cap=30.0) == 30.0  # the cap holds
    assert retry_after_s(rate_limited(datetime.now(UTC) - timedelta(hours=1)), cap=30.0) == 0.0


def test_timeout_and_5xx_are_retried() -> None:
    with ScriptedLLM(timeout_sleep_s=1.0) as server:
        server.fail_next("timeout").fail_next("http_500")
        gateway = LLMGateway(_settings(server, llm_timeout_s=0.3), retry=FAST)
        assert gateway.text("small", PROMPT) == "Scripted reply."
        record = gateway.records[-1]
        assert (record.attempts, record.retries_transient, record.outcome) == (3, 2, "ok")


# --------------------------------------------------------------------------- candidates
def test_fallback_and_health_ordering(server: ScriptedLLM) -> None:
    server.on(model="flaky-large", fault="http_500")
    tiers = {"large": {"models": ["flaky-large", "steady-large"]}}
    gateway = LLMGateway(_settings(server, tiers=tiers, llm_max_attempts=2), retry=FAST)

    gateway.structured("large", PROMPT, SceneCard)
    first_call = [r.model for r in server.requests]
    assert first_call == ["flaky-large", "flaky-large", "steady-large"]
    record = gateway.records[-1]
    assert record.fallbacks == 1 and record.model == "steady-large"
    assert "HTTP 500" in record.fallback_reasons[0]

    for _ in range(4):
        gateway.structured("large", PROMPT, SceneCard)
    # Health ordering now puts the healthy candidate first: no more wasted attempts.
    assert [r.model for r in server.requests[3:]] == ["steady-large"] * 4
    health = gateway.health()
    assert health[(server.base_url, "flaky-large")][0] == 0.0
    assert health[(server.base_url, "steady-large")] == (1.0, 5)


def test_model_override_routes_one_slot(server: ScriptedLLM) -> None:
    tiers = {"medium": {"models": ["m-one", "m-two"]}}
    gateway = LLMGateway(_settings(server, tiers=tiers), retry=FAST)
    gateway.text("medium", PROMPT, model="slot-actor")
    assert server.requests[-1].model == "slot-actor"
    assert gateway.records[-1].model == "slot-actor"


def test_rules_match_by_schema_and_text_newest_first(server: ScriptedLLM) -> None:
    server.on(contains="dragon", respond="Here be dragons.", times=1)
    server.on(contains="dragon", respond="Newest rule wins.", times=1)
    server.on(schema="Beat", respond={"summary": "A door creaks.", "intensity": 0.3})
    gateway = LLMGateway(_settings(server), retry=FAST)
    ask = [{"role": "user", "content": "Describe the dragon."}]
    assert gateway.text("narrative", ask) == "Newest rule wins."
    assert gateway.text("narrative", ask) == "Here be dragons."
    assert gateway.text("narrative", ask) == "Scripted reply."
    beat = gateway.structured("small", PROMPT, Beat)
    assert beat == Beat(summary="A door creaks.", intensity=0.3)
    assert server.requests[-1].schema_name == "Beat"
    assert server.counts_by_path["/v1/chat/completions"] == 4


# --------------------------------------------------------------------------- async
def test_async_calls_run_concurrently(server: ScriptedLLM) -> None:
    server.fail_next("http_500", n=2)
    # The first 8 requests are held until all 8 are in flight: a gateway that sent them one
    # after another would never get there (each would wait out the rendezvous alone).
    server.rendezvous = 8
    gateway = LLMGateway(_settings(server), retry=FAST)

    async def main() -> tuple[list[SceneCard], str, np.ndarray]:
        cards = asyncio.gather(
            *(gateway.astructured("medium", PROMPT, SceneCard, purpose=f"a{i}") for i in range(6))
        )
        text = gateway.atext("narrative", PROMPT)
        vectors = gateway.aembed(["one", "two"])
        results = await asyncio.gather(cards, text, vectors)
        await gateway.aclose()
        return results[0], results[1], results[2]

    cards, text, vectors = asyncio.run(main())
    assert len(cards) == 6 and all(isinstance(c, SceneCard) for c in cards)
    assert text == "Scripted reply."
    assert vectors.shape == (2, 64)
    assert server.max_in_flight >= 8  # 6 structured + 1 text + 1 embedding call at once
    assert sum(r.retries_transient for r in gateway.records) == 2


# --------------------------------------------------------------------------- embeddings
def test_embeddings_shape_dtype_and_similarity(server: ScriptedLLM) -> None:
    gateway = LLMGateway(_settings(server), retry=RetryPolicy(embed_batch_size=2))
    texts = [
        "The old king rides north to the frozen keep.",
        "The old king rides south to the frozen sea.",
        "Bananas simmer in a sweet syrup.",
        "",
        "North keep, old king.",
    ]
    vectors = gateway.embed(texts)
    assert vectors.shape == (5, 64) and vectors.dtype == np.float32
    assert server.counts_by_path["/v1/embeddings"] == 3  # batches of 2
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > 0.5 > similarity[0, 2]
    assert similarity[0, 4] > similarity[2, 4]
    assert np.allclose(vectors[0], hashed_embedding(texts[0]), atol=1e-6)
    assert gateway.embed([]).shape[0] == 0
    assert gateway.records[-2].tier == "embedding" and gateway.records[-2].outcome == "ok"


def test_an_input_the_server_cannot_fit_is_not_retried(server: ScriptedLLM) -> None:
    server.fail_next("http_500_too_large", n=3)
    gateway = LLMGateway(_settings(server), retry=FAST)
    with pytest.raises(LLMFatalError, match="too large to process"):
        gateway.embed(["a scene far longer than the server's batch"])
    assert server.counts_by_path["/v1/embeddings"] == 1  # deterministic: asking again is waste
    assert gateway.records[-1].outcome == "fatal"


# --------------------------------------------------------------------------- scripted server
@pytest.mark.parametrize("model", [SceneCard, World, Place])
def test_scripted_auto_instance_validates(model: type[BaseModel]) -> None:
    instance = instance_from_schema(model.model_json_schema())
    model.model_validate(instance)


def test_scripted_auto_instance_validates_through_the_gateway(server: ScriptedLLM) -> None:
    gateway = LLMGateway(_settings(server), retry=FAST)
    world = gateway.structured("large", PROMPT, World)
    assert 0 < world.rank < 10 and world.places and world.capital is not None
    sent = server.requests[-1].body["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True
    assert sent["json_schema"]["name"] == "World"
    assert sent["json_schema"]["schema"]["additionalProperties"] is False
    assert set(sent["json_schema"]["schema"]["required"]) == {
        "places",
        "capital",
        "weights",
        "rank",
    }


def test_scripted_server_routes_and_counters(server: ScriptedLLM) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["scripted-model"]
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi there"}],
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].message.content == '{"reply": "Scripted reply."}'
    assert reply.usage is not None and reply.usage.total_tokens >= 2
    base64_vectors = client.embeddings.create(model="e", input="hello world")  # base64 default
    assert len(base64_vectors.data[0].embedding) == 64
    assert server.request_count == 3 and len(server.requests) == 3
    server.reset()
    assert server.request_count == 0 and not server.requests and not server.counts_by_path
    client.close()


def test_every_field_of_a_call_record_reaches_its_parquet_file(tmp_path: Path) -> None:
    """The record's fields are written three times (the model, the Parquet schema, the stats an
    attempt accumulates); pyarrow drops a key its schema lacks without a word, so they must agree."""
    assert CALL_RECORD_SCHEMA.names == list(CallRecord.model_fields)
    stats = CallStats(tier="draft", purpose="scene", schema_name=None, model="m", endpoint="e")
    stats.fallback_reasons.append("timeout")
    stats.outcome, stats.attempts = "ok", 2
    record = stats.to_record("run-1", datetime(2026, 11, 27, tzinfo=UTC), 12.5)
    write_parquet([record], tmp_path / "calls.parquet")
    assert pl.read_parquet(tmp_path / "calls.parquet").to_dicts() == [record.model_dump()]


def test_the_embedding_fingerprint_names_the_endpoint_without_its_secrets() -> None:
    """It is stored on every remembered turn (kg.dialogue `embedded_by`): a key in the URL must
    not be, and a URL with none keeps the fingerprint (and the caches keyed on it) it had."""

    def fingerprint(url: str) -> str:
        return LLMGateway(
            Settings(embedding_base_url=url, embedding_model="m")
        ).embedding_fingerprint()

    assert fingerprint("http://user:s3cret@host:8080/v1?api_key=k2#x") == "http://host:8080/v1|m"
    assert fingerprint("https://key@api.example.com/v1") == "https://api.example.com/v1|m"
    assert fingerprint("http://host:8080/v1") == "http://host:8080/v1|m"  # the look-alike
    assert LLMGateway(Settings()).embedding_fingerprint().startswith("local|")
