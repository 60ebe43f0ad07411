"""core.phases: one timer for a flow's phases (wall seconds per named phase, optionally a stage)."""

from __future__ import annotations

import pytest

from core.phases import PhaseTimer
from core.stages import LEDGER


def test_a_phase_entered_again_adds_up_and_keeps_its_first_place() -> None:
    timer = PhaseTimer()
    with timer.phase("codex") as first:
        pass
    with timer.phase("chapter 2"):
        pass
    with timer.phase("codex") as second:
        pass
    assert list(timer.seconds) == ["codex", "chapter 2"]
    assert timer.seconds["codex"] == first.seconds + second.seconds
    # A phase's own figure stops when it ends: it does not keep running after the block.
    assert first.ended is not None and first.seconds == first.ended - first.started


def test_a_running_phase_reads_its_time_so_far_and_a_failing_one_records_nothing() -> None:
    timer = PhaseTimer()
    with timer.phase("chapter") as chapter:
        assert chapter.ended is None and chapter.seconds >= 0.0
        assert timer.seconds == {}  # recorded when it ends, not before
    assert "chapter" in timer.seconds
    with pytest.raises(RuntimeError), timer.phase("initialization"):
        raise RuntimeError("the step failed")
    assert "initialization" not in timer.seconds


def test_a_phase_with_a_stage_is_booked_in_the_ledger_and_one_without_is_not() -> None:
    before = LEDGER.totals()
    timer = PhaseTimer()
    with timer.phase("maintenance after 3", stage="test phases: maintenance"):
        pass
    with timer.phase("chapter 3"):
        pass
    after = LEDGER.totals()
    calls = {
        name: t.calls - (before[name].calls if name in before else 0) for name, t in after.items()
    }
    assert calls.get("test phases: maintenance") == 1
    assert "chapter 3" not in after and "maintenance after 3" not in after
    assert timer.rounded() == {name: round(s, 2) for name, s in timer.seconds.items()}
