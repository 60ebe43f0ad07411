"""The turn pipeline of the dialogue sidecar (spec 000): one request in, one TurnResult out.

    RECEIVED -> RETRIEVING -> INJECTING -> ACTING -> EXTRACTING -> JUDGING -> HISTORIANING
             -> PREPARED -> COMMITTING -> COMMITTED          (any failure: ROLLED_BACK)

Guarantees, and where they come from:

- Idempotency: the key `conversation_id:turn_id` is a KGTurn node written in the commit
  transaction (uniqueness constraint on `key`), with the payload hash and the result. The
  same request again returns the stored result and writes nothing; a different payload under
  a committed key is rejected (INVALID_REQUEST). Persisted, so it survives restarts.
- One turn per conversation at a time, across threads and processes: an in-process lock,
  then a lease in the graph (kg.dialogue). A second caller waits up to `lock_wait_s` and
  then gets IN_PROGRESS (retryable); expired leases are taken over, and the commit
  transaction refuses to write when its lease was taken (fencing).
- All or nothing: every write of a turn (turn record, entities, relation actions, their
  KGRelEvent log, bio patches, milestones) is one transaction, which also releases the lease.
  Anything failing before or during it ends ROLLED_BACK with nothing written and a
  `retryable` flag. The commit gate (no relation actions, identity conflicts) also ends
  ROLLED_BACK, not retryable: the same input would be blocked again.

The pipeline is plain Python so the HTTP server and the regression batch pay no
orchestration cost per turn; `run_slot` lets the Prefect flow run each slot as a task.

Slot scheduling: every slot runs on the service's worker pool and the turn waits for it
with the turn deadline (and the slot's own timeout from `settings.slot_timeouts_s`), so a
slot still running when either passes ends the turn ROLLED_BACK (timed_out) at once; the
abandoned call finishes in the background and its result is dropped (nothing it computed
can reach the commit transaction). Judge and historian depend only on the extractor and
run concurrently; the commit embedding reuses the retriever's query vector (the same text
in recorded mode) or is computed while the extractor runs. Round trips per recorded turn:
query embedding, extractor, max(judge, historian).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from core.errors import (
    GraphUnavailableError,
    GraphWriteError,
    InvalidInputError,
    LLMBadOutputError,
    LLMFatalError,
    LLMUnavailableError,
    SkaldError,
)
from core.graph_server import GraphEndpoint
from core.heap import HeapTrimmer
from core.llm import LLMGateway
from core.settings import Settings
from kg.dialogue import (
    AppliedAction,
    DialogueRepository,
    RewindOutcome,
    RewindRefusedError,
    StoredTurn,
    TurnWrite,
    payload_digest,
    turn_key,
)
from kg.store import GraphStore
from tasks.dialogue.actor import act
from tasks.dialogue.extractor import extract
from tasks.dialogue.gate import commit_gate
from tasks.dialogue.historian import historian
from tasks.dialogue.injector import build_packet
from tasks.dialogue.judge import judge, proposal_lines
from tasks.dialogue.models import (
    BioPatchResult,
    ErrorKind,
    MemoryQueryRequest,
    MemoryQueryResult,
    RewindResult,
    TurnCommitRequest,
    TurnResult,
    TurnState,
    TurnTrace,
    parse_request,
)
from tasks.dialogue.retriever import (
    RecalledTurn,
    VectorIndexRegistry,
    memory_row,
    recall,
    retrieve,
    turn_text,
    without_pending,
)
from tasks.dialogue.routing import Route, override_problem, resolve_routes
from tasks.dialogue.trace import TraceRecorder

log = logging.getLogger("skald.dialogue")

T = TypeVar("T")
#: Runs one slot's work: `run_slot(slot_name, work)`. The default calls `work()`.
SlotRunner = Callable[[str, Callable[[], T]], T]
_COMMIT_ROUTE = Route(slot="commit", tier="embedding", source="none")


def _direct(slot: str, work: Callable[[], T]) -> T:
    return work()


class SidecarOptions(BaseModel):
    """Operational knobs of the sidecar (CLI flags of `flows.dialogue serve`)."""

    lock_wait_s: float = Field(
        30.0, ge=0, description="how long a turn waits for its conversation's lock before IN_PROGRESS"
    )
    lock_lease_s: float = Field(
        420.0, gt=0, description="lease of a conversation lock; a crashed holder blocks at most this long"
    )
    turn_timeout_s: float = Field(
        300.0, gt=0, description="a turn still preparing after this long ends ROLLED_BACK (timed_out)"
    )
    allow_request_db: bool = Field(
        False, description="honour a request's config.db naming another graph than the configured one"
    )
    relation_limit: int = Field(12, ge=0, le=200, description="relations the retriever hands on")
    max_conversation_locks: int = Field(
        4096, ge=16, description="per-conversation in-process locks kept (least recently used idle ones go)"
    )
    max_call_records: int | None = Field(
        None, ge=100,
        description="LLM call records kept in memory; older ones are flushed to Parquet under "
        "<project>/.saga/runs/sidecar (None: keep all, for batch runs that write them at the end)",
    )
    heap_trim_turns: int = Field(
        50, ge=1, description="every this many turns, give the malloc arenas' free pages back to the OS (core.heap)"
    )
    slot_workers: int = Field(32, ge=2, le=512, description="threads running slots (abandoned slots hold one until done)")
    serialize_writes: bool | None = Field(
        None,
        description="one graph write transaction at a time in this process; None: only on ArcadeDB, where "
        "concurrent inserts into one page conflict and each conflict costs a ~1 s driver retry",
    )


class TurnTimeoutError(SkaldError):
    """The turn ran past its deadline before it could commit."""


class DialogueService:
    """The sidecar: validate -> idempotency -> lock -> six slots -> gate -> one transaction."""

    def __init__(
        self,
        settings: Settings,
        *,
        gateway: LLMGateway | None = None,
        store: GraphStore | None = None,
        options: SidecarOptions | None = None,
        owner: str | None = None,
    ) -> None:
        self.settings = settings
        self.options = options or SidecarOptions()
        # One owner per process: the in-process lock already serialises its own turns.
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._gateway = gateway
        self._owns_gateway = gateway is None
        self._store = store
        self._owns_store = store is None
        self._other_stores: dict[tuple[str, str, str, str], GraphStore] = {}
        self._lock = threading.Lock()
        # LRU: a server that sees many conversations keeps only the recently used locks.
        self._conversation_locks: OrderedDict[tuple[str, str], threading.Lock] = OrderedDict()
        self._write_lock = threading.Lock()
        self.vectors = VectorIndexRegistry(max_turns=settings.recall_cache_turns)
        # Native memory freed by turns goes back to the OS now and then (see core.heap).
        self.heap = HeapTrimmer(every=self.options.heap_trim_turns)
        self._pool = ThreadPoolExecutor(max_workers=self.options.slot_workers, thread_name_prefix="dialogue-slot")
        self.rolled_back_count = 0
        self._trace_lock = threading.Lock()

    # ------------------------------------------------------------------ resources
    @property
    def gateway(self) -> LLMGateway:
        with self._lock:
            if self._gateway is None:
                flush_dir = self.settings.saga_dir / "runs" / "sidecar"
                self._gateway = LLMGateway(self.settings, max_records=self.options.max_call_records,
                                           flush_dir=flush_dir if self.options.max_call_records else None)
            return self._gateway

    @property
    def store(self) -> GraphStore:
        with self._lock:
            if self._store is None:
                self._store = GraphStore.open(self.settings)
            return self._store

    @property
    def store_connected(self) -> bool:
        """Whether `store` is connected already (reading it would neither start nor connect a graph)."""
        with self._lock:
            return self._store is not None

    def close(self) -> None:
        with self._lock:
            stores = list(self._other_stores.values())
            self._other_stores.clear()
            if self._owns_store and self._store is not None:
                stores.append(self._store)
                self._store = None
            gateway, self._gateway = (self._gateway, None) if self._owns_gateway else (None, self._gateway)
        for store in stores:
            store.close()
        if gateway is not None:
            gateway.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _store_for(self, request: TurnCommitRequest) -> GraphStore:
        default = self.store
        db = request.config.db
        if db is None or (db.uri is None and db.database is None and db.username is None and db.password is None):
            return default
        if db.password is not None and not self.options.allow_request_db:
            # Credentials in request bodies are off unless the operator enables them.
            raise InvalidInputError(
                "config.db.password is refused: this sidecar does not take database credentials from requests",
                hint="drop config.db, or start the sidecar with --allow-request-db",
            )
        ep = default.endpoint
        wanted = (db.uri or ep.uri, db.username or ep.username, db.database or ep.database)
        if wanted == (ep.uri, ep.username, ep.database):
            return default
        if not self.options.allow_request_db:
            raise InvalidInputError(
                f"config.db names graph {wanted[0]}/{wanted[2]}, but this sidecar serves {ep.label} only",
                hint="drop config.db, or start the sidecar with --allow-request-db",
            )
        password = db.password.get_secret_value() if db.password else ""
        cache_key = (*wanted, hashlib.sha256(password.encode()).hexdigest())
        with self._lock:
            store = self._other_stores.get(cache_key)
        if store is None:
            endpoint = GraphEndpoint(wanted[0], wanted[1], password, wanted[2], embedded=False)
            store = GraphStore(endpoint, connect_attempts=self.settings.graph_connect_attempts).connect()
            store.migrate()
            with self._lock:
                store = self._other_stores.setdefault(cache_key, store)
        return store

    def _write_guard(self, store: GraphStore) -> Callable[[], AbstractContextManager[Any]]:
        serialize = self.options.serialize_writes
        if serialize is None:
            serialize = store.server.is_arcadedb
        return (lambda: self._write_lock) if serialize else nullcontext

    def write_guard(self) -> AbstractContextManager[Any]:
        """The write serialisation this process uses for the default graph (see SidecarOptions)."""
        return self._write_guard(self.store)()

    def _conversation_lock(self, graph: str, conversation_id: str) -> threading.Lock:
        with self._lock:
            key = (graph, conversation_id)
            lock = self._conversation_locks.get(key)
            if lock is None:
                lock = self._conversation_locks[key] = threading.Lock()
            self._conversation_locks.move_to_end(key)
            excess = len(self._conversation_locks) - self.options.max_conversation_locks
            if excess > 0:
                # Only idle locks go: a held one (or one a waiter is about to take) stays.
                for old_key in list(self._conversation_locks)[:-1]:
                    if excess <= 0:
                        break
                    old = self._conversation_locks[old_key]
                    if old.acquire(blocking=False):
                        old.release()
                        del self._conversation_locks[old_key]
                        excess -= 1
            return lock

    def conversation_lock_count(self) -> int:
        with self._lock:
            return len(self._conversation_locks)

    # ------------------------------------------------------------------ public API
    def commit(
        self,
        raw: TurnCommitRequest | bytes | str | dict[str, Any],
        *,
        attempt: Literal["commit", "retry"] = "commit",
        run_slot: SlotRunner[Any] | None = None,
        replace: bool = False,
    ) -> TurnResult:
        """Run one turn. Never raises for a turn's own failures: they are in the result.

        `replace=True` (an edit or a swipe): a turn already remembered under this key with a
        different payload is rewound first (it and every later turn of the conversation,
        exactly; see kg.dialogue rewind), then the new text is committed."""
        parsed = raw if isinstance(raw, TurnCommitRequest) else parse_request(raw)
        if isinstance(parsed, TurnResult):
            return parsed
        request = parsed
        self.heap.tick()
        problem = override_problem(request.config)
        if problem is not None:
            return TurnResult.invalid(problem, key=request.key)
        trace = TraceRecorder(request.key, attempt)
        try:
            store = self._store_for(request)
        except InvalidInputError as exc:
            return TurnResult.invalid(str(exc), key=request.key)
        except SkaldError as exc:  # the graph is unreachable or its schema cannot be migrated
            return self._rolled_back(request, trace, str(exc), retryable=True, kind="graph")
        repo = DialogueRepository(store)
        payload_hash = payload_digest(request.payload_canonical())
        try:
            stored = repo.get_turn(request.key)
        except SkaldError as exc:
            return self._rolled_back(request, trace, str(exc), retryable=True, kind="graph")
        if stored is not None and (not replace or stored.payload_hash == payload_hash):
            return self._replay(request, stored, payload_hash, trace)

        def body(claim_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
            if claim_stored is not None and (not replace or claim_stored.payload_hash == payload_hash):
                return self._replay(request, claim_stored, payload_hash, trace), True
            if replace and repo.remembered_text(request.key) == turn_text(request.messages):
                # The same text as remembered (a turn the commit gate blocked, sent again): a
                # plain retry; rewinding would throw away every later turn for nothing.
                pass
            elif replace:
                try:
                    outcome = repo.rewind(request.conversation_id, request.key, self.owner,
                                          guard=self._write_guard(store))
                except RewindRefusedError as exc:
                    return TurnResult.invalid(str(exc), key=request.key), True
                if outcome.status != "absent":
                    self.vectors.forget(store.endpoint.label, request.conversation_id)
                    log.info("conversation %s: turn %s replaced (%d turns rewound)",
                             request.conversation_id, request.turn, len(outcome.removed_turns))
            result, held = self._run(request, repo, store, trace, payload_hash, run_slot or _direct)
            if replace and result.retryable and result.state == TurnState.ROLLED_BACK:
                # The rewind took the turn's old text out of memory; if the slots failed (model
                # down, timeout), memory would hold neither text until the retry. It holds the
                # new one (not committed; the retry commits its facts and marks it).
                self._remember_blocked(request, repo, store, request.messages, trace)
                self._take_records(trace)
            return result, held

        return self._locked(store, repo, request.conversation_id, request.key, trace, request, body)

    def rewind(self, conversation_id: str, before_turn: str, *, db: Any = None) -> RewindResult:
        """Rewind a conversation to before turn `before_turn`: that turn and every later one
        are removed exactly (their facts, events, milestones, memory), as if never committed."""
        request = TurnCommitRequest(conversation_id=conversation_id, turn_id=before_turn,
                                    messages=[{"role": "user", "content": "(rewind)"}])  # type: ignore[list-item]
        if db is not None:
            request.config.db = db
        trace = TraceRecorder(request.key, "commit")
        try:
            store = self._store_for(request)
        except InvalidInputError as exc:
            return RewindResult(ok=False, conversation_id=conversation_id, before_turn=str(before_turn),
                                code="INVALID_REQUEST", reason=str(exc))
        repo = DialogueRepository(store)
        holder: dict[str, RewindOutcome] = {}

        def body(_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
            try:
                holder["outcome"] = repo.rewind(conversation_id, request.key, self.owner,
                                                guard=self._write_guard(store))
            except RewindRefusedError as exc:
                return TurnResult.invalid(str(exc), key=request.key), True
            self.vectors.forget(store.endpoint.label, conversation_id)
            return TurnResult(ok=True, state=TurnState.COMMITTED, key=request.key), True

        result = self._locked(store, repo, conversation_id, None, trace, request, body)
        outcome = holder.get("outcome")
        if outcome is None:
            return RewindResult(ok=False, conversation_id=conversation_id, before_turn=request.turn,
                                code=result.code, reason=result.reason, retryable=result.retryable)
        return RewindResult(ok=True, conversation_id=conversation_id, before_turn=request.turn,
                            found=outcome.status != "absent", removed_turns=outcome.removed_turns,
                            removed_memory=outcome.removed_memory, replayed_turns=outcome.replayed)

    def memory_query(self, raw: MemoryQueryRequest | bytes | str | dict[str, Any]) -> MemoryQueryResult:
        """The injection_packet for pending messages: the turn's own retrieval and injector,
        no lock, no writes (the in-process recall index is topped up from the graph)."""
        parsed = raw if isinstance(raw, MemoryQueryRequest) else MemoryQueryRequest.parse(raw)
        if isinstance(parsed, MemoryQueryResult):
            return parsed
        request = parsed
        problem = override_problem(request.config)
        if problem is not None:
            return MemoryQueryResult.invalid(problem)
        started = time.perf_counter()
        probe = TurnCommitRequest(conversation_id=request.conversation_id, turn_id="query",
                                  messages=request.messages, config=request.config)
        trace = TraceRecorder(None, "commit")
        try:
            store = self._store_for(probe)
            index = self.vectors.get(store.endpoint.label, request.conversation_id)
            pending = request.stale_turns()
            # The turns a pending write holds back make room for as many others.
            extra = min(len(pending), 50) if request.config.recall_k else 0
            retrieval = retrieve(
                DialogueRepository(store), self.gateway, index, request.conversation_id, request.messages,
                recall_k=request.config.recall_k + extra, relation_limit=self.options.relation_limit,
                purpose=trace.purpose("retriever"),
            )
            remembered = {turn_id: index.text_of(turn_key(request.conversation_id, turn_id)) for turn_id in pending}
            retrieval, held_back = without_pending(retrieval, pending, request.config.recall_k, remembered)
            packet = build_packet(retrieval, request.config.token_budget)
        except InvalidInputError as exc:
            return MemoryQueryResult.invalid(str(exc))
        except (LLMUnavailableError, LLMBadOutputError, LLMFatalError, GraphUnavailableError, GraphWriteError) as exc:
            return MemoryQueryResult(ok=False, conversation_id=request.conversation_id, code="UNAVAILABLE",
                                     reason=str(exc), retryable=not isinstance(exc, LLMFatalError))
        except SkaldError as exc:
            return MemoryQueryResult(ok=False, conversation_id=request.conversation_id, code="UNAVAILABLE",
                                     reason=str(exc), retryable=True)
        self._take_records(trace)
        return MemoryQueryResult(
            ok=True, conversation_id=request.conversation_id, injection_packet=packet,
            recalled=[t.model_dump(mode="json", exclude={"signals"}) for t in retrieval.recalled],
            stored_turns=retrieval.stored_turns, held_back=held_back,
            elapsed_ms=round((time.perf_counter() - started) * 1000.0, 3),
        )

    def _locked(
        self,
        store: GraphStore,
        repo: DialogueRepository,
        conversation_id: str,
        turn_key: str | None,
        trace: TraceRecorder,
        request: TurnCommitRequest,
        body: Callable[[StoredTurn | None], tuple[TurnResult, bool]],
    ) -> TurnResult:
        """Run `body` holding the conversation's in-process lock and its lease in the graph.
        `body` returns (result, whether the lease is still held)."""
        wait_s = self.options.lock_wait_s
        started = time.monotonic()
        local = self._conversation_lock(store.endpoint.label, conversation_id)
        if not local.acquire(timeout=wait_s):
            return self._in_progress(request, "another turn of this conversation is running in this process")
        try:
            try:
                claim = repo.acquire_lock(
                    conversation_id,
                    self.owner,
                    lease_s=self.options.lock_lease_s,
                    wait_s=max(0.0, wait_s - (time.monotonic() - started)),
                    turn_key=turn_key,
                    guard=self._write_guard(store),
                )
            except SkaldError as exc:
                return self._rolled_back(request, trace, str(exc), retryable=True, kind="graph")
            if not claim.acquired:
                return self._in_progress(
                    request,
                    f"conversation is locked by {claim.holder} "
                    f"(lease ends in {max(0, claim.expires_in_ms) / 1000:.1f}s)",
                )
            if claim.stolen_from:
                log.warning("conversation %s: took over the expired lock of %s", conversation_id, claim.stolen_from)
            lock_held = True
            try:
                result, lock_held = body(claim.stored)
                return result
            except SkaldError as exc:
                return self._rolled_back(request, trace, str(exc), retryable=True, kind="graph")
            finally:
                if lock_held:
                    try:
                        with self._write_guard(store)():
                            repo.release_lock(conversation_id, self.owner)
                    except SkaldError as exc:  # the lease runs out on its own
                        log.warning("conversation %s: could not release the lock: %s", conversation_id, exc)
        finally:
            local.release()

    def recall(self, conversation_id: str, query: str, k: int, *, graph: GraphStore | None = None) -> list[RecalledTurn]:
        """Hybrid recall of earlier turns for a question (the regression recall probe)."""
        store = graph or self.store
        index = self.vectors.get(store.endpoint.label, conversation_id)
        return recall(DialogueRepository(store), self.gateway, index, conversation_id, query, k)

    # ------------------------------------------------------------------ the turn
    def _run(
        self,
        request: TurnCommitRequest,
        repo: DialogueRepository,
        store: GraphStore,
        trace: TraceRecorder,
        payload_hash: str,
        run_slot: SlotRunner[Any],
    ) -> tuple[TurnResult, bool]:
        """(result, whether the lease is still held): the commit transaction releases it."""
        gateway = self.gateway
        config = request.config
        deadline = time.monotonic() + self.options.turn_timeout_s
        routes = resolve_routes(self.settings, config.models.as_dict())
        index = self.vectors.get(store.endpoint.label, request.conversation_id)

        slot_timeouts = self.settings.slot_timeouts_s

        def start(state: TurnState, slot: str, work: Callable[[], T]) -> Future[T]:
            if time.monotonic() > deadline:
                raise TurnTimeoutError(
                    f"turn {request.key} passed its {self.options.turn_timeout_s:.0f}s deadline before {state.value}"
                )
            trace.enter(state)

            def traced() -> T:
                with trace.slot(routes[slot]):
                    return run_slot(slot, work)

            # A copy of the caller's context: a Prefect task run still finds its flow run.
            return self._pool.submit(contextvars.copy_context().run, traced)

        def wait(slot: str, future: Future[T], started: float) -> T:
            limit = slot_timeouts.get(slot)
            until = deadline if limit is None else min(deadline, started + limit)
            try:
                return future.result(timeout=max(0.0, until - time.monotonic()))
            except FutureTimeoutError:
                future.cancel()
                what = (f"its {self.options.turn_timeout_s:g}s deadline" if until == deadline
                        else f"the {slot} slot's {limit:g}s timeout")
                raise TurnTimeoutError(
                    f"turn {request.key} passed {what} while the {slot} slot was running"
                ) from None

        def step(state: TurnState, slot: str, work: Callable[[], T]) -> T:
            started = time.monotonic()
            return wait(slot, start(state, slot, work), started)

        try:
            query_future: Future[Any] | None = None
            if config.recall_k > 0 and len(index):
                # The query embedding overlaps the retriever's graph read (it needs only the text).
                query_future = self._pool.submit(
                    gateway.embed, [turn_text(request.messages)], purpose=trace.purpose("retriever"))
            retrieval = step(
                TurnState.RETRIEVING,
                "retriever",
                lambda: retrieve(
                    repo, gateway, index, request.conversation_id, request.messages,
                    recall_k=config.recall_k, relation_limit=self.options.relation_limit,
                    purpose=trace.purpose("retriever"),
                    query_vector=None if query_future is None else (lambda: query_future.result()[0]),
                ),
            )
            packet = step(TurnState.INJECTING, "injector", lambda: build_packet(retrieval, config.token_budget))
            acted = step(
                TurnState.ACTING, "actor",
                lambda: act(gateway, routes["actor"], request, packet, purpose=trace.purpose("actor")),
            )
            text = turn_text(acted.messages)
            embedding_future: Future[Any] | None = None
            if retrieval.query_vector is None or text != turn_text(request.messages):
                # Not embedded yet (first turn, or the actor added a reply): while the extractor runs.
                embedding_future = self._pool.submit(gateway.embed, [text], purpose=trace.purpose("commit"))
            raw, plan = step(
                TurnState.EXTRACTING, "extractor",
                lambda: extract(
                    gateway, routes["extractor"], acted.messages, request.window, retrieval,
                    purpose=trace.purpose("extractor"),
                ),
            )
            proposals = proposal_lines(raw, plan)
            concurrent_started = time.monotonic()
            judging = start(
                TurnState.JUDGING, "judge",
                lambda: judge(
                    gateway, routes["judge"], acted.messages, retrieval, raw, plan, purpose=trace.purpose("judge")
                ),
            )
            historianing = start(
                TurnState.HISTORIANING, "historian",
                lambda: historian(
                    gateway, routes["historian"], acted.messages, retrieval, plan, proposals,
                    purpose=trace.purpose("historian"),
                ),
            )
            try:
                verdict = wait("judge", judging, concurrent_started)
                chronicle = wait("historian", historianing, concurrent_started)
            except BaseException:
                historianing.cancel()
                raise
            trace.dropped([*plan.dropped, *chronicle.dropped])
            trace.enter(TurnState.PREPARED)
            gate = commit_gate(plan, verdict, require_actions=config.require_actions)
            base = TurnResult(
                ok=False,
                state=TurnState.PREPARED,
                **request.ids(),
                injection_packet=packet,
                reply=acted.reply,
                entities=[e.name for e in plan.entities],
                bio_patches=[BioPatchResult(**p.model_dump()) for p in plan.bio_patches],
                events=chronicle.events,
                milestones=[m.text for m in chronicle.milestones],
                facts=plan.facts,
                judge=verdict,
                gate=gate,
            )
            if not gate.passed:
                # The gate governs graph facts only: the turn's text is still remembered.
                known = retrieval.query_vector if embedding_future is None else None
                self._remember_blocked(request, repo, store, acted.messages, trace, known)
                return self._finish_rolled_back(
                    base, trace, f"commit gate: {'; '.join(gate.reasons)}", retryable=False, kind="gate"
                ), True
            if time.monotonic() > deadline:
                raise TurnTimeoutError(
                    f"turn {request.key} passed its {self.options.turn_timeout_s:.0f}s deadline before COMMITTING"
                )

            trace.enter(TurnState.COMMITTING)
            with trace.slot(_COMMIT_ROUTE):
                if embedding_future is None:
                    embedding = retrieval.query_vector
                else:
                    vectors = wait("commit", embedding_future, time.monotonic())
                    embedding = vectors[0]
                write = TurnWrite(
                    **request.ids(),
                    payload_hash=payload_hash,
                    speaker=", ".join(dict.fromkeys(m.speaker for m in acted.messages)),
                    text=text,
                    source_refs=[m.message_id for m in acted.messages if m.message_id],
                    facts=plan.facts,
                    events=chronicle.events,
                    committed_at=datetime.now(UTC).isoformat(),
                    memory=memory_row(
                        request.conversation_id, request.key, request.turn, acted.messages,
                        embedding=list(embedding), facts=plan.facts, committed=True,
                    ),
                    entities=plan.entities,
                    actions=plan.actions,
                    bio_patches=plan.bio_patches,
                    milestones=chronicle.milestones,
                )

                def build_result(seq: int, applied: list[AppliedAction]) -> tuple[str, str]:
                    # The trace is kept apart from the result: timings are operational, and
                    # the export leaves them out (kg.vocabulary.OPERATIONAL_PROPERTIES).
                    stored = base.model_copy(
                        update={"ok": True, "state": TurnState.COMMITTED, "committed": True, "seq": seq,
                                "actions": applied}
                    )
                    return stored.model_dump_json(), self._finish_trace(trace, keep=True).model_dump_json()

                with self._write_guard(store)():
                    outcome = repo.commit_turn(write, self.owner, build_result)
        except TurnTimeoutError as exc:
            return self._rolled_back(request, trace, str(exc), retryable=True, kind="timeout"), True
        except LLMFatalError as exc:
            return self._rolled_back(request, trace, str(exc), retryable=False, kind="llm"), True
        except LLMUnavailableError as exc:
            kind: ErrorKind = "timeout" if "timed out" in str(exc) else "llm"
            return self._rolled_back(request, trace, str(exc), retryable=True, kind=kind), True
        except LLMBadOutputError as exc:
            return self._rolled_back(request, trace, str(exc), retryable=True, kind="llm"), True
        except (GraphUnavailableError, GraphWriteError) as exc:
            return self._rolled_back(request, trace, str(exc), retryable=True, kind="graph"), True
        except SkaldError as exc:
            return self._rolled_back(request, trace, str(exc), retryable=False, kind="internal"), True
        except Exception as exc:  # a bug must not leave a lease behind or kill the server
            log.exception("turn %s failed unexpectedly", request.key)
            reason = f"internal error: {type(exc).__name__}: {exc}"
            return self._rolled_back(request, trace, reason, retryable=False, kind="internal"), True

        # The transaction ran: it released the lease whatever it found.
        if outcome.status == "conflict":
            return self._conflict(request), False
        if outcome.status == "duplicate" and outcome.stored is not None:
            return self._replay(request, outcome.stored, payload_hash, trace), False
        trace.enter(TurnState.COMMITTED)
        # A turn remembered before this commit (blocked by the gate or rolled back, then sent
        # again) was just marked committed with its facts; a cached index still has the old
        # row: rebuild it from the graph when next asked (rare, and a rebuild is by position).
        self.vectors.forget_if_held(store.endpoint.label, request.conversation_id, request.key)
        result = base.model_copy(
            update={
                "ok": True, "state": TurnState.COMMITTED, "committed": True, "seq": outcome.seq,
                "actions": outcome.applied, "trace": self._finish_trace(trace),
            }
        )
        log.debug("turn %s committed (%d actions) in %.0f ms", request.key, len(outcome.applied), result.trace.total_ms)  # type: ignore[union-attr]
        return result, False

    def _remember_blocked(
        self,
        request: TurnCommitRequest,
        repo: DialogueRepository,
        store: GraphStore,
        messages: list[Any],
        trace: TraceRecorder,
        vector: list[float] | None = None,
    ) -> None:
        """Remember a gate-blocked turn's text (its own small transaction, idempotent by key).
        A failure here is logged, not raised: the turn's outcome is the gate's."""
        try:
            if vector is None:  # the retriever's query vector is this text's when it had one
                vector = list(self.gateway.embed([turn_text(messages)], purpose=trace.purpose("remember"))[0])
            row = memory_row(request.conversation_id, request.key, request.turn, messages, embedding=list(vector))
            with self._write_guard(store)():
                repo.remember(request.conversation_id, [row])
        except SkaldError as exc:
            log.warning("turn %s: blocked by the gate and could not be remembered: %s", request.key, exc)

    # ------------------------------------------------------------------ outcomes
    def _finish_trace(self, trace: TraceRecorder, *, keep: bool = False) -> Any:
        """The turn's trace from its own call records only (taken out of the gateway by the
        turn's tag: no scan of every record since start). `keep` leaves them for a later finish."""
        if self._gateway is None:
            return trace.finish([])
        records = self._gateway.records_for(trace.tag) if keep else self._gateway.take_records(trace.tag)
        return trace.finish(records)

    def _take_records(self, trace: TraceRecorder) -> None:
        if self._gateway is not None:
            self._gateway.take_records(trace.tag)

    def _persist_rolled_back(self, result: TurnResult) -> None:
        """Append a rolled-back turn's result and trace to <project>/.saga/runs/sidecar/
        rolled-back-<day>.jsonl (the graph keeps nothing of such a turn by design)."""
        with self._trace_lock:
            self.rolled_back_count += 1
            try:
                folder = self.settings.saga_dir / "runs" / "sidecar"
                folder.mkdir(parents=True, exist_ok=True)
                day = datetime.now(UTC).strftime("%Y-%m-%d")
                with (folder / f"rolled-back-{day}.jsonl").open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(result.model_dump(mode="json"), ensure_ascii=False) + "\n")
            except OSError as exc:
                log.warning("could not persist the trace of rolled-back turn %s: %s", result.key, exc)

    def _replay(
        self, request: TurnCommitRequest, stored: StoredTurn, payload_hash: str, trace: TraceRecorder
    ) -> TurnResult:
        if stored.payload_hash != payload_hash:
            return self._conflict(request)
        original = TurnResult.model_validate_json(stored.result_json)
        # Turns committed before the trace had its own property carry it inside the result.
        original_trace = TurnTrace.model_validate_json(stored.trace_json) if stored.trace_json else original.trace
        trace.enter(TurnState.COMMITTED)
        return original.model_copy(
            update={
                "idempotent_hit": True,
                "trace": trace.finish([], replay_of=original_trace.trace_id if original_trace else None),
            }
        )

    def _conflict(self, request: TurnCommitRequest) -> TurnResult:
        return TurnResult.invalid(
            f"idempotency conflict: turn {request.key} is already committed with a different payload",
            key=request.key,
            kind="conflict",
        ).model_copy(update={"conversation_id": request.conversation_id, "turn_id": request.turn})

    def _in_progress(self, request: TurnCommitRequest, why: str) -> TurnResult:
        return TurnResult(
            ok=False,
            state=TurnState.RECEIVED,
            code="IN_PROGRESS",
            error_kind="busy",
            reason=f"turn {request.key} not started: {why}",
            retryable=True,
            **request.ids(),
        )

    def _rolled_back(
        self,
        request: TurnCommitRequest,
        trace: TraceRecorder,
        reason: str,
        *,
        retryable: bool,
        kind: ErrorKind,
    ) -> TurnResult:
        base = TurnResult(
            ok=False,
            state=TurnState.ROLLED_BACK,
            **request.ids(),
        )
        return self._finish_rolled_back(base, trace, reason, retryable=retryable, kind=kind)

    def _finish_rolled_back(
        self, base: TurnResult, trace: TraceRecorder, reason: str, *, retryable: bool, kind: ErrorKind
    ) -> TurnResult:
        failed_in = trace.state.value
        trace.enter(TurnState.ROLLED_BACK)
        log.info("turn %s rolled back in %s: %s", base.key, failed_in, reason)
        result = base.model_copy(
            update={
                "ok": False,
                "state": TurnState.ROLLED_BACK,
                "committed": False,
                "code": "ROLLED_BACK",
                "error_kind": kind,
                "reason": reason,
                "retryable": retryable,
                "timed_out": kind == "timeout",
                "actions": [],
                "trace": self._finish_trace(trace),
            }
        )
        self._persist_rolled_back(result)
        return result
