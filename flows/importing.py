"""`python -m flows.novel import`: bring an existing manuscript in, so the writer can continue it.

Split into chapters and scenes -> extract every scene -> summarize every chapter -> the
story bible's first version from what was found (committed as chapter 0, written as the
bible files) -> each chapter committed as its own change-set -> chapter files. Every LLM
step is a cached task: an interrupted import repeats no finished call.
Orchestration only: the steps are tasks in tasks/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger
from pydantic import BaseModel

from core.content import ContentRef, atomic_write, read_state
from core.errors import InvalidInputError
from core.sentences import tail_from_sentence
from prompts.initialization.models import CharacterSheets
from prompts.knowledge.models import ChapterSummary, SceneExtraction
from prompts.narrative.models import SceneDetail, ScenePlan
from tasks.assembly import assemble_chapter
from tasks.codex import write_codex_or_log
from tasks.commit import (
    chapter_commit_state,
    commit_chapter,
    commit_initialization,
    store_chapter_summary,
)
from tasks.consolidation import ChapterParts, build_chapter_delta
from tasks.ebook import export_ebooks_or_log
from tasks.embedding import embed_scenes_or_none
from tasks.export import export_manuscript, finalize_chapter
from tasks.extraction import extract_scene
from tasks.grounding import ground_scenes
from tasks.manuscript import Manuscript, ManuscriptChapter, imported_artifacts, scene_refs
from tasks.persist import InitArtifacts, persist_initialization_files
from tasks.runtime import Runtime, runtime
from tasks.services import Services
from tasks.steering import ImportedChapter, load_steering, save_steering
from tasks.summarization import summarize_chapter

IMPORT_FILE = "imported.json"
ENDING_CHARS = 600


class ImportReport(BaseModel):
    title: str
    chapters: int
    characters: list[str]
    manuscript: str
    ebooks: list[str]


def imported_artifacts_path(saga_dir: Path) -> Path:
    return saga_dir / IMPORT_FILE


def load_imported_artifacts(saga_dir: Path) -> InitArtifacts:
    path = imported_artifacts_path(saga_dir)
    hint = "restore it, or import the manuscript again into a new --project-dir"
    artifacts = read_state(path, InitArtifacts, hint)
    if artifacts is None:
        raise InvalidInputError(f"{path} is missing: this project was imported", hint=hint)
    return artifacts


@flow(name="import-manuscript", log_prints=True)
def import_flow(manuscript: Manuscript, genre: str) -> ImportReport:
    rt = runtime()
    services = rt.services()
    if manuscript.preamble:
        words = manuscript.preamble.split()
        get_run_logger().warning(
            "the %d word(s) before the first chapter heading are not imported (%r); to import "
            "them as a chapter, give them a heading of the chapters' level (e.g. 'Prologue')",
            len(words),
            " ".join(words[:8]) + (" ..." if len(words) > 8 else ""),
        )
    chapters = read_chapters(rt, services, manuscript)
    artifacts = imported_artifacts(
        services,
        manuscript.title,
        genre,
        manuscript.chapters,
        [chapter.models for chapter in chapters],
        [chapter.summary for chapter in chapters],
    )
    commit_initialization(services, artifacts, genre)
    steering = load_steering(rt.settings.saga_dir)
    for chapter, read in zip(manuscript.chapters, chapters, strict=True):
        commit_imported_chapter(rt, services, chapter, read)
        steering.imported[chapter.number] = ImportedChapter(
            title=chapter.title,
            summary=read.summary.summary,
            ending=tail_from_sentence(chapter.scenes[-1], ENDING_CHARS),
            text=read.text,
        )
    save_steering(rt.settings.saga_dir, steering)
    persist_initialization_files(services, artifacts)
    atomic_write(
        imported_artifacts_path(rt.settings.saga_dir),
        artifacts.model_dump_json(indent=2).encode("utf-8"),
    )
    path = export_manuscript(services, manuscript.title, len(manuscript.chapters))
    ebooks = export_ebooks_or_log(path)
    write_codex_or_log(services, "of the imported book")
    sheets = rt.content.get_model(artifacts.characters, CharacterSheets)
    return ImportReport(
        title=manuscript.title,
        chapters=len(manuscript.chapters),
        manuscript=path,
        ebooks=ebooks,
        characters=[c.name for c in sheets.characters],
    )


@dataclass(frozen=True)
class ReadChapter:
    """One manuscript chapter as read: its scenes, grounded extractions, text and summary."""

    refs: tuple[ContentRef, ...]
    found: tuple[ContentRef, ...]
    models: list[SceneExtraction]
    text: ContentRef
    summary: ChapterSummary


def read_chapters(rt: Runtime, services: Services, manuscript: Manuscript) -> list[ReadChapter]:
    """Extract, ground and summarize every chapter in order; the characters found so far are
    the cast the next chapter's extraction knows."""
    log = get_run_logger()
    known: list[str] = []
    titles = (manuscript.title, *(c.title for c in manuscript.chapters))
    chapters = []
    for chapter in manuscript.chapters:
        refs = scene_refs(services, chapter)
        extracted = tuple(
            extract_scene(services, ref, chapter.number, index, tuple(known))
            for index, ref in enumerate(refs, 1)
        )
        # Only what the manuscript's own words support becomes the bible and the graph.
        found = ground_scenes(
            services, chapter.number, refs, extracted, tuple(known), titles
        ).extractions
        models = [rt.content.get_model(ref, SceneExtraction) for ref in found]
        for scene in models:
            known += [
                e.name for e in scene.entities if e.kind == "Character" and e.name not in known
            ]
        text = assemble_chapter(services, chapter.number, 1, refs)
        summary = summarize_chapter(services, chapter.number, chapter.title, text)
        chapters.append(ReadChapter(refs, tuple(found), models, text, summary))
        log.info(
            "import: chapter %d %r: %d scenes extracted and summarized",
            chapter.number,
            chapter.title,
            len(refs),
        )
    return chapters


def commit_imported_chapter(
    rt: Runtime, services: Services, chapter: ManuscriptChapter, read: ReadChapter
) -> None:
    """The chapter as its own change-set (a plan of its scenes' casts), its summary and file."""
    plan = ScenePlan(
        scenes=[
            SceneDetail(
                title=f"Scene {index}",
                pov="",
                setting="",
                characters=[e.name for e in scene.entities if e.kind == "Character"],
                beats=[],
            )
            for index, scene in enumerate(read.models, start=1)
        ]
    )
    plan_ref = rt.content.put_json("chapter_plan", f"chapter_{chapter.number:03d}/imported", plan)
    embeddings = embed_scenes_or_none(
        services, f"chapter_{chapter.number:03d}/imported/scenes", tuple(chapter.scenes)
    )
    delta = build_chapter_delta(
        services,
        ChapterParts(
            number=chapter.number,
            title=chapter.title,
            iteration=1,
            plan=plan_ref,
            scenes=read.refs,
            extractions=read.found,
            embeddings=embeddings,
            chapter_text=read.text,
        ),
    )
    commit_chapter(services, delta, chapter_commit_state(services, chapter.number))
    store_chapter_summary(services, chapter.number, read.summary)
    finalize_chapter(services, chapter.number, chapter.title, read.text)
