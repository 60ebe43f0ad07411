"""Where a run's own time goes: CPU and wall seconds per stage.

A stage is a pipeline task (tasks/policy.py times every task it makes) or a block a flow
names (`with stage("steering"):`). The ledger is process-wide and always on; it costs two
clock reads and a lock per stage entry and exit.

CPU is the process's (`time.process_time`): every thread, so the embedded graph's JVM, which
answers queries on its own threads in this process, counts for the stage that asked. CPU and
wall time are attributed exactly once: between two stage events anywhere in the process, the
time goes to the innermost stage of each thread that is in one, in equal shares (scenes are
extracted in parallel), and to `OUTSIDE` when no thread is: Prefect's own work around the
tasks (task runs, cache keys, results, state) and the flow code between tasks. So the
stages and `OUTSIDE` always add up to the process's CPU and wall time.

`checkpoint()` returns what was spent since the previous checkpoint (and the process's
resident memory then): a flow calls it once a chapter to get the chapter's split.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

#: The time no stage was running: Prefect's orchestration and the flow code between tasks.
OUTSIDE = "(prefect and flow code)"


@dataclass
class StageTime:
    cpu_s: float = 0.0
    wall_s: float = 0.0
    calls: int = 0

    def minus(self, earlier: StageTime | None) -> StageTime:
        if earlier is None:
            return StageTime(self.cpu_s, self.wall_s, self.calls)
        return StageTime(
            self.cpu_s - earlier.cpu_s, self.wall_s - earlier.wall_s, self.calls - earlier.calls
        )


@dataclass
class Checkpoint:
    """What the process spent between two checkpoints, by stage, and its RSS at the second."""

    label: str
    cpu_s: float
    wall_s: float
    rss_mb: float
    stages: dict[str, StageTime] = field(default_factory=dict)
    at: float = 0.0  # when it was taken (time.time())


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return 4096


_PAGE_SIZE = _page_size()


def rss_mb() -> float:
    """The process's resident memory now, in MiB (0.0 where /proc is not there)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * _PAGE_SIZE / 2**20


class StageLedger:
    """CPU and wall seconds per stage, each moment attributed once (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stacks: dict[int, list[str]] = {}
        self._totals: dict[str, StageTime] = {}
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        self._mark: dict[str, StageTime] = {}
        self._mark_cpu, self._mark_wall = self._cpu, self._wall

    def _settle(self) -> None:
        """Attribute the time since the last event (the caller holds the lock)."""
        cpu, wall = time.process_time(), time.perf_counter()
        spent_cpu, spent_wall = cpu - self._cpu, wall - self._wall
        self._cpu, self._wall = cpu, wall
        running = [stack[-1] for stack in self._stacks.values() if stack] or [OUTSIDE]
        for name in running:
            total = self._totals.setdefault(name, StageTime())
            total.cpu_s += spent_cpu / len(running)
            total.wall_s += spent_wall / len(running)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        thread = threading.get_ident()
        with self._lock:
            self._settle()
            self._stacks.setdefault(thread, []).append(name)
        try:
            yield
        finally:
            with self._lock:
                self._settle()
                stack = self._stacks[thread]
                stack.pop()
                if not stack:
                    del self._stacks[thread]
                self._totals.setdefault(name, StageTime()).calls += 1

    def totals(self) -> dict[str, StageTime]:
        """Seconds per stage since the process started (a copy)."""
        with self._lock:
            self._settle()
            return {name: StageTime(t.cpu_s, t.wall_s, t.calls) for name, t in self._totals.items()}

    def checkpoint(self, label: str) -> Checkpoint:
        """What was spent since the previous checkpoint (or the start), by stage."""
        with self._lock:
            self._settle()
            now = {name: StageTime(t.cpu_s, t.wall_s, t.calls) for name, t in self._totals.items()}
            stages = {name: t.minus(self._mark.get(name)) for name, t in now.items()}
            point = Checkpoint(
                label=label,
                cpu_s=self._cpu - self._mark_cpu,
                wall_s=self._wall - self._mark_wall,
                rss_mb=rss_mb(),
                at=time.time(),
                stages={n: t for n, t in stages.items() if t.calls or t.cpu_s > 0 or t.wall_s > 0},
            )
            self._mark, self._mark_cpu, self._mark_wall = now, self._cpu, self._wall
            return point


LEDGER = StageLedger()


def stage(name: str) -> AbstractContextManager[None]:
    """`with stage("name"):` times a block as a stage of the process-wide ledger."""
    return LEDGER.stage(name)
