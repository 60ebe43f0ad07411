"""The LLM gateway: every model call in Skald goes through `LLMGateway`.

It wraps the official `openai` client (sync and async) and adds what a long unattended
run needs:

- tiers ("large", "medium", "small", "narrative") with candidate chains, tried in
  health-weighted order (rolling success rate, then latency) with fallback;
- structured output: a strict `json_schema` response format per pydantic model (built
  once per class), near-JSON repair, validation, and re-asking with the validation
  error (or with more room when the answer was cut off); unvalidated data never leaves;
- failure classes: transient (timeouts, connection errors, 5xx) -> capped exponential
  backoff with jitter; 429 -> honour Retry-After; fatal (401/403/404/400) -> raise at
  once; every error a user sees is one line (core.errors);
- a `CallRecord` per logical call, written to Parquet and summarised with polars.

The openai client's own retries are off (`max_retries=0`): one retry policy, ours.
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import json
import logging
import random
import re
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import openai
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import LLMBadOutputError, LLMError, LLMFatalError, LLMUnavailableError
from core.llm_server import LOCAL_CHAT_MODEL
from core.settings import LLAMA_CPP_ANTI_REPETITION, AntiRepetition, Settings

log = logging.getLogger("skald.llm")
#: Call-record tags (turn trace ids) indexed at once; older untaken ones age out.
_MAX_OPEN_TAGS = 4096

T = TypeVar("T", bound=BaseModel)
Message = dict[str, Any]
Outcome = Literal["ok", "bad_output", "fatal", "unavailable"]
_FailureKind = Literal["transient", "rate_limited", "fatal"]

NO_API_KEY = "not-needed"  # local servers ignore the key, but the openai client wants one
EMBEDDING_TIER = "embedding"
FEEDBACK = "Your previous answer was invalid: {error}. Reply with only JSON matching the schema."
_UNAVAILABLE_HINT = "is the server running? set OPENAI_BASE_URL"
_EMBEDDING_HINT = "is the server running? set SKALD_EMBEDDING_BASE_URL"
# Grammar bounds for the embedded 135M model: llama-server compiles maxLength / maxItems into
# its sampling grammar, so a string that would loop is closed instead of running into the
# token cap (which leaves invalid JSON); string caps shrink so the whole answer fits.
LOCAL_MAX_STRING_CHARS = 160
LOCAL_MIN_STRING_CHARS = 24
LOCAL_MAX_ITEMS = 3
# Characters per SmolLM2 token assumed when sizing string caps to the token cap: English runs
# ~4, the model's repetitive junk less.
LOCAL_CHARS_PER_TOKEN = 3
# What the grammar lets the model spend around one field or item: quotes, colon, comma and
# a newline with indentation.
_JSON_SEPARATOR_CHARS = 12
# Printable ASCII but the quote and backslash: one token at most per character.
_ASCII_TEXT = r"[\x20\x21\x23-\x5b\x5d-\x7e]"
# llama-server's grammar bounds integers but not floats (a tiny model then answers -3 for a
# 0-1 score); a bounded float becomes an enum of this many evenly spaced values instead.
LOCAL_NUMBER_STEPS = 20
# Below this token budget a tighter grammar no longer helps: the answer is asked again as is.
_MIN_SIZE_BUDGET = 64


class RetryPolicy(BaseModel):
    """Timing knobs of the retry loop (attempt counts and timeouts live in RunLimits)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backoff_base_s: float = Field(
        0.1, ge=0, description="first transient backoff; doubles per retry"
    )
    backoff_max_s: float = Field(5.0, ge=0, description="cap on one transient backoff")
    retry_after_max_s: float = Field(30.0, ge=0, description="cap on an honoured Retry-After")
    health_window: int = Field(20, ge=1, description="outcomes remembered per candidate")
    embed_batch_size: int = Field(64, ge=1, description="texts per embeddings request")
    feedback_echo_chars: int = Field(2000, ge=0, description="bad answer shown back to the model")


