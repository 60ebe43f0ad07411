"""The book around its chapters, for flows.novel: the project (its spec, initialization), what
happens before each chapter (the writer's steering, the chapter's outline refreshed from the
story so far) and after it (the codex, healing and QA, the heap trimmed, the chapter's cost).

Orchestration only: the steps are tasks in tasks/ and sub-flows; the helpers keep the task
calls, their inputs and their order exactly as the chapter loop makes them, so the resume
cache and the run's logs and artifacts do not depend on this split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import Flow, Task, flow, get_run_logger
from pydantic import BaseModel, Field

from core.cli import prefect_results_dir
from core.content import ContentRef, atomic_write, read_state
from core.errors import ContentIntegrityError, InvalidInputError
from core.heap import trim as trim_heap
from core.phases import PhaseTimer
from core.stages import LEDGER, Checkpoint, stage
from flows.chapter import BookInfo, ChapterResult, chapter_flow, chapter_runner
from flows.maintenance import heal_flow, qa_flow
from prompts.initialization.models import (
    ActOutline,
    ChapterOutline,
    CharacterSheets,
    GlobalOutline,
)
from tasks.bible import CHAPTERS_FILE, StoryBible, load_story_bible, sync_story_bible
from tasks.codex import FLAT_CODEX_CHAPTERS, codex_due, write_codex_or_log
from tasks.commit import commit_initialization, maintenance_due, record_maintenance
from tasks.export import chapter_path, manuscript_path, restore_chapter_file
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
from tasks.runtime import Runtime, runtime
from tasks.services import Services
from tasks.steering import (
    ImportedChapter,
    Steering,
    chapter_guidance,
    first_stale_chapter,
    load_steering,
    record_written,
    request_redo,
    roll_back_chapters_from,
    written_chapters,
)

PROJECT_FILE = "project.json"
#: The artifacts of a finished initialization (`initialize`).
INITIALIZED_FILE = "initialized.json"
#: A new book's shape when the run names none.
DEFAULT_GENRE = "literary fiction"
DEFAULT_ACTS = 3
DEFAULT_CHARACTERS = 4
#: What `--acts` and `--characters` may ask (ProjectSpec's bounds).
ACTS_RANGE = (1, 10)
CHARACTERS_RANGE = (1, 20)


class ProjectSpec(BaseModel):
    """What a project was started with; fixed for its lifetime so caches stay valid."""

    premise: str = Field(min_length=1, max_length=20_000)
    genre: str = Field(min_length=1, max_length=200)
    initial_chapters: int = Field(ge=1)
    acts: int = Field(ge=ACTS_RANGE[0], le=ACTS_RANGE[1])
    characters: int = Field(ge=CHARACTERS_RANGE[0], le=CHARACTERS_RANGE[1])
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


def resolve_project(
    project_dir: Path,
    premise: str | None,
    genre: str | None,
    chapters: int,
    acts: int | None,
    characters: int | None,
) -> ProjectSpec:
    """Load the stored project spec, or create it on the first run; reject contradictions.
    `genre`, `acts` and `characters` shape a new book (None or empty: the defaults); given for
    a book that was started otherwise, they are refused, as another premise is: the book goes
    on as it was started, and a run that said otherwise must not seem to have applied them."""
    premise = (premise or "").strip() or None
    genre = (genre or "").strip() or None
    path = project_dir / ".saga" / PROJECT_FILE
    spec = read_state(path, ProjectSpec, "restore it or start a new --project-dir")
    if spec is not None:
        if premise is not None and premise != spec.premise:
            raise InvalidInputError(
                f"{project_dir} was started with a different premise",
                hint="omit --premise (a deployment run: leave `premise` empty) to continue it, or use a new --project-dir",
            )
        given = {
            "genre": (genre, spec.genre),
            "acts": (None if acts is None else min(acts, spec.initial_chapters), spec.acts),
            "characters": (characters, spec.characters),
        }
        differing = [
            f"{name} {stored!r}, not {wanted!r}"
            for name, (wanted, stored) in given.items()
            if wanted is not None and wanted != stored
        ]
        if differing:
            raise InvalidInputError(
                f"{project_dir} was started with " + " and ".join(differing),
                hint="--genre, --acts and --characters shape a new book only: omit them to "
                "continue this one (a deployment run: leave `genre`, `acts` and `characters` "
                "empty), or use a new --project-dir",
            )
        return spec
    refuse_unowned_chapters(project_dir)
    if premise is None:
        raise InvalidInputError(
            "a new project needs a premise",
            hint="pass --premise TEXT or --premise-file FILE (a deployment run: the `premise` parameter)",
        )
    spec = ProjectSpec(
        premise=premise,
        genre=genre or DEFAULT_GENRE,
        initial_chapters=chapters,
        acts=min(DEFAULT_ACTS if acts is None else acts, chapters),
        characters=DEFAULT_CHARACTERS if characters is None else characters,
    )
    save_project(project_dir, spec)
    return spec


def refuse_unowned_chapters(project_dir: Path) -> None:
    """A new book (or an import) goes where no chapter files are: in a directory where Skald
    keeps nothing (no graph, content store or project file under `.saga/`; its run lock does
    not count), ones already there belong to no Skald project (another tool's, a project whose
    .saga/ was lost), and writing the book would overwrite them. Otherwise they are a killed
    first run's or import's own, which the same command resumes."""
    saga = project_dir / ".saga"
    if any((saga / name).exists() for name in ("graph", "content", PROJECT_FILE)):
        return
    found = sorted(
        str(path.relative_to(project_dir))
        for path in [
            *(project_dir / "chapters").glob("chapter_*.md"),
            manuscript_path(project_dir),
        ]
        if path.is_file()
    )
    if found:
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        raise InvalidInputError(
            f"{project_dir} holds no Skald project but has {found[0]}{more}, which a new book "
            "would overwrite",
            hint="use an empty --project-dir; to continue your own chapters, import them: "
            "python -m flows.novel import --manuscript FILE --project-dir NEW_DIR",
        )


def save_project(project_dir: Path, spec: ProjectSpec) -> None:
    atomic_write(
        project_dir / ".saga" / PROJECT_FILE, spec.model_dump_json(indent=2).encode("utf-8")
    )


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
        elif not request_redo(rt.settings.saga_dir, redo_from, max(written)):
            log.info(
                "redo: the redo from chapter %d did not finish in an earlier run; resuming it "
                "with the takes it asked for",
                redo_from,
            )
    steering = load_steering(rt.settings.saga_dir)
    stale = first_stale_chapter(
        steering, rt.settings.project_dir, [n for n in written if n <= chapters]
    )
    if stale is not None:
        roll_back_chapters_from(
            services, stale, f"chapters {stale}.. must be written again (guidance or redo)"
        )


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


@dataclass(frozen=True)
class Book:
    """What the chapter loop reads, fixed once initialization and the story bible are done."""

    rt: Runtime
    services: Services
    project_dir: str
    spec: ProjectSpec
    chapters: int
    artifacts: InitArtifacts
    bible: StoryBible
    outline: GlobalOutline
    info: BookInfo
    planned: dict[int, ChapterOutline]
    write: Flow[..., ChapterResult]
    refresh: Task[..., ChapterOutline]
    committed: frozenset[int] = frozenset()  # chapters in the graph when the run began


@dataclass
class BookProgress:
    """What the chapters so far leave for the next: results, summaries, titles, the ending."""

    costs: list[ChapterCost]
    results: list[ChapterResult] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)  # grounding never takes one for a name
    ending: str = ""
    codex_current: bool = False  # whether exports/codex.html shows every chapter so far

    def follow_imported(self, number: int, imported: ImportedChapter) -> None:
        """The writer's own chapter, brought in by `import`: its summary, title and ending."""
        self.codex_current = False
        self.summaries.append(f"Chapter {number}: {imported.title}: {imported.summary}")
        self.titles.append(imported.title)
        self.ending = imported.ending

    def follow(self, result: ChapterResult) -> None:
        """A chapter written, now or by an earlier run: what the next chapters read of it."""
        self.results.append(result)
        self.titles.append(result.title)
        self.ending = result.ending
        self.summaries.append(
            f"Chapter {result.number}: {result.title}: {result.summary}".rstrip(": ")
        )


