"""The dialogue sidecar's service (spec 000): one request in, one result out.

    RECEIVED -> RETRIEVING -> INJECTING -> ACTING -> EXTRACTING -> JUDGING -> HISTORIANING
             -> PREPARED -> COMMITTING -> COMMITTED          (any failure: ROLLED_BACK)

`DialogueService` validates a request, answers it from the idempotency record when it can,
takes the conversation's lock and lease, and hands the turn to `tasks.dialogue.turn.TurnRun`,
which walks the state machine one step per method. Endings other than COMMITTED are built in
`tasks.dialogue.outcomes`; slot scheduling (deadline, per-slot timeouts) is
`tasks.dialogue.slots`; the options, the graphs a request may name, the per-conversation locks
and the serialised writes are `tasks.dialogue.resources`.

Guarantees, and where they come from:

- Idempotency: the key `conversation_id:turn_id` is a KGTurn node written in the commit
  transaction (uniqueness constraint on `key`), with the payload hash and the result. The
  same request again returns the stored result and writes nothing; a different payload under
  a committed key is refused (INVALID_REQUEST, error_kind `conflict`). Persisted, so it
  survives restarts.
- One turn per conversation at a time, across threads and processes: an in-process lock,
  then a lease in the graph (kg.dialogue). A second caller waits up to `lock_wait_s` and
  then gets IN_PROGRESS (retryable). The lease is short and renewed by a heartbeat while the
  turn runs, so a crashed holder frees the conversation within seconds and a slow live one
  is never robbed; expired leases are taken over, and the commit transaction refuses to write
  when its lease was taken (fencing).
- All or nothing: every write of a turn (turn record, entities, relation actions, their
  KGRelEvent log, bio patches, milestones) is one transaction, which also releases the lease.
  Anything failing before or during it ends ROLLED_BACK with nothing written and a
  `retryable` flag. The commit gate (no relation actions, identity conflicts) also ends
  ROLLED_BACK, not retryable: the same input would be blocked again.
- Bad input never raises: every public method answers it with INVALID_REQUEST and one line.

The pipeline is plain Python so the HTTP server and the regression batch pay no
orchestration cost per turn; `run_slot` lets the Prefect flow run each slot as a task.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import date
from typing import Any, Generic, Literal, TypeVar, cast

from core.errors import Err, Ok, Result, SkaldError, classify
from core.heap import HeapTrimmer
from core.llm import LLMGateway
from core.priority import QUERIES, BackgroundPool
from core.settings import Settings
from kg.dialogue import (
    ConversationContents,
    DialogueRepository,
    RenameRefusedError,
    RewindOutcome,
    RewindRefusedError,
    StoredTurn,
    payload_digest,
    turn_key,
)
from kg.store import GraphStore
from tasks.dialogue.injector import build_packet
from tasks.dialogue.models import (
    CopyRequest,
    CopyResult,
    DbConfig,
    ForgetRequest,
    ForgetResult,
    ImportRequest,
    ImportResult,
    MemoryQueryRequest,
    MemoryQueryResult,
    RenameRequest,
    RenameResult,
    RewindRequest,
    RewindResult,
    TurnCommitRequest,
    TurnResult,
    failed_kind,
    parse_copy,
    parse_forget,
    parse_import,
    parse_rename,
    parse_request,
    parse_rewind,
)
from tasks.dialogue.outcomes import Ids, Outcomes
from tasks.dialogue.parts import TurnState
from tasks.dialogue.remember import import_turns
from tasks.dialogue.resources import ConversationLocks, RequestGraphs, SidecarOptions
from tasks.dialogue.retriever import (
    QueryVectors,
    RecalledTurn,
    TurnMemoryIndex,
    VectorIndexRegistry,
    recall,
    remembered_speakers,
    retrieve,
    start_query_vectors,
    turn_text,
    without_pending,
)
from tasks.dialogue.routing import resolve_routes
from tasks.dialogue.slots import SlotRunner, SlotScheduler, direct
from tasks.dialogue.trace import TraceRecorder
from tasks.dialogue.turn import TurnContext, TurnRun

log = logging.getLogger("skald.dialogue")
#: A rename's or a copy's answer.
CarryResult = TypeVar("CarryResult", RenameResult, CopyResult)
T = TypeVar("T")

#: Threads that embed memory queries' messages: the ONNX session runs one batch at a time,
#: so a few suffice for queries arriving together.
QUERY_EMBED_WORKERS = 4


@dataclass(frozen=True)
class Ran(Generic[T]):
    """What work run under a conversation's lock returned (None included)."""

    value: T


