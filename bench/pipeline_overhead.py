"""How much time the novel pipeline spends outside the LLM, and Prefect's share of it.

    python -m bench.pipeline_overhead [--chapters 2] [--scenes 2] [--local]

Part 1 (scripted server answering instantly): runs the real novel flow in-process and
reports the pipeline's own time per chapter (wall time minus time with an LLM call in flight).
Prefect's share is estimated in the same run by timing the same kind of task (cached,
result persisted as JSON) through Prefect and as a plain call, times the number of task
runs the chapter flows made.

Part 2 (`--local`, the real local llama-server model): a fresh 2-chapter run, and the
ratio of non-LLM time to LLM time (goal <= 0.05).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

if TYPE_CHECKING:
    from core.llm import CallRecord

PREMISE = "A cartographer discovers that her maps change the land they describe."


def _run_novel(
    project: Path, chapters: int, scenes: int, **overrides: object
) -> tuple[float, float, int, object]:
    """Run the novel flow; return (wall s, LLM wait s, LLM calls, report)."""
    from core.settings import load_settings
    from flows.novel import novel_flow, resolve_project
    from tasks.runtime import Runtime, set_runtime

    settings = load_settings(project, **overrides)  # type: ignore[arg-type]
    settings.project_dir.mkdir(parents=True, exist_ok=True)
    resolve_project(settings.project_dir, PREMISE, "fantasy", chapters, 2, 3)
    rt = set_runtime(Runtime(settings))
    try:
        rt.graph.schema_version()
        started = time.perf_counter()
        report = novel_flow(str(settings.project_dir), chapters, scenes_per_chapter=scenes)
        wall = time.perf_counter() - started
        records = rt.gateway.records
        return wall, _llm_busy_s(records), len(records), report
    finally:
        rt.close()


def _llm_busy_s(records: Sequence[CallRecord]) -> float:
    """Seconds during which at least one LLM call was in flight: scenes are extracted in
    parallel, so summing call latencies would count overlapping waits twice."""
    spans = sorted((r.ts.timestamp() - r.latency_ms / 1000, r.ts.timestamp()) for r in records)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def _task_runs_since(started_at: float) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterStartTime
    from prefect.types import DateTime

    async def count() -> int:
        task_filter = TaskRunFilter(
            start_time=TaskRunFilterStartTime(after_=DateTime.fromtimestamp(started_at))
        )
        total = 0
        async with get_client() as client:
            while True:  # the API pages at 200
                page = await client.read_task_runs(
                    task_run_filter=task_filter, limit=200, offset=total
                )
                total += len(page)
                if len(page) < 200:
                    return total

    return asyncio.run(count())


def _per_task_overhead_ms(project: Path, n: int = 150) -> tuple[float, float]:
    """Median ms per call of a cached, persisted task through Prefect vs as a plain function."""
    from prefect import flow

    from core.cli import project_prefect_settings
    from tasks.policy import cached_task

    def body(i: int, text: str) -> dict[str, object]:
        return {"i": i, "words": len(text.split())}

    probe = cached_task("bench_probe")(body)

    @flow(name="bench-task-overhead")
    def through_prefect(count: int) -> list[float]:
        with project_prefect_settings(project):
            times = []
            for i in range(count):
                t = time.perf_counter()
                probe(i, f"scene text number {i} " * 20)
                times.append(time.perf_counter() - t)
            return times

    prefect_times = through_prefect(n)
    plain_times = []
    for i in range(n):
        t = time.perf_counter()
        body(i, f"scene text number {i} " * 20)
        plain_times.append(time.perf_counter() - t)
    return statistics.median(prefect_times) * 1000, statistics.median(plain_times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline_overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--chapters", type=int, default=2)
    parser.add_argument("--scenes", type=int, default=2)
    parser.add_argument(
        "--local", action="store_true", help="also run part 2 on the real local model"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.novel_script import script_novel
    from tests.support.scripted_llm import ScriptedLLM

    with tempfile.TemporaryDirectory(prefix="skald-bench-") as tmp, ScriptedLLM() as llm:
        script_novel(llm)  # a coherent scripted story: chapters pass review on the first draft
        root = Path(tmp)
        started_at = time.time()
        wall, llm_s, calls, report = _run_novel(
            root / "scripted",
            args.chapters,
            args.scenes,
            openai_base_url=llm.base_url,
            embedding_base_url=llm.base_url,
        )
        task_runs = _task_runs_since(started_at)
        init_s = report.seconds_by_phase.get("initialization", 0.0)  # type: ignore[attr-defined]
        own_ms = (wall - llm_s) * 1000
        chapter_s = [v for k, v in report.seconds_by_phase.items() if k.startswith("chapter ")]  # type: ignore[attr-defined]
        chapter_own_ms = (
            (sum(chapter_s) - llm_s * len(chapter_s) / max(1, args.chapters + 1))
            * 1000
            / len(chapter_s)
        )
        per_task_prefect, per_task_plain = _per_task_overhead_ms(root / "probe")
        prefect_ms = task_runs * (per_task_prefect - per_task_plain)
        print("== Part 1: scripted server answering instantly ==")
        print(f"chapters x scenes            {args.chapters} x {args.scenes}")
        print(f"LLM calls                    {calls} (a call in flight for {llm_s * 1000:.0f} ms)")
        print(
            f"wall time                    {wall * 1000:.0f} ms (initialization {init_s * 1000:.0f} ms)"
        )
        print(
            f"pipeline's own time          {own_ms:.0f} ms in total (incl. Prefect start-up and initialization)"
        )
        print(f"per chapter (chapter flows)  {chapter_own_ms:.0f} ms own time")
        print(
            "seconds by phase             "
            + ", ".join(f"{k} {v:.2f}" for k, v in report.seconds_by_phase.items())
        )
        print(f"task runs                    {task_runs}")
        print(f"per task: Prefect {per_task_prefect:.2f} ms vs plain call {per_task_plain:.3f} ms")
        chapter_runs = task_runs * sum(chapter_s) / max(1e-9, sum(report.seconds_by_phase.values()))  # type: ignore[attr-defined]
        print(
            f"Prefect's share              {prefect_ms:.0f} ms of task orchestration = {prefect_ms / own_ms:.0%} of the "
            f"pipeline's own time; per chapter ~{chapter_runs / len(chapter_s) * (per_task_prefect - per_task_plain):.0f} ms "
            f"= {chapter_runs / len(chapter_s) * (per_task_prefect - per_task_plain) / chapter_own_ms:.0%}"
        )

        if args.local:
            started = time.perf_counter()
            wall, llm_s, calls, _ = _run_novel(root / "local", 2, args.scenes)
            print("\n== Part 2: real local model (llama-server + SmolLM2-135M) ==")
            print(
                f"wall {wall:.1f} s, an LLM call in flight {llm_s:.1f} s ({calls} calls), non-LLM {wall - llm_s:.1f} s"
            )
            print(f"non-LLM / LLM time ratio     {(wall - llm_s) / llm_s:.3f} (goal <= 0.05)")
            print(f"(whole part 2 including server start: {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
