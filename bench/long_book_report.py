"""bench/long_book.py's report: what the run left (the prompts by section, the graph's size as
of each chapter) and the tables it prints from the chapters' costs (per block of chapters, the
ratios of the last block over the first two, the prompts, healing + QA per run).

Reads only the costs and records handed in and the files the run wrote; measures nothing.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.llm import CallRecord
    from flows.novel import ChapterCost

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


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def ratio(late: float, early: float) -> str:
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
            g: mean(
                sum(what(t) for s, t in costs[n].stages.items() if group_of(s) == g)
                for n in numbers
            )
            for g in groups
        }
        total = mean(what(costs[n]) for n in numbers)
        api = mean(child_cpu.get(n, 0.0) for n in numbers)
        rss = mean(costs[n].rss_mb for n in numbers)
        nodes, rels = sizes[numbers[-1] - 1] if sizes else (0, 0)
        tokens = mean(
            prompts.get(n, {}).get("fixed", 0) + prompts.get(n, {}).get("context", 0)
            for n in numbers
        )
        print(
            f"{f'{numbers[0]}-{numbers[-1]}':>9} {total:6.2f} "
            + " ".join(f"{per_group[g]:11.3f}" for g in groups)
            + f" {api:11.3f} {rss:7.0f} {nodes:6d} {rels:6d} {tokens:10.0f}"
        )


def blockmean(
    costs: dict[int, ChapterCost], numbers: Iterable[int], what: Callable[[ChapterCost], float]
) -> float:
    return mean(what(costs[n]) for n in numbers if n in costs)


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
        a, b, c = (blockmean(costs, r, what) for r in (first, second, last))
        print(
            f"  {name:<34} {fmt.format(a)} {fmt.format(b)} {fmt.format(c)}   {ratio(c, a)}   {ratio(c, b)}"
        )

    print(f"  {'':<34} {'1st':>8} {'2nd':>8} {'last':>8}   ratio   ratio(warm)")
    line("non-LLM CPU s per chapter", lambda c: c.cpu_s)
    line("wall s per chapter (busy machine)", lambda c: c.wall_s)
    line("RSS MiB", lambda c: c.rss_mb, "{:8.0f}")
    a, b, c = (mean(child_cpu.get(n, 0.0) for n in r) for r in (first, second, last))
    print(
        f"  {'Prefect API server CPU s':<34} {a:8.3f} {b:8.3f} {c:8.3f}   {ratio(c, a)}   {ratio(c, b)}"
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
        calls = blockmean(
            costs, last, lambda cost, n=name: cost.stages[n].calls if n in cost.stages else 0
        )
        a, b, c = (
            blockmean(
                costs, r, lambda cost, n=name: cost.stages[n].cpu_s if n in cost.stages else 0.0
            )
            for r in (first, second, last)
        )
        print(
            f"    {name[:32]:<32} {a:8.4f} {b:8.4f} {c:8.4f}   {ratio(c, a)}   {ratio(c, b)}   ({calls:.1f} calls)"
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
    return {n: {purpose: mean(tokens) for purpose, tokens in by.items()} for n, by in found.items()}


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


def print_healing(costs: dict[int, ChapterCost], qa_every: int, block: int) -> None:
    """Healing + QA per run, and its last run over the first at or after chapter `block`."""
    runs = healing_runs(costs, qa_every)
    print("\nHealing + QA per run (CPU s of its tasks; wall s of the whole maintenance block):")
    print("  " + ", ".join(f"after {n}: {cpu:.2f} CPU / {wall:.2f} wall" for n, cpu, wall in runs))
    early = next((r for r in runs if r[0] >= block), None)
    if early and runs:
        print(
            f"  at chapter {runs[-1][0]} over chapter {early[0]}: "
            f"CPU {ratio(runs[-1][1], early[1])}, wall {ratio(runs[-1][2], early[2])}"
        )
