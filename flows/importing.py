"""`python -m flows.novel import`: bring an existing manuscript in, so the writer can continue it.

Split into chapters and scenes -> extract every scene -> summarize every chapter -> the
story bible's first version from what was found (committed as chapter 0, written as the
bible files) -> each chapter committed as its own change-set -> chapter files. Every LLM
step is a cached task: an interrupted import repeats no finished call.
Orchestration only: the steps are tasks in tasks/.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from pydantic import BaseModel

from core.content import atomic_write
from core.sentences import tail_from_sentence
from prompts.initialization.models import CharacterSheets
from prompts.knowledge.models import SceneExtraction
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
from tasks.manuscript import Manuscript, imported_artifacts, scene_refs
from tasks.persist import InitArtifacts, persist_initialization_files
from tasks.runtime import runtime
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
    return InitArtifacts.model_validate_json(
        imported_artifacts_path(saga_dir).read_text(encoding="utf-8")
    )


@flow(name="import-manuscript", log_prints=True)
def import_flow(manuscript: Manuscript, genre: str) -> ImportReport:
    rt = runtime()
    services = rt.services()
    log = get_run_logger()
    known: list[str] = []
    titles = (manuscript.title, *(c.title for c in manuscript.chapters))
    refs_by_chapter, extraction_refs, extractions, texts, summaries = [], [], [], [], []
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
        summaries.append(summarize_chapter(services, chapter.number, chapter.title, text))
        refs_by_chapter.append(refs)
        extraction_refs.append(tuple(found))
        extractions.append(models)
        texts.append(text)
        log.info(
            "import: chapter %d %r: %d scenes extracted and summarized",
            chapter.number,
            chapter.title,
            len(refs),
        )
    artifacts = imported_artifacts(
        services, manuscript.title, genre, manuscript.chapters, extractions, summaries
    )
    commit_initialization(services, artifacts, genre)
    steering = load_steering(rt.settings.saga_dir)
    for chapter, refs, found, models, text, summary in zip(
        manuscript.chapters,
        refs_by_chapter,
        extraction_refs,
        extractions,
        texts,
        summaries,
        strict=True,
    ):
        plan = ScenePlan(
            scenes=[
                SceneDetail(
                    title=f"Scene {index}",
                    pov="",
                    setting="",
                    characters=[e.name for e in scene.entities if e.kind == "Character"],
                    beats=[],
                )
                for index, scene in enumerate(models, start=1)
            ]
        )
        plan_ref = rt.content.put_json(
            "chapter_plan", f"chapter_{chapter.number:03d}/imported", plan
        )
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
                scenes=refs,
                extractions=found,
                embeddings=embeddings,
                chapter_text=text,
            ),
        )
        commit_chapter(services, delta, chapter_commit_state(services, chapter.number))
        store_chapter_summary(services, chapter.number, summary)
        finalize_chapter(services, chapter.number, chapter.title, text)
        steering.imported[chapter.number] = ImportedChapter(
            title=chapter.title,
            summary=summary.summary,
            ending=tail_from_sentence(chapter.scenes[-1], ENDING_CHARS),
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
    return ImportReport(
        title=manuscript.title,
        chapters=len(manuscript.chapters),
        manuscript=path,
        ebooks=ebooks,
        characters=[
            c.name for c in rt.content.get_model(artifacts.characters, CharacterSheets).characters
        ],
    )
