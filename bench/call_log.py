"""What keeping a run's LLM call log as it goes costs: `python -m bench.call_log`.

A run saves its whole log again after each unit of work (the novel after each chapter, the
regression batch after each dialogue: `LLMGateway.save_records`), so a run of U units pays
for U rewrites of a growing file instead of one write at its end. This times both ways, for
two run sizes, on records shaped like a dialogue turn's (three slot calls and an embedding per
turn), in one process, best of `--repeats` each:

- `at the end`: one write of every record;
- `as it goes`: one write after each unit, each holding the records so far.

It prints the seconds of each way, their ratio, and the ratio between the sizes (the cost of
saving as it goes grows with the square of the units; what matters is its size next to the
run's own time: a unit is a dialogue of many LLM calls, each seconds long).

Measured 2026-12-01 (2 cores, quiet): 50 units 0.040 s at the end against 0.641 s as it goes
(12.8 ms a unit), 200 units 0.092 s against 9.908 s (49.5 ms a unit; 15.5x the time for 4x
the units). A 200-dialogue batch of 20-turn dialogues makes 12,000 LLM calls; at 1 s each its
saves add 0.08%. At 10,000 dialogues a save would take about 2.5 s, still a few percent of a
dialogue's own time: part files appended per unit would be linear, and were not needed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from core.llm.records import CallRecord, write_parquet

#: (units, records per unit): a batch of 50 20-turn dialogues, and one of 200 (4 records a
#: turn: extractor, judge, historian, embedding).
SIZES = ((50, 80), (200, 80))


def _records(count: int) -> list[CallRecord]:
    tiers = ("small", "small", "medium", "embedding")
    return [
        CallRecord(
            run_id="bench",
            ts=datetime(2026, 12, 1, tzinfo=UTC),
            tier=tiers[i % 4],
            model="gpt-4o-mini",
            endpoint="http://127.0.0.1:8080/v1",
            purpose=f"dialogue.turn|regression-bench/locomo-{i // 80}:{i % 80}",
            schema_name="TurnExtraction",
            prompt_tokens=900 + i % 300,
            completion_tokens=120 + i % 50,
            latency_ms=800.0 + i % 400,
            attempts=1,
            outcome="ok",
        )
        for i in range(count)
    ]


def _best(run: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def measure(units: int, per_unit: int, repeats: int, folder: Path) -> tuple[float, float]:
    """(seconds at the end, seconds as it goes) for a run of `units` units."""
    records = _records(units * per_unit)
    target = folder / "llm-calls-bench.parquet"

    def at_the_end() -> None:
        write_parquet(records, target)

    def as_it_goes() -> None:
        for unit in range(1, units + 1):
            write_parquet(records[: unit * per_unit], target)

    return _best(at_the_end, repeats), _best(as_it_goes, repeats)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.call_log",
        description="The cost of saving a run's LLM call log after each unit of work.",
    )
    parser.add_argument("--repeats", type=int, default=3, help="best of N per way (default 3)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for units, per_unit in SIZES:
            end, going = measure(units, per_unit, args.repeats, Path(folder))
            rows.append((units, per_unit, end, going))
            print(
                f"{units} units x {per_unit} records ({units * per_unit:,} records): at the end "
                f"{end:.3f} s, as it goes {going:.3f} s (ratio {going / end:.1f}; "
                f"{1000 * going / units:.1f} ms per unit)"
            )
    (small_units, _, _, small), (large_units, _, _, large) = rows
    print(
        f"as it goes, {large_units} units against {small_units}: {large / small:.1f}x the time "
        f"for {large_units / small_units:.0f}x the units"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
