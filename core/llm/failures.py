"""The one-line errors users see when an LLM call fails, and how long a 429 asks to wait.

Which failures are retried is decided by core.errors (`llm_retry_kind` for the gateway's loop,
`classify` for everyone else): transient -> back off and retry; rate_limited -> honour
Retry-After; fatal -> raise at once with a hint saying what to fix (`fatal_error` here).
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import openai

from core.errors import LLMFatalError, api_detail, clip_line

if TYPE_CHECKING:
    from core.llm.routing import Target


#: What to do about a server whose streams Skald cannot read (also core.llm.steps).
STREAM_HINT = (
    "set llm_stream = false under [limits] in skald.toml (or SKALD_LIMITS__LLM_STREAM=false)"
)


class NoStreamError(openai.OpenAIError):
    """A streamed request answered with no event: the server (or a proxy before it) does not
    stream, and asking again will not change that."""


def describe_failure(exc: openai.OpenAIError) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return clip_line(f"connection failed: {cause or exc.message}", 160)
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {api_detail(exc)}"
    return clip_line(f"{type(exc).__name__}: {exc}", 160)


def fatal_error(exc: openai.OpenAIError, target: Target, tier: str, purpose: str) -> LLMFatalError:
    url, model = target.endpoint.base_url, target.model
    status = getattr(exc, "status_code", None)
    detail = api_detail(exc)
    if isinstance(exc, NoStreamError) or (status == 400 and "stream" in detail.lower()):
        what = f"HTTP 400: {detail}" if status == 400 else str(exc)
        return LLMFatalError(
            clip_line(f"LLM endpoint {url} cannot stream answers for model {model!r} ({what})"),
            hint=STREAM_HINT,
        )
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
        clip_line(f"LLM client error for {url} ({model!r}): {type(exc).__name__}: {exc}")
    )


def retry_after_s(exc: openai.OpenAIError, cap: float) -> float | None:
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
