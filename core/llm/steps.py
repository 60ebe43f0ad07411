"""The step driver: the gateway's retry/fallback logic is written once, as a generator of
I/O requests (`Call`, `Sleep`); `drive` performs them blocking, `adrive` awaiting.

Why not tenacity: a retry here is not "call the same function again". Each attempt may
change the request (re-ask with the validation error, more room, a tighter grammar), move to
the next candidate in health order, honour Retry-After, and count every step in the call's
record, and the same logic must serve sync and async callers. A generator that yields its
I/O keeps that in one readable loop (core.llm.gateway); tenacity would split it into
callbacks and still need the sync/async pair. `RetryPolicy` holds the timing knobs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import openai
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, ConfigDict, Field

from core.llm.routing import Target


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

    def backoff_s(self, failures: int, rng: random.Random) -> float:
        """Capped exponential backoff with "equal jitter": half fixed, half random, so
        concurrent callers spread out."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * (2**failures))
        return ceiling / 2 + rng.random() * ceiling / 2


@dataclass(slots=True)
class Call:
    """Engine -> driver: perform one HTTP request and send back the response or error."""

    target: Target
    kind: Literal["chat", "embed"]
    kwargs: dict[str, Any]


@dataclass(slots=True)
class Sleep:
    seconds: float


Steps = Generator[Call | Sleep, Any, Any]


def _create(client: OpenAI | AsyncOpenAI, op: Call) -> Any:
    """The client method that performs `op` (the same on the sync and the async client)."""
    return client.chat.completions.create if op.kind == "chat" else client.embeddings.create


def drive(steps: Steps) -> Any:
    """Run `steps` with blocking I/O; the generator's return value is the result."""
    try:
        op = next(steps)
        while True:
            if type(op) is Sleep:
                time.sleep(op.seconds)
                op = steps.send(None)
                continue
            try:
                result: Any = _create(op.target.endpoint.sync(), op)(**op.kwargs)
            except openai.OpenAIError as exc:
                result = exc
            op = steps.send(result)
    except StopIteration as done:
        return done.value


async def adrive(steps: Steps) -> Any:
    """Run `steps` in the running event loop; the generator's return value is the result."""
    try:
        op = next(steps)
        while True:
            if type(op) is Sleep:
                await asyncio.sleep(op.seconds)
                op = steps.send(None)
                continue
            try:
                result: Any = await _create(op.target.endpoint.async_(), op)(**op.kwargs)
            except openai.OpenAIError as exc:
                result = exc
            op = steps.send(result)
    except StopIteration as done:
        return done.value