def start_book(
    rt: Runtime,
    project_dir: str,
    spec: ProjectSpec,
    chapters: int,
    scenes_per_chapter: int,
    redo_from: int | None,
    phases: PhaseTimer,
) -> Book:
    """Initialization (or the imported book's), the writer's steering, the story bible."""
    services = rt.services()
    # Sub-flows (and their tasks) persist results under the project: that is the resume cache.
    results = prefect_results_dir(Path(project_dir))
    with phases.phase("initialization"):
        if spec.imported_from:
            from flows.importing import load_imported_artifacts

            artifacts = load_imported_artifacts(rt.settings.saga_dir)
            persist_initialization_files(services, artifacts)
        else:
            artifacts = initialize(rt, spec, results)
    with stage("steering and story bible"):
        bring_steering_up_to_date(chapters, redo_from)
        sync_story_bible(services, initial_bible(services, artifacts))
        bible = load_story_bible(rt.settings.project_dir)
        planned = {c.number: ChapterOutline.model_validate(c.model_dump()) for c in bible.chapters}
        note_replanned_chapters(load_steering(rt.settings.saga_dir), planned)
    outline = rt.content.get_model(artifacts.global_outline, GlobalOutline)
    info = BookInfo(
        title=outline.title,
        genre=spec.genre,
        character_names=tuple(c.name for c in bible.characters),
        scenes_per_chapter=scenes_per_chapter,
        logline=outline.logline,
        themes=tuple(outline.themes),
    )
    return Book(
        rt=rt,
        services=services,
        project_dir=project_dir,
        spec=spec,
        chapters=chapters,
        artifacts=artifacts,
        bible=bible,
        outline=outline,
        info=info,
        planned=planned,
        committed=frozenset(c.chapter for c in services.graph_reader.committed_chapters()),
        write=chapter_flow.with_options(
            result_storage=results, task_runner=chapter_runner(rt.settings)
        ),
        refresh=generate_chapter_outline.with_options(result_storage=results),
    )


