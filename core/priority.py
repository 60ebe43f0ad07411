"""Background work at a lower OS priority than the requests a person waits for.

The sidecar's memory query and a turn's commit share the process's CPU (Python, the ONNX
embedder, the embedded graph's JVM) on machines with few cores. A front end waits for the
query before it generates; the commit runs after the reply, in the background. Linux
schedules threads, not processes, and each thread has its own nice value
(`setpriority(PRIO_PROCESS, <thread id>, n)`), so the threads that run a turn's slots
(retrieval, extraction, judge, historian) are started niced: when the cores are busy the
scheduler gives a query's thread the CPU first, and idle cores still run the slots at full
speed. The turn's own thread (which takes the process's serialised graph writes) is niced
less than its slots: a niced holder of those writes keeps every other commit waiting longer
(measured in bench/sidecar_load.py: at nice 10 the write lock was held 429 instead of 287 ms a
turn), while 3 steps cost the holder nothing measurable and gave the queries the CPU sooner.

The embedded graph's server threads (its Bolt connections above all: each runs the Cypher of
one client connection, a commit's writes and a query's read alike) can be started niced as
well (`lower_threads` over the threads its start created; a connection's thread, started by
the niced listener, inherits it): the query's graph read runs beside its embedding, which is
the longer of the two, so the embedding and the query's Python get the CPU first.

Every thread made nicer here (a pool's niced workers, the graph's server threads) is also put
under Linux's SCHED_BATCH policy (`batch_thread`): the scheduler takes it for CPU-bound work and
never lets its wake-up preempt a running thread. It keeps its nice-weighted share of the CPU
(unlike SCHED_IDLE, which would starve the commits beside a busy model server); what changes is
that a waking slot, commit or Bolt thread no longer cuts into the slice of the query that runs.
Measured in bench/sidecar_load.py: query p95 at 16 conversations 48, 58, 48 ms against 59, 68,
55, with commit p95 and turns/s no worse. Any thread may lower its own policy so; a thread it
starts inherits it, as it inherits the nice value.

A thread can make itself nicer but, without CAP_SYS_NICE, never less nice again, so the
niced threads are pools of their own (`BackgroundPool`) whose workers are niced once, when
they start; a thread they start inherits their nice value. A pool's workers are niced
relative to the thread that made the pool, not to the thread whose submit happened to start
them (a turn's thread, niced itself, starts the slot pool's workers): so the slots run at the
server's priority plus their own steps whatever the turn's. Where per-thread priority is not
available (not Linux, or setpriority refused) the pools are ordinary ones.

OS priority decides who runs when both are runnable; it does not stop a commit's next burst
of CPU from starting while a query runs, and on two cores each such burst takes a core the
query's embedding would use. So background work also yields at its step boundaries:
`QUERIES` counts the memory queries in flight (`serving()`, from the HTTP edge to the answer),
and a background step about to start (a turn's retrieval, each slot, the processing of each
LLM answer, the commit transaction) first waits while any query is in flight, at most
`max_wait_s` (default 30 ms; `SidecarOptions.yield_to_queries_ms`), so sustained queries
delay a commit by a bounded amount and never starve it. A thread that serves a query never
waits for itself. Measured in bench/sidecar_load.py, on the same host: query p95 at 16
conversations 31, 27, 28 ms against 33, 31, 31 without (alternating runs, the query counted from
the service's call; from the HTTP edge 27, 27, 26 against 29, 28, 30), and over six default
runs its 16:1 ratio 1.48-1.95x (median 1.63x) against 1.74-2.07x (median 1.92x) before; the
commit's ratio stays within its spread.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

log = logging.getLogger("skald.priority")


def process_threads() -> set[int]:
    """The OS thread ids of this process now (Linux: /proc/self/task; elsewhere none)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def lower_threads(tids: set[int], by: int) -> int:
    """Make the OS threads `tids` of this process `by` nicer (Linux); how many took it (a
    thread that has exited meanwhile does not)."""
    return sum(_lower(tid, by) for tid in sorted(tids))


