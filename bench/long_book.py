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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

if TYPE_CHECKING:
    from core.llm import CallRecord
    from flows.novel import ChapterCost, NovelReport

REPO = Path(__file__).resolve().parent.parent
OUTSIDE = "(prefect and flow code)"
#: Stage name -> the group the tables show it in; any other stage (a new task) shows on its own.
GROUPS: dict[str, str] = {
    "retrieve_context": "context+retrieval",
    "generate_chapter_outline": "LLM steps (client)",
    "plan_scenes": "LLM steps (client)",
    "draft_scene": "LLM steps (client)",
    "enrich_narrative": "LLM steps (client)",
    "extract_scene": "LLM steps (client)",
    "evaluate_quality": "LLM steps (client)",
    "revision_guidance": "LLM steps (client)",
    "embed_texts": "LLM steps (client)",
    "ground_extraction": "grounding+delta",
    "consolidate_extraction": "grounding+delta",
    "assemble_chapter": "grounding+delta",
    "chapter_commit_state": "commit",
    "commit_to_graph": "commit",
    "commit_accepted_chapter": "commit",
    "rollback_chapter": "commit",
    "validate_consistency": "validation",
    "prose and plan checks": "validation",
    "maintenance": "healing+QA",
    "detect_duplicates": "healing+QA",
    "merge_duplicates": "healing+QA",
    "enrich_entities": "healing+QA",
    "graduate_provisional": "healing+QA",
    "check_quality": "healing+QA",
    "summarize_chapter": "summaries",
    "store_chapter_summary": "summaries",
    "finalize_chapter": "files+steering",
    "publish_chapter_quality": "files+steering",
    "steering and story bible": "files+steering",
    "export_manuscript": "files+steering",
    "export_ebooks": "files+steering",
    "codex": "codex",
    "write_codex": "codex",
    OUTSIDE: "prefect+flow code",
}
GROUP_ORDER = (
    "context+retrieval",
    "LLM steps (client)",
    "grounding+delta",
    "commit",
    "validation",
    "healing+QA",
    "summaries",
    "files+steering",
    "codex",
    "prefect+flow code",
)
HEALING_QA = {name for name, group in GROUPS.items() if group == "healing+QA"}
SECTIONS = ("guidance", "characters", "relationships", "lore", "summaries", "history")


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
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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
    spec = resolve_project(settings.project_dir, _premise(), "gothic mystery", planned, 4, 4)
    rt = set_runtime(Runtime(settings))
    try:
        preflight(rt)
        with project_prefect_settings(settings.project_dir):
            report = novel_flow(str(settings.project_dir), spec, chapters, scenes)
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


# --- what the run left: prompts by section, graph size -------------------------------------------------


def prompt_sections(project: Path, chapter: int) -> dict[str, float]:
    """Mean tokens per section (and "fixed", "total", "budget") over the chapter's scene requests."""
    reports = [
        json.loads(p.read_text())
        for p in sorted(
            (project / ".saga/content/context_budget" / f"chapter_{chapter:03d}").glob("*.json")
        )
    ]
    if not reports:
        return {}
    sums: dict[str, float] = defaultdict(float)
    for report in reports:
        for section in report["sections"]:
            sums[section["name"]] += section["used_tokens"]
        sums["fixed"] += report["fixed_tokens"]
        sums["context"] += report["used_tokens"]
        sums["budget"] += report["total_budget"]
        sums["cut"] += sum(
            1 for s in report["sections"] if s["truncated"] or s["items_kept"] < s["items_in"]
        )
    return {k: v / len(reports) for k, v in sums.items()}


