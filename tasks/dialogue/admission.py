"""Queries first: which of the sidecar's requests gets the machine when several want it.

A chat front end waits for the memory query before it generates, so the query's latency is
the user's; a turn's commit runs after the reply is shown, and nobody waits for it but the
next commit of the same conversation. `Admission` gives the two different treatment:

- a memory query is never held back (`query()` only counts it in flight);
- a turn's own non-LLM steps (its retrieval before the LLM calls, its commit transaction
  after them) are background work: at most `background_slots` of them run at once, and one
  that would start while a memory query is in flight waits for the queries to finish, up to
  `query_wait_s` (so a steady stream of queries delays a commit by that much, never starves
  it). The LLM calls between those steps are not bounded: they wait on the model, not on
  this machine.

Neither the query nor this gate takes a lock that a commit holds across an LLM call: the
gate is held only during a step that makes none (see tasks.dialogue.turn).

Why this and not a separate executor for the queries: measured with `python -m
bench.sidecar_load` (its docstring has the figures), the query did not wait for a thread (16
commits and 16 queries use 32 of anyio's 40 tokens); it waited for the CPU, which the
commits' retrievals and transactions (Python, the in-process JVM of the graph, onnxruntime)
took in equal shares with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Admission:
    """Memory queries first; background steps bounded and held back while queries run."""

    def __init__(self, background_slots: int, query_wait_s: float) -> None:
        if background_slots < 1 or query_wait_s < 0:
            raise ValueError("background_slots must be >= 1 and query_wait_s >= 0")
        self.background_slots = background_slots
        self.query_wait_s = query_wait_s
        self._changed = threading.Condition()
        self._queries = 0
        self._background = 0
        self._waiting = 0

    @property
    def queries_in_flight(self) -> int:
        with self._changed:
            return self._queries

    @property
    def background_running(self) -> int:
        with self._changed:
            return self._background

    @property
    def background_waiting(self) -> int:
        """Background steps waiting to start."""
        with self._changed:
            return self._waiting

    @contextmanager
    def query(self) -> Iterator[None]:
        """An interactive read: runs at once; background steps wait while it is in flight."""
        with self._changed:
            self._queries += 1
        try:
            yield
        finally:
            with self._changed:
                self._queries -= 1
                self._changed.notify_all()

    @contextmanager
    def background(self) -> Iterator[None]:
        """A turn's non-LLM step: waits for a free slot, and for the queries in flight to end
        (at most `query_wait_s` for those)."""
        yield_to_queries_until = time.monotonic() + self.query_wait_s
        with self._changed:
            self._waiting += 1
            while True:
                now = time.monotonic()
                queries_first = self._queries > 0 and now < yield_to_queries_until
                if self._background < self.background_slots and not queries_first:
                    break
                # A query's end or a slot's release notifies; the timeout ends the yield to queries.
                self._changed.wait(timeout=max(0.0, yield_to_queries_until - now) if queries_first else None)
            self._waiting -= 1
            self._background += 1
        try:
            yield
        finally:
            with self._changed:
                self._background -= 1
                self._changed.notify_all()
