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
from typing import Annotated

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from core.cli import add_settings_options, project_prefect_settings, run_main, setup_logging
from core.content import USER_TEXT_ENCODING
from core.errors import InvalidInputError
from core.phases import PhaseTimer
from core.project_lock import project_writer
from core.settings import load_settings
from core.stages import LEDGER, stage
from flows.book import (
    ACTS_RANGE,
    CHARACTERS_RANGE,
    DEFAULT_ACTS,
    DEFAULT_CHARACTERS,
    DEFAULT_GENRE,
    PROJECT_FILE,
    Book,
    BookProgress,
    ChapterCost,
    ProjectSpec,
    after_chapter,
    follow_imported,
    refuse_unowned_chapters,
    resolve_project,
    save_project,
    start_book,
    write_chapter,
    written_result,
)
from flows.chapter import ChapterResult
from tasks.bible import load_story_bible, write_learned_characters
from tasks.codex import write_codex_or_log
from tasks.ebook import EBOOK_FORMATS, export_ebooks_or_log, write_ebooks
from tasks.export import export_manuscript, manuscript_path
from tasks.runtime import Runtime, project_runtime, set_runtime
from tasks.steering import finish_redo, guidance_files, load_steering, read_guidance

__all__ = [
    "ChapterCost",
    "NovelReport",
    "ProjectSpec",
    "novel_flow",
    "preflight",
    "resolve_project",
]


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


@flow(name="novel", log_prints=True)
def novel_flow(
    project_dir: str,
    chapters: Annotated[int, Field(ge=1)],
    premise: str = "",
    genre: str = "",
    acts: Annotated[int, Field(ge=ACTS_RANGE[0], le=ACTS_RANGE[1])] | None = None,
    characters: Annotated[int, Field(ge=CHARACTERS_RANGE[0], le=CHARACTERS_RANGE[1])] | None = None,
    scenes_per_chapter: Annotated[int, Field(ge=1, le=20)] | None = None,
    redo_from: Annotated[int, Field(ge=1)] | None = None,
) -> NovelReport:
    """Write or continue the novel in `project_dir`: what `python -m flows.novel` runs, and the
    `write-novel` deployment (deployments/prefect.yaml) from the Prefect UI. Initialization once,
    the writer's steering and story bible, then chapters 1..`chapters` (finished ones replay
    from the project's cache, whoever started the run), then the codex and the exports. One
    run at a time per project (core.project_lock): a run refuses while another writes.

    Args:
        project_dir: the book's directory (chapters/, outline/, .saga/ ...), on the worker.
        chapters: total chapters to have written; a larger number continues the book.
        premise: the story premise; required for a new project, else empty or the same.
        genre: the genre of a new project (empty: literary fiction); for a started book,
            empty or the same.
        acts: acts in a new project's global outline (default 3); for a started book, none
            or the same.
        characters: main characters a new project creates (default 4); for a started book,
            none or the same.
        scenes_per_chapter: scenes per chapter (default: settings limits.scenes_per_chapter).
        redo_from: write chapters N.. again with the current story bible and guidance.
    """
    check_run_request(chapters, redo_from)
    with (
        # Its sub-flows (initialization, chapters, maintenance) carry the run's tags, so a
        # deployment run's `crash-detection` watches them too (deployments/automations.yaml).
        tags(*flow_run.tags),
        project_writer(Path(project_dir), "novel flow"),
        project_runtime(project_dir) as rt,
    ):
        check_writer_files(rt.settings.project_dir)
        spec = resolve_project(rt.settings.project_dir, premise, genre, chapters, acts, characters)
        preflight(rt)
        check_book_length(rt, chapters)
        scenes = scenes_per_chapter or rt.settings.limits.scenes_per_chapter
        phases = PhaseTimer()
        LEDGER.checkpoint("start")
        try:
            book = start_book(rt, project_dir, spec, chapters, scenes, redo_from, phases)
            progress = BookProgress(costs=[ChapterCost.of(0, LEDGER.checkpoint("initialization"))])
            rt.save_call_log()
            for number in range(1, chapters + 1):
                with stage("steering and story bible"):
                    steering = load_steering(rt.settings.saga_dir)
                imported = steering.imported.get(number)
                if imported is not None:  # the writer's own chapter, brought in by `import`
                    follow_imported(book, progress, number, imported)
                    continue
                recorded = written_result(book, steering, number)
                if recorded is not None:  # written by an earlier run: as it recorded it
                    get_run_logger().info(
                        "chapter %d/%d: %s (written by an earlier run; followed as recorded)",
                        number,
                        chapters,
                        recorded.title,
                    )
                    progress.follow(recorded)
                else:
                    write_chapter(book, progress, steering, number, phases)
                after_chapter(book, progress, number, phases)
                rt.save_call_log()
            report = finish_book(book, progress, phases)
            with stage("steering and story bible"):
                finish_redo(rt.settings.saga_dir)
            return report
        except BaseException:
            rt.save_call_log()  # what a failed run's calls cost, the failed ones too
            raise


def check_run_request(chapters: int, redo_from: int | None) -> None:
    """What the CLI's parser cannot check alone (and a deployment run's form does not)."""
    if chapters < 1:
        raise InvalidInputError(f"--chapters must be at least 1 (got {chapters})")
    if redo_from is not None and not 1 <= redo_from <= chapters:
        raise InvalidInputError(
            f"--redo-from must be between 1 and --chapters {chapters} (got {redo_from})"
        )


