"""`python -m flows.novel`: write a novel. Initialization once, then the chapter loop; after
each chapter the codex (`exports/codex.html`, linked from the run in the Prefect UI; past 20
chapters every few chapters, see tasks.codex.codex_due, and always after the run's last).

Every step is a Prefect task whose result is cached on disk under `<project>/.saga/`, so
running the same command again repeats no finished LLM call, and running it with a
larger `--chapters` continues from the last finished chapter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, Field

from core.cli import (
    add_settings_options,
    prefect_results_dir,
    project_prefect_settings,
    run_main,
    setup_logging,
)
from core.errors import InvalidInputError
from core.heap import trim as trim_heap
from core.settings import load_settings
from core.stages import LEDGER, Checkpoint, stage
from flows.chapter import BookInfo, ChapterResult, chapter_flow, chapter_runner
from flows.maintenance import heal_flow, qa_flow
from prompts.initialization.models import (
    ActOutline,
    ChapterOutline,
    CharacterSheets,
    GlobalOutline,
)
from tasks.bible import load_story_bible, sync_story_bible, write_learned_characters
from tasks.codex import FLAT_CODEX_CHAPTERS, codex_due, write_codex_or_log
from tasks.commit import commit_initialization, maintenance_due, record_maintenance
from tasks.ebook import EBOOK_FORMATS, export_ebooks_or_log, write_ebooks
from tasks.export import export_manuscript, manuscript_path
from tasks.initialization import (
    act_ranges,
    extract_outline_relationships,
    generate_act_outline,
    generate_chapter_outlines,
    generate_character_sheets,
    generate_global_outline,
)
from tasks.outlining import (
    STORY_SO_FAR_SHARE,
    OutlineRequest,
    generate_chapter_outline,
    story_so_far,
)
from tasks.persist import (
    InitArtifacts,
    initial_bible,
    persist_initialization_files,
    run_initialization_parsers,
)
from tasks.runtime import Runtime, runtime, set_runtime
from tasks.steering import (
    chapter_guidance,
    first_stale_chapter,
    load_steering,
    read_guidance,
    record_written,
    request_redo,
    roll_back_chapters_from,
    written_chapters,
)

PROJECT_FILE = "project.json"


class ProjectSpec(BaseModel):
    """What a project was started with; fixed for its lifetime so caches stay valid."""

    premise: str = Field(min_length=1, max_length=20_000)
    genre: str = Field(min_length=1, max_length=200)
    initial_chapters: int = Field(ge=1)
    acts: int = Field(ge=1, le=10)
    characters: int = Field(ge=1, le=20)
    imported_from: str = Field("", description="the manuscript an imported project started from")


class StageCost(BaseModel):
    cpu_s: float
    wall_s: float
    calls: int


class ChapterCost(BaseModel):
    """The pipeline's own cost of one chapter, the maintenance after it included (chapter 0:
    initialization): process CPU and wall seconds by stage (core.stages), RSS at its end."""

    chapter: int
    cpu_s: float
    wall_s: float
    rss_mb: float
    stages: dict[str, StageCost] = Field(default_factory=dict)
    ended_at: float = Field(0.0, description="when the chapter ended (seconds since the epoch)")

    @classmethod
    def of(cls, chapter: int, point: Checkpoint) -> ChapterCost:
        return cls(
            chapter=chapter,
            cpu_s=point.cpu_s,
            wall_s=point.wall_s,
            rss_mb=point.rss_mb,
            ended_at=point.at,
            stages={
                name: StageCost(cpu_s=t.cpu_s, wall_s=t.wall_s, calls=t.calls)
                for name, t in sorted(point.stages.items())
            },
        )

    def brief(self) -> str:
        top = sorted(self.stages.items(), key=lambda item: -item[1].cpu_s)[:4]
        return (
            f"{self.cpu_s:.2f}s CPU, {self.wall_s:.2f}s wall, RSS {self.rss_mb:.0f} MiB; most CPU: "
            + ", ".join(f"{name} {cost.cpu_s:.2f}s" for name, cost in top)
        )


class NovelReport(BaseModel):
    title: str
    chapters: list[ChapterResult]
    manuscript: str
    ebooks: list[str] = Field(
        default_factory=list, description="the manuscript as EPUB and DOCX (none if they failed)"
    )
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds_by_phase: dict[str, float]
    costs: list[ChapterCost] = Field(
        default_factory=list, description="the pipeline's own cost per chapter"
    )


def resolve_project(
    project_dir: Path,
    premise: str | None,
    genre: str | None,
    chapters: int,
    acts: int,
    characters: int,
) -> ProjectSpec:
    """Load the stored project spec, or create it on the first run; reject contradictions."""
    path = project_dir / ".saga" / PROJECT_FILE
    if path.exists():
        try:
            spec = ProjectSpec.model_validate_json(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise InvalidInputError(
                f"{path} is corrupted: {exc}", hint="restore it or start a new --project-dir"
            ) from None
        if premise is not None and premise.strip() != spec.premise:
            raise InvalidInputError(
                f"{project_dir} was started with a different premise",
                hint="omit --premise to continue it, or use a new --project-dir",
            )
        return spec
    if premise is None or not premise.strip():
        raise InvalidInputError(
            "a new project needs a premise", hint="pass --premise TEXT or --premise-file FILE"
        )
    spec = ProjectSpec(
        premise=premise.strip(),
        genre=(genre or "literary fiction").strip(),
        initial_chapters=chapters,
        acts=min(acts, chapters),
        characters=characters,
    )
    save_project(project_dir, spec)
    return spec


def save_project(project_dir: Path, spec: ProjectSpec) -> None:
    path = project_dir / ".saga" / PROJECT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
    tmp.replace(path)


@flow(name="initialization", log_prints=True)
def initialization_flow(spec: ProjectSpec) -> InitArtifacts:
    """Character sheets -> global outline -> act outlines -> chapter outlines ->
    outline relationships -> commit to graph -> persist files -> parse them back."""
    rt = runtime()
    services = rt.services()
    characters = generate_character_sheets(services, spec.premise, spec.genre, spec.characters)
    names = tuple(c.name for c in rt.content.get_model(characters, CharacterSheets).characters)
    outline = generate_global_outline(
        services, spec.premise, spec.genre, spec.initial_chapters, spec.acts, characters
    )
    acts, chapter_sets = [], []
    for act, first, last in act_ranges(spec.initial_chapters, spec.acts):
        act_ref = generate_act_outline(services, outline, act, first, last)
        acts.append(act_ref)
        chapter_sets.append(
            generate_chapter_outlines(services, outline, act_ref, act, first, last, names)
        )
    relationships = extract_outline_relationships(services, outline, tuple(chapter_sets), names)
    artifacts = InitArtifacts(
        characters=characters,
        global_outline=outline,
        act_outlines=tuple(acts),
        chapter_outlines=tuple(chapter_sets),
        relationships=relationships,
    )
    commit_initialization(services, artifacts, spec.genre)
    persist_initialization_files(services, artifacts)
    run_initialization_parsers(services, spec.initial_chapters)
    return artifacts


def act_for(artifacts: InitArtifacts, spec: ProjectSpec, number: int) -> tuple[int, str]:
    """(act number, act summary) of a chapter; chapters past the initial plan belong to the last act."""
    rt = runtime()
    ranges = act_ranges(spec.initial_chapters, spec.acts)
    act = next((a for a, first, last in ranges if first <= number <= last), ranges[-1][0])
    return act, rt.content.get_model(artifacts.act_outlines[act - 1], ActOutline).summary


def bring_steering_up_to_date(chapters: int, redo_from: int | None) -> None:
    """Apply a redo request, then roll back every written chapter whose guidance or take
    changed (from the first such chapter on), so it is written again."""
    rt = runtime()
    services = rt.services()
    log = get_run_logger()
    written = written_chapters(services)
    if redo_from is not None:
        if not any(n >= redo_from for n in written):
            log.info("redo: no chapter from %d on is written; nothing to redo", redo_from)
        else:
            request_redo(rt.settings.saga_dir, redo_from, max(written))
    steering = load_steering(rt.settings.saga_dir)
    stale = first_stale_chapter(
        steering, rt.settings.project_dir, [n for n in written if n <= chapters]
    )
    if stale is not None:
        roll_back_chapters_from(
            services, stale, f"chapters {stale}.. must be written again (guidance or redo)"
        )


@flow(name="novel", log_prints=True)
def novel_flow(
    project_dir: str,
    spec: ProjectSpec,
    chapters: int,
    scenes_per_chapter: int,
    redo_from: int | None = None,
) -> NovelReport:
    """The main job: initialization once, the writer's steering and story bible, then chapters
    1..`chapters` (finished ones replay from cache)."""
    rt = _runtime_for(project_dir)
    services = rt.services()
    log = get_run_logger()
    # Sub-flows (and their tasks) persist results under the project: that is the resume cache.
    results = prefect_results_dir(Path(project_dir))
    phases: dict[str, float] = {}
    costs: list[ChapterCost] = []
    LEDGER.checkpoint("start")
    started = time.monotonic()
    if spec.imported_from:
        from flows.importing import load_imported_artifacts

        artifacts = load_imported_artifacts(rt.settings.saga_dir)
        persist_initialization_files(services, artifacts)
    else:
        artifacts = initialization_flow.with_options(result_storage=results)(spec)
    phases["initialization"] = time.monotonic() - started
    with stage("steering and story bible"):
        bring_steering_up_to_date(chapters, redo_from)
        sync_story_bible(services, initial_bible(services, artifacts))
        bible = load_story_bible(rt.settings.project_dir)
    planned = {c.number: ChapterOutline.model_validate(c.model_dump()) for c in bible.chapters}
    outline = rt.content.get_model(artifacts.global_outline, GlobalOutline)
    names = tuple(c.name for c in bible.characters)
    book = BookInfo(
        title=outline.title,
        genre=spec.genre,
        character_names=names,
        scenes_per_chapter=scenes_per_chapter,
        logline=outline.logline,
        themes=tuple(outline.themes),
    )
    results_list: list[ChapterResult] = []
    summaries: list[str] = []
    titles: list[str] = []  # the chapters' titles so far: grounding never takes one for a name
    ending = ""
    codex_current = False  # whether exports/codex.html shows every chapter so far
    one_chapter = chapter_flow.with_options(
        result_storage=results, task_runner=chapter_runner(rt.settings)
    )
    refresh = generate_chapter_outline.with_options(result_storage=results)
    costs.append(ChapterCost.of(0, LEDGER.checkpoint("initialization")))
    for number in range(1, chapters + 1):
        with stage("steering and story bible"):
            steering = load_steering(rt.settings.saga_dir)
        imported = steering.imported.get(number)
        if imported is not None:  # the writer's own chapter, brought in by `import`
            codex_current = False
            summaries.append(f"Chapter {number}: {imported.title}: {imported.summary}")
            titles.append(imported.title)
            ending = imported.ending
            continue
        with stage("steering and story bible"):
            guidance = chapter_guidance(
                rt.settings.project_dir, number, steering.takes.get(number, 1)
            )
        written_with = steering.inputs.get(number)
        if written_with is not None:
            # A written chapter replays with the inputs it was written with (cache hits, no call),
            # whatever the bible says now: edits steer the chapters still to be written.
            chapter, cast = written_with.outline, written_with.character_names
        else:
            act, act_summary = act_for(artifacts, spec, number)
            story, left_out = story_so_far(
                summaries, int(rt.settings.tier("large").context_window * STORY_SO_FAR_SHARE)
            )
            if left_out:
                log.info(
                    "chapter %d: its outline is refreshed from the summaries of the %d most recent chapters; "
                    "the %d before them are left out of the prompt (their budget is %d%% of the context window; "
                    "the global and act outlines stand for them)",
                    number,
                    len(story),
                    left_out,
                    round(STORY_SO_FAR_SHARE * 100),
                )
            chapter = refresh(
                services,
                OutlineRequest(
                    title=outline.title,
                    genre=spec.genre,
                    number=number,
                    global_outline=bible.global_outline,
                    act_number=act,
                    act=act_summary,
                    characters=tuple(bible.character_lines()),
                    summaries=story,
                    planned=planned.get(number),
                    guidance=guidance,
                ),
            )
            cast = names
        log.info("chapter %d/%d: %s", number, chapters, chapter.title)
        chapter_started = time.monotonic()
        result = one_chapter(
            book.model_copy(update={"character_names": cast, "chapter_titles": tuple(titles)}),
            chapter,
            ending,
            guidance,
        )
        results_list.append(result)
        titles.append(result.title)
        ending = result.ending
        with stage("steering and story bible"):
            record_written(rt.settings.saga_dir, number, guidance, chapter, cast)
        summaries.append(f"Chapter {number}: {result.title}: {result.summary}".rstrip(": "))
        phases[f"chapter {number}"] = time.monotonic() - chapter_started
        codex_current = codex_due(number, chapters)
        if codex_current:
            codex_started = time.monotonic()
            with stage("codex"):
                write_codex_or_log(services, f"after chapter {number}")
            phases["codex"] = phases.get("codex", 0.0) + time.monotonic() - codex_started
        else:
            log.info(
                "chapter %d: the codex is rewritten every %d chapters in a book past %d chapters, and after "
                "the run's last chapter (%d)",
                number,
                -(-number // FLAT_CODEX_CHAPTERS),
                FLAT_CODEX_CHAPTERS,
                chapters,
            )
        if number % rt.settings.limits.qa_every == 0:
            if maintenance_due(services, number):
                maintenance_started = time.monotonic()
                with stage("maintenance"):
                    if _run_maintenance(project_dir, number):
                        record_maintenance(services, number)
                phases[f"maintenance after {number}"] = time.monotonic() - maintenance_started
            else:
                log.info("chapter %d: healing and QA already ran after this chapter", number)
        with stage("heap trim"):
            trim_heap()  # a chapter's native garbage (driver, index, HTTP buffers) goes back to the OS
        costs.append(ChapterCost.of(number, LEDGER.checkpoint(f"chapter {number}")))
        log.info("chapter %d: the pipeline's own cost: %s", number, costs[-1].brief())
    if (
        not codex_current
    ):  # the run ended on the writer's own (imported) chapters: the codex shows them too
        write_codex_or_log(services, "at the end of the run")
    write_learned_characters(services)
    manuscript = export_manuscript(services, outline.title, chapters)
    ebooks = export_ebooks_or_log(manuscript)
    report = _report(rt, outline.title, results_list, manuscript, phases)
    report.ebooks = ebooks
    report.costs = costs
    _publish_artifacts(report)
    return report


def _runtime_for(project_dir: str) -> Runtime:
    """The CLI sets the runtime up front; a deployment run builds it from the project dir."""
    try:
        rt = runtime()
        if rt.settings.project_dir == Path(project_dir).resolve():
            return rt
    except RuntimeError:
        pass
    return set_runtime(Runtime(load_settings(project_dir)))


def _run_maintenance(project_dir: str, chapter: int) -> bool:
    """Healing and QA are best effort: a failure is logged, never fatal (spec 001 section 7).
    True when both ran."""
    log = get_run_logger()
    done = True
    runs: tuple[tuple[Any, dict[str, Any]], ...] = (
        (heal_flow, {}),
        (qa_flow, {"incremental": True}),
    )
    for maintenance, options in runs:
        try:
            maintenance(project_dir, **options)
        except Exception as exc:  # graceful degradation: keep writing
            done = False
            log.warning(
                "%s after chapter %d failed (continuing): %s", maintenance.name, chapter, exc
            )
    return done


def _report(
    rt: Runtime, title: str, results: list[ChapterResult], manuscript: str, phases: dict[str, float]
) -> NovelReport:
    records = rt.gateway.records
    runs = rt.settings.saga_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    if records:
        rt.gateway.write_records(runs / f"llm_calls_{rt.run_id}.parquet")
    return NovelReport(
        title=title,
        chapters=results,
        manuscript=manuscript,
        llm_calls=len(records),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        seconds_by_phase={k: round(v, 2) for k, v in phases.items()},
    )


def _publish_artifacts(report: NovelReport) -> None:
    """A quality table and a run summary in the Prefect UI (chapters publish their own markdown)."""
    create_table_artifact(
        key="chapter-quality",
        table=[
            {
                "chapter": c.number,
                "title": c.title,
                "iterations": c.iterations,
                **{k: round(v, 2) for k, v in c.scores.model_dump(exclude={"feedback"}).items()},
                "problems": len(c.problems),
                "distinct_trigrams": c.prose.distinct_trigrams,
                "max_sentence_repeats": c.prose.max_sentence_repeats,
                "compression_ratio": c.prose.compression_ratio,
                "words": c.prose.words,
                "flagged": c.flagged,
                "facts_kept": c.facts_kept,
                "facts_dropped": c.facts_dropped,
                "plan_problems": len(c.plan_problems),
            }
            for c in report.chapters
        ],
        description="Quality per chapter: editor scores (0-1), prose metrics of the degeneration guard, flags",
    )
    lines = [
        f"# Run summary: {report.title}",
        "",
        f"- chapters: {len(report.chapters)}",
        f"- LLM calls this run: {report.llm_calls} (cached steps make none)",
        f"- tokens: {report.prompt_tokens} prompt, {report.completion_tokens} completion",
        f"- manuscript: `{report.manuscript}`",
        *(f"- book: `{path}`" for path in report.ebooks),
        "",
        "| chapter | words | distinct trigrams | max sentence repeats | compression | flagged |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {c.number} | {c.prose.words} | {c.prose.distinct_trigrams:.2f} | {c.prose.max_sentence_repeats} | "
        f"{c.prose.compression_ratio:.2f} | {'; '.join(c.flags) or 'no'} |"
        for c in report.chapters
    ]
    lines += ["", "| phase | seconds |", "|---|---|"]
    lines += [f"| {phase} | {seconds:.1f} |" for phase, seconds in report.seconds_by_phase.items()]
    create_markdown_artifact(
        key="run-summary", markdown="\n".join(lines), description="tokens, calls, time per phase"
    )


def run_summary(report: NovelReport, seconds: float) -> dict[str, object]:
    """The exit summary printed as one JSON line: per chapter, the degeneration guard's
    metrics (distinct word-trigram ratio, most repeats of one sentence) and any flags."""
    return {
        "title": report.title,
        "chapters": len(report.chapters),
        "manuscript": report.manuscript,
        "ebooks": report.ebooks,
        "llm_calls": report.llm_calls,
        "seconds": round(seconds, 1),
        "chapter_quality": [
            {
                "chapter": c.number,
                "words": c.prose.words,
                "distinct_trigrams": c.prose.distinct_trigrams,
                "max_sentence_repeats": c.prose.max_sentence_repeats,
                "compression_ratio": c.prose.compression_ratio,
                "editor_mean": round(c.scores.mean, 3),
                "iterations": c.iterations,
                "flags": c.flags,
                "facts_kept": c.facts_kept,
                "facts_dropped": c.facts_dropped,
                "plan_problems": len(c.plan_problems),
            }
            for c in report.chapters
        ],
        "flagged_chapters": [c.number for c in report.chapters if c.flagged],
    }


def preflight(rt: Runtime) -> None:
    """Fail fast, with one line, when the graph is unreachable.

    The LLM endpoint is not probed: a finished project replays from cache without it, and
    on a new project the first LLM call fails before anything is written to the graph.
    """
    rt.graph.schema_version()  # connects (bounded retries) and migrates, or raises GraphUnavailableError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.novel",
        description="Write a novel with LLMs, keeping the story world in a knowledge graph. "
        "Re-running resumes from cached steps; a larger --chapters continues the book. "
        "`python -m flows.novel import --help`: start a project from an existing manuscript; "
        "`python -m flows.novel export --help`: write the book's EPUB and DOCX again.",
    )
    parser.add_argument(
        "--project-dir", type=Path, required=True, help="where chapters/, outline/, .saga/ ... live"
    )
    premise = parser.add_mutually_exclusive_group()
    premise.add_argument("--premise", help="the story premise (required for a new project)")
    premise.add_argument("--premise-file", type=Path, help="read the premise from a text file")
    parser.add_argument(
        "--chapters", type=int, required=True, help="total chapters to have written (>= 1)"
    )
    parser.add_argument(
        "--scenes-per-chapter",
        type=int,
        default=None,
        help="scenes per chapter (default: settings limits.scenes_per_chapter, 3)",
    )
    parser.add_argument(
        "--genre", default=None, help="genre (new projects; default 'literary fiction')"
    )
    parser.add_argument(
        "--acts", type=int, default=3, help="acts in the global outline (new projects)"
    )
    parser.add_argument(
        "--characters", type=int, default=4, help="main characters to create (new projects)"
    )
    parser.add_argument(
        "--redo-from",
        type=int,
        default=None,
        metavar="N",
        help="write chapters N.. again: roll them back in the graph (newest first), move their "
        "files to chapters/replaced/, and redraft them with the current story bible and guidance",
    )
    add_settings_options(parser)
    return parser


def build_import_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.novel import",
        description="Import an existing markdown manuscript into a new project: split it into chapters "
        "(headings) and scenes (*** lines), extract the story world, commit each chapter as its change-set "
        "and write the story bible files. Continue it afterwards with `python -m flows.novel --chapters N`.",
    )
    parser.add_argument(
        "--project-dir", type=Path, required=True, help="the new project's directory"
    )
    parser.add_argument(
        "--manuscript", type=Path, required=True, help="the manuscript (markdown, UTF-8)"
    )
    parser.add_argument("--genre", default="literary fiction", help="the book's genre")
    add_settings_options(parser)
    return parser


def import_main(argv: Sequence[str]) -> int:
    from flows.importing import import_flow
    from tasks.manuscript import split_manuscript

    args = build_import_parser().parse_args(argv)
    try:
        text = args.manuscript.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read --manuscript {args.manuscript}: {exc}") from None
    manuscript = split_manuscript(
        text, args.manuscript.stem.replace("_", " ").strip() or "Untitled"
    )
    setup_logging(args.verbose)
    settings = load_settings(args.project_dir, args.config)
    if (settings.saga_dir / PROJECT_FILE).exists():
        raise InvalidInputError(
            f"{args.project_dir} already holds a book", hint="import into a new --project-dir"
        )
    settings.project_dir.mkdir(parents=True, exist_ok=True)
    rt = set_runtime(Runtime(settings))
    try:
        preflight(rt)
        with project_prefect_settings(settings.project_dir):
            report = import_flow(manuscript, args.genre.strip() or "literary fiction")
        spec = ProjectSpec(
            premise=f"{manuscript.title} (imported from {args.manuscript.name})",
            genre=args.genre,
            initial_chapters=report.chapters,
            acts=1,
            characters=max(1, min(20, len(report.characters))),
            imported_from=str(args.manuscript),
        )
        save_project(settings.project_dir, spec)
        print(json.dumps(report.model_dump()))
    finally:
        rt.close()
    return 0


def build_export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.novel export",
        description="Write the book's EPUB and DOCX again from its manuscript (exports/manuscript.md), next to "
        "it. A run or an import writes them itself; this needs neither the graph nor an LLM.",
    )
    parser.add_argument(
        "--project-dir", type=Path, required=True, help="the book's project directory"
    )
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=EBOOK_FORMATS,
        default=None,
        help="epub or docx; repeat for both (default: both)",
    )
    return parser


def export_main(argv: Sequence[str]) -> int:
    args = build_export_parser().parse_args(argv)
    manuscript = manuscript_path(args.project_dir)
    if not manuscript.is_file():
        raise InvalidInputError(
            f"{args.project_dir} has no manuscript ({manuscript} is missing)",
            hint="write the book with `python -m flows.novel` or import one first",
        )
    paths = write_ebooks(manuscript, args.formats or EBOOK_FORMATS)
    print(json.dumps({"manuscript": str(manuscript), "ebooks": [str(path) for path in paths]}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["import"]:
        return import_main(argv[1:])
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.chapters < 1:
        raise InvalidInputError(f"--chapters must be at least 1 (got {args.chapters})")
    if args.redo_from is not None and not 1 <= args.redo_from <= args.chapters:
        raise InvalidInputError(
            f"--redo-from must be between 1 and --chapters {args.chapters} (got {args.redo_from})"
        )
    if args.scenes_per_chapter is not None and not 1 <= args.scenes_per_chapter <= 20:
        raise InvalidInputError(
            f"--scenes-per-chapter must be between 1 and 20 (got {args.scenes_per_chapter})"
        )
    if args.premise_file is not None:
        try:
            args.premise = args.premise_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(
                f"cannot read --premise-file {args.premise_file}: {exc}"
            ) from None
    setup_logging(args.verbose)
    overrides = {}
    settings = load_settings(args.project_dir, args.config)
    if args.scenes_per_chapter is not None:
        overrides["limits"] = settings.limits.model_copy(
            update={"scenes_per_chapter": args.scenes_per_chapter}
        )
        settings = settings.model_copy(update=overrides)
    settings.project_dir.mkdir(parents=True, exist_ok=True)
    if (settings.saga_dir / PROJECT_FILE).exists():
        # The writer's story bible and guidance are validated before anything is written or asked.
        load_story_bible(settings.project_dir)
        for path in sorted((settings.project_dir / "guidance").glob("chapter_*.md")):
            digits = path.stem.removeprefix("chapter_")
            if digits.isdigit():
                read_guidance(settings.project_dir, int(digits))
    spec = resolve_project(
        settings.project_dir, args.premise, args.genre, args.chapters, args.acts, args.characters
    )
    rt = set_runtime(Runtime(settings))
    try:
        preflight(rt)
        started = time.monotonic()
        with project_prefect_settings(settings.project_dir):
            report = novel_flow(
                str(settings.project_dir),
                spec,
                args.chapters,
                settings.limits.scenes_per_chapter,
                args.redo_from,
            )
        print(json.dumps(run_summary(report, time.monotonic() - started)))
        flagged = [c for c in report.chapters if c.flagged]
        for chapter in flagged:
            print(
                f"FLAGGED chapter {chapter.number}: " + " | ".join(chapter.flags), file=sys.stderr
            )
    finally:
        rt.close()
    return 0


if __name__ == "__main__":
    run_main(main, "novel", sys.argv[1:])