def _failure(result: TurnResult) -> dict[str, Any]:
    """The fields of a conversation call's answer that say why it did not happen."""
    return {
        "ok": False,
        "code": result.code,
        "error_kind": result.error_kind,
        "reason": result.reason,
        "retryable": result.retryable,
    }


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
        call_log: bool = True,
    ) -> None:
        """`call_log`: the gateway it makes writes its LLM call records under
        `.saga/runs/sidecar` (past `options.max_call_records`, at most
        `options.flush_call_records_s` after each call, and the rest when it closes); off
        for a caller that writes them itself (the regression batch, into its run's folder)."""
        self.settings = settings
        self._call_log = call_log
        self.options = options or SidecarOptions()
        # One owner per process: the in-process lock already serialises its own turns.
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._gateway = gateway
        self._owns_gateway = gateway is None
        self._store = store
        self._owns_store = store is None
        self._lock = threading.Lock()
        self.graphs = RequestGraphs(
            lambda: self.store, self.options, settings.graph_connect_attempts
        )
        # A server that sees many conversations keeps only the recently used locks.
        self._conversation_locks = ConversationLocks(self.options.max_conversation_locks)
        self.vectors = VectorIndexRegistry(max_turns=settings.recall_cache_turns)
        # Native memory freed by turns goes back to the OS now and then (see core.heap).
        self.heap = HeapTrimmer(every=self.options.heap_trim_turns)
        # A turn's slots run below the memory queries' priority (core.priority); the turn's own
        # thread, which takes the serialised graph writes, does not: a niced writer would hold
        # them longer while every other commit waits.
        self._pool = BackgroundPool(
            self.options.slot_workers, "dialogue-slot", self.options.background_nice
        )
        # A memory query embeds its messages on a thread of this pool while its own thread reads
        # the graph (the two overlap); at the queries' priority, not on the niced slot pool.
        self._query_pool = ThreadPoolExecutor(QUERY_EMBED_WORKERS, "memory-query")
        # The HTTP API's turn writes run a little below the queries too (SidecarOptions.turn_nice):
        # nobody waits for a commit before the next reply; a query is what a person waits for.
        self._turn_pool = BackgroundPool(
            self.options.turn_workers, "dialogue-turn", self.options.turn_nice
        )
        # ... and each of a turn's steps waits (bounded) for the queries in flight to be answered.
        # One setting per process (the queries in flight are the process's): the last service made
        # sets it; `serve` makes one.
        QUERIES.max_wait_s = self.options.yield_to_queries_ms / 1000.0
        self.outcomes = Outcomes(settings.saga_dir, lambda: self._gateway)

    @property
    def rolled_back_count(self) -> int:
        """Turns rolled back since start (their traces are under .saga/runs/sidecar)."""
        return self.outcomes.rolled_back_count

    # ------------------------------------------------------------------ resources
    @property
    def gateway(self) -> LLMGateway:
        with self._lock:
            if self._gateway is None:
                flush_dir = self.settings.saga_dir / "runs" / "sidecar"
                self._gateway = LLMGateway(
                    self.settings,
                    max_records=self.options.max_call_records,
                    flush_dir=flush_dir if self._call_log else None,
                    flush_after_s=self.options.flush_call_records_s,
                )
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
        self.graphs.close()
        stores: list[GraphStore] = []
        with self._lock:
            if self._owns_store and self._store is not None:
                stores.append(self._store)
                self._store = None
            gateway, self._gateway = (
                (self._gateway, None) if self._owns_gateway else (None, self._gateway)
            )
        for store in stores:
            store.close()
        if gateway is not None:
            gateway.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._query_pool.shutdown(wait=False, cancel_futures=True)
        self._turn_pool.shutdown(wait=False, cancel_futures=True)

    def write_lock_totals(self) -> dict[str, float]:
        """The serialised graph writes so far (TimedLock.totals; all 0 where writes are not serialised)."""
        return self.graphs.write_lock.totals()

    def yielded_to_queries(self) -> dict[str, float]:
        """What the turns' background steps waited for memory queries so far (core.priority)."""
        return QUERIES.totals()

    def write_guard(self) -> AbstractContextManager[Any]:
        """The write serialisation this process uses for the default graph (see SidecarOptions)."""
        return self.graphs.write_guard(self.store)()

    def conversation_lock_count(self) -> int:
        return len(self._conversation_locks)

    # ------------------------------------------------------------------ public API
    def submit_turn_write(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """`work(*args, **kwargs)` (commit, retry, replace, rewind) on the turn-write pool, in a
        copy of the caller's context: the HTTP API's way to run a turn's write, below the
        memory queries' priority (SidecarOptions.turn_nice)."""
        return self._turn_pool.submit(contextvars.copy_context().run, work, *args, **kwargs)

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
        ids = request.ids()
        self.heap.tick()
        trace = TraceRecorder(request.key, attempt)
        store = self._graph(request.config.db, request.key, ids, trace)
        if isinstance(store, TurnResult):
            return store
        repo = DialogueRepository(store)
        payload_hash = payload_digest(request.payload_canonical())

        def replay_of(stored: StoredTurn | None) -> TurnResult | None:
            """The stored turn's answer (or a conflict), unless this is a replace of it."""
            if stored is None:
                return None
            # A turn of a renamed or copied conversation was hashed with the id it was sent under.
            hashed = (
                payload_hash
                if stored.payload_conversation_id is None
                else payload_digest(request.payload_canonical(stored.payload_conversation_id))
            )
            if replace and stored.payload_hash != hashed:
                return None
            return self.outcomes.replay(ids, stored, hashed, trace)

        try:
            replayed = replay_of(repo.get_turn(request.key))
        except SkaldError as exc:
            return self.outcomes.failed(ids, trace, exc)
        if replayed is not None:
            return replayed

        def body(claim_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
            replayed = replay_of(claim_stored)
            if replayed is not None:
                return replayed, True
            if replace and repo.remembered_text(request.key) != turn_text(request.messages):
                # Changed text: rewind the old turn and every later one. (The same text as
                # remembered, a turn the commit gate blocked sent again, is a plain retry:
                # rewinding would throw away every later turn for nothing.)
                match self._rewind_locked(store, repo, request.conversation_id, request.key):
                    case Err(reason, kind):
                        return TurnResult.invalid(reason, key=request.key, kind=kind), True
                    case Ok(rewound) if rewound.status != "absent":
                        log.info(
                            "conversation %s: turn %s replaced (%d turns rewound)",
                            request.conversation_id,
                            request.turn,
                            len(rewound.removed_turns),
                        )
            return self._turn(
                request, repo, store, trace, payload_hash, run_slot or direct, replace=replace
            )

        return self._locked(store, repo, ids, request.key, trace, body)

    def rewind(
        self,
        conversation_id: str | RewindRequest,
        before_turn: int | str | None = None,
        *,
        db: DbConfig | None = None,
    ) -> RewindResult:
        """Rewind a conversation to before turn `before_turn`: that turn and every later one
        are removed exactly (their facts, events, milestones, memory), as if never committed.
        Takes a RewindRequest, or the two ids (validated like one)."""
        if isinstance(conversation_id, RewindRequest):
            parsed: RewindRequest | RewindResult = conversation_id
        else:
            parsed = parse_rewind({"conversation_id": conversation_id, "before_turn": before_turn})
        if isinstance(parsed, RewindResult):
            return parsed
        request = parsed
        key = request.key
        before = str(request.before_turn)
        ids = {"key": key, "conversation_id": request.conversation_id, "turn_id": before}

        def failed(result: TurnResult) -> RewindResult:
            return RewindResult(
                ok=False,
                conversation_id=request.conversation_id,
                before_turn=before,
                code=result.code,
                error_kind=result.error_kind,
                reason=result.reason,
                retryable=result.retryable,
            )

        trace = TraceRecorder(key, "commit")
        store = self._graph(db, key, ids, trace)
        if isinstance(store, TurnResult):
            return failed(store)
        repo = DialogueRepository(store)
        holder: dict[str, RewindOutcome] = {}

        def body(_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
            rewound = self._rewind_locked(store, repo, request.conversation_id, key)
            if isinstance(rewound, Err):
                return TurnResult.invalid(rewound.reason, key=key, kind=rewound.kind), True
            holder["outcome"] = rewound.value
            return TurnResult(ok=True, state=TurnState.COMMITTED, key=key), True

        result = self._locked(store, repo, ids, None, trace, body)
        outcome = holder.get("outcome")
        if outcome is None:
            return failed(result)
        return RewindResult(
            ok=True,
            conversation_id=request.conversation_id,
            before_turn=before,
            found=outcome.status != "absent",
            removed_turns=outcome.removed_turns,
            removed_memory=outcome.removed_memory,
            replayed_turns=outcome.replayed,
        )

    def forget(
        self, conversation_id: str | ForgetRequest, *, db: DbConfig | None = None
    ) -> ForgetResult:
        """Forget a conversation (its chat was deleted): every turn, memory row, entity,
        relation, event and milestone it holds, in one transaction under its lock: a turn of
        it in flight finishes first (past `lock_wait_s` the forget answers IN_PROGRESS, and
        removes nothing). Takes a ForgetRequest, or the id (validated like one). Forgetting a
        conversation memory does not hold finds nothing. Like a rewind, a forget the graph
        fails is logged with the rolled-back turns."""
        parsed = (
            conversation_id
            if isinstance(conversation_id, ForgetRequest)
            else parse_forget({"conversation_id": conversation_id})
        )
        if isinstance(parsed, ForgetResult):
            return parsed
        cid = parsed.conversation_id

        def forget(store: GraphStore, repo: DialogueRepository) -> ConversationContents | None:
            removed = repo.forget(cid, self.owner, guard=self.graphs.write_guard(store))
            self.vectors.forget(store.endpoint.label, cid)
            return removed

        outcome = self._on_conversation(cid, "forget", db, forget)
        if isinstance(outcome, TurnResult):
            return ForgetResult(conversation_id=cid, **_failure(outcome))
        if outcome.value is not None:
            log.info("conversation %s forgotten: %s", cid, outcome.value)
        return ForgetResult(
            ok=True,
            conversation_id=cid,
            found=outcome.value is not None,
            removed=outcome.value or ConversationContents(),
        )

    def rename(
        self,
        conversation_id: str | RenameRequest,
        new_conversation_id: str | None = None,
        *,
        db: DbConfig | None = None,
    ) -> RenameResult:
        """Move a conversation to another id (its chat was renamed): every turn, memory row,
        entity, relation, event and milestone, in one transaction under both ids' locks (a turn
        of either in flight finishes first; past `lock_wait_s` the rename answers IN_PROGRESS
        and moves nothing). Refused as a conflict when the new id already holds memory. Takes
        a RenameRequest, or the two ids (validated like one)."""
        return self._carry(conversation_id, new_conversation_id, RenameResult, db=db)

    def copy(
        self,
        conversation_id: str | CopyRequest,
        new_conversation_id: str | None = None,
        *,
        db: DbConfig | None = None,
    ) -> CopyResult:
        """Copy a conversation to another id (its chat was branched), leaving it as it was:
        the same transaction and locks as `rename`, and the same refusals. Takes a
        CopyRequest, or the two ids (validated like one)."""
        return self._carry(conversation_id, new_conversation_id, CopyResult, db=db)

    def _carry(
        self,
        given: str | RenameRequest | CopyRequest,
        new_conversation_id: str | None,
        answer: type[CarryResult],
        *,
        db: DbConfig | None,
    ) -> CarryResult:
        """A rename (RenameResult) or a copy (CopyResult), under both ids' locks."""
        move = answer is RenameResult
        parsed = (
            given
            if isinstance(given, RenameRequest | CopyRequest)
            else (parse_rename if move else parse_copy)(
                {"conversation_id": given, "new_conversation_id": new_conversation_id}
            )
        )
        if isinstance(parsed, RenameResult | CopyResult):
            return cast(CarryResult, parsed)
        request = parsed
        verb, field = ("rename", "moved") if move else ("copy", "copied")
        old, new = request.conversation_id, request.new_conversation_id
        named = {"conversation_id": old, "new_conversation_id": new}
        if old == new:
            return answer(ok=True, **named)
        # Labels for the locks' refusals and the rolled-back log, not turns' keys.
        ids = {"key": turn_key(old, verb), "conversation_id": old, "turn_id": ""}
        new_ids = {"key": turn_key(new, verb), "conversation_id": new, "turn_id": ""}
        trace = TraceRecorder(ids["key"], "commit")
        store = self._graph(db, ids["key"], ids, trace)
        holder: dict[str, ConversationContents | None] = {}
        if isinstance(store, TurnResult):
            result = store
        else:
            repo = DialogueRepository(store)

            def both_held(_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
                try:
                    guard = self.graphs.write_guard(store)
                    holder["carried"] = repo.carry(old, new, self.owner, move=move, guard=guard)
                except RenameRefusedError as exc:
                    return TurnResult.invalid(str(exc), key=ids["key"], kind="conflict"), True
                for cid in (old, new):
                    self.vectors.forget(store.endpoint.label, cid)
                return TurnResult(ok=True, state=TurnState.COMMITTED, key=ids["key"]), True

            def old_held(_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
                return self._locked(store, repo, new_ids, None, trace, both_held), True

            result = self._locked(store, repo, ids, None, trace, old_held)
        if "carried" in holder:
            carried = holder["carried"]
            if carried is not None:
                log.info("conversation %s: %s to %s: %s", old, verb, new, carried)
            contents = carried or ConversationContents()
            return answer.model_validate(
                {"ok": True, **named, "found": carried is not None, field: contents}
            )
        return answer(
            ok=False,
            **named,
            code=result.code,
            error_kind=result.error_kind,
            reason=result.reason,
            retryable=result.retryable,
        )

    def import_turns(self, raw: ImportRequest | bytes | str | dict[str, Any]) -> ImportResult:
        """Remember turns of a chat's history in bulk, as text (no LLM slot, no facts: what
        `flows.dialogue ingest` does with the chat's file), appended in the order given, each
        embedded without the speakers of the turns before it, as a commit would
        (tasks.dialogue.remember.import_turns). Under the conversation's lock: a turn of it in
        flight finishes first (past `lock_wait_s` the import answers IN_PROGRESS and writes
        nothing). A turn memory holds already is left as it is (`already`)."""
        parsed = raw if isinstance(raw, ImportRequest) else parse_import(raw)
        if isinstance(parsed, ImportResult):
            return parsed
        cid = parsed.conversation_id

        def remember(store: GraphStore, repo: DialogueRepository) -> tuple[list[str], list[str]]:
            index = self.vectors.get(store.endpoint.label, cid)
            speakers = remembered_speakers(index, repo, cid, self.gateway.embedding_fingerprint())
            return import_turns(self, cid, parsed.turns, speakers)

        outcome = self._on_conversation(cid, "import", None, remember)
        if isinstance(outcome, TurnResult):
            return ImportResult(conversation_id=cid, **_failure(outcome))
        added, already = outcome.value
        if added:
            log.info("conversation %s: %d turn(s) imported", cid, len(added))
        return ImportResult(ok=True, conversation_id=cid, added=added, already=already)

    def _on_conversation(
        self,
        cid: str,
        label: str,
        db: DbConfig | None,
        work: Callable[[GraphStore, DialogueRepository], T],
    ) -> Ran[T] | TurnResult:
        """`work(store, repo)` on a whole conversation (a forget, an import) under its lock: what
        it returned, or the result that says why it did not run (the graph unreachable, the
        lock busy past `lock_wait_s`, the graph failing under it)."""
        # A label for the lock's refusals and the rolled-back log, not a turn's key.
        key = turn_key(cid, label)
        ids = {"key": key, "conversation_id": cid, "turn_id": ""}
        trace = TraceRecorder(key, "commit")
        store = self._graph(db, key, ids, trace)
        if isinstance(store, TurnResult):
            return store
        repo = DialogueRepository(store)
        ran: list[Ran[T]] = []

        def body(_stored: StoredTurn | None) -> tuple[TurnResult, bool]:
            ran.append(Ran(work(store, repo)))
            return TurnResult(ok=True, state=TurnState.COMMITTED, key=key), True

        result = self._locked(store, repo, ids, None, trace, body)
        return ran[0] if ran else result

    def memory_query(
        self, raw: MemoryQueryRequest | bytes | str | dict[str, Any]
    ) -> MemoryQueryResult:
        """The injection_packet for pending messages: the turn's own retrieval and injector,
        no lock, no writes (the in-process recall index is topped up from the graph)."""
        parsed = raw if isinstance(raw, MemoryQueryRequest) else MemoryQueryRequest.parse(raw)
        if isinstance(parsed, MemoryQueryResult):
            return parsed
        request = parsed
        started = time.perf_counter()
        trace = TraceRecorder(None, "commit")
        try:
            # A person waits for this one: the embedder serves it before background callers, and
            # the turns' background steps wait for it (core.priority).
            with QUERIES.serving():
                opened = self.graphs.open(request.config.db)
                if isinstance(opened, Err):
                    return MemoryQueryResult.invalid(opened.reason, kind=opened.kind)
                store = opened.value
                index = self.vectors.get(store.endpoint.label, request.conversation_id)
                purpose = trace.purpose("retriever")
                query_vectors = self._start_query_embedding(index, request, purpose)
                pending = request.stale_turns()
                # A replace may rewind and rewrite a pending turn while this query reads (it takes no
                # lock), so memory's text for it is read before and after the retrieval: an old text
                # seen either time, or none after, holds back what the turn wrote (see without_pending).
                before = {
                    turn_id: index.text_of(turn_key(request.conversation_id, turn_id))
                    for turn_id in pending
                }
                # The turns a pending write may hold back make room for as many others: those memory
                # holds (a front end catching up lists up to 200 turns memory holds none of).
                held = sum(text is not None for text in before.values())
                extra = min(held, 50) if request.config.recall_k else 0
                retrieval = retrieve(
                    DialogueRepository(store),
                    self.gateway,
                    index,
                    request.conversation_id,
                    request.messages,
                    window=request.window,
                    recall_k=request.config.recall_k + extra,
                    relation_limit=self.options.relation_limit,
                    purpose=purpose,
                    query_vectors=query_vectors,
                )
                remembered = {
                    turn_id: held
                    if held is not None and held != pending[turn_id]
                    else index.text_of(turn_key(request.conversation_id, turn_id))
                    for turn_id, held in before.items()
                }
                retrieval, held_back = without_pending(
                    retrieval, pending, request.config.recall_k, remembered
                )
                packet = build_packet(retrieval, request.config.token_budget)
        except SkaldError as exc:
            failure = classify(exc)
            return MemoryQueryResult(
                ok=False,
                conversation_id=request.conversation_id,
                code="UNAVAILABLE",
                error_kind=failed_kind(failure),
                reason=str(exc),
                retryable=failure.retryable,
            )
        self.outcomes.drop_records(trace)
        return MemoryQueryResult(
            ok=True,
            conversation_id=request.conversation_id,
            injection_packet=packet,
            recalled=[t.model_dump(mode="json", exclude={"signals"}) for t in retrieval.recalled],
            stored_turns=retrieval.stored_turns,
            held_back=held_back,
            elapsed_ms=round((time.perf_counter() - started) * 1000.0, 3),
        )

    def _start_query_embedding(
        self, index: TurnMemoryIndex, request: MemoryQueryRequest, purpose: str
    ) -> QueryVectors | None:
        """`start_query_vectors` for a memory query, on the memory-query pool (the copied context
        carries `QUERIES.serving()` to the pool's thread)."""
        return start_query_vectors(
            index,
            request.messages,
            request.window,
            request.config.recall_k,
            lambda texts: self.gateway.embed(texts, purpose=purpose),
            lambda work, *args: self._query_pool.submit(
                contextvars.copy_context().run, work, *args
            ),
        )

    def recall(
        self,
        conversation_id: str,
        query: str,
        k: int,
        *,
        asked_on: date | None = None,
        graph: GraphStore | None = None,
    ) -> list[RecalledTurn]:
        """Hybrid recall of earlier turns for a question (the regression recall probe);
        `asked_on`: the day it is asked, when the benchmark gives it."""
        store = graph or self.store
        index = self.vectors.get(store.endpoint.label, conversation_id)
        return recall(
            DialogueRepository(store),
            self.gateway,
            index,
            conversation_id,
            query,
            k,
            asked_on=asked_on,
        )

    def _graph(
        self, db: DbConfig | None, key: str, ids: Ids, trace: TraceRecorder
    ) -> GraphStore | TurnResult:
        """The graph a request names, or the result that answers the request: INVALID_REQUEST
        when it may not use that graph, ROLLED_BACK when the graph is unreachable or its
        schema cannot be migrated."""
        try:
            opened = self.graphs.open(db)
        except SkaldError as exc:
            return self.outcomes.failed(ids, trace, exc)
        if isinstance(opened, Err):
            return TurnResult.invalid(opened.reason, key=key, kind=opened.kind)
        return opened.value

    # ------------------------------------------------------------------ under the lock
    def _locked(
        self,
        store: GraphStore,
        repo: DialogueRepository,
        ids: Ids,
        turn_key: str | None,
        trace: TraceRecorder,
        body: Callable[[StoredTurn | None], tuple[TurnResult, bool]],
    ) -> TurnResult:
        """Run `body` holding the conversation's in-process lock and its lease in the graph.
        `body` returns (result, whether the lease is still held)."""
        conversation_id = ids["conversation_id"]
        wait_s = self.options.lock_wait_s
        started = time.monotonic()
        local = self._conversation_locks.get(store.endpoint.label, conversation_id)
        if not local.acquire(timeout=wait_s):
            return self.outcomes.in_progress(
                ids, "another turn of this conversation is running in this process"
            )
        try:
            try:
                claim = repo.acquire_lock(
                    conversation_id,
                    self.owner,
                    lease_s=self.options.lock_lease_s,
                    wait_s=max(0.0, wait_s - (time.monotonic() - started)),
                    turn_key=turn_key,
                    guard=self.graphs.write_guard(store),
                )
            except SkaldError as exc:
                return self.outcomes.failed(ids, trace, exc)
            if not claim.acquired:
                return self.outcomes.in_progress(
                    ids,
                    f"conversation is locked by {claim.holder} "
                    f"(lease ends in {max(0, claim.expires_in_ms) / 1000:.1f}s)",
                )
            if claim.stolen_from:
                log.warning(
                    "conversation %s: took over the expired lock of %s",
                    conversation_id,
                    claim.stolen_from,
                )
            lock_held = True
            try:
                with repo.heartbeat(
                    conversation_id,
                    self.owner,
                    self.options.lock_lease_s,
                    guard=self.graphs.write_guard(store),
                ):
                    result, lock_held = body(claim.stored)
                return result
            except SkaldError as exc:
                return self.outcomes.failed(ids, trace, exc)
            finally:
                if lock_held:
                    try:
                        with self.graphs.write_guard(store)():
                            repo.release_lock(conversation_id, self.owner)
                    except SkaldError as exc:  # the lease runs out on its own
                        log.warning(
                            "conversation %s: could not release the lock: %s", conversation_id, exc
                        )
        finally:
            local.release()

    def _rewind_locked(
        self, store: GraphStore, repo: DialogueRepository, conversation_id: str, key: str
    ) -> Result[RewindOutcome, Literal["conflict"]]:
        """Rewind to before turn `key` (the lease held), or Err(the one-line refusal, conflict)
        when the conversation cannot be rewound. Drops the conversation's cached recall index.

        A result, not the RewindRefusedError: both callers answer a refusal as a conflict from
        inside `_locked`, which would take any SkaldError escaping it for a graph failure."""
        try:
            outcome = repo.rewind(
                conversation_id, key, self.owner, guard=self.graphs.write_guard(store)
            )
        except RewindRefusedError as exc:
            return Err(str(exc), "conflict")
        if outcome.status != "absent":
            self.vectors.forget(store.endpoint.label, conversation_id)
        return Ok(outcome)

    def _turn(
        self,
        request: TurnCommitRequest,
        repo: DialogueRepository,
        store: GraphStore,
        trace: TraceRecorder,
        payload_hash: str,
        run_slot: SlotRunner[Any],
        *,
        replace: bool = False,
    ) -> tuple[TurnResult, bool]:
        """The turn itself (tasks.dialogue.turn); (result, whether the lease is still held)."""
        routes = resolve_routes(self.settings, request.config.models.as_dict())
        scheduler = SlotScheduler(
            key=request.key,
            pool=self._pool,
            trace=trace,
            routes=routes,
            run_slot=run_slot,
            turn_timeout_s=self.options.turn_timeout_s,
            slot_timeouts_s=self.settings.slot_timeouts_s,
        )
        context = TurnContext(
            gateway=self.gateway,
            vectors=self.vectors,
            outcomes=self.outcomes,
            write_guard=self.graphs.write_guard(store),
            owner=self.owner,
            relation_limit=self.options.relation_limit,
        )
        run = TurnRun(
            request,
            repo=repo,
            store=store,
            trace=trace,
            payload_hash=payload_hash,
            scheduler=scheduler,
            routes=routes,
            context=context,
        )
        result, held = run.run()
        if replace and result.retryable and result.state == TurnState.ROLLED_BACK:
            # The rewind took the turn's old text out of memory; if the slots failed (model
            # down, timeout), memory would hold neither text until the retry. It holds the
            # new one (not committed; the retry commits its facts and marks it).
            run.remember_text()
        return result, held
