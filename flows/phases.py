"""A flow's phases timed in wall seconds: `with timer.phase("replay") as replay:` adds the
block's time to `timer.seconds["replay"]` (a phase entered again adds up; the dict keeps the
order in which phases first ended), and `replay.seconds` reads the block's time so far while it
runs and its final time after it ends.

A failing block records no time. The figures are wall time: they go into reports and
summaries, never into a file that must be byte-identical across runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Phase:
    """One timed block: `seconds` runs while the block runs and stops when it ends."""

    name: str
    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return (time.perf_counter() if self.ended is None else self.ended) - self.started


@dataclass
class PhaseTimer:
    """Wall seconds per named phase of one run."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        timed = Phase(name)
        yield timed
        timed.ended = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + timed.seconds
