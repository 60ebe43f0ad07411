"""A long book at flat cost: the novel pipeline's own cost per chapter over a 100-chapter book.

    python -m bench.long_book [--chapters 100] [--scenes 2] [--qa-every 5] [--rollback-chapter 50]
                              [--project-dir DIR] [--block 10]

The real novel flow (Prefect flows and tasks, the embedded graph) runs in this process against
the scripted OpenAI-compatible server of tests/support/long_story.py, which plans a whole book (new
characters and places every few chapters, recurring ones, relationships that change, deaths,
names written two ways so healing has work) and runs in its own process, answering at once:
its CPU is not the pipeline's. What is measured is the pipeline's own cost:

- per chapter, the process's CPU seconds (every thread: the embedded graph's JVM answers on
  its own threads in this process, so its work counts) split by stage (core.stages: every
  task, and the blocks the flows name; "(prefect and flow code)" is what ran outside them),
  wall seconds (noisy on a shared machine), RSS, and the CPU of Prefect's API server (a child
  process: the rest of Prefect's cost);
- per chapter, the prompt of a scene request by section (the context envelope's report);
- the graph's size as of each chapter (from the final export);
- then the ratios of chapters 91-100 over 1-10 (and over 11-20, once the JVM's JIT and the
  caches are warm), and healing + QA per run at the last chapter over chapter 10;
- at the end: `kg export`, a re-run of the finished command (it must ask the LLM nothing) and
  `kg rollback --chapter 50 --cascade`, whose export must be byte-identical to the export
  taken before chapter 50 was written (the 100-chapter run is stopped after chapter 49 and
  resumed, as after a crash).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from bench.long_book_report import (
    graph_size,
    print_blocks,
    print_healing,
    print_prompts,
    print_ratios,
    prompt_sections,
    request_tokens,
)
from bench.served import stop_process

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

if TYPE_CHECKING:
    from core.llm import CallRecord
    from flows.novel import ChapterCost, NovelReport

REPO = Path(__file__).resolve().parent.parent


# --- the scripted server, in its own process ------------------------------------------------------------


class ScriptedServer:
    """`python -m tests.support.long_story` in a child process (its CPU is not the pipeline's)."""

    def __init__(self, chapters: int, scenes: int) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.long_story",
                "--chapters",
                str(chapters),
                "--scenes",
                str(scenes),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"(http://\S+)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"the scripted server did not start: {line!r}")
        self.base_url = found.group(1)

    def requests(self) -> int:
        with urllib.request.urlopen(f"{self.base_url}/scripted/stats", timeout=10) as answer:
            return int(json.loads(answer.read())["requests"])

    def close(self) -> None:
        stop_process(self.proc, grace_s=10)


# --- Prefect's API server: a child process of this one -----------------------------------------------------


def _children_cpu(exclude: set[int]) -> float:
    """CPU seconds of this process's descendants (Prefect's API server), minus `exclude`'s trees."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in mine and child not in exclude:
                mine.add(child)
                todo.append(child)
    return sum(cpu.get(pid, 0.0) for pid in mine)


class ChildSampler:
    """Samples the descendants' CPU once a second, so each chapter gets its share."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude, self.samples = exclude, [(time.time(), _children_cpu(exclude))]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="child-cpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append((time.time(), _children_cpu(self.exclude)))

    def at(self, when: float) -> float:
        before = [cpu for t, cpu in self.samples if t <= when]
        return before[-1] if before else self.samples[0][1]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def rss_parts() -> str:
    """Resident memory by kind (/proc/self/status): anonymous (heaps) and file-backed (mapped files)."""
    try:
        fields = dict(
            line.split(":", 1)
            for line in Path("/proc/self/status").read_text().splitlines()
            if ":" in line
        )
        return ", ".join(
            f"{k} {int(fields[k].split()[0]) / 1024:.0f} MiB"
            for k in ("RssAnon", "RssFile", "RssShmem")
            if k in fields
        )
    except OSError:
        return "no /proc"


def jvm_heap() -> str:
    """The embedded graph's JVM heap now: committed, used, and live after a full GC (MiB)."""
    try:
        import jpype

        if not jpype.isJVMStarted():
            return "no JVM in this process"
        runtime = jpype.JClass("java.lang.Runtime").getRuntime()
        committed, used = (
            runtime.totalMemory() / 2**20,
            (runtime.totalMemory() - runtime.freeMemory()) / 2**20,
        )
        jpype.JClass("java.lang.System").gc()
        live = (runtime.totalMemory() - runtime.freeMemory()) / 2**20
        return (
            f"JVM heap committed {committed:.0f} MiB, used {used:.0f}, live after a GC {live:.0f}"
        )
    except Exception as exc:  # a measurement only
        return f"JVM heap unknown ({exc})"


# --- running the pipeline ------------------------------------------------------------------------------


def run_novel(
    project: Path, planned: int, chapters: int, scenes: int
) -> tuple[NovelReport, list[CallRecord], str]:
    """`python -m flows.novel` as its main() runs it, in this process, for a book planned with
    `planned` chapters, up to chapter `chapters` (fewer: as if the run had been stopped there):
    (report, its LLM calls, what they were for)."""
    from core.cli import project_prefect_settings
    from core.settings import load_settings
    from flows.novel import novel_flow, preflight, resolve_project
    from tasks.runtime import Runtime, set_runtime

    settings = load_settings(project)
    resolve_project(settings.project_dir, _premise(), "gothic mystery", planned, 4, 4)
    rt = set_runtime(Runtime(settings))
    try:
        preflight(rt)
        with project_prefect_settings(settings.project_dir):
            report = novel_flow(str(settings.project_dir), chapters, scenes_per_chapter=scenes)
        purposes = ", ".join(
            f"{k} x{v}" for k, v in Counter(r.purpose for r in rt.gateway.records).most_common()
        )
        return report, list(rt.gateway.records), purposes
    finally:
        rt.close()


def _premise() -> str:
    from tests.support.long_story import PREMISE

    return PREMISE


def kg_command(project: Path, *args: str) -> tuple[float, float, str]:
    """`python -m kg ARGS --project-dir P` (its main, in this process): (CPU s, wall s, output)."""
    import contextlib
    import io

    from kg.__main__ import main as kg_main

    out = io.StringIO()
    cpu, wall = time.process_time(), time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = kg_main([*args, "--project-dir", str(project)])
    if code != 0:
        raise RuntimeError(f"kg {' '.join(args)} exited {code}: {out.getvalue()}")
    return time.process_time() - cpu, time.perf_counter() - wall, out.getvalue().strip()


# --- main -----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.long_book", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--chapters", type=int, default=100)
    parser.add_argument("--scenes", type=int, default=2)
    parser.add_argument("--qa-every", type=int, default=5)
    parser.add_argument("--rollback-chapter", type=int, default=None, help="default: half the book")
    parser.add_argument("--block", type=int, default=10, help="chapters per row of the tables")
    parser.add_argument(
        "--project-dir", type=Path, default=None, help="keep the book here (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    rollback_at = args.rollback_chapter or max(2, args.chapters // 2)
    if not 2 <= rollback_at <= args.chapters or args.chapters < 2 * args.block:
        parser.error("need --chapters >= 2 * --block and 2 <= --rollback-chapter <= --chapters")
    sys.path.insert(0, str(REPO))

    with tempfile.TemporaryDirectory(prefix="skald-long-") as tmp:
        project = (args.project_dir or Path(tmp) / "book").resolve()
        project.mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect-home")  # this run's task runs only
        (project / "skald.toml").write_text(
            f"[limits]\nqa_every = {args.qa_every}\nscenes_per_chapter = {args.scenes}\n",
            encoding="utf-8",
        )
        server = ScriptedServer(args.chapters, args.scenes)
        os.environ.update(
            {
                "OPENAI_BASE_URL": server.base_url,
                "SKALD_EMBEDDING_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "scripted",
            }
        )
        sampler = ChildSampler(exclude={server.proc.pid})
        try:
            return _bench(args, project, rollback_at, server, sampler)
        finally:
            sampler.stop()
            server.close()


class Written(NamedTuple):
    """The book written in two runs (stopped before `rollback_at`, then resumed), as measured."""

    costs: dict[int, ChapterCost]
    child_cpu: dict[int, float]
    requests: dict[int, dict[str, float]]
    replay: list[ChapterCost]
    minutes: float
    before_path: Path


def _write(
    args: argparse.Namespace,
    project: Path,
    rollback_at: int,
    sampler: ChildSampler,
) -> Written:
    """The book up to chapter rollback_at - 1, its export, then the rest (the first chapters
    replayed from the cache): each chapter's cost from the run that wrote it."""
    started = time.perf_counter()
    first, first_calls, _ = run_novel(project, args.chapters, rollback_at - 1, args.scenes)
    print(
        f"chapters 1-{rollback_at - 1}: {time.perf_counter() - started:.0f} s wall, "
        f"{len(first_calls)} LLM calls; "
        f"RSS {first.costs[-1].rss_mb:.0f} MiB ({rss_parts()}), {jvm_heap()}"
    )
    before_path = project.parent / "export-before-rollback-chapter.json"
    kg_command(project, "export", "--out", str(before_path))
    second_started = time.perf_counter()
    second, second_calls, _ = run_novel(project, args.chapters, args.chapters, args.scenes)
    print(
        f"chapters {rollback_at}-{args.chapters} (1-{rollback_at - 1} replayed from the cache): "
        f"{time.perf_counter() - second_started:.0f} s wall, {len(second_calls)} LLM calls; "
        f"RSS {second.costs[-1].rss_mb:.0f} MiB ({rss_parts()}), {jvm_heap()}"
    )
    total_minutes = (time.perf_counter() - started) / 60
    costs = {c.chapter: c for c in first.costs if c.chapter > 0}
    costs |= {c.chapter: c for c in second.costs if c.chapter >= rollback_at}
    ends = {c.chapter: c.ended_at for c in [*first.costs, *second.costs]}
    starts = {c.chapter: c.ended_at - c.wall_s for c in [*first.costs, *second.costs]}
    return Written(
        costs=costs,
        child_cpu={n: sampler.at(ends[n]) - sampler.at(starts[n]) for n in costs},
        requests=request_tokens(
            [*first_calls, *second_calls], {n: (starts[n], ends[n]) for n in costs}
        ),
        replay=[c for c in second.costs if 0 < c.chapter < rollback_at],
        minutes=total_minutes,
        before_path=before_path,
    )


def _print_tables(
    args: argparse.Namespace, project: Path, rollback_at: int, book: Written
) -> tuple[float, float, str, Path]:
    """The final export (timed, returned), then the tables and the run's totals."""
    export_path = project.parent / "export-final.json"
    export_cpu, export_wall, export_out = kg_command(project, "export", "--out", str(export_path))
    exported = json.loads(export_path.read_text(encoding="utf-8"))
    sizes = graph_size(exported, args.chapters)
    prompts = {n: prompt_sections(project, n) for n in range(1, args.chapters + 1)}
    costs, child_cpu = book.costs, book.child_cpu
    for what, unit in (
        (lambda c: c.cpu_s, "CPU seconds of the novel process"),
        (lambda c: c.wall_s, "wall seconds, busy machine"),
    ):
        print_blocks(costs, child_cpu, prompts, sizes, args.block, what, unit)
    print_ratios(costs, child_cpu, args.chapters, args.block)
    print_prompts(prompts, book.requests, args.chapters, args.block)
    print_healing(costs, args.qa_every, args.block)
    print(
        f"\nA {args.chapters}-chapter run at an instant scripted server took "
        f"{book.minutes:.1f} minutes (wall, busy machine; "
        f"{sum(c.cpu_s for c in costs.values()) / 60:.1f} CPU minutes in the chapters), "
        f"plus replaying chapters 1-{rollback_at - 1} from the cache: "
        f"{sum(c.wall_s for c in book.replay):.0f} s wall"
    )
    return export_cpu, export_wall, export_out, export_path


def _rerun(args: argparse.Namespace, project: Path, server: ScriptedServer) -> bool:
    """The finished command run again (printed): True when it asked the LLM nothing."""
    requests = server.requests()
    rerun_cpu, rerun_wall = time.process_time(), time.perf_counter()
    rerun, rerun_records, rerun_purposes = run_novel(
        project, args.chapters, args.chapters, args.scenes
    )
    rerun_calls = len(rerun_records)
    rerun_cpu, rerun_wall = time.process_time() - rerun_cpu, time.perf_counter() - rerun_wall
    served = server.requests() - requests
    print(
        f"  re-run of the finished command: {rerun_calls} LLM calls (the scripted server saw "
        f"{served} requests), "
        f"{rerun_cpu:.1f} s CPU, {rerun_wall:.1f} s wall ({len(rerun.chapters)} chapters replayed)"
        + (f"; the calls: {rerun_purposes}" if rerun_calls else "")
    )
    return rerun_calls == 0 and served == 0


def _rollback(project: Path, rollback_at: int, before_path: Path) -> bool:
    """`kg rollback --chapter N --cascade` (printed): True when its export is byte-identical
    to the one taken before chapter N was written."""
    rb_cpu, rb_wall, rb_out = kg_command(
        project, "rollback", "--chapter", str(rollback_at), "--cascade"
    )
    after_path = project.parent / "export-after-rollback.json"
    kg_command(project, "export", "--out", str(after_path))
    same = after_path.read_bytes() == before_path.read_bytes()
    print(
        f"  kg rollback --chapter {rollback_at} --cascade: {rb_cpu:.2f} s CPU, "
        f"{rb_wall:.2f} s wall; {rb_out}"
    )
    print(
        f"  export after the rollback byte-identical to the export before chapter {rollback_at}: "
        f"{'yes' if same else 'NO'}"
    )
    if not same:
        _show_difference(before_path, after_path)
    return same


def _bench(
    args: argparse.Namespace,
    project: Path,
    rollback_at: int,
    server: ScriptedServer,
    sampler: ChildSampler,
) -> int:
    print(
        f"== Skald long book: {args.chapters} chapters x {args.scenes} scenes, healing + QA every "
        f"{args.qa_every} chapters =="
    )
    print(
        f"scripted server {server.base_url} (its own process, answers at once); project {project}"
    )
    book = _write(args, project, rollback_at, sampler)
    export_cpu, export_wall, export_out, export_path = _print_tables(
        args, project, rollback_at, book
    )

    from kg.mirror import _mirrors

    mirrors = list(_mirrors.values())
    print(
        f"story mirror: {sum(m.scans for m in mirrors)} full scans, "
        f"{sum(m.applied for m in mirrors)} change-sets followed by index"
    )
    print(f"\nAt {args.chapters} chapters:")
    print(
        f"  kg export: {export_cpu:.2f} s CPU, {export_wall:.2f} s wall; {export_out} "
        f"({export_path.stat().st_size / 2**20:.1f} MiB)"
    )
    replayed_without_llm = _rerun(args, project, server)
    same = _rollback(project, rollback_at, book.before_path)
    return 0 if same and replayed_without_llm else 1


def _show_difference(before: Path, after: Path, limit: int = 12) -> None:
    import difflib

    lines = difflib.unified_diff(
        before.read_text().splitlines(),
        after.read_text().splitlines(),
        "before",
        "after",
        n=1,
        lineterm="",
    )
    for i, line in enumerate(lines):
        if i >= limit * 4:
            print("    ...")
            break
        print("    " + line[:200])


if __name__ == "__main__":
    raise SystemExit(main())
