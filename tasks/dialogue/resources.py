"""What the sidecar's requests share besides the turn itself: its options, the graphs a request
may name, the per-conversation locks and the serialised graph writes.

- `SidecarOptions`: the operational knobs (`flows.dialogue serve`'s flags).
- `RequestGraphs.open(db)`: Ok(the graph a request's `config.db` names), the served one unless
  the operator allows others; Err(one line, `forbidden`) for another graph or for credentials
  this sidecar does not take from requests, Err(one line, `malformed`) for a URI the driver
  cannot use. A graph that cannot be reached or migrated raises (SkaldError): that is the
  server's failure, not the request's. `write_guard(store)` is the write serialisation a
  graph gets (`TimedLock`, or none).
- `ConversationLocks.get(graph, conversation_id)`: a conversation's one in-process lock. Past
  the bound, the least recently used idle locks go; a held one stays, so the table may stay
  over it. A lock table, not a cache, hence hand-written (docs/decisions/lru-caches.md).
- `TimedLock`: a lock that adds up how long it was waited for and held.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from pydantic import BaseModel, Field

from core.errors import Err, Ok, Result
from core.graph_server import GraphEndpoint
from kg.store import GraphStore
from tasks.dialogue.models import DbConfig

#: Why a request may not use the graph it names.
RefusedKind = Literal["malformed", "forbidden"]
_ALLOW_HINT = "drop config.db, or start the sidecar with --allow-request-db"


class SidecarOptions(BaseModel):
    """Operational knobs of the sidecar (CLI flags of `flows.dialogue serve`)."""

    lock_wait_s: float = Field(
        30.0,
        ge=0,
        description="how long a turn waits for its conversation's lock before IN_PROGRESS",
    )
    lock_lease_s: float = Field(
        6.0,
        gt=0,
        description="lease of a conversation lock, renewed by a heartbeat while its turn runs: a crashed "
        "holder blocks its conversation at most this long, a live one keeps it however long its turn takes",
    )
    turn_timeout_s: float = Field(
        300.0,
        gt=0,
        description="a turn still preparing after this long ends ROLLED_BACK (timed_out)",
    )
    allow_request_db: bool = Field(
        False,
        description="honour a request's config.db naming another graph than the configured one",
    )
    relation_limit: int = Field(12, ge=0, le=200, description="relations the retriever hands on")
    max_conversation_locks: int = Field(
        4096,
        ge=16,
        description="per-conversation in-process locks kept (least recently used idle ones go)",
    )
    max_call_records: int | None = Field(
        None,
        ge=100,
        description="LLM call records kept in memory; older ones are flushed to Parquet under "
        "<project>/.saga/runs/sidecar, the rest when the service closes (None: keep all until "
        "then)",
    )
    flush_call_records_s: float | None = Field(
        None,
        gt=0,
        description="at most this many seconds between an LLM call and its record in Parquet "
        "under <project>/.saga/runs/sidecar (a server killed with kill -9 loses no older record; "
        "None: only past max_call_records and when the service closes)",
    )
    heap_trim_turns: int = Field(
        50,
        ge=1,
        description="every this many turns, give the malloc arenas' free pages back to the OS (core.heap)",
    )
    slot_workers: int = Field(
        32, ge=2, le=512, description="threads running slots (abandoned slots hold one until done)"
    )
    background_nice: int = Field(
        5,
        ge=0,
        le=19,
        description="how much nicer (OS priority, Linux per thread) the threads running a turn's slots (retrieval, "
        "extraction, judge, historian) are than the server's, so a memory query a person waits for gets the CPU "
        "first (0: same priority)",
    )
    turn_nice: int = Field(
        3,
        ge=0,
        le=19,
        description="how much nicer (OS priority, Linux per thread) the threads running the HTTP API's turn writes "
        "(commit, retry, replace, rewind: nobody waits for them before the next reply) are than the memory queries; "
        "their slots run `background_nice` below the queries whatever this is, unless this is more. Small: the turn's "
        "thread takes the serialised graph writes, and a niced holder keeps the other commits waiting (0: same priority)",
    )
    yield_to_queries_ms: float = Field(
        30.0,
        ge=0,
        le=1000,
        description="how long each background step of a turn (its retrieval, each slot, each LLM answer's "
        "processing, the commit) waits at most for the memory queries in flight to be answered before it "
        "starts, so they get the cores first (core.priority); bounds what sustained queries delay a commit "
        "by (0: no waiting)",
    )
    turn_workers: int = Field(
        40,
        ge=1,
        le=512,
        description="threads running the HTTP API's turn writes at once; more wait for a free one",
    )
    graph_nice: int = Field(
        5,
        ge=0,
        le=19,
        description="how much nicer (OS priority, Linux per thread) the embedded graph's server threads are than "
        "the server's when `serve` starts that graph: they run the commits' Cypher and the queries' reads, and a "
        "query's read runs beside its embedding, the longer of the two (0: same priority)",
    )
    serialize_writes: bool | None = Field(
        None,
        description="one graph write transaction at a time in this process; None: only on ArcadeDB, where "
        "concurrent inserts into one page conflict and each conflict costs a ~1 s driver retry",
    )


class TimedLock:
    """A lock that adds up how long it was waited for and held (the serialised graph writes:
    their held time per turn bounds the turns per second, whatever the machine's load)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = threading.Lock()
        self.acquired = 0
        self.waited_s = 0.0
        self.held_s = 0.0
        self._taken_at = 0.0

    def __enter__(self) -> TimedLock:
        asked = time.perf_counter()
        self._lock.acquire()
        self._taken_at = time.perf_counter()
        with self._totals:
            self.acquired += 1
            self.waited_s += self._taken_at - asked
        return self

    def __exit__(self, *exc: object) -> None:
        held = time.perf_counter() - self._taken_at
        self._lock.release()
        with self._totals:
            self.held_s += held

    def totals(self) -> dict[str, float]:
        """Acquisitions, and the seconds waited for and held, since start."""
        with self._totals:
            return {
                "acquired": self.acquired,
                "waited_s": round(self.waited_s, 3),
                "held_s": round(self.held_s, 3),
            }


class RequestGraphs:
    """The served graph (`default`, opened on first use by its owner) and the others requests
    named, opened once each, when the options allow them."""

    def __init__(
        self,
        default: Callable[[], GraphStore],
        options: SidecarOptions,
        connect_attempts: int,
    ) -> None:
        self._default = default
        self._options = options
        self._connect_attempts = connect_attempts
        self._lock = threading.Lock()
        self._others: dict[tuple[str, str, str, str], GraphStore] = {}
        self.write_lock = TimedLock()

    def open(self, db: DbConfig | None) -> Result[GraphStore, RefusedKind]:
        """The graph `db` names (see the module's contract)."""
        default = self._default()
        if db is None or db.is_empty():
            return Ok(default)
        allowed = self._options.allow_request_db
        if db.password is not None and not allowed:
            # Credentials in request bodies are off unless the operator enables them.
            return Err(
                "config.db.password is refused: this sidecar does not take database "
                f"credentials from requests ({_ALLOW_HINT})",
                "forbidden",
            )
        ep = default.endpoint
        wanted = (db.uri or ep.uri, db.username or ep.username, db.database or ep.database)
        if wanted == (ep.uri, ep.username, ep.database):
            return Ok(default)
        if not allowed:
            return Err(
                f"config.db names graph {wanted[0]}/{wanted[2]}, but this sidecar serves "
                f"{ep.label} only ({_ALLOW_HINT})",
                "forbidden",
            )
        password = db.password.get_secret_value() if db.password else ""
        cache_key = (*wanted, hashlib.sha256(password.encode()).hexdigest())
        with self._lock:
            store = self._others.get(cache_key)
        if store is not None:
            return Ok(store)
        endpoint = GraphEndpoint(wanted[0], wanted[1], password, wanted[2], embedded=False)
        try:
            store = GraphStore(endpoint, connect_attempts=self._connect_attempts).connect()
        except ValueError as exc:  # the driver's reading of the URI (the schema's pattern passed)
            return Err(f"config.db.uri cannot be used: {exc}", "malformed")
        store.migrate()
        with self._lock:
            return Ok(self._others.setdefault(cache_key, store))

    def write_guard(self, store: GraphStore) -> Callable[[], AbstractContextManager[Any]]:
        """The write serialisation `store` gets: the timed lock, or none (SidecarOptions)."""
        serialize = self._options.serialize_writes
        if serialize is None:
            serialize = store.server.is_arcadedb
        return (lambda: self.write_lock) if serialize else nullcontext

    def close(self) -> None:
        """Close the graphs requests named (the served one is its owner's to close)."""
        with self._lock:
            stores = list(self._others.values())
            self._others.clear()
        for store in stores:
            store.close()


class ConversationLocks:
    """The per-conversation in-process locks, at most `bound` idle ones kept."""

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._lock = threading.Lock()
        self._locks: OrderedDict[tuple[str, str], threading.Lock] = OrderedDict()

    def get(self, graph: str, conversation_id: str) -> threading.Lock:
        """The lock of `conversation_id` in `graph`, made on first use."""
        with self._lock:
            key = (graph, conversation_id)
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            self._locks.move_to_end(key)
            excess = len(self._locks) - self._bound
            if excess > 0:
                # Only idle locks go: a held one (or one a waiter is about to take) stays.
                for old_key in list(self._locks)[:-1]:
                    if excess <= 0:
                        break
                    old = self._locks[old_key]
                    if old.acquire(blocking=False):
                        old.release()
                        del self._locks[old_key]
                        excess -= 1
            return lock

    def __len__(self) -> int:
        with self._lock:
            return len(self._locks)
