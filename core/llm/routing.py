"""Endpoints and health-ordered routing: which (base URL, model) a tier's call goes to.

A tier's candidates (settings `tiers.<tier>.models`, else OPENAI_BASE_URL's default model,
else the embedded llama-server) are tried in health order: rolling success rate first,
then latency; untried candidates keep their configured order.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
from openai import AsyncOpenAI, DefaultHttpxClient, OpenAI

from core.errors import LLMFatalError
from core.interrupt import on_stop, stop_if_interrupted
from core.priority import QUERIES
from core.settings import Settings

NO_API_KEY = "not-needed"  # local servers ignore the key, but the openai client wants one
#: How often a coroutine waiting for a server's slot looks again (a few ms against answers that
#: take seconds).
_SLOT_POLL_S = 0.005
#: How often a thread waiting for a slot looks whether the run was interrupted.
_SLOT_LOOK_S = 0.5


#: How long a finished stream's last bytes (the body's end after `[DONE]`) are waited for, as
#: the openai package's async streams do (0.1 s): a server that sends them late loses only the
#: connection, never the answer's time.
_DRAIN_READ_S = 0.1
#: ... and how much of them: the body's end is a few bytes; a server that goes on talking after
#: `[DONE]` loses the connection instead.
_DRAIN_MAX_BYTES = 65_536


class _DrainedAfterDone(httpx2.SyncByteStream):
    """A streamed body that is read to its end when closed after `[DONE]`.

    The openai package's sync streams stop reading at `[DONE]` and close the response, a few
    bytes short of the body's end, so the connection cannot go back to the pool: measured
    against the scripted server, 19 of 20 streamed calls opened a new connection (a TCP and TLS
    handshake each against a remote API). Its async streams read those bytes first (openai
    3.57 `drain_response_async`); this does the same for the sync client. A body closed before
    `[DONE]` (a stall, a cut, an error) is closed as it is: reading on could wait out a model
    that is still talking."""

    def __init__(self, body: httpx2.SyncByteStream, request: httpx2.Request) -> None:
        self._body, self._request = body, request
        self._tail = b""

    @property
    def elapsed(self) -> Any:  # httpx2's `Response.elapsed` reads it from the stream
        return getattr(self._body, "elapsed", None)

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._body:
            self._tail = (self._tail + piece)[-32:]
            yield piece

    def close(self) -> None:
        try:
            if self._tail.rstrip().endswith(b"[DONE]"):
                timeout = self._request.extensions.get("timeout")
                if isinstance(timeout, dict):  # httpcore reads it as the rest is read
                    timeout["read"] = _DRAIN_READ_S
                left = _DRAIN_MAX_BYTES
                for piece in self._body:
                    left -= len(piece)
                    if left < 0:
                        break
        except httpx2.HTTPError:
            pass  # the answer is whole already: only the connection is lost
        finally:
            self._body.close()


#: The sockets the sync clients have opened (a connection's TCP socket, and its TLS one over it).
_SOCKETS: weakref.WeakSet[socket.socket] = weakref.WeakSet()
#: Re-entrant: `_cut_connections` may run in a signal handler on a thread that holds it.
_SOCKETS_LOCK = threading.RLock()
_OPENED = frozenset({"connection.connect_tcp.complete", "connection.start_tls.complete"})


def _note_connection(event: str, info: dict[str, Any]) -> None:
    """httpcore's `trace` extension: remember each socket a connection opens."""
    if event in _OPENED:
        opened = info["return_value"].get_extra_info("socket")
        if isinstance(opened, socket.socket):
            with _SOCKETS_LOCK:
                _SOCKETS.add(opened)


def _on_request(request: httpx2.Request) -> None:
    request.extensions.setdefault("trace", _note_connection)


def _cut_connections() -> None:
    """Shut down every connection of the sync clients (`core.interrupt.on_stop`): a worker
    thread blocked reading the answer's first byte, which the stop flag cannot reach, then
    reads the end of its connection at once instead of after the model's whole prefill (a
    large model reading a long prompt: minutes), and a llama-server sees the client gone and
    drops the request. The run is ending: connections kept idle in the pools go too."""
    with _SOCKETS_LOCK:
        opened = list(_SOCKETS)
    for connection in opened:
        with contextlib.suppress(OSError):  # closed already
            # The plain socket's shutdown even for a TLS one: SSLSocket's own would also drop
            # its TLS state under the thread reading it.
            socket.socket.shutdown(connection, socket.SHUT_RDWR)


on_stop(_cut_connections)


def _on_response(response: httpx2.Response) -> None:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        # A streamed answer has only begun when its headers arrive: core.llm.steps yields to
        # the memory queries once it has been read whole.
        if isinstance(response.stream, httpx2.SyncByteStream):
            response.stream = _DrainedAfterDone(response.stream, response.request)
        return
    QUERIES.yield_to_queries()