def _lower(tid: int, by: int) -> bool:
    if by <= 0 or not hasattr(os, "setpriority"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError as exc:
        log.debug("could not lower the priority of thread %d: %s", tid, exc)
        return False
    batch_thread(tid)
    return True


def batch_thread(tid: int) -> bool:
    """Put OS thread `tid` of this process under SCHED_BATCH (Linux; see the module docstring),
    keeping its nice value; whether it took it."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:
        log.debug("could not make thread %d a batch thread: %s", tid, exc)
        return False
    return True


def this_thread_nice() -> int | None:
    """The calling OS thread's nice value (Linux), or None where it cannot be read."""
    if not sys.platform.startswith("linux"):  # elsewhere a native thread id is no PRIO_PROCESS id
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except OSError:
        return None


def nice_this_thread_to(target: int) -> bool:
    """Make the calling OS thread at least `target` nice (Linux); whether it is now exactly
    that (a thread already nicer stays as it is: it cannot be made less nice)."""
    now = this_thread_nice()
    if now is None:
        return False
    if now < target and not _lower(threading.get_native_id(), target - now):
        return False
    return this_thread_nice() == target


class BackgroundPool(ThreadPoolExecutor):
    """A thread pool whose workers run `nice` steps below the thread that made the pool (0:
    its priority), whichever thread's submit starts them."""

    def __init__(self, max_workers: int, thread_name_prefix: str, nice: int) -> None:
        self.nice = nice
        base = this_thread_nice()
        super().__init__(
            max_workers=max_workers,
            thread_name_prefix=thread_name_prefix,
            initializer=nice_this_thread_to if base is not None else None,
            initargs=(min(19, base + nice),) if base is not None else (),
        )


_SERVING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "skald_serving_query", default=False
)


def serving_query() -> bool:
    """Whether this context serves a memory query a person waits for: inside
    `QUERIES.serving()`, or in a thread handed a copy of such a context (the query's embedding)."""
    return _SERVING.get()


class QueriesInFlight:
    """The memory queries in flight, and the background steps that yield to them (see the
    module docstring). Thread-safe; one per process (`QUERIES`)."""

    def __init__(self, max_wait_s: float = 0.03) -> None:
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._in_flight = 0
        self._waiting = 0
        self.yields = 0  # background steps that found a query in flight
        self.waited_s = 0.0
        self.timed_out = 0  # ... and gave up waiting after max_wait_s

    @contextmanager
    def serving(self) -> Iterator[None]:
        """A query a person waits for runs in this context (nested: counted once per entry)."""
        token = _SERVING.set(True)
        with self._cond:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                if not self._in_flight:
                    self._cond.notify_all()
            _SERVING.reset(token)

    def yield_to_queries(self) -> float:
        """Wait while a query is in flight, at most `max_wait_s`; the seconds waited. At once
        when none is, when waiting is off (0) or when the caller serves a query itself."""
        if not self._in_flight or self.max_wait_s <= 0 or serving_query():
            return 0.0
        started = time.perf_counter()
        with self._cond:
            self._waiting += 1
            try:
                done = self._cond.wait_for(lambda: not self._in_flight, timeout=self.max_wait_s)
            finally:
                self._waiting -= 1
            waited = time.perf_counter() - started
            self.yields += 1
            self.waited_s += waited
            self.timed_out += 0 if done else 1
        return waited

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Background steps waiting now."""
        return self._waiting

    def totals(self) -> dict[str, float]:
        with self._cond:
            return {
                "yields": self.yields,
                "waited_s": round(self.waited_s, 6),
                "timed_out": self.timed_out,
            }


#: The process's memory queries in flight (the sidecar's HTTP API and DialogueService mark them).
QUERIES = QueriesInFlight()