def note_replanned_chapters(steering: Steering, planned: dict[int, ChapterOutline]) -> None:
    """Say which written chapters' plans the writer edited: an edit steers the chapters still to
    be written, so without a word the new plan of a written one would seem ignored."""
    replanned = sorted(
        number
        for number, written in steering.inputs.items()
        if written.planned is not None and planned.get(number) != written.planned
    )
    if replanned:
        get_run_logger().warning(
            "%s: the plan of written chapter(s) %s changed since they were written; a written "
            "chapter is not rewritten by an edit (run with --redo-from %d to write it and the "
            "chapters after it to the new plan)",
            CHAPTERS_FILE,
            ", ".join(map(str, replanned)),
            replanned[0],
        )


def initialize(rt: Runtime, spec: ProjectSpec, results: Path) -> InitArtifacts:
    """Initialization once: its flow (a resumed one replays the steps it finished), then its
    artifacts recorded. Later runs read the record, so a model or setting changed since never
    plans the book again; the flow runs again only for a graph without chapter 0 (wiped or
    rolled back: the cache restores it)."""
    services = rt.services()
    path = rt.settings.saga_dir / INITIALIZED_FILE
    if any(c.chapter == 0 for c in services.graph_reader.committed_chapters()):
        hint = "delete it: initialization is then replayed from the cache"
        recorded = read_state(path, InitArtifacts, hint)
        if recorded is not None:
            persist_initialization_files(services, recorded)
            run_initialization_parsers(services, spec.initial_chapters)
            return recorded
    artifacts = initialization_flow.with_options(result_storage=results)(spec)
    atomic_write(path, (artifacts.model_dump_json(indent=2) + "\n").encode("utf-8"))
    return artifacts


def write_chapter(
    book: Book, progress: BookProgress, steering: Steering, number: int, phases: PhaseTimer
) -> None:
    """The chapter's guidance and outline, then the chapter flow; recorded as written."""
    settings = book.rt.settings
    with stage("steering and story bible"):
        guidance = chapter_guidance(settings.project_dir, number, steering.takes.get(number, 1))
    chapter, cast = chapter_outline(book, progress, steering, number, guidance)
    get_run_logger().info("chapter %d/%d: %s", number, book.chapters, chapter.title)
    with phases.phase(f"chapter {number}"):
        result = book.write(
            book.info.model_copy(
                update={"character_names": cast, "chapter_titles": tuple(progress.titles)}
            ),
            chapter,
            progress.ending,
            guidance,
        )
        with stage("steering and story bible"):
            # The result first: a chapter recorded as written always has its result beside it.
            atomic_write(
                written_result_path(settings.saga_dir, number),
                (result.model_copy(update=_RUN_BOUND).model_dump_json(indent=2) + "\n").encode(),
            )
            record_written(
                settings.saga_dir, number, guidance, chapter, cast, book.planned.get(number)
            )
        progress.follow(result)


#: What a chapter's result holds of the run that wrote it, not of the chapter: left out of its
#: record, so a resumed run's record is the same bytes as the uninterrupted run's.
_RUN_BOUND: dict[str, Any] = {"seconds": 0.0, "path": ""}


def written_result_path(saga_dir: Path, number: int) -> Path:
    return saga_dir / "written" / f"chapter_{number:03d}.json"


def written_result(book: Book, steering: Steering, number: int) -> ChapterResult | None:
    """A chapter an earlier run wrote, as it recorded it: followed without its flow, so nothing
    changed since (another model, endpoint or temperature, another revision budget) writes it
    again, and its file keeps the writer's hand edits; a deleted file is written again from the
    text as written. None when it goes through its flow: not recorded as written (a chapter to
    write, or one rolled back for guidance or a redo), or no longer in the graph (a `kg
    rollback`: the flow restores it from the cache)."""
    settings = book.rt.settings
    if number not in steering.inputs or number not in book.committed:
        return None
    result = read_state(
        written_result_path(settings.saga_dir, number),
        ChapterResult,
        "delete it: the chapter is then replayed through its flow",
    )
    if result is None:
        return None
    if not restore_deleted_chapter(book, number, result.title, result.text):
        # No text to restore it from (a record made before it was kept, a stored text gone):
        # the flow restores it from the cache, or writes it anew under other settings.
        return None
    return result.model_copy(update={"path": str(chapter_path(settings.project_dir, number))})


