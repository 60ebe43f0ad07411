"""One chapter: plan -> (retrieve -> draft) per scene -> extract (parallel) -> consolidate ->
embed -> assemble -> commit -> validate -> revise (exact rollback) or summarize -> finalize.

Orchestration only: each step is a task in tasks/.
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel

from core.runtime import runtime
from prompts.initialization.models import ChapterOutline
from prompts.narrative.models import ScenePlan
from prompts.validation.models import QualityScores
from tasks.assembly import assemble_chapter
from tasks.commit import (
    chapter_commit_state,
    commit_accepted_chapter,
    commit_chapter,
    rollback_chapter,
    store_chapter_summary,
)
from tasks.consolidation import build_chapter_delta
from tasks.drafting import draft_scene
from tasks.embedding import embed_scenes_or_none
from tasks.evaluation import evaluate_quality
from tasks.export import finalize_chapter
from tasks.extraction import extract_scene
from tasks.planning import plan_scenes
from tasks.retrieval import retrieve_context
from tasks.revision import revision_guidance
from tasks.summarization import summarize_chapter
from tasks.validation import revision_needed, validate_consistency

PREVIOUS_SCENE_TAIL_CHARS = 600


class BookInfo(BaseModel):
    """What every chapter needs to know about the book (hashable, small)."""

    title: str
    genre: str
    character_names: tuple[str, ...]
    scenes_per_chapter: int


class ChapterResult(BaseModel):
    number: int
    title: str
    iterations: int
    scores: QualityScores
    problems: list[str]
    path: str
    seconds: float


@flow(name="chapter", flow_run_name="chapter-{outline.number}", task_runner=ThreadPoolTaskRunner(max_workers=4),
      log_prints=True)
def chapter_flow(book: BookInfo, outline: ChapterOutline) -> ChapterResult:
    rt = runtime()
    log = get_run_logger()
    started = time.monotonic()
    number = outline.number
    limits = rt.settings.limits
    committed = chapter_commit_state(number)
    guidance = ""
    iteration = 0
    for iteration in range(1, limits.max_iterations + 1):
        log.info("chapter %d: iteration %d of at most %d", number, iteration, limits.max_iterations)
        plan_ref = plan_scenes(book.title, book.genre, outline, book.scenes_per_chapter, book.character_names,
                               guidance, iteration, rt.llm_fingerprint("large"))
        plan = rt.content.get_model(plan_ref, ScenePlan)
        drafts = []
        tail = ""
        for index, scene in enumerate(plan.scenes, start=1):
            context = retrieve_context(number, scene)
            draft = draft_scene(book.title, book.genre, number, index, len(plan.scenes), scene, context, tail,
                                guidance, iteration, rt.llm_fingerprint("narrative"))
            drafts.append(draft)
            tail = rt.content.get_text(draft)[-PREVIOUS_SCENE_TAIL_CHARS:]
        # Scenes are independent for extraction: run them in parallel (bounded by the runner).
        futures = [
            extract_scene.submit(draft, number, index, book.character_names, rt.llm_fingerprint("small"))
            for index, draft in enumerate(drafts, start=1)
        ]
        extractions = [future.result() for future in futures]
        texts = tuple(rt.content.get_text(d) for d in drafts)
        embeddings = embed_scenes_or_none(f"chapter_{number:03d}/iter_{iteration}/scenes", texts,
                                          rt.embedding_fingerprint())
        chapter_text = assemble_chapter(number, iteration, tuple(drafts))
        delta = build_chapter_delta(number, outline.title, iteration, plan_ref, tuple(drafts), tuple(extractions),
                                    embeddings, chapter_text)
        outcome = commit_chapter(delta, committed)
        problems = validate_consistency(delta)
        scores = evaluate_quality(book.title, book.genre, number, outline.summary, chapter_text,
                                  rt.llm_fingerprint("medium"))
        needs_revision = revision_needed(scores, problems, limits.revision_threshold)
        if needs_revision and iteration < limits.max_iterations:
            log.warning("chapter %d: revision needed (mean quality %.2f, %d problems)", number, scores.mean,
                        len(problems))
            if outcome != "deferred":
                rollback_chapter(number)
            guidance = revision_guidance(number, outline.summary, scores, tuple(p.message for p in problems),
                                         rt.llm_fingerprint("medium")).guidance
            continue
        if needs_revision:
            log.warning("chapter %d: still below threshold after %d iterations; keeping the last draft",
                        number, iteration)
        if outcome == "deferred":
            commit_accepted_chapter(delta)
        break
    summary = summarize_chapter(number, outline.title, chapter_text, rt.llm_fingerprint("small"))
    store_chapter_summary(number, summary)
    path = finalize_chapter(number, outline.title, chapter_text)
    log.info("chapter %d: finished in %.1fs -> %s", number, time.monotonic() - started, path)
    return ChapterResult(number=number, title=outline.title, iterations=iteration, scores=scores,
                         problems=[p.message for p in problems], path=path, seconds=time.monotonic() - started)
