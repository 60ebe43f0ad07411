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
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
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
from core.llm import LLMGateway
from core.settings import Settings
from kg.dialogue import (
    AppliedAction,
    DialogueRepository,
    StoredTurn,
    TurnWrite,
    payload_digest,
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
    TurnCommitRequest,
    TurnResult,
    TurnState,
    parse_request,
)
from tasks.dialogue.retriever import (
    RecalledTurn,
    VectorIndexRegistry,
    memory_row,
    recall,
    retrieve,
    turn_text,
)
from tasks.dialogue.routing import Route, resolve_routes
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
        self._conversation_locks: dict[tuple[str, str], threading.Lock] = {}
        self._write_lock = threading.Lock()
        self.vectors = VectorIndexRegistry()

    # ------------------------------------------------------------------ resources
    @property
    def gateway(self) -> LLMGateway:
        with self._lock:
            if self._gateway is None:
                self._gateway = LLMGateway(self.settings)
            return self._gateway

    @property
    def store(self) -> GraphStore:
        with self._lock:
            if self._store is None:
                self._store = GraphStore.open(self.settings)
            return self._store

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

    def _store_for(self, request: TurnCommitRequest) -> GraphStore:
        default = self.store
        db = request.config.db
        if db is None or (db.uri is None and db.database is None and db.username is None):
            return default
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
            return self._conversation_locks.setdefault((graph, conversation_id), threading.Lock())

    # ------------------------------------------------------------------ public API
    def commit(
        self,
        raw: TurnCommitRequest | bytes | str | dict[str, Any],
        *,
        attempt: Literal["commit", "retry"] = "commit",
        run_slot: SlotRunner[Any] | None = None,
    ) -> TurnResult:
        """Run one turn. Never raises for a turn's own failures: they are in the result."""
        parsed = raw if isinstance(raw, TurnCommitRequest) else parse_request(raw)
        if isinstance(parsed, TurnResult):
            return parsed
        request = parsed
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
        if stored is not None:
            return self._replay(request, stored, payload_hash, trace)

        wait_s = self.options.lock_wait_s
        started = time.monotonic()
        local = self._conversation_lock(store.endpoint.label, request.conversation_id)
        if not local.acquire(timeout=wait_s):
            return self._in_progress(request, "another turn of this conversation is running in this process")
        try:
            try:
                claim = repo.acquire_lock(
                    request.conversation_id,
                    self.owner,
                    lease_s=self.options.lock_lease_s,
                    wait_s=max(0.0, wait_s - (time.monotonic() - started)),
                    turn_key=request.key,
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
                log.warning(
                    "conversation %s: took over the expired lock of %s", request.conversation_id, claim.stolen_from
                )
            lock_held = True
            try:
                if claim.stored is not None:  # committed while we waited for the lock
                    return self._replay(request, claim.stored, payload_hash, trace)
                result, lock_held = self._run(request, repo, store, trace, payload_hash, run_slot or _direct)
                return result
            except SkaldError as exc:
                return self._rolled_back(request, trace, str(exc), retryable=True, kind="graph")
            finally:
                if lock_held:
                    try:
                        with self._write_guard(store)():
                            repo.release_lock(request.conversation_id, self.owner)
                    except SkaldError as exc:  # the lease runs out on its own
                        log.warning("conversation %s: could not release the lock: %s", request.conversation_id, exc)
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

        def step(state: TurnState, slot: str, work: Callable[[], T]) -> T:
            if time.monotonic() > deadline:
                raise TurnTimeoutError(
                    f"turn {request.key} passed its {self.options.turn_timeout_s:.0f}s deadline before {state.value}"
                )
            trace.enter(state)
            with trace.slot(routes[slot]):
                return run_slot(slot, work)

        try:
            retrieval = step(
                TurnState.RETRIEVING,
                "retriever",
                lambda: retrieve(
                    repo, gateway, index, request.conversation_id, request.messages,
                    recall_k=config.recall_k, relation_limit=self.options.relation_limit,
                    purpose=trace.purpose("retriever"),
                ),
            )
            packet = step(TurnState.INJECTING, "injector", lambda: build_packet(retrieval, config.token_budget))
            acted = step(
                TurnState.ACTING, "actor",
                lambda: act(gateway, routes["actor"], request, packet, purpose=trace.purpose("actor")),
            )
            raw, plan = step(
                TurnState.EXTRACTING, "extractor",
                lambda: extract(
                    gateway, routes["extractor"], acted.messages, request.window, retrieval,
                    purpose=trace.purpose("extractor"),
                ),
            )
            verdict = step(
                TurnState.JUDGING, "judge",
                lambda: judge(
                    gateway, routes["judge"], acted.messages, retrieval, raw, plan, purpose=trace.purpose("judge")
                ),
            )
            proposals = proposal_lines(raw, plan)
            chronicle = step(
                TurnState.HISTORIANING, "historian",
                lambda: historian(
                    gateway, routes["historian"], acted.messages, retrieval, plan, proposals,
                    purpose=trace.purpose("historian"),
                ),
            )
            trace.enter(TurnState.PREPARED)
            gate = commit_gate(plan, verdict, require_actions=config.require_actions)
            base = TurnResult(
                ok=False,
                state=TurnState.PREPARED,
                conversation_id=request.conversation_id,
                turn_id=request.turn,
                key=request.key,
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
                self._remember_blocked(request, repo, store, acted.messages, trace)
                return self._finish_rolled_back(
                    base, trace, f"commit gate: {'; '.join(gate.reasons)}", retryable=False, kind="gate"
                ), True
            if time.monotonic() > deadline:
                raise TurnTimeoutError(
                    f"turn {request.key} passed its {self.options.turn_timeout_s:.0f}s deadline before COMMITTING"
                )

            trace.enter(TurnState.COMMITTING)
            with trace.slot(_COMMIT_ROUTE):
                text = turn_text(acted.messages)
                embedding = gateway.embed([text], purpose=trace.purpose("commit"))[0]
                write = TurnWrite(
                    key=request.key,
                    conversation_id=request.conversation_id,
                    turn_id=request.turn,
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

                def build_result(seq: int, applied: list[AppliedAction]) -> str:
                    stored = base.model_copy(
                        update={
                            "ok": True, "state": TurnState.COMMITTED, "committed": True, "seq": seq,
                            "actions": applied, "trace": trace.finish(gateway.records),
                        }
                    )
                    return stored.model_dump_json()

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
        result = base.model_copy(
            update={
                "ok": True, "state": TurnState.COMMITTED, "committed": True, "seq": outcome.seq,
                "actions": outcome.applied, "trace": trace.finish(gateway.records),
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
    ) -> None:
        """Remember a gate-blocked turn's text (its own small transaction, idempotent by key).
        A failure here is logged, not raised: the turn's outcome is the gate's."""
        try:
            vector = self.gateway.embed([turn_text(messages)], purpose=trace.purpose("remember"))[0]
            row = memory_row(request.conversation_id, request.key, request.turn, messages, embedding=list(vector))
            with self._write_guard(store)():
                repo.remember(request.conversation_id, [row])
        except SkaldError as exc:
            log.warning("turn %s: blocked by the gate and could not be remembered: %s", request.key, exc)

    # ------------------------------------------------------------------ outcomes
    def _records(self) -> list[Any]:
        return self._gateway.records if self._gateway is not None else []

    def _replay(
        self, request: TurnCommitRequest, stored: StoredTurn, payload_hash: str, trace: TraceRecorder
    ) -> TurnResult:
        if stored.payload_hash != payload_hash:
            return self._conflict(request)
        original = TurnResult.model_validate_json(stored.result_json)
        trace.enter(TurnState.COMMITTED)
        return original.model_copy(
            update={
                "idempotent_hit": True,
                "trace": trace.finish([], replay_of=original.trace.trace_id if original.trace else None),
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
            conversation_id=request.conversation_id,
            turn_id=request.turn,
            key=request.key,
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
            conversation_id=request.conversation_id,
            turn_id=request.turn,
            key=request.key,
        )
        return self._finish_rolled_back(base, trace, reason, retryable=retryable, kind=kind)

    def _finish_rolled_back(
        self, base: TurnResult, trace: TraceRecorder, reason: str, *, retryable: bool, kind: ErrorKind
    ) -> TurnResult:
        failed_in = trace.state.value
        trace.enter(TurnState.ROLLED_BACK)
        log.info("turn %s rolled back in %s: %s", base.key, failed_in, reason)
        return base.model_copy(
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
                "trace": trace.finish(self._records()),
            }
        )
