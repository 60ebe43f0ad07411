"""The step driver: the gateway's retry/fallback logic is written once, as a generator of
I/O requests (`Call`, `Sleep`); `drive` performs them blocking, `adrive` awaiting.

Why not tenacity: a retry here is not "call the same function again". Each attempt may
change the request (re-ask with the validation error, more room, a tighter grammar), move to
the next candidate in health order, honour Retry-After, and count every step in the call's
record, and the same logic must serve sync and async callers. A generator that yields its
I/O keeps that in one readable loop (core.llm.gateway); tenacity would split it into
callbacks and still need the sync/async pair. `RetryPolicy` holds the timing knobs.

A chat call asks for a streamed answer unless the settings say not (`limits.llm_stream`): the
client's timeout then bounds each silence of the server (before its first token, between two)
rather than the whole answer, so a slow model that keeps talking is not cut off and asked
again from the start. The chunks are put together by the openai package's own accumulator
(`ChatCompletionStreamState`), and what the driver hands back reads like a whole completion.
A read timeout or a broken connection in the middle of a stream comes out of the openai
package (3.57 on) as the `APITimeoutError` or `APIConnectionError` a whole answer's would; a
stream whose body ends before its finish reason is raised here as the latter.
A chat request to a server with few slots first waits for one in the process (`Endpoint.serving`,
core.llm.routing), so what the timeout counts is the model's own silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import openai
from openai import AsyncOpenAI, OpenAI
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel, ConfigDict, Field

from core.interrupt import stop_if_interrupted
from core.llm.failures import STREAM_HINT, NoStreamError
from core.llm.routing import Target
from core.priority import QUERIES

if TYPE_CHECKING:
    import httpx2  # the openai package's HTTP client (its fork of httpx)


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
    #: A chat call whose answer is asked for streamed (see the module's docstring).
    stream: bool = False


@dataclass(slots=True)
class Sleep:
    seconds: float


Steps = Generator[Call | Sleep, Any, Any]


def _create(client: OpenAI | AsyncOpenAI, op: Call) -> Any:
    """The client method that performs `op` (the same on the sync and the async client)."""
    return client.chat.completions.create if op.kind == "chat" else client.embeddings.create


#: The token counts come in the stream's last chunk only when asked for.
_STREAM_KWARGS: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}


def _whole(state: ChatCompletionStreamState, chunks: int, request: httpx2.Request) -> Any:
    """The streamed answer as a completion reads (`choices`, `usage`)."""
    if not chunks:
        # A whole JSON body, or nothing: no event of a stream (a proxy that buffers the answer
        # and drops the stream's format answers so).
        raise NoStreamError("the streamed answer held no event")
    completion = state.current_completion_snapshot
    if not completion.choices or any(c.finish_reason is None for c in completion.choices):
        # A stream whose body ended before its answer did (a proxy that dropped its upstream
        # and closed the body properly): the text so far would pass for a whole answer, a
        # scene cut mid-sentence. Lost like a dropped connection, so asked again like one.
        raise openai.APIConnectionError(message=_CUT_STREAM, request=request)
    return completion


_CUT_STREAM = (
    "the streamed answer ended without a finish reason (cut off on its way; if this server "
    f"never sends one, {STREAM_HINT})"
)


def _streamed_chat(client: OpenAI, kwargs: dict[str, Any]) -> Any:
    state = ChatCompletionStreamState()
    chunks = 0
    with client.chat.completions.create(**kwargs, **_STREAM_KWARGS) as stream:
        for chunk in stream:
            stop_if_interrupted()
            state.handle_chunk(chunk)
            chunks += 1
    return _whole(state, chunks, stream.response.request)


async def _astreamed_chat(client: AsyncOpenAI, kwargs: dict[str, Any]) -> Any:
    state = ChatCompletionStreamState()
    chunks = 0
    async with await client.chat.completions.create(**kwargs, **_STREAM_KWARGS) as stream:
        async for chunk in stream:
            stop_if_interrupted()
            state.handle_chunk(chunk)
            chunks += 1
    return _whole(state, chunks, stream.response.request)


def drive(steps: Steps) -> Any:
    """Run `steps` with blocking I/O; the generator's return value is the result."""
    try:
        op = next(steps)
        while True:
            stop_if_interrupted()
            if type(op) is Sleep:
                time.sleep(op.seconds)
                op = steps.send(None)
                continue
            endpoint = op.target.endpoint
            try:
                with endpoint.serving() if op.kind == "chat" else contextlib.nullcontext():
                    client = endpoint.sync()
                    result: Any = (
                        _streamed_chat(client, op.kwargs)
                        if op.stream
                        else _create(client, op)(**op.kwargs)
                    )
            except openai.OpenAIError as exc:
                # A call the run's stop cut (core.interrupt) failed for that, not the server.
                stop_if_interrupted()
                result = exc
            if op.stream:
                # What a whole answer's response hook does as it arrives (core.llm.routing), with
                # the server's slot given back first: the answer's processing waits for the
                # memory queries in flight.
                QUERIES.yield_to_queries()
            op = steps.send(result)
    except StopIteration as done:
        return done.value


async def adrive(steps: Steps) -> Any:
    """Run `steps` in the running event loop; the generator's return value is the result."""
    try:
        op = next(steps)
        while True:
            stop_if_interrupted()
            if type(op) is Sleep:
                await asyncio.sleep(op.seconds)
                op = steps.send(None)
                continue
            endpoint = op.target.endpoint
            try:
                async with endpoint.aserving() if op.kind == "chat" else contextlib.nullcontext():
                    aclient = endpoint.async_()
                    result: Any = await (
                        _astreamed_chat(aclient, op.kwargs)
                        if op.stream
                        else _create(aclient, op)(**op.kwargs)
                    )
            except openai.OpenAIError as exc:
                result = exc
            op = steps.send(result)
    except StopIteration as done:
        return done.value