def graph_size(exported: dict[str, Any], chapters: int) -> list[tuple[int, int]]:
    """(nodes, relationships) as of each chapter 1..N, reconstructed from the final export."""

    def chapter_of(props: dict[str, Any], labels: Sequence[str]) -> int | None:
        for key in ("first_chapter", "chapter", "number"):
            value = props.get(key)
            if isinstance(value, int):
                return value
        return 0 if "Entity" in labels or "EntityName" in labels else None

    node_ch = defaultdict(int)
    entity_first = {n["ref"]: chapter_of(n["properties"], n["labels"]) for n in exported["nodes"]}
    for node in exported["nodes"]:
        ch = entity_first[node["ref"]]
        if "EntityName" in node["labels"]:
            ch = None
        node_ch[ch if ch is not None else 0] += 1
    rel_ch = defaultdict(int)
    for rel in exported["relationships"]:
        value = rel["properties"].get("chapter")
        rel_ch[value if isinstance(value, int) else 0] += 1
    out, nodes, rels = [], node_ch.get(0, 0), rel_ch.get(0, 0)
    for n in range(1, chapters + 1):
        nodes += node_ch.get(n, 0)
        rels += rel_ch.get(n, 0)
        out.append((nodes, rels))
    return out


# --- tables -------------------------------------------------------------------------------------------


def group_of(stage: str) -> str:
    return GROUPS.get(stage, stage)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def _ratio(late: float, early: float) -> str:
    return f"{late / early:5.2f}" if early > 1e-9 else "  n/a"


def print_blocks(
    costs: dict[int, ChapterCost],
    child_cpu: dict[int, float],
    prompts: dict[int, dict[str, float]],
    sizes: list[tuple[int, int]],
    block: int,
    what: Callable[[Any], float],
    unit: str,
) -> None:
    chapters = sorted(costs)
    groups = list(GROUP_ORDER) + sorted(
        {group_of(s) for c in costs.values() for s in c.stages} - set(GROUP_ORDER)
    )
    head = (
        f"{'chapters':>9} {'total':>6} "
        + " ".join(f"{g[:11]:>11}" for g in groups)
        + f" {'prefect API':>11} {'RSS MiB':>7} {'nodes':>6} {'rels':>6} {'prompt tok':>10}"
    )
    print(
        f"\nPer chapter, mean over blocks of {block} ({unit}; 'prefect API' is its server's own process):"
    )
    print(head)
    for start in range(1, chapters[-1] + 1, block):
        numbers = [n for n in range(start, start + block) if n in costs]
        if not numbers:
            continue
        per_group = {
            g: _mean(
                sum(what(t) for s, t in costs[n].stages.items() if group_of(s) == g)
                for n in numbers
            )
            for g in groups
        }
        total = _mean(what(costs[n]) for n in numbers)
        api = _mean(child_cpu.get(n, 0.0) for n in numbers)
        rss = _mean(costs[n].rss_mb for n in numbers)
        nodes, rels = sizes[numbers[-1] - 1] if sizes else (0, 0)
        tokens = _mean(
            prompts.get(n, {}).get("fixed", 0) + prompts.get(n, {}).get("context", 0)
            for n in numbers
        )
        print(
            f"{f'{numbers[0]}-{numbers[-1]}':>9} {total:6.2f} "
            + " ".join(f"{per_group[g]:11.3f}" for g in groups)
            + f" {api:11.3f} {rss:7.0f} {nodes:6d} {rels:6d} {tokens:10.0f}"
        )


def block_mean(
    costs: dict[int, ChapterCost], numbers: Iterable[int], what: Callable[[ChapterCost], float]
) -> float:
    return _mean(what(costs[n]) for n in numbers if n in costs)