def restore_deleted_chapter(book: Book, number: int, title: str, text: ContentRef | None) -> bool:
    """Whether a written or imported chapter's file is there: if it was deleted, it is written
    again from the chapter's text as stored. False when it cannot be: no reference to the text
    (a record from before they were kept), or the stored text gone or changed."""
    if chapter_path(book.rt.settings.project_dir, number).is_file():
        return True
    log = get_run_logger()
    if text is None:
        return False
    try:
        path = restore_chapter_file(book.services, number, title, text)
    except ContentIntegrityError as exc:
        log.warning(
            "chapter %d: its file was deleted and its stored text is unusable: %s", number, exc
        )
        return False
    log.warning(
        "chapter %d: its file was deleted; %s is written again from the chapter's text as stored "
        "(to write the chapter anew, run with --redo-from %d)",
        number,
        path,
        number,
    )
    return True


def follow_imported(
    book: Book, progress: BookProgress, number: int, imported: ImportedChapter
) -> None:
    """The writer's own chapter, brought in by `import`: its file as imported, then what the
    next chapters read of it."""
    if not restore_deleted_chapter(book, number, imported.title, imported.text):
        get_run_logger().warning(
            "chapter %d: %s is missing and cannot be restored; the manuscript goes without it "
            "until you put it back",
            number,
            chapter_path(book.rt.settings.project_dir, number),
        )
    progress.follow_imported(number, imported)


def chapter_outline(
    book: Book, progress: BookProgress, steering: Steering, number: int, guidance: str
) -> tuple[ChapterOutline, tuple[str, ...]]:
    """The chapter's outline and cast: the ones it was written with, or the outline refreshed
    from the story so far and the bible's cast."""
    written_with = steering.inputs.get(number)
    if written_with is not None:
        # A written chapter replays with the inputs it was written with (cache hits, no call),
        # whatever the bible says now: edits steer the chapters still to be written.
        return written_with.outline, written_with.character_names
    act, act_summary = act_for(book.artifacts, book.spec, number)
    window = book.rt.settings.tier("large").context_window
    story, left_out = story_so_far(progress.summaries, int(window * STORY_SO_FAR_SHARE))
    if left_out:
        get_run_logger().info(
            "chapter %d: its outline is refreshed from the summaries of the %d most recent "
            "chapters; the %d before them are left out of the prompt (their budget is %d%% of the "
            "context window; the global and act outlines stand for them)",
            number,
            len(story),
            left_out,
            round(STORY_SO_FAR_SHARE * 100),
        )
    chapter = book.refresh(
        book.services,
        OutlineRequest(
            title=book.outline.title,
            genre=book.spec.genre,
            number=number,
            global_outline=book.bible.global_outline,
            act_number=act,
            act=act_summary,
            characters=tuple(book.bible.character_lines()),
            summaries=story,
            planned=book.planned.get(number),
            guidance=guidance,
            earlier_titles=tuple(progress.titles),
            character_names=book.info.character_names,
        ),
    )
    return chapter, book.info.character_names


def after_chapter(book: Book, progress: BookProgress, number: int, phases: PhaseTimer) -> None:
    """The codex when due, healing and QA every `limits.qa_every` chapters, the heap trimmed,
    and the chapter's own cost."""
    log = get_run_logger()
    progress.codex_current = codex_due(number, book.chapters)
    if progress.codex_current:
        with phases.phase("codex", stage="codex"):
            write_codex_or_log(book.services, f"after chapter {number}")
    else:
        log.info(
            "chapter %d: the codex is rewritten every %d chapters in a book past %d chapters, "
            "and after the run's last chapter (%d)",
            number,
            -(-number // FLAT_CODEX_CHAPTERS),
            FLAT_CODEX_CHAPTERS,
            book.chapters,
        )
    if number % book.rt.settings.limits.qa_every == 0:
        if maintenance_due(book.services, number):
            with phases.phase(f"maintenance after {number}", stage="maintenance"):
                if _run_maintenance(book.project_dir, number):
                    record_maintenance(book.services, number)
        else:
            log.info("chapter %d: healing and QA already ran after this chapter", number)
    with stage("heap trim"):
        trim_heap()  # a chapter's native garbage (driver, index, HTTP buffers) goes back to the OS
    progress.costs.append(ChapterCost.of(number, LEDGER.checkpoint(f"chapter {number}")))
    log.info("chapter %d: the pipeline's own cost: %s", number, progress.costs[-1].brief())