class Endpoint:
    """One base URL + key: a lazily built sync client and one async client per event loop.

    `slots`: how many chat requests the server answers at once, when it is few (the embedded
    llama-server has one). The process then sends it no more than that: the others wait here
    (`serving`, `aserving`), not in the server's queue, where the wait would count as the
    model's silence toward `llm_timeout_s` and a request queued behind three long ones would
    time out and be asked again from the back of the queue."""

    __slots__ = ("base_url", "_api_key", "_timeout", "_sync", "_async", "_lock", "_slots")

    def __init__(
        self, base_url: str, api_key: str, timeout: float, slots: int | None = None
    ) -> None:
        self.base_url = base_url
        self._api_key = api_key
        self._timeout = timeout
        self._slots = threading.BoundedSemaphore(slots) if slots else None
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
                        # openai's own defaults, plus: an answer's processing (the CPU burst
                        # after the wait) starts once the memory queries in flight are
                        # answered (core.priority), and a streamed body is read to its end so
                        # its connection is kept. Not on the async clients: the first blocks,
                        # and their streams read to the end already. Each connection's socket
                        # is noted, so that a stopped run can cut the calls waiting on it.
                        http_client=DefaultHttpxClient(
                            timeout=self._timeout,
                            event_hooks={"request": [_on_request], "response": [_on_response]},
                        ),
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

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Hold one of the server's slots while a chat request is answered (no limit: none)."""
        slots = self._slots
        if slots is None:
            yield
            return
        # Looked at twice a second, so a run interrupted meanwhile does not queue on (core.interrupt).
        while not slots.acquire(timeout=_SLOT_LOOK_S):
            stop_if_interrupted()
        try:
            stop_if_interrupted()
            yield
        finally:
            slots.release()

    @contextlib.asynccontextmanager
    async def aserving(self) -> AsyncIterator[None]:
        """`serving` for a coroutine. The slots are a thread's semaphore, shared with the blocking
        callers of other threads and event loops, so it is polled rather than awaited: a wait
        that is cancelled (a turn's deadline) then holds nothing."""
        slots = self._slots
        if slots is None:
            yield
            return
        while not slots.acquire(blocking=False):
            await asyncio.sleep(_SLOT_POLL_S)
            stop_if_interrupted()
        try:
            yield
        finally:
            slots.release()

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
class Target:
    model: str
    endpoint: Endpoint

    @property
    def key(self) -> tuple[str, str]:
        return (self.endpoint.base_url, self.model)


class Health:
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

    def order(self, targets: tuple[Target, ...]) -> tuple[Target, ...] | list[Target]:
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


class Router:
    """The gateway's endpoints (one client pair per base URL and key) and each tier's
    candidate chain, resolved once (resolving may start the embedded server)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        # Separate from _lock (which endpoint() takes): resolving may start a local server.
        self._resolve_lock = threading.Lock()
        self._endpoints: dict[tuple[str, str], Endpoint] = {}
        self._default: tuple[Endpoint, str] | None = None
        self._embedding: Target | None = None
        self._chains: dict[tuple[str, str | None], tuple[Target, ...]] = {}

    def endpoint(self, base_url: str, api_key: str, slots: int | None = None) -> Endpoint:
        """The endpoint of a base URL and key (`slots`: the server's own, when known; else
        the settings' `limits.llm_slots`)."""
        key = (base_url, api_key)
        with self._lock:
            endpoint = self._endpoints.get(key)
            if endpoint is None:
                limits = self.settings.limits
                endpoint = Endpoint(
                    base_url, api_key, limits.llm_timeout_s, slots or limits.llm_slots
                )
                self._endpoints[key] = endpoint
            return endpoint

    def all_endpoints(self) -> list[Endpoint]:
        with self._lock:
            return list(self._endpoints.values())

    def default_endpoint(self) -> tuple[Endpoint, str]:
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
                    self.endpoint(settings.openai_base_url, key),
                    settings.default_model,
                )
            else:
                from core.llm_server import (  # starts a process: only when needed
                    LOCAL_CHAT_SLOTS,
                    local_llm_endpoint,
                )

                base_url, model = local_llm_endpoint(settings)
                endpoint = self.endpoint(base_url, NO_API_KEY, slots=LOCAL_CHAT_SLOTS)
                self._default = (endpoint, model)
            return self._default

    def targets(self, tier_name: str, model: str | None) -> tuple[Target, ...]:
        cached = self._chains.get((tier_name, model))
        if cached is not None:
            return cached
        if model is not None:
            # Per-slot routing: that one model, on the endpoint the tier would use for it.
            chain = self.targets(tier_name, None)
            match = next((t for t in chain if t.model == model), None)
            targets: tuple[Target, ...] = (match or Target(model, chain[0].endpoint),)
        else:
            settings = self.settings
            candidates = settings.tier(tier_name).models
            if not candidates:
                endpoint, default_model = self.default_endpoint()
                targets = (Target(default_model, endpoint),)
            else:
                built = []
                for candidate in candidates:
                    if candidate.base_url is None:
                        endpoint = self.default_endpoint()[0]
                    else:
                        key = candidate.api_key.get_secret_value() if candidate.api_key else None
                        if (
                            key is None
                            and candidate.base_url == settings.openai_base_url
                            and settings.openai_api_key
                        ):
                            key = settings.openai_api_key.get_secret_value()
                        endpoint = self.endpoint(candidate.base_url, key or NO_API_KEY)
                    built.append(Target(candidate.model, endpoint))
                targets = tuple(built)
        self._chains[(tier_name, model)] = targets
        return targets

    def embedding_target(self) -> Target:
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
                self._embedding = Target(
                    settings.embedding_model, self.endpoint(settings.embedding_base_url, key)
                )
            else:
                raise LLMFatalError(
                    "no embedding endpoint configured: the embedded model runs in process"
                )
            return self._embedding
