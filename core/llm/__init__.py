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

One concern per module:
- `gateway`: `LLMGateway`, the public calls and the retry/fallback engine;
- `steps`: the sync/async step driver and the retry timing (`RetryPolicy`);
- `routing`: endpoints (openai clients) and health-ordered candidate chains;
- `failures`: failure classification and the one-line fatal errors;
- `schemas`: strict and tiny-model-bounded JSON schemas;
- `repair`: near-JSON repair and validation of an answer;
- `sampling`: anti-repetition request fields;
- `records`: call records, their Parquet files and `summarize_records`.
"""

from core.errors import (
    LLMBadOutputError,
    LLMError,
    LLMFatalError,
    LLMTimeoutError,
    LLMUnavailableError,
)
from core.llm.chat import FEEDBACK, Message
from core.llm.gateway import EMBEDDING_TIER, LLMGateway
from core.llm.records import CALL_RECORD_SCHEMA, CallRecord, Outcome, summarize_records
from core.llm.repair import repair_json
from core.llm.routing import NO_API_KEY
from core.llm.sampling import anti_repetition_kwargs, first_draft_anti_repetition
from core.llm.schemas import (
    LOCAL_CHARS_PER_TOKEN,
    LOCAL_MAX_ITEMS,
    LOCAL_MAX_STRING_CHARS,
    LOCAL_MIN_STRING_CHARS,
    LOCAL_NUMBER_STEPS,
    bounded_response_format_for,
    response_format_for,
)
from core.llm.steps import RetryPolicy

__all__ = [
    "CALL_RECORD_SCHEMA",
    "EMBEDDING_TIER",
    "FEEDBACK",
    "LOCAL_CHARS_PER_TOKEN",
    "LOCAL_MAX_ITEMS",
    "LOCAL_MAX_STRING_CHARS",
    "LOCAL_MIN_STRING_CHARS",
    "LOCAL_NUMBER_STEPS",
    "NO_API_KEY",
    "CallRecord",
    "LLMBadOutputError",
    "LLMError",
    "LLMFatalError",
    "LLMGateway",
    "LLMTimeoutError",
    "LLMUnavailableError",
    "Message",
    "Outcome",
    "RetryPolicy",
    "anti_repetition_kwargs",
    "bounded_response_format_for",
    "first_draft_anti_repetition",
    "repair_json",
    "response_format_for",
    "summarize_records",
]
