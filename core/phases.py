"""A flow's phases timed in wall seconds: `with timer.phase("codex"):` adds the block's time to
`timer.seconds["codex"]` (a phase entered again adds up; the dict keeps the order in which
phases first ended), and the `Phase` it yields reads its time so far while it runs and its
final time after it ends. `stage=` also books the block as a stage of the process's ledger
(core.stages), for a phase that is one.

Figures are recorded when a phase ends normally: a failing block leaves no partial time.
Flows report these seconds (the novel's `seconds_by_phase`, a chapter's `seconds`); they are
wall time, so they are never part of a file that must be byte-identical across runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from core.stages import stage as ledger_stage


@dataclass
class Phase:
    """One timed block: `seconds` runs while the block runs and stops when it ends."""

    name: str
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return (time.monotonic() if self.ended is None else self.ended) - self.started


@dataclass
class PhaseTimer:
    """Wall seconds per named phase of one run."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str, stage: str | None = None) -> Iterator[Phase]:
        timed = Phase(name)
        with ledger_stage(stage) if stage is not None else nullcontext():
            yield timed
        timed.ended = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + timed.seconds

    def rounded(self, digits: int = 2) -> dict[str, float]:
        """The seconds per phase rounded for a report."""
        return {name: round(seconds, digits) for name, seconds in self.seconds.items()}