def print_ratios(
    costs: dict[int, ChapterCost], child_cpu: dict[int, float], chapters: int, block: int
) -> None:
    first, second = range(1, block + 1), range(block + 1, 2 * block + 1)
    last = range(chapters - block + 1, chapters + 1)
    print(
        f"\nRatios, chapters {last[0]}-{last[-1]} over {first[0]}-{first[-1]} (and over {second[0]}-{second[-1]}, "
        "JVM JIT and caches warm):"
    )

    def line(name: str, what: Callable[[ChapterCost], float], fmt: str = "{:8.3f}") -> None:
        a, b, c = (block_mean(costs, r, what) for r in (first, second, last))
        print(
            f"  {name:<34} {fmt.format(a)} {fmt.format(b)} {fmt.format(c)}   {_ratio(c, a)}   {_ratio(c, b)}"
        )

    print(f"  {'':<34} {'1st':>8} {'2nd':>8} {'last':>8}   ratio   ratio(warm)")
    line("non-LLM CPU s per chapter", lambda c: c.cpu_s)
    line("wall s per chapter (busy machine)", lambda c: c.wall_s)
    line("RSS MiB", lambda c: c.rss_mb, "{:8.0f}")
    a, b, c = (_mean(child_cpu.get(n, 0.0) for n in r) for r in (first, second, last))
    print(
        f"  {'Prefect API server CPU s':<34} {a:8.3f} {b:8.3f} {c:8.3f}   {_ratio(c, a)}   {_ratio(c, b)}"
    )
    print("  by group (CPU s per chapter):")
    groups = sorted(
        {group_of(s) for cost in costs.values() for s in cost.stages},
        key=lambda g: GROUP_ORDER.index(g) if g in GROUP_ORDER else 99,
    )
    for group in groups:
        line(
            f"  {group}",
            lambda cost, g=group: sum(t.cpu_s for s, t in cost.stages.items() if group_of(s) == g),
        )
    print("  by stage (CPU s per chapter; calls per chapter in the last block):")
    stages = sorted({s for cost in costs.values() for s in cost.stages})
    for name in stages:
        calls = block_mean(
            costs, last, lambda cost, n=name: cost.stages[n].calls if n in cost.stages else 0
        )
        a, b, c = (
            block_mean(
                costs, r, lambda cost, n=name: cost.stages[n].cpu_s if n in cost.stages else 0.0
            )
            for r in (first, second, last)
        )
        print(
            f"    {name[:32]:<32} {a:8.4f} {b:8.4f} {c:8.4f}   {_ratio(c, a)}   {_ratio(c, b)}   ({calls:.1f} calls)"
        )


def request_tokens(
    records: Sequence[CallRecord], spans: dict[int, tuple[float, float]]
) -> dict[int, dict[str, float]]:
    """Per chapter, the prompt tokens the scripted server counted (~4 characters a token) of
    its scene drafts (mean) and of its outline refresh."""
    found: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        at = record.ts.timestamp()
        chapter = next((n for n, (start, end) in spans.items() if start <= at <= end), None)
        if chapter is not None:
            found[chapter][record.purpose].append(record.prompt_tokens)
    return {
        n: {purpose: _mean(tokens) for purpose, tokens in by.items()} for n, by in found.items()
    }


def print_prompts(
    prompts: dict[int, dict[str, float]],
    requests: dict[int, dict[str, float]],
    chapters: int,
    block: int,
) -> None:
    print(
        "\nPrompt of a scene request by section (estimated tokens, mean over the chapter's scenes; 'request' is "
        "what the server counted\nof the whole draft request; 'outline' of the chapter outline request):"
    )
    print(
        f"{'chapter':>8} "
        + " ".join(f"{s:>13}" for s in SECTIONS)
        + f" {'fixed':>6} {'total':>6} {'budget':>6} "
        f"{'cut':>4} {'request':>7} {'outline':>7}"
    )
    for n in sorted({1, block, *range(block, chapters + 1, block), chapters}):
        p = prompts.get(n)
        if not p:
            continue
        r = requests.get(n, {})
        print(
            f"{n:>8} "
            + " ".join(f"{p.get(s, 0):13.0f}" for s in SECTIONS)
            + f" {p['fixed']:6.0f} {p['fixed'] + p['context']:6.0f} {p['budget']:6.0f} {p['cut']:4.1f}"
            + f" {r.get('draft_scene', 0):7.0f} {r.get('chapter_outline', 0):7.0f}"
        )


