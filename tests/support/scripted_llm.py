"""A scripted OpenAI-compatible HTTP server: the LLM test double for tests and benchmarks.

It speaks real HTTP on 127.0.0.1 (so the official `openai` client, its timeouts and its
error mapping are exercised for real) and answers from canned rules:

    with ScriptedLLM() as llm:
        llm.on(schema="Verdict", respond={"score": 0.9, "reason": "fine"})
        llm.on(contains="summarise", respond="A short summary.", times=1)
        llm.fail_next("http_500", n=2)
        settings = load_settings(openai_base_url=llm.base_url)

Unscripted json_schema requests get a minimal valid instance generated from the schema,
plain chat gets "Scripted reply." (as server-sent events when the request asks for a stream:
the content in a few chunks, the token counts last when `stream_options.include_usage`
asks for them; `stream_gap_s` paces the chunks), and embeddings are a deterministic hashed bag of words,
so end-to-end tests script only what they care about. `GET <base_url>/scripted/stats` answers
the number of requests served and of connections accepted (for a server run in another process). Faults ("http_500", "http_429",
"timeout", "malformed_json", "truncated_json", "schema_invalid", "near_json", "http_401",
"http_404_model", "http_500_too_large", "stream_stall": the first chunk of a streamed answer,
then silence longer than the client waits; "stream_cut": the first chunk, then the body's proper
end, with no finish reason and no [DONE], as a proxy that drops its upstream cleanly; a whole
answer is sent whole) are injected from a queue (`fail_next`) or at seeded random rates
(`fault_rates`). Run standalone with `python -m tests.support.scripted_llm --port 8089`.

Over 600 lines on purpose: the server, its fault injection and the schema-driven default
answers are one double that every end-to-end test and benchmark shares; split, each part
would import the others' internals.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import math
import random
import re
import struct
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, get_args

FaultKind = Literal[
    "http_500",
    "http_429",
    "timeout",
    "malformed_json",
    "truncated_json",
    "schema_invalid",
    "near_json",
    "http_401",
    "http_404_model",
    "http_500_too_large",
    "stream_stall",
    "stream_cut",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
# Faults that corrupt the message content: only meaningful for JSON-mode chat requests.
JSON_FAULTS: frozenset[str] = frozenset(
    {"malformed_json", "truncated_json", "schema_invalid", "near_json"}
)
HTTP_FAULTS: frozenset[str] = frozenset(
    {"http_500", "http_429", "timeout", "http_401", "http_404_model", "http_500_too_large"}
)

DEFAULT_REPLY = "Scripted reply."
#: GET <base_url>/scripted/stats: the requests served so far (for a server in another process).
STATS_PATH = "/scripted/stats"
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)?")


@dataclass(slots=True)
class ScriptedRequest:
    """One request the server received, as rules and tests see it."""

    path: str
    body: dict[str, Any]
    model: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    schema_name: str | None = None
    schema: dict[str, Any] | None = None
    response_format: str | None = None  # "json_schema" | "json_object" | "text" | None
    #: Wall-clock ms (time.time()) when it arrived: its answer leaves `latency_s` later at the
    #: earliest, so a test can order what another process did against it.
    received_ms: float = field(default_factory=lambda: time.time() * 1000.0)

    @property
    def is_json(self) -> bool:
        return self.response_format in ("json_schema", "json_object")

    @property
    def text(self) -> str:
        """Every message's text joined: what `contains=` rules search."""
        return "\n".join(_content_text(m.get("content")) for m in self.messages)

    @property
    def last_user(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _content_text(message.get("content"))
        return ""


Responder = Mapping[str, Any] | list[Any] | str | Callable[[ScriptedRequest], Any]


@dataclass(slots=True)
class _Rule:
    schema: str | None
    contains: str | None
    model: str | None
    respond: Responder | None
    fault: str | None
    times: int | None

    def matches(self, request: ScriptedRequest) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.schema is not None and self.schema != request.schema_name:
            return False
        if self.model is not None and self.model != request.model:
            return False
        return self.contains is None or self.contains in request.text


@dataclass(slots=True)
class _Reply:
    status: int
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    #: A streamed answer: the server-sent events sent in place of `payload`, with `stall_s` of
    #: silence after the first piece of content and `gap_s` between the others; `cut` ends the
    #: body after the first piece.
    events: list[dict[str, Any]] | None = None
    stall_s: float = 0.0
    gap_s: float = 0.0
    cut: bool = False


class ScriptedLLM:
    """OpenAI-compatible server on a free 127.0.0.1 port, in a daemon thread."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        timeout_sleep_s: float = 2.0,
        retry_after: str = "0.05",
        embedding_dim: int = 64,
        models: tuple[str, ...] = ("scripted-model",),
        require_api_key: str | None = None,
        port: int = 0,
    ) -> None:
        self.latency_s = latency_s
        self.timeout_sleep_s = timeout_sleep_s
        #: The pace of a model: seconds between two events of a streamed answer, in how many
        #: pieces its content comes. An answer not streamed comes whole as late as the last event.
        self.stream_gap_s = 0.0
        self.stream_pieces = 4
        #: False: answer a streamed request whole, as a proxy that buffers answers does.
        self.streams = True
        #: True: answer one chat request at a time, the others queued in silence (a llama-server
        #: with one slot, as Skald's embedded one).
        self.one_slot = False
        self._slot = threading.Lock()
        self.retry_after = retry_after
        self.embedding_dim = embedding_dim
        self.models = models
        self.require_api_key = require_api_key
        self._port = port
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._queued: deque[str] = deque()
        self._rates: list[tuple[str, float]] = []
        self._rng = random.Random(0)
        self.request_count = 0
        self.counts_by_path: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self.requests: list[ScriptedRequest] = []
        #: TCP connections accepted: a client that keeps its connections alive opens few.
        self.connections = 0
        self._server: ThreadingHTTPServer | None = None
        self._bound_port: int | None = None  # kept after stop() so messages can still name it
        self._thread: threading.Thread | None = None
        # Requests being answered at once: `max_in_flight` is the most seen. With `rendezvous`
        # n > 1, a request is held until n are in flight (or `rendezvous_timeout_s` passes), so a
        # test shows that a client sends requests concurrently by what the server saw, not by
        # a wall-clock margin a loaded machine can break.
        self.rendezvous = 0
        self.rendezvous_timeout_s = 60.0
        self.max_in_flight = 0
        self._rendezvous_met = False
        self._in_flight = 0
        self._in_flight_changed = threading.Condition()
        # A gate a test closes (`hold`) to keep every request it receives waiting until
        # `release`, e.g. to kill a client at a moment it surely waits on the model; `held`
        # counts the requests waiting there.
        self._gate = threading.Event()
        self._gate.set()
        self.held = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> ScriptedLLM:
        if self._server is not None:
            return self
        server = ThreadingHTTPServer(("127.0.0.1", self._port), _make_handler(self))
        server.daemon_threads = True  # in-flight "timeout" sleeps must not block stop()
        self._server = server
        self._bound_port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, name="scripted-llm", daemon=True
        )
        self._thread.start()
        return self

    def serve_until_interrupted(self) -> None:
        """For the standalone commands: say where the server listens (the line their callers
        wait for), then serve until Ctrl-C or SIGINT."""
        print(f"scripted LLM listening on {self.base_url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass

    def stop(self) -> None:
        self._gate.set()  # no request is left held
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError(
                "ScriptedLLM was never started: call start() or use it as a context manager"
            )
        return self._bound_port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ----------------------------------------------------------------- scripting
    def on(
        self,
        *,
        schema: str | None = None,
        contains: str | None = None,
        respond: Responder | None = None,
        times: int | None = None,
        model: str | None = None,
        fault: str | None = None,
    ) -> ScriptedLLM:
        """Add a rule (newest wins). `respond` is the message content (dict/list -> JSON,
        str as is, or a callable of the request); `fault` injects a fault kind instead."""
        if respond is None and fault is None:
            raise ValueError("a rule needs respond= or fault=")
        if fault is not None:
            _check_kind(fault)
        if times is not None and times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._rules.append(_Rule(schema, contains, model, respond, fault, times))
        return self

    def fail_next(self, kind: str, n: int = 1) -> ScriptedLLM:
        """Queue `n` faults; each hits the next request it applies to."""
        _check_kind(kind)
        with self._lock:
            self._queued.extend([kind] * n)
        return self

    def fault_rates(self, rates: Mapping[str, float], *, seed: int = 0) -> ScriptedLLM:
        """Inject faults at random: each request draws once from a seeded RNG."""
        for kind, rate in rates.items():
            _check_kind(kind)
            if rate < 0:
                raise ValueError(f"fault rate for {kind} must be >= 0")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError("fault rates must sum to at most 1.0")
        with self._lock:
            self._rates = list(rates.items())
            self._rng = random.Random(seed)
        return self

    def clear_faults(self) -> None:
        with self._lock:
            self._queued.clear()
            self._rates = []

    def reset(self) -> None:
        """Forget rules, faults and counters (the server keeps running)."""
        with self._lock:
            self._rules.clear()
            self._queued.clear()
            self._rates = []
            self.request_count = 0
            self.counts_by_path.clear()
            self.faults_injected.clear()
            self.requests.clear()
        with self._in_flight_changed:
            self.rendezvous, self.max_in_flight, self._rendezvous_met = 0, 0, False

    # ----------------------------------------------------------------- handling
    def hold(self) -> None:
        """From now on every request waits (counted, before its answer) until `release`."""
        self._gate.clear()

    def release(self) -> None:
        """Let the held requests, and the ones after them, be answered."""
        self._gate.set()

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """One POST being answered (the handler threads wrap each in this)."""
        with self._in_flight_changed:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            self._in_flight_changed.notify_all()
            if self.rendezvous > 1 and not self._rendezvous_met:
                # The request that sees n in flight marks the rendezvous met and wakes the rest.
                # They wait on that mark, not on the count: by the time they wake, a request
                # that went through may have finished, and a recount would wait out the timeout.
                if self._in_flight >= self.rendezvous:
                    self._rendezvous_met = True
                    self._in_flight_changed.notify_all()
                self._in_flight_changed.wait_for(
                    lambda: self._rendezvous_met, timeout=self.rendezvous_timeout_s
                )
                self._rendezvous_met = True  # met (or given up on): later requests go straight
        try:
            yield
        finally:
            with self._in_flight_changed:
                self._in_flight -= 1

    def handle(
        self, method: str, path: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> _Reply:
        """Route one request (called from handler threads)."""
        path = path.split("?", 1)[0].rstrip("/")
        if method == "GET" and path.endswith(STATS_PATH):  # a probe, not a request: counts nothing
            with self._lock:
                return _Reply(
                    200,
                    {
                        "requests": self.request_count,
                        "by_path": dict(self.counts_by_path),
                        "connections": self.connections,
                    },
                )
        request = _describe(path, body)
        with self._lock:
            self.request_count += 1
            self.counts_by_path[path] += 1
            self.requests.append(request)
            fault = self._pick_fault(request)
            rule = None
            if path.endswith("/chat/completions"):
                # A request lost to an injected HTTP fault does not use up a rule's `times`.
                rule = self._pick_rule(request, consume=fault is None or fault in JSON_FAULTS)
                if rule is not None and rule.fault is not None and fault is None:
                    fault = rule.fault if _applies(rule.fault, request) else None
            if fault is not None:
                self.faults_injected[fault] += 1
        if not self._gate.is_set():
            with self._lock:
                self.held += 1
            self._gate.wait()
            with self._lock:
                self.held -= 1
        if self.latency_s > 0:
            time.sleep(self.latency_s)

        if self.require_api_key is not None:
            auth = headers.get("authorization") or headers.get("Authorization") or ""
            if auth != f"Bearer {self.require_api_key}":
                fault = "http_401"
        if fault in HTTP_FAULTS:
            reply = self._http_fault(fault, request)
            if reply is not None:
                return reply

        if method == "GET" and path.endswith("/models"):
            return _Reply(200, self._models())
        if method != "POST":
            return _Reply(405, _error(f"{method} {path} is not supported", "invalid_request_error"))
        if path.endswith("/chat/completions"):
            return self._chat(request, rule, fault)
        if path.endswith("/embeddings"):
            return self._embeddings(request)
        return _Reply(404, _error(f"unknown route {path}", "invalid_request_error"))

    def _pick_fault(self, request: ScriptedRequest) -> str | None:
        # Exactly one RNG draw per request keeps seeded runs reproducible.
        chosen: str | None = None
        if self._rates:
            draw = self._rng.random()
            acc = 0.0
            for kind, rate in self._rates:
                acc += rate
                if draw < acc:
                    chosen = kind if _applies(kind, request) else None
                    break
        for i, kind in enumerate(self._queued):
            if _applies(kind, request):
                del self._queued[i]
                return kind
        return chosen

    def _pick_rule(self, request: ScriptedRequest, *, consume: bool) -> _Rule | None:
        for rule in reversed(self._rules):
            if rule.matches(request):
                if consume and rule.times is not None:
                    rule.times -= 1
                return rule
        return None

    def _http_fault(self, fault: str | None, request: ScriptedRequest) -> _Reply | None:
        if fault == "http_500":
            return _Reply(500, _error("scripted internal server error", "server_error"))
        if fault == "http_500_too_large":  # llama-server's answer to an input over its batch
            message = "input (900 tokens) is too large to process. increase the physical batch size (current batch size: 512)"
            return _Reply(500, _error(message, "server_error"))
        if fault == "http_429":
            return _Reply(
                429,
                _error("scripted rate limit", "rate_limit_exceeded", code="rate_limit_exceeded"),
                {"Retry-After": self.retry_after},
            )
        if fault == "http_401":
            return _Reply(
                401,
                _error(
                    "Incorrect API key provided.", "invalid_request_error", code="invalid_api_key"
                ),
            )
        if fault == "http_404_model":
            return _Reply(
                404,
                _error(
                    f"The model `{request.model}` does not exist or you do not have access to it.",
                    "invalid_request_error",
                    code="model_not_found",
                ),
            )
        if fault == "timeout":
            time.sleep(self.timeout_sleep_s)  # the client gives up first; then answer anyway
        return None

    def _chat(self, request: ScriptedRequest, rule: _Rule | None, fault: str | None) -> _Reply:
        streamed = self.streams and request.body.get("stream") is True
        if fault == "stream_stall" and not streamed:
            time.sleep(self.timeout_sleep_s)  # a whole answer's silence: as the "timeout" fault
        finish_reason = "stop"
        if rule is not None and rule.respond is not None:
            produced = rule.respond(request) if callable(rule.respond) else rule.respond
            content = produced if isinstance(produced, str) else json.dumps(produced)
        elif request.response_format == "json_schema" and request.schema is not None:
            content = json.dumps(instance_from_schema(request.schema))
        elif request.response_format == "json_object":
            content = json.dumps({"reply": DEFAULT_REPLY})
        else:
            content = DEFAULT_REPLY

        if fault == "malformed_json":
            content = "Sure! Here is the JSON you asked for: {name: 'unquoted', ..."
        elif fault == "truncated_json":
            content = content[: max(1, len(content) // 2)]
            finish_reason = "length"
        elif fault == "schema_invalid":
            needs_keys = bool((request.schema or {}).get("required"))
            content = "{}" if needs_keys else "[1, 2, 3]"
        elif fault == "near_json":
            content = f"Here you go:\n```json\n{_with_trailing_comma(content)}\n```"

        prompt_tokens = _approx_tokens(request.text)
        completion_tokens = _approx_tokens(content)
        reply = _Reply(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.model or self.models[0],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
        )
        options = request.body.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        events = _stream_events(reply.payload, pieces=self.stream_pieces, include_usage=usage)
        if streamed:
            reply.events = events
            reply.stall_s = self.timeout_sleep_s if fault == "stream_stall" else 0.0
            reply.gap_s = self.stream_gap_s
            reply.cut = fault == "stream_cut"
        elif self.stream_gap_s > 0:
            time.sleep(self.stream_gap_s * len(events))
        return reply

    def _embeddings(self, request: ScriptedRequest) -> _Reply:
        raw = request.body.get("input", "")
        texts = [raw] if isinstance(raw, str) else [str(t) for t in raw]
        dim = int(request.body.get("dimensions") or self.embedding_dim)
        as_base64 = request.body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = hashed_embedding(text, dim)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode("ascii")
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(_approx_tokens(t) for t in texts)
        return _Reply(
            200,
            {
                "object": "list",
                "data": data,
                "model": request.model or "scripted-embedding",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _models(self) -> dict[str, Any]:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": created, "owned_by": "scripted"}
                for m in self.models
            ],
        }


# --------------------------------------------------------------------- HTTP plumbing
def _make_handler(owner: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the openai client's pool expects
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle plus the
        # client's delayed ACK adds ~40 ms to every response.
        disable_nagle_algorithm = True

        def handle(self) -> None:
            with owner._in_flight_changed:
                owner.connections += 1
            try:
                super().handle()
            except ConnectionResetError:
                # A client that closes a kept-alive connection with bytes of a stream unread
                # resets it, as it may: a real server shrugs, and so does this one (socketserver
                # would print a traceback to the stderr of the test that runs it).
                self.close_connection = True

        def do_GET(self) -> None:
            self._serve("GET", {})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                self._send(_Reply(400, _error("request body is not JSON", "invalid_request_error")))
                return
            one_slot = owner.one_slot and self.path.rstrip("/").endswith("/chat/completions")
            with owner.in_flight(), owner._slot if one_slot else contextlib.nullcontext():
                self._serve("POST", body if isinstance(body, dict) else {})

        def _serve(self, method: str, body: dict[str, Any]) -> None:
            try:
                reply = owner.handle(method, self.path, body, dict(self.headers.items()))
            except Exception as exc:  # a bug in a responder must surface as a 500, not a hang
                reply = _Reply(500, _error(f"scripted server error: {exc!r}", "server_error"))
            self._send(reply)

        def _send(self, reply: _Reply) -> None:
            if reply.events is not None:
                self._send_events(reply)
                return
            payload = json.dumps(reply.payload).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (a "timeout" fault): nothing left to answer.
                self.close_connection = True

        def _send_events(self, reply: _Reply) -> None:
            """Server-sent events in HTTP/1.1 chunks, as an OpenAI-compatible server streams."""
            lines = [f"data: {json.dumps(event)}\n\n".encode() for event in reply.events or ()]
            lines = lines[:2] if reply.cut else [*lines, b"data: [DONE]\n\n"]
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for index, line in enumerate(lines):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    if index == 1 and reply.stall_s > 0:
                        time.sleep(reply.stall_s)  # the client gives up first
                    elif reply.gap_s > 0 and index < len(lines) - 1:
                        time.sleep(reply.gap_s)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            return  # keep test output clean

    return Handler


def _describe(path: str, body: dict[str, Any]) -> ScriptedRequest:
    request = ScriptedRequest(path=path, body=body, model=body.get("model"))
    messages = body.get("messages")
    if isinstance(messages, list):
        request.messages = [m for m in messages if isinstance(m, dict)]
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        request.response_format = fmt.get("type")
        spec = fmt.get("json_schema")
        if isinstance(spec, dict):
            request.schema_name = spec.get("name")
            schema = spec.get("schema")
            request.schema = schema if isinstance(schema, dict) else None
    return request


def _applies(kind: str, request: ScriptedRequest) -> bool:
    if kind in JSON_FAULTS:
        return request.path.endswith("/chat/completions") and request.is_json
    if kind in ("stream_stall", "stream_cut"):
        return request.path.endswith("/chat/completions")
    return True


def _stream_events(
    completion: dict[str, Any], *, pieces: int, include_usage: bool
) -> list[dict[str, Any]]:
    """A whole chat completion as the chunks a server streams: the role, the content in up to
    `pieces` pieces, the finish reason, then the token counts when asked for."""
    choice = completion["choices"][0]
    content: str = choice["message"]["content"]
    head = {key: completion[key] for key in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    size = max(1, -(-len(content) // max(1, pieces)))
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": content[i : i + size]}) for i in range(0, len(content), size)]
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append({**head, "choices": [], "usage": completion["usage"]})
    return events


def _check_kind(kind: str) -> None:
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; use one of {', '.join(FAULT_KINDS)}")


def _error(message: str, type_: str, *, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: keep the text parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _with_trailing_comma(content: str) -> str:
    stripped = content.rstrip()
    if stripped.endswith("}") and stripped != "{}":
        return stripped[:-1] + ",}"
    if stripped.endswith("]") and stripped != "[]":
        return stripped[:-1] + ",]"
    return stripped


# --------------------------------------------------------------------- embeddings
def hashed_embedding(text: str, dim: int = 64) -> list[float]:
    """Signed feature hashing of lowercased words, L2-normalised: shared words -> closer."""
    vector = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vector[digest % dim] += 1.0 if (digest >> 63) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        # No words: a fixed unit vector keeps cosine similarity defined.
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


# --------------------------------------------------------------------- schema instances
def instance_from_schema(
    schema: Mapping[str, Any], root: Mapping[str, Any] | None = None, depth: int = 0
) -> Any:
    """A minimal instance that validates against `schema` (the subset pydantic emits)."""
    root = schema if root is None else root
    if "$ref" in schema:
        merged = {
            **_resolve_ref(root, schema["$ref"]),
            **{k: v for k, v in schema.items() if k != "$ref"},
        }
        return instance_from_schema(merged, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        variants = schema.get(key)
        if isinstance(variants, list) and variants:
            non_null = [v for v in variants if v.get("type") != "null"]
            # Prefer real structure, but stop at null when a recursive model nests too deep.
            if non_null and depth < 8:
                return instance_from_schema(non_null[0], root, depth + 1)
            return (
                None
                if len(non_null) < len(variants)
                else instance_from_schema(variants[0], root, depth + 1)
            )
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            part = _resolve_ref(root, part["$ref"]) if "$ref" in part else part
            merged = _merge_schemas(merged, part)
        return instance_from_schema(merged, root, depth + 1)

    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"

    if kind == "object":
        props = schema.get("properties") or {}
        return {name: instance_from_schema(sub, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        if isinstance(schema.get("prefixItems"), list):
            return [instance_from_schema(s, root, depth + 1) for s in schema["prefixItems"]]
        count = max(1, int(schema.get("minItems", 0)))
        if "maxItems" in schema:
            count = min(count, int(schema["maxItems"]))
        if depth >= 8:
            count = int(schema.get("minItems", 0))
        item_schema = schema.get("items") or {"type": "string"}
        return [instance_from_schema(item_schema, root, depth + 1) for _ in range(count)]
    if kind == "string":
        return _string_for(schema)
    if kind == "number":
        return _clamp(0.5, schema, integer=False)
    if kind == "integer":
        return int(_clamp(1, schema, integer=True))
    if kind == "boolean":
        return True
    return None


def _string_for(schema: Mapping[str, Any]) -> str:
    formats = {
        "date-time": "2024-01-01T00:00:00Z",
        "date": "2024-01-01",
        "time": "00:00:00",
        "uuid": "00000000-0000-4000-8000-000000000000",
        "email": "scripted@example.com",
        "uri": "https://example.com/",
    }
    value = formats.get(schema.get("format", ""), "text")
    min_len = int(schema.get("minLength", 0))
    if len(value) < min_len:
        value = value + "x" * (min_len - len(value))
    if "maxLength" in schema:
        value = value[: int(schema["maxLength"])]
    return value


def _clamp(value: float, schema: Mapping[str, Any], *, integer: bool) -> float:
    step = 1 if integer else 1e-6
    low = schema.get("minimum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + step
    high = schema.get("maximum")
    if "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - step
    if low is not None and value < low:
        value = math.ceil(low) if integer else low
    if high is not None and value > high:
        value = math.floor(high) if integer else high
    return value


def _resolve_ref(root: Mapping[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $refs are supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return dict(node)


def _merge_schemas(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**a, **b}
    if "properties" in a or "properties" in b:
        merged["properties"] = {**a.get("properties", {}), **b.get("properties", {})}
    return merged


# --------------------------------------------------------------------- standalone
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the scripted OpenAI-compatible server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds of sleep per request")
    args = parser.parse_args(argv)
    with ScriptedLLM(port=args.port, latency_s=args.latency) as server:
        server.serve_until_interrupted()


if __name__ == "__main__":
    main()


_SYLLABLES = (
    "ka",
    "lo",
    "mir",
    "ven",
    "tas",
    "ru",
    "bel",
    "on",
    "dre",
    "si",
    "gul",
    "ha",
    "pen",
    "or",
    "vi",
    "struk",
    "ma",
    "tel",
    "quo",
    "rin",
    "ad",
    "fen",
    "lu",
    "sar",
)


def _pseudo_word(*key: int) -> str:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return "".join(_SYLLABLES[b % len(_SYLLABLES)] for b in digest[: 2 + digest[7] % 2])


def scripted_prose(seed: int, sentences: int = 12, words: int = 9) -> str:
    """Prose-shaped text that passes the degeneration guard and the duplicate-scene check:
    every word is drawn from (seed, sentence, position), so no sentence or trigram repeats
    and two seeds share next to no vocabulary (their hashed embeddings are far apart)."""
    out = []
    for i in range(sentences):
        tokens = [_pseudo_word(seed, i, k) for k in range(words)]
        out.append(" ".join(tokens).capitalize() + ".")
    return " ".join(out)


# --------------------------------------------------------------------- quoting extractions
_SCENE_QUOTED = re.compile(r'"""\n(.*?)\n"""', re.DOTALL)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def scene_text_of(request: ScriptedRequest) -> str:
    """The scene an extraction prompt quotes (between its triple quotes), else its last user message."""
    found = _SCENE_QUOTED.search(request.last_user)
    return found.group(1) if found else request.last_user


def sentence_naming(text: str, *names: str) -> str:
    """The first sentence of `text` that names all of `names` (else any of them), or ""."""
    from core.grounding import SourceText

    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip()]
    for wanted in (all, any):
        for sentence in sentences:
            source = SourceText(sentence)
            if wanted(source.names(name) for name in names):
                return sentence
    return ""


def quoting_extraction(
    text: str,
    entities: list[dict[str, Any]],
    relationships: list[dict[str, Any]] = (),  # type: ignore[assignment]
    status_changes: list[dict[str, Any]] = (),
) -> dict[str, Any]:  # type: ignore[assignment]
    """A SceneExtraction answer as a careful model gives it: only the entities `text` names,
    each fact with the sentence of `text` that states it as its quote. Traits may be plain
    words; a fact given with its own "quote" keeps it (tests of made-up evidence)."""
    from core.grounding import SourceText

    source = SourceText(text)
    kept = []
    for entity in entities:
        if not source.names(entity["name"]) and "quote" not in entity:
            continue
        quote = entity.get("quote", sentence_naming(text, entity["name"]))
        traits = [
            t if isinstance(t, dict) else {"trait": t, "quote": quote}
            for t in entity.get("traits", [])
        ]
        kept.append(
            {"description": "", "presence": "present", **entity, "quote": quote, "traits": traits}
        )
    rels = [
        {
            "description": "",
            **r,
            "quote": r.get("quote", sentence_naming(text, r["source"], r["target"])),
        }
        for r in relationships
    ]
    statuses = [
        {**s, "quote": s.get("quote", sentence_naming(text, s["name"]))} for s in status_changes
    ]
    return {"entities": kept, "relationships": rels, "status_changes": statuses}
