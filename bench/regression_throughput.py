"""`python -m bench.regression_throughput`: regression-batch throughput, 1 vs 4 dialogues at once.

Runs the real `long-dialogue-regression` flow (Prefect, the graph, the sidecar pipeline)
against the scripted OpenAI-compatible server with a fixed latency per call (200 ms by
default), over 4 dialogues x N turns (the two shared LoCoMo dialogues, each twice, into
separate fresh conversations), once with concurrency 1 and once with concurrency 4. Prints
turns/s of the replay phase for each, their ratio (goal: >= 3x), and the per-turn non-LLM
overhead: a turn's wall time minus the time at least one of its LLM calls was in flight
(gateway records; judge and historian overlap).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from flows.regression import RegressionSummary

REPO_ROOT = Path(__file__).resolve().parent.parent
DIALOGUES = REPO_ROOT.parent / "shared" / "data" / "dialogues"
SPEAKERS = ["Caroline", "Melanie", "Jon", "Gina"]


def _print_results(
    results: dict[int, tuple[RegressionSummary, pl.DataFrame]],
    dialogues: int,
    args: argparse.Namespace,
    project: Path,
) -> None:
    """Turns/s and the per-turn split at each concurrency, and the speed-up."""
    print(
        f"regression throughput: {dialogues} dialogues x {args.turns} turns, scripted model "
        f"{args.latency * 1000:.0f} ms per call, graph {project}"
    )
    for concurrency, (summary, turns) in results.items():
        overhead = turns["total_ms"] - turns["llm_ms"]
        print(
            f"  concurrency {concurrency}: {summary.turns_per_second:6.2f} turns/s "
            f"({summary.turns} turns in {summary.replay_seconds:.1f} s, {summary.committed} committed); "
            f"per turn: wall {turns['total_ms'].mean():.0f} ms, LLM {turns['llm_ms'].mean():.0f} ms "
            f"in {turns['llm_calls'].mean():.1f} calls, non-LLM overhead mean {overhead.mean():.0f} ms "
            f"/ p50 {overhead.median():.0f} ms"
        )
    one, many = results[1][0], results[args.concurrency][0]
    ratio = many.turns_per_second / one.turns_per_second if one.turns_per_second else 0.0
    print(f"  speed-up at concurrency {args.concurrency}: {ratio:.2f}x (goal >= 3x)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.regression_throughput", description=__doc__
    )
    parser.add_argument("--turns", type=int, default=10, help="turns per dialogue (default 10)")
    parser.add_argument(
        "--latency", type=float, default=0.2, help="seconds per scripted model call (default 0.2)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="the parallel run's concurrency (default 4)"
    )
    parser.add_argument(
        "--project-dir",
        type=Path,
        default=None,
        help="project (graph) to use (default: a temp dir)",
    )
    args = parser.parse_args(argv)

    # Keep the measurement honest: the scripted server, never a configured provider.
    for name in ("OPENAI_API_KEY",):
        os.environ.pop(name, None)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    sys.path.insert(0, str(REPO_ROOT))
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    logging.basicConfig(level=logging.WARNING)
    project = args.project_dir
    if project is None:
        project = Path(tempfile.mkdtemp(prefix="skald-bench-regression-"))
        # Registered before the embedded graph starts, so it runs after the graph's own
        # shutdown hook (atexit is last-in, first-out).
        atexit.register(shutil.rmtree, project, ignore_errors=True)
    files = [
        str(DIALOGUES / f"{d}.turns.jsonl")
        for d in ("locomo-26", "locomo-30", "locomo-26", "locomo-30")
    ]
    with ScriptedLLM(latency_s=args.latency) as llm:
        DialogueScript(SPEAKERS).install(llm)
        os.environ["OPENAI_BASE_URL"] = llm.base_url
        os.environ["SKALD_EMBEDDING_BASE_URL"] = llm.base_url
        from flows.regression import RegressionParams, run_regression

        def run(
            concurrency: int, turns: int, dialogues: list[str], *, warm_up: bool = False
        ) -> tuple[RegressionSummary, pl.DataFrame]:
            summary = run_regression(
                RegressionParams(
                    project_dir=str(project),
                    dialogues=dialogues,
                    turns=turns,
                    concurrency=concurrency,
                )
            )
            if not summary.passed and not warm_up:
                print(f"warning: gates failed: {summary.failed_gates}", file=sys.stderr)
            return summary, pl.read_parquet(Path(summary.out_dir) / "turns.parquet")

        # Warm-up: Prefect's API, the graph server's query plans, the HTTP connection pools.
        run(1, 2, files[:1], warm_up=True)
        results = {c: run(c, args.turns, files) for c in (1, args.concurrency)}

    _print_results(results, len(files), args, project)
    return 0


if __name__ == "__main__":
    sys.exit(main())
