"""`LLMGateway`: tiered, health-ordered, validated access to OpenAI-compatible endpoints.

The public calls (`structured`, `text`, `embed` and their async twins) build one step
generator per logical call (the retry/fallback engine below) and hand it to the sync or
async driver (core.llm.steps). The engine asks the router for the tier's candidates
(core.llm.routing), classifies failures (core.llm.failures), validates and repairs answers
(core.llm.repair) against strict schemas (core.llm.schemas), and leaves one call record
per logical call (core.llm.records).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Generator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import openai
from pydantic import BaseModel

from core.errors import (
    Err,
    LLMBadOutputError,
    LLMError,
    LLMFatalError,
    LLMRetryKind,
    LLMTimeoutError,
    LLMUnavailableError,
    Ok,
    Result,
    clip_line,
    llm_retry_kind,
)
from core.llm.chat import ChatRequest, Message, read_reply
from core.llm.failures import describe_failure, fatal_error, retry_after_s
from core.llm.records import CallRecord, CallStats, write_parquet
from core.llm.routing import Health, Router, Target
from core.llm.sampling import first_draft_anti_repetition
from core.llm.steps import Call, RetryPolicy, Sleep, Steps, adrive, drive
from core.llm_server import LOCAL_CHAT_MODEL
from core.lru import LRU
from core.settings import Settings

log = logging.getLogger("skald.llm")
#: Call-record tags (turn trace ids) indexed at once; older untaken ones age out.
_MAX_OPEN_TAGS = 4096

T = TypeVar("T", bound=BaseModel)
#: Why a candidate gave no answer: no reply (unavailable, timeout) or none valid.
_ChatFailure = Literal["unavailable", "timeout", "bad_output"]

EMBEDDING_TIER = "embedding"
_UNAVAILABLE_HINT = "is the server running? set OPENAI_BASE_URL"
_EMBEDDING_HINT = "is the server running? set SKALD_EMBEDDING_BASE_URL"


def timeout_hint(seconds: float, *, streamed: bool = False) -> str:
    """What to do when every attempt timed out: the server answered nothing within the setting's
    seconds, which a slow model (a large one on a CPU, a reasoning model) needs more than; "is
    the server running?" would send the user after the wrong thing. `streamed`: the seconds
    bounded each silence (before the first token: the prompt's processing), not the answer."""
    waited = (
        f"each attempt heard nothing from the model for {seconds:g} s (a long prompt is read "
        "before the first token)"
        if streamed
        else f"each attempt waited {seconds:g} s for a whole answer"
    )
    return (
        f"{waited}: a slower model needs more, "
        "e.g. SKALD_LIMITS__LLM_TIMEOUT_S=600 or llm_timeout_s under [limits] in skald.toml"
    )


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
        flush_after_s: float | None = None,
    ) -> None:
        """`max_records`: keep at most this many call records in memory (a long-running
        server); older ones are appended to `flush_dir/llm-calls-<run_id>-<day>-<n>.parquet`
        (dropped when no directory is given). None keeps every record (batch runs).
        `flush_after_s` (with `flush_dir`): a record goes to that folder at most this many
        seconds after its call, so a server killed with `kill -9` loses no older ones."""
        self.settings = settings
        self.run_id = run_id or f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
        self.retry = retry or RetryPolicy()
        self._router = Router(settings)
        self._health = Health(self.retry.health_window)
        self._records: list[CallRecord] = []
        self._records_lock = threading.Lock()
        # One writer of the records' file at a time: the regression batch saves it from the
        # thread that sees a dialogue end, and two writers would race on its ".partial" file.
        self._write_lock = threading.Lock()
        self._max_records = max_records
        self._flush_dir = Path(flush_dir) if flush_dir is not None else None
        self._flushed_files = 0
        self.flushed_records = 0
        self._flush_after_s = flush_after_s if self._flush_dir is not None else None
        # Armed by the first record since the last flush; a daemon thread, so a process that
        # ends does not wait for it (close() flushes what is left).
        self._flush_timer: threading.Timer | None = None
        # Records by the tag after "|" in their purpose (a turn's trace id): a turn finds its
        # own calls without scanning every record. Bounded: tags nobody takes age out.
        self._by_tag = LRU(_MAX_OPEN_TAGS)
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
        return drive(steps)  # type: ignore[no-any-return]

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
        sample: int = 0,
    ) -> str:
        """The assistant's reply text (never empty). `anti_repetition` adds the tier's
        anti-repetition sampling (settings `tiers.<tier>.anti_repetition`) to the request;
        `sample` > 0 asks the same request for another answer (a seeded server gives the same
        request the same answer: core.llm.sampling)."""
        steps = self._chat_steps(
            tier, messages, None, purpose, model, max_tokens, temperature, anti_repetition, sample
        )
        return drive(steps)  # type: ignore[no-any-return]

    def embed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        """float32 array of shape (len(texts), dim)."""
        return drive(self._embed_steps(texts, purpose))  # type: ignore[no-any-return]

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
        return await adrive(steps)  # type: ignore[no-any-return]

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
        sample: int = 0,
    ) -> str:
        steps = self._chat_steps(
            tier, messages, None, purpose, model, max_tokens, temperature, anti_repetition, sample
        )
        return await adrive(steps)  # type: ignore[no-any-return]

    async def aembed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        return await adrive(self._embed_steps(texts, purpose))  # type: ignore[no-any-return]

    def sends_anti_repetition_first(self, tier: str) -> bool:
        """Whether prose of this tier gets anti-repetition sampling on the first try
        (`tiers.<tier>.anti_repetition.first_draft`; unset: only on the embedded model)."""
        return first_draft_anti_repetition(
            self.settings.tier(tier).anti_repetition, embedded=self.settings.embedded_tier(tier)
        )

    def endpoint_label(self, tier: str) -> str:
        """ "<base_url> (<model>)" of the tier's first candidate, for logs and `doctor`."""
        targets = self._router.targets(tier, None)
        more = f" +{len(targets) - 1} fallback(s)" if len(targets) > 1 else ""
        return f"{targets[0].endpoint.base_url} ({targets[0].model}){more}"

    def embedding_fingerprint(self) -> str:
        """What decides a vector besides the text: an endpoint's model by name, the in-process
        model by its weights' hash. Vectors with different fingerprints are not comparable
        (task caches key on it; a remembered turn records it, kg.dialogue `embedded_by`)."""
        if self.settings.embedding_base_url is not None:
            endpoint = _without_secrets(str(self.settings.embedding_base_url))
            return f"{endpoint}|{self.settings.embedding_model}"
        from core.embedder import MODEL_NAME, MODEL_SHA256

        return f"local|{MODEL_NAME}|{MODEL_SHA256[:16]}"

    def embedding_endpoint_label(self) -> str:
        if self.settings.embedding_base_url is None:
            from core.embedder import MODEL_NAME

            return f"in-process ({MODEL_NAME}, onnxruntime)"
        target = self._router.embedding_target()
        return f"{target.endpoint.base_url} ({target.model})"

    def check_endpoint(self, tier: str = "large") -> str:
        """Fail fast before a long run: one `GET /models` per distinct endpoint of the tier.

        Returns the endpoint label when any candidate's server answers; raises
        LLMFatalError (e.g. a rejected key) or LLMUnavailableError (nothing reachable)."""
        targets = self._router.targets(tier, None)
        timeout = min(self.settings.limits.llm_timeout_s, 10.0)
        last_error, timed_out = "", False
        for endpoint in dict.fromkeys(t.endpoint for t in targets):
            try:
                endpoint.sync().models.list(timeout=timeout)
                return self.endpoint_label(tier)
            except (openai.NotFoundError, openai.RateLimitError):
                return self.endpoint_label(tier)  # it answered: /models is optional, 429 is load
            except openai.OpenAIError as exc:
                if llm_retry_kind(exc) == "fatal":
                    model = next(t.model for t in targets if t.endpoint is endpoint)
                    raise fatal_error(exc, Target(model, endpoint), tier, "preflight") from None
                last_error, timed_out = (
                    describe_failure(exc),
                    isinstance(exc, openai.APITimeoutError),
                )
        urls = ", ".join(dict.fromkeys(t.endpoint.base_url for t in targets))
        raise _unavailable(timed_out)(
            f"LLM endpoint {urls} unreachable (tier {tier}): {last_error}", hint=_UNAVAILABLE_HINT
        )

    @property
    def records(self) -> list[CallRecord]:
        with self._records_lock:
            return list(self._records)

    def records_for(self, tag: str) -> list[CallRecord]:
        """The records whose purpose ends in `|tag` (kept for a later take)."""
        with self._records_lock:
            return list(self._by_tag.peek(tag, ()))

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
        self._flush(old)

    def _flush_pending(self) -> None:
        """Every record still in memory to the flush directory (the timer's call)."""
        with self._records_lock:
            self._flush_timer = None
            old, self._records = self._records, []
            self._flush(old)

    def _flush(self, old: list[CallRecord]) -> None:
        """`old` (out of memory already) to the next file of `flush_dir`, if one is set.
        Called with _records_lock held."""
        self.flushed_records += len(old)
        if self._flush_dir is None or not old:
            return
        try:
            self._flush_dir.mkdir(parents=True, exist_ok=True)
            self._flushed_files += 1
            day = datetime.now(UTC).strftime("%Y%m%d")
            name = f"llm-calls-{self.run_id}-{day}-{self._flushed_files:05d}.parquet"
            write_parquet(old, self._flush_dir / name)
        except OSError as exc:
            log.warning(
                "could not flush %d LLM call records to %s: %s", len(old), self._flush_dir, exc
            )

    def health(self) -> dict[tuple[str, str], tuple[float, int]]:
        """{(base_url, model): (success rate, samples)} over the rolling window."""
        return self._health.snapshot()

    def write_records(self, path: str | Path) -> Path:
        """Write this run's records to `<path>/llm-calls-<run_id>.parquet` (or to `path`
        itself when it ends in .parquet). One file per run, rewritten atomically."""
        path = Path(path)
        target = path if path.suffix == ".parquet" else path / f"llm-calls-{self.run_id}.parquet"
        with self._write_lock:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_parquet(self.records, target)
        return target

    def save_records(self, path: str | Path) -> Path | None:
        """`write_records` for a run's call log kept as the run goes (after each chapter or
        dialogue, when it fails, at its end), so that a run that fails or is killed still shows
        what its calls cost: None while there is nothing to write, and a disk that refuses the
        file is a warning, never the run's failure (it is a log, not the run's output)."""
        if not self.records:
            return None
        try:
            return self.write_records(path)
        except OSError as exc:
            log.warning("could not write the LLM call log to %s: %s", path, exc)
            return None

    def close(self) -> None:
        """Close the sync clients (async ones: `await aclose()` inside their loop). With a flush
        directory (a server's gateway), the records still in memory go to it too: a sidecar
        that stops loses none of its calls (killed, the ones since its last flush)."""
        if self._flush_dir is not None:
            with self._records_lock:
                if self._flush_timer is not None:
                    self._flush_timer.cancel()
                    self._flush_timer = None
                old, self._records = self._records, []
                self._flush(old)
        for endpoint in self._router.all_endpoints():
            endpoint.close()

    async def aclose(self) -> None:
        for endpoint in self._router.all_endpoints():
            await endpoint.aclose()

    def __enter__(self) -> LLMGateway:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
        sample: int = 0,
    ) -> Steps:
        schema_name = output_model.__name__ if output_model is not None else None
        stats = CallStats(tier=tier_name, purpose=purpose, schema_name=schema_name)
        started = time.perf_counter()
        try:
            return (
                yield from self._chat_attempts(
                    stats,
                    tier_name,
                    messages,
                    output_model,
                    model,
                    max_tokens,
                    temperature,
                    anti_repetition,
                    sample,
                )
            )
        except BaseException as exc:
            if stats.outcome is None:  # not one of ours: keep why (cancelled, server start failed)
                stats.error = clip_line(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._record(stats, started)

    def _chat_attempts(
        self,
        stats: CallStats,
        tier_name: str,
        messages: Sequence[Message],
        output_model: type[BaseModel] | None,
        model: str | None,
        max_tokens: int | None,
        temperature: float | None,
        anti_repetition: bool = False,
        sample: int = 0,
    ) -> Steps:
        """The tier's candidates in health order, each asked until it answers or its attempts
        run out (`_candidate_attempts`): the first answer, or the last candidate's failure
        raised (`_chat_error`)."""
        targets = self._health.order(self._router.targets(tier_name, model))
        base = messages if isinstance(messages, list) else list(messages)
        failed: Err[_ChatFailure] = Err("", "unavailable")
        for index, target in enumerate(targets):
            if index:
                stats.fallbacks += 1
                stats.fallback_reasons.append(f"{targets[index - 1].model}: {failed.reason}"[:300])
            stats.model = target.model
            stats.endpoint = target.endpoint.base_url
            outcome = yield from self._candidate_attempts(
                stats,
                tier_name,
                target,
                base,
                output_model,
                max_tokens,
                temperature,
                anti_repetition,
                sample,
            )
            if isinstance(outcome, Ok):
                return outcome.value
            failed = outcome
        raise self._chat_error(stats, tier_name, targets, failed)

    def _candidate_attempts(
        self,
        stats: CallStats,
        tier_name: str,
        target: Target,
        base: list[Message],
        output_model: type[BaseModel] | None,
        max_tokens: int | None,
        temperature: float | None,
        anti_repetition: bool,
        sample: int,
    ) -> Generator[Call | Sleep, Any, Result[Any, _ChatFailure]]:
        """One candidate, up to `llm_max_attempts` calls: Ok(its answer), or Err(its last
        failure: unavailable, timeout or bad_output). A failed call is retried after the
        backoff (a fatal one raises); a bad answer is asked again, reshaped (ChatRequest)."""
        tier = self.settings.tier(tier_name)
        max_attempts = self.settings.limits.llm_max_attempts
        temp = tier.temperature if temperature is None else temperature
        request = ChatRequest.first(
            tier,
            base,
            output_model,
            max_tokens,
            tiny=self.settings.openai_base_url is None and target.model == LOCAL_CHAT_MODEL,
            tiny_max_tokens=self.settings.local_max_tokens,
            feedback_echo_chars=self.retry.feedback_echo_chars,
            seed=self.settings.llm_seed,
            sample=sample,
        )
        failed: Err[_ChatFailure] = Err("", "unavailable")
        transient_failures = 0
        for attempt in range(1, max_attempts + 1):
            stats.attempts += 1
            t0 = time.perf_counter()
            result = yield Call(
                target,
                "chat",
                request.kwargs(target.model, temp, anti_repetition),
                stream=self.settings.limits.llm_stream,
            )
            elapsed = time.perf_counter() - t0
            if isinstance(result, openai.OpenAIError):
                kind = self._raise_if_fatal(result, stats, target, tier_name)
                self._health.record(target.key, False, elapsed)
                timed_out = isinstance(result, openai.APITimeoutError)
                failed = Err(describe_failure(result), "timeout" if timed_out else "unavailable")
                if attempt == max_attempts:
                    break  # next candidate, if any
                delay = self._retry_delay_s(result, kind, stats, transient_failures)
                transient_failures += 1
                if delay > 0:
                    yield Sleep(delay)
                continue
            reply = read_reply(result, stats)
            answer = request.answer(reply, output_model)
            self._health.record(target.key, isinstance(answer, Ok), elapsed)
            if isinstance(answer, Ok):
                stats.outcome = "ok"
                return answer
            failed = Err(answer.reason, "bad_output")
            if attempt == max_attempts:
                break
            stats.retries_bad_output += 1
            request.after_bad_answer(reply, answer.reason, output_model)
        return failed

    def _chat_error(
        self,
        stats: CallStats,
        tier_name: str,
        targets: Sequence[Target],
        failed: Err[_ChatFailure],
    ) -> LLMError:
        """The one-line error of a call no candidate answered, recorded in `stats`."""
        names = ", ".join(dict.fromkeys(t.model for t in targets))
        what = f"tier {tier_name}, model {names}, purpose {stats.purpose or '-'}"
        if failed.kind == "bad_output":
            error: LLMError = LLMBadOutputError(
                f"LLM returned invalid output after {stats.attempts} attempts ({what}): "
                f"{failed.reason}"
            )
        else:
            urls = ", ".join(dict.fromkeys(t.endpoint.base_url for t in targets))
            timed_out = failed.kind == "timeout"
            error = _unavailable(timed_out)(
                f"LLM endpoint {urls} unavailable after {stats.attempts} attempts ({what}): "
                f"{failed.reason}",
                hint=timeout_hint(
                    self.settings.limits.llm_timeout_s, streamed=self.settings.limits.llm_stream
                )
                if timed_out
                else _UNAVAILABLE_HINT,
            )
        stats.outcome = "bad_output" if failed.kind == "bad_output" else "unavailable"
        stats.error = str(error)
        return error

    # ------------------------------------------------------------------ embeddings engine
    def _embed_steps(self, texts: Sequence[str], purpose: str) -> Steps:
        stats = CallStats(tier=EMBEDDING_TIER, purpose=purpose, schema_name=None)
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
                matrix = embedder.encode_recent(list(texts))
                stats.outcome = "ok"
                return matrix
            target = self._router.embedding_target()
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
                stats.error = clip_line(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._record(stats, started)

    def _embed_batch(self, stats: CallStats, target: Target, batch: list[str]) -> Steps:
        max_attempts = self.settings.limits.llm_max_attempts
        kwargs = {"model": target.model, "input": batch, "encoding_format": "float"}
        failure: Literal["unavailable", "bad_output"] = "unavailable"
        last_error, timed_out = "", False
        for attempt in range(1, max_attempts + 1):
            stats.attempts += 1
            result = yield Call(target, "embed", kwargs)
            if isinstance(result, openai.OpenAIError):
                kind = self._raise_if_fatal(result, stats, target, EMBEDDING_TIER)
                failure, last_error = "unavailable", describe_failure(result)
                timed_out = isinstance(result, openai.APITimeoutError)
                if attempt == max_attempts:
                    break
                yield Sleep(self._retry_delay_s(result, kind, stats, attempt - 1))
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
            error = _unavailable(timed_out)(
                f"embedding endpoint {target.endpoint.base_url} unavailable after {stats.attempts} "
                f"attempts (model {target.model}): {last_error}",
                hint=timeout_hint(self.settings.limits.llm_timeout_s)
                if timed_out
                else _EMBEDDING_HINT,
            )
        stats.error = str(error)
        raise error

    # ------------------------------------------------------------------ helpers
    def _raise_if_fatal(
        self, error: openai.OpenAIError, stats: CallStats, target: Target, tier: str
    ) -> LLMRetryKind:
        """The failure's kind; a fatal one is recorded and raised as its one-line error."""
        kind = llm_retry_kind(error)
        if kind == "fatal":
            fatal = fatal_error(error, target, tier, stats.purpose)
            stats.outcome, stats.error = "fatal", str(fatal)
            raise fatal
        return kind

    def _retry_delay_s(
        self, error: openai.OpenAIError, kind: LLMRetryKind, stats: CallStats, failures: int
    ) -> float:
        """Counts the retry; waits what a 429's Retry-After asks, else the jittered backoff."""
        if kind == "rate_limited":
            stats.retries_rate_limited += 1
            delay = retry_after_s(error, self.retry.retry_after_max_s)
            if delay is not None:
                return delay
        else:
            stats.retries_transient += 1
        return self.retry.backoff_s(failures, self._rng)

    def _record(self, stats: CallStats, started: float) -> None:
        record = stats.to_record(
            self.run_id, datetime.now(UTC), (time.perf_counter() - started) * 1000.0
        )
        with self._records_lock:
            self._records.append(record)
            _, bar, tag = record.purpose.rpartition("|")
            if bar and tag:
                self._by_tag.setdefault(tag, []).append(record)  # the tag now most recent
            if self._max_records is not None and len(self._records) > self._max_records:
                self._flush_oldest()
            if self._flush_after_s is not None and self._records and self._flush_timer is None:
                self._flush_timer = threading.Timer(self._flush_after_s, self._flush_pending)
                self._flush_timer.daemon = True
                self._flush_timer.start()


def _unavailable(timed_out: bool) -> type[LLMUnavailableError]:
    """The error for an endpoint that did not answer: LLMTimeoutError when its last request
    timed out (core.errors.classify calls that a timeout), else LLMUnavailableError."""
    return LLMTimeoutError if timed_out else LLMUnavailableError


def _without_secrets(url: str) -> str:
    """`url` without a user, password, query or fragment (the fingerprint is stored on every
    remembered turn and in reports); unchanged when it has none, so fingerprints, and the caches
    keyed on them, stay what they were."""
    parts = urlsplit(url)
    if not (parts.username or parts.password or parts.query or parts.fragment):
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