class CallRecord(BaseModel):
    """One logical gateway call (all its attempts and fallbacks)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    ts: datetime
    tier: str
    model: str
    endpoint: str
    purpose: str = ""
    schema_name: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    attempts: int = 0
    retries_transient: int = 0
    retries_rate_limited: int = 0
    retries_bad_output: int = 0
    fallbacks: int = 0
    fallback_reasons: list[str] = Field(default_factory=list)
    outcome: Outcome
    error: str | None = None


# Explicit so that empty runs and all-null columns still get stable Parquet types.
CALL_RECORD_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("tier", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("purpose", pa.string()),
        ("schema_name", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("latency_ms", pa.float64()),
        ("attempts", pa.int64()),
        ("retries_transient", pa.int64()),
        ("retries_rate_limited", pa.int64()),
        ("retries_bad_output", pa.int64()),
        ("fallbacks", pa.int64()),
        ("fallback_reasons", pa.list_(pa.string())),
        ("outcome", pa.string()),
        ("error", pa.string()),
    ]
)


# --------------------------------------------------------------------------- endpoints
class _Endpoint:
    """One base URL + key: a lazily built sync client and one async client per event loop."""

    __slots__ = ("base_url", "_api_key", "_timeout", "_sync", "_async", "_lock")

    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        self.base_url = base_url
        self._api_key = api_key
        self._timeout = timeout
        self._sync: OpenAI | None = None
        # httpx async pools are bound to the loop that created them (tests and flows
        # may run several loops), so async clients are kept per loop.
        self._async: dict[asyncio.AbstractEventLoop, AsyncOpenAI] = {}
        self._lock = threading.Lock()

    def sync(self) -> OpenAI:
        client = self._sync
        if client is None:
            with self._lock:
                if self._sync is None:
                    self._sync = OpenAI(
                        base_url=self.base_url,
                        api_key=self._api_key,
                        max_retries=0,
                        timeout=self._timeout,
                    )
                client = self._sync
        return client

    def async_(self) -> AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            with self._lock:
                for old in [lp for lp in self._async if lp.is_closed()]:
                    del self._async[old]
                client = self._async.get(loop)
                if client is None:
                    client = AsyncOpenAI(
                        base_url=self.base_url,
                        api_key=self._api_key,
                        max_retries=0,
                        timeout=self._timeout,
                    )
                    self._async[loop] = client
        return client

    def close(self) -> None:
        with self._lock:
            if self._sync is not None:
                self._sync.close()
                self._sync = None

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async.pop(loop, None)
        if client is not None:
            await client.close()


@dataclass(frozen=True, slots=True)
class _Target:
    model: str
    endpoint: _Endpoint

    @property
    def key(self) -> tuple[str, str]:
        return (self.endpoint.base_url, self.model)


class _Health:
    """Rolling per-candidate outcomes: ordering is success rate first, latency second."""

    def __init__(self, window: int) -> None:
        self._window = window
        self._history: dict[tuple[str, str], deque[tuple[bool, float]]] = {}
        self._lock = threading.Lock()

    def record(self, key: tuple[str, str], ok: bool, latency_s: float) -> None:
        with self._lock:
            history = self._history.get(key)
            if history is None:
                history = self._history[key] = deque(maxlen=self._window)
            history.append((ok, latency_s))

    def order(self, targets: tuple[_Target, ...]) -> tuple[_Target, ...] | list[_Target]:
        if len(targets) < 2:
            return targets  # the common case: nothing to weigh
        with self._lock:
            scores = [self._score(t.key) for t in targets]
        # sorted() is stable: equal scores (e.g. all untried) keep the configured order.
        ranked = sorted(range(len(targets)), key=scores.__getitem__)
        return [targets[i] for i in ranked]

    def _score(self, key: tuple[str, str]) -> tuple[float, float]:
        history = self._history.get(key)
        if not history:
            # Untried: as good as a perfect candidate, but behind any measured latency.
            return (-1.0, float("inf"))
        oks = [latency for ok, latency in history if ok]
        latency = sum(oks) / len(oks) if oks else float("inf")
        return (-len(oks) / len(history), latency)

    def snapshot(self) -> dict[tuple[str, str], tuple[float, int]]:
        """(success rate, samples) per candidate: for logs and tests."""
        with self._lock:
            return {
                k: (sum(ok for ok, _ in h) / len(h), len(h)) for k, h in self._history.items() if h
            }


# --------------------------------------------------------------------------- engine ops
@dataclass(slots=True)
class _Call:
    """Engine -> driver: perform one HTTP request and send back the response or error."""

    target: _Target
    kind: Literal["chat", "embed"]
    kwargs: dict[str, Any]


@dataclass(slots=True)
class _Sleep:
    seconds: float


_Steps = Generator[_Call | _Sleep, Any, Any]


@dataclass(slots=True)
class _Stats:
    tier: str
    purpose: str
    schema_name: str | None
    model: str = ""
    endpoint: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    retries_transient: int = 0
    retries_rate_limited: int = 0
    retries_bad_output: int = 0
    fallbacks: int = 0
    fallback_reasons: list[str] = field(default_factory=list)
    outcome: Outcome | None = None
    error: str | None = None


# --------------------------------------------------------------------------- gateway
class LLMGateway:
    """Tiered, health-ordered, validated access to OpenAI-compatible endpoints."""

    def __init__(
        self,
        settings: Settings,
        *,
        run_id: str | None = None,
        retry: RetryPolicy | None = None,
        max_records: int | None = None,
        flush_dir: str | Path | None = None,
    ) -> None:
        """`max_records`: keep at most this many call records in memory (a long-running
        server); older ones are appended to `flush_dir/llm-calls-<run_id>-<day>-<n>.parquet`
        (dropped when no directory is given). None keeps every record (batch runs)."""
        self.settings = settings
        self.run_id = run_id or f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
        self.retry = retry or RetryPolicy()
        self._lock = threading.Lock()
        # Separate from _lock (which _endpoint() takes): resolving may start a local server.
        self._resolve_lock = threading.Lock()
        self._endpoints: dict[tuple[str, str], _Endpoint] = {}
        self._default: tuple[_Endpoint, str] | None = None
        self._embedding: _Target | None = None
        self._chains: dict[tuple[str, str | None], tuple[_Target, ...]] = {}
        self._health = _Health(self.retry.health_window)
        self._records: list[CallRecord] = []
        self._records_lock = threading.Lock()
        self._max_records = max_records
        self._flush_dir = Path(flush_dir) if flush_dir is not None else None
        self._flushed_files = 0
        self.flushed_records = 0
        # Records by the tag after "|" in their purpose (a turn's trace id): a turn finds its
        # own calls without scanning every record. Bounded: tags nobody takes age out.
        self._by_tag: OrderedDict[str, list[CallRecord]] = OrderedDict()
        self._rng = random.Random()

    # ------------------------------------------------------------------ public API
    def structured(
        self,
        tier: str,
        messages: Sequence[Message],
        output_model: type[T],
        *,
        purpose: str = "",
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> T:
        """One validated `output_model` instance, or LLMBadOutputError/LLMFatalError/LLMUnavailableError."""
        steps = self._chat_steps(
            tier, messages, output_model, purpose, model, max_tokens, temperature
        )
        return self._drive(steps)  # type: ignore[no-any-return]

    def text(
        self,
        tier: str,
        messages: Sequence[Message],
        *,
        purpose: str = "",
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        anti_repetition: bool = False,
    ) -> str:
        """The assistant's reply text (never empty). `anti_repetition` adds the tier's
        anti-repetition sampling (settings `tiers.<tier>.anti_repetition`) to the request."""
        steps = self._chat_steps(
            tier, messages, None, purpose, model, max_tokens, temperature, anti_repetition
        )
        return self._drive(steps)  # type: ignore[no-any-return]

    def embed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        """float32 array of shape (len(texts), dim)."""
        return self._drive(self._embed_steps(texts, purpose))  # type: ignore[no-any-return]

    async def astructured(
        self,
        tier: str,
        messages: Sequence[Message],
        output_model: type[T],
        *,
        purpose: str = "",
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> T:
        steps = self._chat_steps(
            tier, messages, output_model, purpose, model, max_tokens, temperature
        )
        return await self._adrive(steps)  # type: ignore[no-any-return]

    async def atext(
        self,
        tier: str,
        messages: Sequence[Message],
        *,
        purpose: str = "",
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        anti_repetition: bool = False,
    ) -> str:
        steps = self._chat_steps(
            tier, messages, None, purpose, model, max_tokens, temperature, anti_repetition
        )
        return await self._adrive(steps)  # type: ignore[no-any-return]

    async def aembed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        return await self._adrive(self._embed_steps(texts, purpose))  # type: ignore[no-any-return]

    def sends_anti_repetition_first(self, tier: str) -> bool:
        """Whether prose of this tier gets anti-repetition sampling on the first try
        (`tiers.<tier>.anti_repetition.first_draft`; unset: only on the embedded model)."""
        settings = self.settings.tier(tier)
        embedded = self.settings.openai_base_url is None and not any(c.base_url for c in settings.models)
        return first_draft_anti_repetition(settings.anti_repetition, embedded=embedded)

    def endpoint_label(self, tier: str) -> str:
        """ "<base_url> (<model>)" of the tier's first candidate, for logs and `doctor`."""
        targets = self._targets(tier, None)
        more = f" +{len(targets) - 1} fallback(s)" if len(targets) > 1 else ""
        return f"{targets[0].endpoint.base_url} ({targets[0].model}){more}"

    def embedding_endpoint_label(self) -> str:
        if self.settings.embedding_base_url is None:
            from core.embedder import MODEL_NAME

            return f"in-process ({MODEL_NAME}, onnxruntime)"
        target = self._embedding_target()
        return f"{target.endpoint.base_url} ({target.model})"

    def check_endpoint(self, tier: str = "large") -> str:
        """Fail fast before a long run: one `GET /models` per distinct endpoint of the tier.

        Returns the endpoint label when any candidate's server answers; raises
        LLMFatalError (e.g. a rejected key) or LLMUnavailableError (nothing reachable)."""
        targets = self._targets(tier, None)
        timeout = min(self.settings.limits.llm_timeout_s, 10.0)
        last_error = ""
        for endpoint in dict.fromkeys(t.endpoint for t in targets):
            try:
                endpoint.sync().models.list(timeout=timeout)
                return self.endpoint_label(tier)
            except (openai.NotFoundError, openai.RateLimitError):
                return self.endpoint_label(tier)  # it answered: /models is optional, 429 is load
            except openai.OpenAIError as exc:
                if _classify(exc) == "fatal":
                    model = next(t.model for t in targets if t.endpoint is endpoint)
                    raise _fatal_error(exc, _Target(model, endpoint), tier, "preflight") from None
                last_error = _describe_failure(exc)
        urls = ", ".join(dict.fromkeys(t.endpoint.base_url for t in targets))
        raise LLMUnavailableError(
            f"LLM endpoint {urls} unreachable (tier {tier}): {last_error}", hint=_UNAVAILABLE_HINT
        )

    @property
    def records(self) -> list[CallRecord]:
        with self._records_lock:
            return list(self._records)

    def records_for(self, tag: str) -> list[CallRecord]:
        """The records whose purpose ends in `|tag` (kept for a later take)."""
        with self._records_lock:
            return list(self._by_tag.get(tag, ()))

    def take_records(self, tag: str) -> list[CallRecord]:
        """The records whose purpose ends in `|tag`, removed from the tag index (the records
        list itself is unchanged: write_records still sees them)."""
        with self._records_lock:
            return self._by_tag.pop(tag, [])

    def _flush_oldest(self) -> None:
        """Over `max_records`: move the oldest half out of memory (to Parquet when a flush
        directory is set). Called with _records_lock held."""
        assert self._max_records is not None
        cut = len(self._records) - self._max_records // 2
        old, self._records = self._records[:cut], self._records[cut:]
        self.flushed_records += len(old)
        if self._flush_dir is None:
            return
        try:
            self._flush_dir.mkdir(parents=True, exist_ok=True)
            self._flushed_files += 1
            day = datetime.now(UTC).strftime("%Y%m%d")
            target = self._flush_dir / f"llm-calls-{self.run_id}-{day}-{self._flushed_files:05d}.parquet"
            table = pa.Table.from_pylist([r.model_dump() for r in old], schema=CALL_RECORD_SCHEMA)
            partial = target.with_name(target.name + ".partial")
            pq.write_table(table, partial)
            partial.replace(target)
        except OSError as exc:
            log.warning("could not flush %d LLM call records to %s: %s", len(old), self._flush_dir, exc)

    def health(self) -> dict[tuple[str, str], tuple[float, int]]:
        """{(base_url, model): (success rate, samples)} over the rolling window."""
        return self._health.snapshot()

    def write_records(self, path: str | Path) -> Path:
        """Write this run's records to `<path>/llm-calls-<run_id>.parquet` (or to `path`
        itself when it ends in .parquet). One file per run, rewritten atomically."""
        path = Path(path)
        target = path if path.suffix == ".parquet" else path / f"llm-calls-{self.run_id}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(
            [r.model_dump() for r in self.records], schema=CALL_RECORD_SCHEMA
        )
        partial = target.with_name(target.name + ".partial")
        pq.write_table(table, partial)
        partial.replace(target)
        return target

    def close(self) -> None:
        """Close the sync clients (async ones: `await aclose()` inside their loop)."""
        for endpoint in self._all_endpoints():
            endpoint.close()

    async def aclose(self) -> None:
        for endpoint in self._all_endpoints():
            await endpoint.aclose()

    def __enter__(self) -> LLMGateway:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ drivers
    # The retry/fallback logic is written once, as a generator of I/O requests; these
    # two drivers execute them with blocking or awaiting calls.
    def _drive(self, steps: _Steps) -> Any:
        try:
            op = next(steps)
            while True:
                if type(op) is _Sleep:
                    time.sleep(op.seconds)
                    op = steps.send(None)
                    continue
                client = op.target.endpoint.sync()
                try:
                    if op.kind == "chat":
                        result: Any = client.chat.completions.create(**op.kwargs)
                    else:
                        result = client.embeddings.create(**op.kwargs)
                except openai.OpenAIError as exc:
                    result = exc
                op = steps.send(result)
        except StopIteration as done:
            return done.value

    async def _adrive(self, steps: _Steps) -> Any:
        try:
            op = next(steps)
            while True:
                if type(op) is _Sleep:
                    await asyncio.sleep(op.seconds)
                    op = steps.send(None)
                    continue
                client = op.target.endpoint.async_()
                try:
                    if op.kind == "chat":
                        result: Any = await client.chat.completions.create(**op.kwargs)
                    else:
                        result = await client.embeddings.create(**op.kwargs)
                except openai.OpenAIError as exc:
                    result = exc
                op = steps.send(result)
        except StopIteration as done:
            return done.value

    # ------------------------------------------------------------------ chat engine
    def _chat_steps(
        self,
        tier_name: str,
        messages: Sequence[Message],
        output_model: type[BaseModel] | None,
        purpose: str,
        model: str | None,
        max_tokens: int | None,
        temperature: float | None,
        anti_repetition: bool = False,
    ) -> _Steps:
        schema_name = output_model.__name__ if output_model is not None else None
        stats = _Stats(tier=tier_name, purpose=purpose, schema_name=schema_name)
        started = time.perf_counter()
        try:
            return (
                yield from self._chat_attempts(
                    stats, tier_name, messages, output_model, model, max_tokens, temperature,
                    anti_repetition,
                )
            )
        except BaseException as exc:
            if stats.outcome is None:  # not one of ours: keep why (cancelled, server start failed)
                stats.error = _one_line(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._record(stats, started)

    def _chat_attempts(
        self,
        stats: _Stats,
        tier_name: str,
        messages: Sequence[Message],
        output_model: type[BaseModel] | None,
        model: str | None,
        max_tokens: int | None,
        temperature: float | None,
        anti_repetition: bool = False,
    ) -> _Steps:
        tier = self.settings.tier(tier_name)
        targets = self._health.order(self._targets(tier_name, model))
        max_attempts = self.settings.limits.llm_max_attempts
        temp = tier.temperature if temperature is None else temperature
        base = messages if isinstance(messages, list) else list(messages)
        failure: Literal["unavailable", "bad_output"] = "unavailable"
        last_error = ""

        for index, target in enumerate(targets):
            if index:
                stats.fallbacks += 1
                stats.fallback_reasons.append(f"{targets[index - 1].model}: {last_error}"[:300])
            stats.model = target.model
            stats.endpoint = target.endpoint.base_url
            convo = base
            tokens = max_tokens or tier.max_tokens
            token_cap = tier.context_window
            response_format = response_format_for(output_model) if output_model is not None else None
            tiny = self.settings.openai_base_url is None and target.model == LOCAL_CHAT_MODEL
            if tiny:
                # The embedded 135M model can loop until any cap: keep its answers short and
                # bound them in the grammar rather than giving it more room.
                token_cap = self.settings.local_max_tokens
                tokens = min(tokens, token_cap)
                if output_model is not None:
                    response_format = bounded_response_format_for(output_model, tokens)
            size_budget = tokens
            transient_failures = 0
            for attempt in range(1, max_attempts + 1):
                stats.attempts += 1
                kwargs: dict[str, Any] = {
                    "model": target.model,
                    "messages": convo,
                    "max_tokens": tokens,
                    "temperature": temp,
                }
                if response_format is not None:
                    kwargs["response_format"] = response_format
                if anti_repetition:
                    kwargs.update(anti_repetition_kwargs(tier.anti_repetition, embedded=tiny))
                t0 = time.perf_counter()
                result = yield _Call(target, "chat", kwargs)
                elapsed = time.perf_counter() - t0

                if isinstance(result, openai.OpenAIError):
                    kind = _classify(result)
                    if kind == "fatal":
                        error = _fatal_error(result, target, tier_name, stats.purpose)
                        stats.outcome, stats.error = "fatal", str(error)
                        raise error
                    self._health.record(target.key, False, elapsed)
                    failure, last_error = "unavailable", _describe_failure(result)
                    if attempt == max_attempts:
                        break  # next candidate, if any
                    if kind == "rate_limited":
                        stats.retries_rate_limited += 1
                        delay = _retry_after_s(result, self.retry.retry_after_max_s)
                        if delay is None:
                            delay = self._backoff_s(transient_failures)
                    else:
                        stats.retries_transient += 1
                        delay = self._backoff_s(transient_failures)
                    transient_failures += 1
                    if delay > 0:
                        yield _Sleep(delay)
                    continue

                usage = result.usage
                if usage is not None:
                    stats.prompt_tokens += usage.prompt_tokens or 0
                    stats.completion_tokens += usage.completion_tokens or 0
                choice = result.choices[0] if result.choices else None
                content = (choice.message.content if choice is not None else None) or ""
                finish = choice.finish_reason if choice is not None else None

                if output_model is None:
                    if content.strip():
                        self._health.record(target.key, True, elapsed)
                        stats.outcome = "ok"
                        return content
                    problem = "the reply was empty"
                else:
                    value, problem = _parse(content, output_model)
                    if value is not None:
                        self._health.record(target.key, True, elapsed)
                        stats.outcome = "ok"
                        return value

                self._health.record(target.key, False, elapsed)
                failure, last_error = "bad_output", problem
                if attempt == max_attempts:
                    break
                stats.retries_bad_output += 1
                if finish == "length" and tiny and output_model is not None and size_budget > _MIN_SIZE_BUDGET:
                    # Cut off anyway: the tiny model ignores "shorter", so tighten the grammar.
                    size_budget //= 2
                    response_format = bounded_response_format_for(output_model, size_budget)
                    continue
                if finish == "length":
                    # Cut off: the same question with more room, within the context window.
                    room = max(min(token_cap, tier.context_window - _estimate_tokens(convo)), tokens)
                    grown = min(room, int(tokens * 1.5))
                    if grown > tokens:
                        tokens = grown
                        continue
                    problem += "; the answer was cut off, so keep it shorter"
                # Feedback replaces (not accumulates) earlier feedback: the prompt stays bounded.
                convo = [
                    *base,
                    {"role": "assistant", "content": content[: self.retry.feedback_echo_chars]},
                    {"role": "user", "content": FEEDBACK.format(error=problem)},
                ]

        names = ", ".join(dict.fromkeys(t.model for t in targets))
        what = f"tier {tier_name}, model {names}, purpose {stats.purpose or '-'}"
        if failure == "bad_output":
            error: LLMError = LLMBadOutputError(
                f"LLM returned invalid output after {stats.attempts} attempts ({what}): {last_error}"
            )
        else:
            urls = ", ".join(dict.fromkeys(t.endpoint.base_url for t in targets))
            error = LLMUnavailableError(
                f"LLM endpoint {urls} unavailable after {stats.attempts} attempts ({what}): {last_error}",
                hint=_UNAVAILABLE_HINT,
            )
        stats.outcome, stats.error = failure, str(error)
        raise error

    # ------------------------------------------------------------------ embeddings engine
    def _embed_steps(self, texts: Sequence[str], purpose: str) -> _Steps:
        stats = _Stats(tier=EMBEDDING_TIER, purpose=purpose, schema_name=None)
        started = time.perf_counter()
        try:
            if self.settings.embedding_base_url is None:
                # The embedded default: a real sentence-embedding model in this process
                # (core.embedder); the chat model is never used for embeddings.
                from core.embedder import EmbedderUnavailableError, local_embedder

                try:
                    embedder = local_embedder()
                except EmbedderUnavailableError as exc:
                    stats.outcome, stats.error = "fatal", str(exc)
                    raise LLMFatalError(str(exc), hint=_EMBEDDING_HINT) from exc
                stats.model, stats.endpoint = embedder.name, "in-process"
                stats.attempts = 1
                matrix = embedder.encode(list(texts))
                stats.outcome = "ok"
                return matrix
            target = self._embedding_target()
            stats.model, stats.endpoint = target.model, target.endpoint.base_url
            rows: list[np.ndarray] = []
            size = self.retry.embed_batch_size
            for start in range(0, len(texts), size):
                batch = list(texts[start : start + size])
                rows.append((yield from self._embed_batch(stats, target, batch)))
            stats.outcome = "ok"
            if not rows:
                return np.zeros((0, 0), dtype=np.float32)
            return np.concatenate(rows) if len(rows) > 1 else rows[0]
        except BaseException as exc:
            if stats.outcome is None:  # not one of ours: keep why (cancelled, server start failed)
                stats.error = _one_line(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._record(stats, started)

    def _embed_batch(self, stats: _Stats, target: _Target, batch: list[str]) -> _Steps:
        max_attempts = self.settings.limits.llm_max_attempts
        kwargs = {"model": target.model, "input": batch, "encoding_format": "float"}
        failure: Literal["unavailable", "bad_output"] = "unavailable"
        last_error = ""
        for attempt in range(1, max_attempts + 1):
            stats.attempts += 1
            result = yield _Call(target, "embed", kwargs)
            if isinstance(result, openai.OpenAIError):
                kind = _classify(result)
                if kind == "fatal":
                    error = _fatal_error(result, target, EMBEDDING_TIER, stats.purpose)
                    stats.outcome, stats.error = "fatal", str(error)
                    raise error
                failure, last_error = "unavailable", _describe_failure(result)
                if attempt == max_attempts:
                    break
                delay = None
                if kind == "rate_limited":
                    stats.retries_rate_limited += 1
                    delay = _retry_after_s(result, self.retry.retry_after_max_s)
                else:
                    stats.retries_transient += 1
                yield _Sleep(self._backoff_s(attempt - 1) if delay is None else delay)
                continue
            if result.usage is not None:
                stats.prompt_tokens += result.usage.prompt_tokens or 0
            data = sorted(result.data, key=lambda d: d.index)
            matrix = np.asarray([d.embedding for d in data], dtype=np.float32)
            if matrix.ndim == 2 and matrix.shape[0] == len(batch):
                return matrix
            failure = "bad_output"
            last_error = f"expected {len(batch)} vectors, got array of shape {matrix.shape}"
            if attempt < max_attempts:
                stats.retries_bad_output += 1
        stats.outcome = failure
        if failure == "bad_output":
            error: LLMError = LLMBadOutputError(
                f"embedding endpoint {target.endpoint.base_url} (model {target.model}) returned "
                f"malformed vectors after {stats.attempts} attempts: {last_error}"
            )
        else:
            error = LLMUnavailableError(
                f"embedding endpoint {target.endpoint.base_url} unavailable after {stats.attempts} "
                f"attempts (model {target.model}): {last_error}",
                hint=_EMBEDDING_HINT,
            )
        stats.error = str(error)
        raise error

    # ------------------------------------------------------------------ helpers
    def _backoff_s(self, failures: int) -> float:
        # "Equal jitter": half fixed, half random, so concurrent callers spread out.
        ceiling = min(self.retry.backoff_max_s, self.retry.backoff_base_s * (2**failures))
        return ceiling / 2 + self._rng.random() * ceiling / 2

    def _record(self, stats: _Stats, started: float) -> None:
        outcome = stats.outcome
        error = stats.error
        if outcome is None:  # cancelled, or failed before any request: still leave a trace
            outcome, error = "unavailable", error or "interrupted"
        record = CallRecord(
            run_id=self.run_id,
            ts=datetime.now(UTC),
            tier=stats.tier,
            model=stats.model,
            endpoint=stats.endpoint,
            purpose=stats.purpose,
            schema_name=stats.schema_name,
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.completion_tokens,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            attempts=stats.attempts,
            retries_transient=stats.retries_transient,
            retries_rate_limited=stats.retries_rate_limited,
            retries_bad_output=stats.retries_bad_output,
            fallbacks=stats.fallbacks,
            fallback_reasons=stats.fallback_reasons,
            outcome=outcome,
            error=error,
        )
        with self._records_lock:
            self._records.append(record)
            _, bar, tag = record.purpose.rpartition("|")
            if bar and tag:
                self._by_tag.setdefault(tag, []).append(record)
                self._by_tag.move_to_end(tag)
                while len(self._by_tag) > _MAX_OPEN_TAGS:
                    self._by_tag.popitem(last=False)
            if self._max_records is not None and len(self._records) > self._max_records:
                self._flush_oldest()

    def _endpoint(self, base_url: str, api_key: str) -> _Endpoint:
        key = (base_url, api_key)
        with self._lock:
            endpoint = self._endpoints.get(key)
            if endpoint is None:
                endpoint = _Endpoint(base_url, api_key, self.settings.limits.llm_timeout_s)
                self._endpoints[key] = endpoint
            return endpoint

    def _all_endpoints(self) -> list[_Endpoint]:
        with self._lock:
            return list(self._endpoints.values())

    def _default_endpoint(self) -> tuple[_Endpoint, str]:
        """(endpoint, default model): OPENAI_BASE_URL, else the embedded llama-server."""
        if self._default is not None:
            return self._default
        with self._resolve_lock:
            if self._default is not None:
                return self._default
            settings = self.settings
            if settings.openai_base_url is not None:
                key = (
                    settings.openai_api_key.get_secret_value()
                    if settings.openai_api_key
                    else NO_API_KEY
                )
                self._default = (
                    self._endpoint(settings.openai_base_url, key),
                    settings.default_model,
                )
            else:
                from core.llm_server import local_llm_endpoint  # starts a process: only when needed

                base_url, model = local_llm_endpoint(settings)
                self._default = (self._endpoint(base_url, NO_API_KEY), model)
            return self._default

    def _targets(self, tier_name: str, model: str | None) -> tuple[_Target, ...]:
        cached = self._chains.get((tier_name, model))
        if cached is not None:
            return cached
        if model is not None:
            # Per-slot routing: that one model, on the endpoint the tier would use for it.
            chain = self._targets(tier_name, None)
            match = next((t for t in chain if t.model == model), None)
            targets: tuple[_Target, ...] = (match or _Target(model, chain[0].endpoint),)
        else:
            settings = self.settings
            candidates = settings.tier(tier_name).models
            if not candidates:
                endpoint, default_model = self._default_endpoint()
                targets = (_Target(default_model, endpoint),)
            else:
                built = []
                for candidate in candidates:
                    if candidate.base_url is None:
                        endpoint = self._default_endpoint()[0]
                    else:
                        key = candidate.api_key.get_secret_value() if candidate.api_key else None
                        if (
                            key is None
                            and candidate.base_url == settings.openai_base_url
                            and settings.openai_api_key
                        ):
                            key = settings.openai_api_key.get_secret_value()
                        endpoint = self._endpoint(candidate.base_url, key or NO_API_KEY)
                    built.append(_Target(candidate.model, endpoint))
                targets = tuple(built)
        self._chains[(tier_name, model)] = targets
        return targets

    def _embedding_target(self) -> _Target:
        if self._embedding is not None:
            return self._embedding
        with self._resolve_lock:
            if self._embedding is not None:
                return self._embedding
            settings = self.settings
            if settings.embedding_base_url is not None:
                secret = settings.embedding_api_key
                if secret is None and settings.embedding_base_url == settings.openai_base_url:
                    secret = settings.openai_api_key  # same server: same key; never sent elsewhere
                key = secret.get_secret_value() if secret else NO_API_KEY
                self._embedding = _Target(
                    settings.embedding_model, self._endpoint(settings.embedding_base_url, key)
                )
            else:
                raise LLMFatalError("no embedding endpoint configured: the embedded model runs in process")
            return self._embedding


# --------------------------------------------------------------------------- sampling
def anti_repetition_kwargs(settings: AntiRepetition, *, embedded: bool) -> dict[str, Any]:
    """The request fields for a tier's anti-repetition sampling: the OpenAI-standard
    penalties as keyword arguments, server-specific fields in `extra_body` (the openai
    client merges it into the JSON body). llama.cpp's own fields go only to the embedded
    llama-server unless the settings name them: OpenAI-style endpoints reject unknown fields."""
    kwargs: dict[str, Any] = {}
    if settings.frequency_penalty is not None:
        kwargs["frequency_penalty"] = settings.frequency_penalty
    if settings.presence_penalty is not None:
        kwargs["presence_penalty"] = settings.presence_penalty
    extra = settings.server_fields
    if extra is None and embedded:
        extra = LLAMA_CPP_ANTI_REPETITION
    if extra:
        kwargs["extra_body"] = dict(extra)
    return kwargs


def first_draft_anti_repetition(settings: AntiRepetition, *, embedded: bool) -> bool:
    """Whether a first draft already gets anti-repetition sampling (unset: on the embedded model)."""
    return embedded if settings.first_draft is None else settings.first_draft


# --------------------------------------------------------------------------- failures
_TOO_LARGE = re.compile(r"too large to process|exceeds the available context size", re.IGNORECASE)


def _classify(exc: openai.OpenAIError) -> _FailureKind:
    if isinstance(exc, openai.RateLimitError):
        # An exhausted quota is also a 429, but waiting will not refill it.
        return "fatal" if exc.code == "insufficient_quota" else "rate_limited"
    if isinstance(exc, openai.APIStatusError) and _TOO_LARGE.search(_api_detail(exc)):
        return "fatal"  # llama-server's HTTP 500 for an input over its batch: the same every time
    if isinstance(exc, openai.APIConnectionError | openai.InternalServerError):
        return "transient"  # APITimeoutError is an APIConnectionError
    if isinstance(exc, openai.APIStatusError):
        return "transient" if exc.status_code >= 500 or exc.status_code in (408, 409) else "fatal"
    if isinstance(exc, openai.APIResponseValidationError):
        return "transient"
    return "fatal"


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _api_detail(exc: openai.OpenAIError) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return _one_line(body["message"])
    return _one_line(getattr(exc, "message", None) or str(exc))


def _describe_failure(exc: openai.OpenAIError) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return _one_line(f"connection failed: {cause or exc.message}", 160)
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {_api_detail(exc)}"
    return _one_line(f"{type(exc).__name__}: {exc}", 160)


def _fatal_error(
    exc: openai.OpenAIError, target: _Target, tier: str, purpose: str
) -> LLMFatalError:
    url, model = target.endpoint.base_url, target.model
    status = getattr(exc, "status_code", None)
    detail = _api_detail(exc)
    if status == 401:
        return LLMFatalError(
            f"LLM endpoint {url} rejected the API key (HTTP 401)", hint="set OPENAI_API_KEY"
        )
    if status == 403:
        return LLMFatalError(
            f"LLM endpoint {url} refused access to model {model!r} (HTTP 403): {detail}",
            hint="check the API key's permissions for this model",
        )
    if status == 404:
        return LLMFatalError(
            f"LLM endpoint {url} has no model {model!r} (HTTP 404): {detail}",
            hint=f"fix tiers.{tier}.models or SKALD_DEFAULT_MODEL; OPENAI_BASE_URL usually ends in /v1",
        )
    if status == 429:
        return LLMFatalError(
            f"LLM endpoint {url} reports the quota is exhausted (HTTP 429): {detail}",
            hint="check the account's billing",
        )
    if status == 400 and re.search(r"context|maximum.*tokens|too long", detail, re.IGNORECASE):
        return LLMFatalError(
            f"prompt for tier {tier} ({purpose or '-'}) exceeds model {model!r}'s context (HTTP 400): {detail}",
            hint=f"lower limits.context_budget or tiers.{tier}.context_window",
        )
    if status is not None:
        return LLMFatalError(
            f"LLM endpoint {url} rejected the request for model {model!r} (HTTP {status}): {detail}",
            hint="the server does not accept this request; retrying will not help",
        )
    return LLMFatalError(
        _one_line(f"LLM client error for {url} ({model!r}): {type(exc).__name__}: {exc}")
    )


def _retry_after_s(exc: openai.OpenAIError, cap: float) -> float | None:
    """Seconds from Retry-After-Ms / Retry-After (seconds or HTTP date), capped; None if absent."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    value: float | None = None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = None
    if value is None and (raw := headers.get("retry-after")) is not None:
        try:
            value = float(raw)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                value = (when - datetime.now(UTC)).total_seconds()
    if value is None:
        return None
    return min(max(value, 0.0), cap)


# --------------------------------------------------------------------------- structured output
@cache
def response_format_for(model: type[BaseModel]) -> dict[str, Any]:
    """The strict json_schema response_format for `model`, built once per class."""
    schema = model.model_json_schema()
    _make_strict(schema, schema)
    name = re.sub(r"[^A-Za-z0-9_-]", "_", model.__name__)[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@lru_cache(maxsize=256)
def bounded_response_format_for(model: type[BaseModel], max_tokens: int) -> dict[str, Any]:
    """response_format_for(model) bounded for small local models whose grammar-constrained
    sampling enforces the bounds: every array gets at most LOCAL_MAX_ITEMS items (fewer when
    the token budget is small); every free
    string is printable ASCII (an escape or an emoji costs several tokens per character) with
    a length cap sized so that the longest answer the schema allows fits in `max_tokens`
    (between LOCAL_MIN_STRING_CHARS and LOCAL_MAX_STRING_CHARS); every float with a minimum
    and maximum becomes an enum of steps. Tighter bounds of the model are kept, and a bound
    never goes below a field's own minimum."""
    strict = response_format_for(model)["json_schema"]
    schema = copy.deepcopy(strict["schema"])
    for items in range(LOCAL_MAX_ITEMS, 0, -1):
        # Fewer items before strings shorter than LOCAL_MIN_STRING_CHARS: three garbled names
        # are worth less than one whole one.
        strings, fixed = _longest_answer(schema, schema, 0, items)
        room = max_tokens * LOCAL_CHARS_PER_TOKEN - fixed
        cap = int(room / strings) if strings else LOCAL_MAX_STRING_CHARS
        if cap >= LOCAL_MIN_STRING_CHARS:
            break
    _bound(schema, min(LOCAL_MAX_STRING_CHARS, max(LOCAL_MIN_STRING_CHARS, cap)), items)
    return {"type": "json_schema", "json_schema": {**strict, "schema": schema}}


def _kinds(node: dict[str, Any]) -> list[Any]:
    kind = node.get("type")
    return kind if isinstance(kind, list) else [kind]


def _free_string(node: dict[str, Any]) -> bool:
    return "string" in _kinds(node) and not any(k in node for k in ("enum", "const", "pattern", "format"))


def _items_cap(node: dict[str, Any], items: int) -> int:
    cap = max(items, node.get("minItems", 0))
    return int(min(node.get("maxItems", cap), cap))


def _bound(node: Any, string_cap: int, items: int) -> None:
    if isinstance(node, list):
        for item in node:
            _bound(item, string_cap, items)
        return
    if not isinstance(node, dict):
        return
    if _free_string(node):
        low = node.get("minLength", 0)
        cap = max(string_cap, low)
        node["maxLength"] = min(node.get("maxLength", cap), cap)
        node["pattern"] = f"^{_ASCII_TEXT}{{{low},{node['maxLength']}}}$"
    if "array" in _kinds(node):
        node["maxItems"] = _items_cap(node, items)
    low, high = node.get("minimum"), node.get("maximum")
    if _kinds(node) == ["number"] and "enum" not in node and "const" not in node and low is not None and high is not None:
        node["enum"] = [round(low + (high - low) * i / LOCAL_NUMBER_STEPS, 6) for i in range(LOCAL_NUMBER_STEPS + 1)]
    for value in node.values():
        if isinstance(value, dict | list):
            _bound(value, string_cap, items)


def _longest_answer(node: Any, root: dict[str, Any], depth: int, items: int) -> tuple[int, int]:
    """(free strings, other characters) in the longest JSON the schema allows once bounded,
    counting the grammar's optional whitespace; a guess for what cannot be bounded (recursion)."""
    if not isinstance(node, dict) or depth > 12:
        return 0, 8
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _longest_answer(target, root, depth + 1, items)
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key]:
            return max((_longest_answer(b, root, depth + 1, items) for b in node[key]), key=lambda t: t[0] * 100 + t[1])
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")])
        return 0, max((len(json.dumps(v)) for v in values), default=4)
    kinds = _kinds(node)
    if "object" in kinds and isinstance(node.get("properties"), dict):
        strings, fixed = 0, 2
        for key, sub in node["properties"].items():
            s, f = _longest_answer(sub, root, depth + 1, items)
            strings, fixed = strings + s, fixed + f + len(json.dumps(key)) + _JSON_SEPARATOR_CHARS
        return strings, fixed
    if "array" in kinds:
        count = _items_cap(node, items)
        s, f = _longest_answer(node.get("items", {}), root, depth + 1, items)
        return count * s, 2 + count * (f + _JSON_SEPARATOR_CHARS)
    if _free_string(node):
        return 1, 2
    if "string" in kinds:
        return 0, 2 + int(node.get("maxLength", 24))
    if kinds == ["number"] and "minimum" in node and "maximum" in node:
        return 0, 8  # becomes an enum of short steps
    return 0, 18


def _make_strict(node: Any, root: dict[str, Any]) -> Any:
    """In place: what OpenAI's strict mode wants (closed objects, every property required,
    no `$ref` with siblings, no null defaults); local servers accept the same schema."""
    if isinstance(node, list):
        return [_make_strict(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    for defs_key in ("$defs", "definitions"):
        if isinstance(node.get(defs_key), dict):
            for sub in node[defs_key].values():
                _make_strict(sub, root)
    if node.get("type") == "object" and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if isinstance(node.get("properties"), dict):
        node["required"] = list(node["properties"])
        for sub in node["properties"].values():
            _make_strict(sub, root)
    if isinstance(node.get("items"), dict):
        _make_strict(node["items"], root)
    for key in ("anyOf", "oneOf", "prefixItems"):
        if isinstance(node.get(key), list):
            _make_strict(node[key], root)
    if isinstance(node.get("allOf"), list):
        if len(node["allOf"]) == 1:
            only = node.pop("allOf")[0]
            node.update(_make_strict(only, root))
        else:
            _make_strict(node["allOf"], root)
    if "default" in node and node["default"] is None:
        del node["default"]
    ref = node.get("$ref")
    if isinstance(ref, str) and len(node) > 1:
        resolved: Any = root
        for part in ref.removeprefix("#/").split("/"):
            resolved = resolved[part]
        node.update({**resolved, **node})
        del node["$ref"]
        _make_strict(node, root)
    return node


def _parse(content: str, output_model: type[T]) -> tuple[T | None, str]:
    """(instance, "") or (None, one-line reason). Repairs near-JSON before giving up."""
    try:
        return output_model.model_validate_json(content), ""
    except ValidationError as exc:
        error = exc
    if any(e["type"] == "json_invalid" for e in error.errors()):
        repaired = repair_json(content)
        if repaired is not None and repaired != content:
            try:
                return output_model.model_validate_json(repaired), ""
            except ValidationError as exc:
                error = exc
    return None, _summarize_validation(error)


def _summarize_validation(error: ValidationError) -> str:
    problems = error.errors()
    parts = []
    for problem in problems[:3]:
        loc = ".".join(str(p) for p in problem["loc"]) or "answer"
        parts.append(f"{loc}: {problem['msg']}")
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return _one_line("; ".join(parts) + more, 400)


_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_OPENERS = {"{": "}", "[": "]"}


def repair_json(text: str) -> str | None:
    """Best-effort fix of near-JSON: code fences, prose around the value, trailing commas,
    smart double quotes. Returns None when there is no JSON value to salvage."""
    candidate = text.strip()
    fenced = _FENCE.search(candidate)
    if fenced:
        candidate = fenced.group(1).strip()
    starts = [i for i in (candidate.find("{"), candidate.find("[")) if i >= 0]
    if not starts:
        return None
    start = min(starts)
    end = candidate.rfind(_OPENERS[candidate[start]])
    if end < start:
        return None
    return _fix_commas_and_quotes(candidate[start : end + 1])


def _fix_commas_and_quotes(text: str) -> str:
    out: list[str] = []
    in_string = False
    closer = '"'
    escaped = False
    length = len(text)
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == closer:
                in_string = False
                ch = '"'
            elif ch == '"':
                ch = '\\"'  # a plain quote inside a smart-quoted string
            out.append(ch)
            continue
        if ch == '"' or ch == "\u201c":
            in_string, closer = True, ('"' if ch == '"' else "\u201d")
            out.append('"')
            continue
        if ch == ",":
            j = i + 1
            while j < length and text[j] in " \t\r\n":
                j += 1
            if j < length and text[j] in "}]":
                continue  # trailing comma
        out.append(ch)
    return "".join(out)


def _estimate_tokens(messages: Sequence[Message]) -> int:
    chars = 0
    for message in messages:
        content = message.get("content")
        chars += len(content) if isinstance(content, str) else 0
    return chars // 4 + 4 * len(messages)


# --------------------------------------------------------------------------- analysis
def summarize_records(source: pl.DataFrame | str | Path | Iterable[str | Path]) -> pl.DataFrame:
    """Per tier/model: calls, ok rate, tokens, p50/p95 latency, retries and fallbacks.

    `source` is a DataFrame of records, a Parquet file, a directory of them, or a list."""
    if isinstance(source, pl.DataFrame):
        frame = source
    else:
        paths = [source] if isinstance(source, str | Path) else list(source)
        files: list[Path] = []
        for path in map(Path, paths):
            files.extend(sorted(path.glob("*.parquet")) if path.is_dir() else [path])
        frames = [pl.read_parquet(f) for f in files]
        frame = (
            pl.concat(frames, how="diagonal_relaxed")
            if frames
            else pl.from_arrow(CALL_RECORD_SCHEMA.empty_table())  # type: ignore[assignment]
        )
    return (
        frame.group_by("tier", "model")
        .agg(
            pl.len().alias("calls"),
            (pl.col("outcome") == "ok").mean().alias("ok_rate"),
            pl.col("prompt_tokens").sum(),
            pl.col("completion_tokens").sum(),
            pl.col("latency_ms").quantile(0.5, "linear").alias("p50_latency_ms"),
            pl.col("latency_ms").quantile(0.95, "linear").alias("p95_latency_ms"),
            pl.col("attempts").sum(),
            pl.col("retries_transient").sum(),
            pl.col("retries_rate_limited").sum(),
            pl.col("retries_bad_output").sum(),
            pl.col("fallbacks").sum(),
        )
        .sort("tier", "model")
    )
