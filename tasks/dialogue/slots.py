"""Slot scheduling for one turn: each slot runs on the service's worker pool, and the turn waits
for it with the turn's deadline and the slot's own timeout (`settings.slot_timeouts_s`).

A slot still running when either passes ends the turn: `TurnTimeoutError` is raised at once,
the abandoned call finishes in the background and its result is dropped (nothing it computed
can reach the commit transaction). `start` and `wait` are separate so two slots can run at the
same time (judge and historian); `step` is both for a slot the turn waits on right away.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, TypeVar

from core.errors import DeadlineError
from core.priority import QUERIES
from tasks.dialogue.parts import TurnState
from tasks.dialogue.routing import Route
from tasks.dialogue.trace import TraceRecorder

T = TypeVar("T")
#: Runs one slot's work: `run_slot(slot_name, work)`. The default calls `work()`; the Prefect
#: flow passes one that runs it as a task run named after the slot.
SlotRunner = Callable[[str, Callable[[], T]], T]


def direct(slot: str, work: Callable[[], T]) -> T:
    return work()


class TurnTimeoutError(DeadlineError):
    """The turn ran past its deadline (or a slot past its timeout) before it could commit."""


class SlotScheduler:
    """Starts a turn's slots on `pool` and waits for them within the turn's deadline."""

    def __init__(
        self,
        *,
        key: str,
        pool: ThreadPoolExecutor,
        trace: TraceRecorder,
        routes: Mapping[str, Route],
        run_slot: SlotRunner[Any],
        turn_timeout_s: float,
        slot_timeouts_s: Mapping[str, float],
    ) -> None:
        self.key = key
        self.pool = pool
        self.trace = trace
        self.routes = routes
        self.run_slot = run_slot
        self.turn_timeout_s = turn_timeout_s
        self.slot_timeouts_s = slot_timeouts_s
        self.deadline = time.monotonic() + turn_timeout_s

    def check_deadline(self, before: TurnState) -> None:
        """Raise TurnTimeoutError when the deadline passed before the turn entered `before`."""
        if time.monotonic() > self.deadline:
            raise TurnTimeoutError(
                f"turn {self.key} passed its {self.turn_timeout_s:.0f}s deadline before {before.value}"
            )

    def start(self, state: TurnState, slot: str, work: Callable[[], T]) -> Future[T]:
        """Enter `state` and start the slot's work (traced under the slot's route)."""
        self.check_deadline(state)
        self.trace.enter(state)
        route = self.routes[slot]

        def traced() -> T:
            QUERIES.yield_to_queries()  # a memory query in flight gets the cores first
            with self.trace.slot(route):
                return self.run_slot(slot, work)  # type: ignore[no-any-return]

        # A copy of the caller's context: a Prefect task run still finds its flow run.
        return self.pool.submit(contextvars.copy_context().run, traced)

    def wait(self, slot: str, future: Future[T], started: float) -> T:
        """The slot's result, or TurnTimeoutError once the deadline or its own timeout passes."""
        limit = self.slot_timeouts_s.get(slot)
        until = self.deadline if limit is None else min(self.deadline, started + limit)
        try:
            return future.result(timeout=max(0.0, until - time.monotonic()))
        except FutureTimeoutError:
            future.cancel()
            what = (
                f"its {self.turn_timeout_s:g}s deadline"
                if until == self.deadline
                else f"the {slot} slot's {limit:g}s timeout"
            )
            raise TurnTimeoutError(
                f"turn {self.key} passed {what} while the {slot} slot was running"
            ) from None

    def step(self, state: TurnState, slot: str, work: Callable[[], T]) -> T:
        """Run one slot and wait for it."""
        started = time.monotonic()
        return self.wait(slot, self.start(state, slot, work), started)

    def submit(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Background work of the turn outside any slot (an embedding that overlaps a slot)."""
        return self.pool.submit(work, *args, **kwargs)