def check_writer_files(project_dir: Path) -> None:
    """The writer's guidance (and the story bible of an existing project), validated before
    anything is written or asked (one line naming the file on a bad one)."""
    guidance = guidance_files(project_dir)  # a new project's too: it may be written first
    for number in guidance:
        read_guidance(project_dir, number)
    if (project_dir / ".saga" / PROJECT_FILE).exists():
        load_story_bible(project_dir)


def finish_book(book: Book, progress: BookProgress, phases: PhaseTimer) -> NovelReport:
    """The last codex if the run ended on imported chapters, the learned characters, the
    manuscript and its ebooks, the run's report and its Prefect artifacts."""
    services, title = book.services, book.outline.title
    if not progress.codex_current:
        # the run ended on the writer's own (imported) chapters: the codex shows them too
        write_codex_or_log(services, "at the end of the run")
    write_learned_characters(services)
    manuscript = export_manuscript(services, title, book.chapters)
    ebooks = export_ebooks_or_log(manuscript)
    report = _report(book.rt, title, progress.results, manuscript, phases)
    report.ebooks = ebooks
    report.costs = progress.costs
    _publish_artifacts(report)
    return report


def _report(
    rt: Runtime, title: str, results: list[ChapterResult], manuscript: str, phases: PhaseTimer
) -> NovelReport:
    records = rt.gateway.records
    rt.save_call_log()
    return NovelReport(
        title=title,
        chapters=results,
        manuscript=manuscript,
        llm_calls=len(records),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        seconds_by_phase=phases.rounded(),
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


def check_book_length(rt: Runtime, chapters: int) -> None:
    """A --chapters below the chapters the graph holds would export a manuscript, EPUB and DOCX
    without the later ones while the graph and chapters/ keep them: most often an old command
    run again. Refused; taking chapters out of a book is a rollback."""
    past = sorted(
        c.chapter for c in rt.services().graph_reader.committed_chapters() if c.chapter > chapters
    )
    if past:
        raise InvalidInputError(
            f"--chapters {chapters} would leave out chapter(s) {', '.join(map(str, past))}, "
            "which the book holds",
            hint=f"give --chapters {past[-1]} or more; to take chapters out of the book, roll "
            f"them back first: python -m kg rollback --chapter {past[0]} --cascade "
            f"--project-dir {rt.settings.project_dir}",
        )


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
        "--genre", default=None, help=f"genre (new projects; default {DEFAULT_GENRE!r})"
    )
    parser.add_argument(
        "--acts",
        type=int,
        default=None,
        help=f"acts in the global outline (new projects; default {DEFAULT_ACTS})",
    )
    parser.add_argument(
        "--characters",
        type=int,
        default=None,
        help=f"main characters to create (new projects; default {DEFAULT_CHARACTERS})",
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
    parser.add_argument("--genre", default=DEFAULT_GENRE, help="the book's genre")
    add_settings_options(parser)
    return parser


def import_main(argv: Sequence[str]) -> int:
    from flows.importing import import_flow
    from tasks.manuscript import split_manuscript

    args = build_import_parser().parse_args(argv)
    try:
        text = args.manuscript.read_text(encoding=USER_TEXT_ENCODING)
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
    refuse_unowned_chapters(settings.project_dir)
    settings.project_dir.mkdir(parents=True, exist_ok=True)
    with project_writer(settings.project_dir, "python -m flows.novel import"):
        rt = set_runtime(Runtime(settings))
        try:
            preflight(rt)
            with project_prefect_settings(settings.project_dir):
                report = import_flow(manuscript, args.genre.strip() or DEFAULT_GENRE)
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
    with project_writer(args.project_dir, "python -m flows.novel export"):
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
    check_run_request(args.chapters, args.redo_from)
    for option, value, (low, high) in (
        ("--scenes-per-chapter", args.scenes_per_chapter, (1, 20)),
        ("--acts", args.acts, ACTS_RANGE),
        ("--characters", args.characters, CHARACTERS_RANGE),
    ):
        if value is not None and not low <= value <= high:
            raise InvalidInputError(f"{option} must be between {low} and {high} (got {value})")
    if args.premise_file is not None:
        try:
            args.premise = args.premise_file.read_text(encoding=USER_TEXT_ENCODING)
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(
                f"cannot read --premise-file {args.premise_file}: {exc}"
            ) from None
    setup_logging(args.verbose)
    settings = load_settings(args.project_dir, args.config)
    settings.project_dir.mkdir(parents=True, exist_ok=True)
    check_writer_files(settings.project_dir)
    # Held from before the project file and the schema are written until the graph is closed.
    with project_writer(settings.project_dir, "python -m flows.novel"):
        # Checked and stored before Prefect starts, so a bad premise or a graph that is down
        # fails in one line with no flow run; the flow finds the spec and the runtime again.
        resolve_project(
            settings.project_dir,
            args.premise,
            args.genre,
            args.chapters,
            args.acts,
            args.characters,
        )
        rt = set_runtime(Runtime(settings))
        try:
            preflight(rt)
            check_book_length(rt, args.chapters)  # again in the flow, for deployment runs
            started = time.monotonic()
            with project_prefect_settings(settings.project_dir):
                report = novel_flow(
                    str(settings.project_dir),
                    args.chapters,
                    premise=args.premise or "",
                    scenes_per_chapter=args.scenes_per_chapter,
                    redo_from=args.redo_from,
                )
            print(json.dumps(run_summary(report, time.monotonic() - started)))
        finally:
            rt.close()
    for chapter in (c for c in report.chapters if c.flagged):
        print(f"FLAGGED chapter {chapter.number}: " + " | ".join(chapter.flags), file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main, "novel", sys.argv[1:])