def healing_runs(costs: dict[int, ChapterCost], qa_every: int) -> list[tuple[int, float, float]]:
    """(chapter, CPU s, wall s) of each healing + QA run (in the cost of the chapter it followed)."""
    runs = []
    for n in sorted(costs):
        if n % qa_every == 0 and n > 0:
            stages = costs[n].stages
            runs.append(
                (
                    n,
                    sum(t.cpu_s for s, t in stages.items() if s in HEALING_QA),
                    sum(t.wall_s for s, t in stages.items() if s == "maintenance"),
                )
            )
    return runs


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
    started = time.perf_counter()
    first, first_calls, _ = run_novel(project, args.chapters, rollback_at - 1, args.scenes)
    print(
        f"chapters 1-{rollback_at - 1}: {time.perf_counter() - started:.0f} s wall, {len(first_calls)} LLM calls; "
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
    child_cpu = {n: sampler.at(ends[n]) - sampler.at(starts[n]) for n in costs}
    requests = request_tokens(
        [*first_calls, *second_calls], {n: (starts[n], ends[n]) for n in costs}
    )
    replay = [c for c in second.costs if 0 < c.chapter < rollback_at]

    export_path = project.parent / "export-final.json"
    export_cpu, export_wall, export_out = kg_command(project, "export", "--out", str(export_path))
    exported = json.loads(export_path.read_text(encoding="utf-8"))
    sizes = graph_size(exported, args.chapters)
    prompts = {n: prompt_sections(project, n) for n in range(1, args.chapters + 1)}

    print_blocks(
        costs,
        child_cpu,
        prompts,
        sizes,
        args.block,
        lambda c: c.cpu_s,
        "CPU seconds of the novel process",
    )
    print_blocks(
        costs,
        child_cpu,
        prompts,
        sizes,
        args.block,
        lambda c: c.wall_s,
        "wall seconds, busy machine",
    )
    print_ratios(costs, child_cpu, args.chapters, args.block)
    print_prompts(prompts, requests, args.chapters, args.block)
    runs = healing_runs(costs, args.qa_every)
    print("\nHealing + QA per run (CPU s of its tasks; wall s of the whole maintenance block):")
    print("  " + ", ".join(f"after {n}: {cpu:.2f} CPU / {wall:.2f} wall" for n, cpu, wall in runs))
    early = next((r for r in runs if r[0] >= args.block), None)
    if early and runs:
        print(
            f"  at chapter {runs[-1][0]} over chapter {early[0]}: CPU {_ratio(runs[-1][1], early[1])}, "
            f"wall {_ratio(runs[-1][2], early[2])}"
        )
    print(
        f"\nA {args.chapters}-chapter run at an instant scripted server took {total_minutes:.1f} minutes "
        f"(wall, busy machine; {sum(c.cpu_s for c in costs.values()) / 60:.1f} CPU minutes in the chapters), "
        f"plus replaying chapters 1-{rollback_at - 1} from the cache: {sum(c.wall_s for c in replay):.0f} s wall"
    )

    from kg.mirror import _mirrors

    mirrors = list(_mirrors.values())
    print(
        f"story mirror: {sum(m.scans for m in mirrors)} full scans, {sum(m.applied for m in mirrors)} change-sets "
        "followed by index"
    )
    print(f"\nAt {args.chapters} chapters:")
    print(
        f"  kg export: {export_cpu:.2f} s CPU, {export_wall:.2f} s wall; {export_out} "
        f"({export_path.stat().st_size / 2**20:.1f} MiB)"
    )
    requests = server.requests()
    rerun_cpu, rerun_wall = time.process_time(), time.perf_counter()
    rerun, rerun_records, rerun_purposes = run_novel(
        project, args.chapters, args.chapters, args.scenes
    )
    rerun_calls = len(rerun_records)
    rerun_cpu, rerun_wall = time.process_time() - rerun_cpu, time.perf_counter() - rerun_wall
    served = server.requests() - requests
    print(
        f"  re-run of the finished command: {rerun_calls} LLM calls (the scripted server saw {served} requests), "
        f"{rerun_cpu:.1f} s CPU, {rerun_wall:.1f} s wall ({len(rerun.chapters)} chapters replayed)"
        + (f"; the calls: {rerun_purposes}" if rerun_calls else "")
    )
    rb_cpu, rb_wall, rb_out = kg_command(
        project, "rollback", "--chapter", str(rollback_at), "--cascade"
    )
    after_path = project.parent / "export-after-rollback.json"
    kg_command(project, "export", "--out", str(after_path))
    same = after_path.read_bytes() == before_path.read_bytes()
    print(
        f"  kg rollback --chapter {rollback_at} --cascade: {rb_cpu:.2f} s CPU, {rb_wall:.2f} s wall; {rb_out}"
    )
    print(
        f"  export after the rollback byte-identical to the export before chapter {rollback_at}: "
        f"{'yes' if same else 'NO'}"
    )
    if not same:
        _show_difference(before_path, after_path)
    ok = same and rerun_calls == 0 and served == 0
    return 0 if ok else 1


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
