"""One chapter: plan -> (retrieve -> draft) per scene -> extract (parallel) -> consolidate ->
embed -> assemble -> commit -> validate -> revise (exact rollback) or summarize -> finalize.

Orchestration only: each step is a task in tasks/.
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from core.content import ContentRef
from core.prose import ProseMetrics
from core.sentences import tail_from_sentence
from core.settings import Settings
from core.stages import stage
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
from tasks.consolidation import ChapterParts, build_chapter_delta
from tasks.drafting import (
    SceneBrief,
    SceneDraft,
    draft_scene,
    fixed_prompt_tokens,
    scene_target_words,
)
from tasks.embedding import embed_scenes_or_none
from tasks.enrichment import EnrichRequest, enrich_scene
from tasks.evaluation import evaluate_quality
from tasks.export import finalize_chapter, publish_chapter_quality
from tasks.extraction import extract_scene
from tasks.grounding import ground_scenes
from tasks.planning import PlanRequest, plan_scenes
from tasks.retrieval import retrieve_context
from tasks.revision import revision_guidance
from tasks.runtime import runtime
from tasks.summarization import summarize_chapter
from tasks.validation import (
    check_scenes,
    decide_revision,
    degeneration_flags,
    measure_chapter,
    quality_rows,
    validate_consistency,
)

PREVIOUS_SCENE_TAIL_CHARS = 600


class BookInfo(BaseModel):
    """What every chapter needs to know about the book (hashable, small)."""

    title: str
    genre: str
    character_names: tuple[str, ...]
    scenes_per_chapter: int
    logline: str = ""
    themes: tuple[str, ...] = ()
    chapter_titles: tuple[str, ...] = Field(
        (), description="titles of the chapters before this one"
    )


class ChapterResult(BaseModel):
    number: int
    title: str
    iterations: int
    scores: QualityScores
    problems: list[str]
    path: str
    seconds: float
    prose: ProseMetrics = Field(description="the final chapter text against the degeneration guard")
    scene_prose: list[ProseMetrics] = Field(default_factory=list)
    draft_attempts: int = Field(0, description="scene drafts made for the final iteration")
    flags: list[str] = Field(
        default_factory=list, description="why the chapter is flagged (empty: clean)"
    )
    ending: str = Field(
        "", description="the last scene's ending, for the next chapter's first scene"
    )
    summary: str = Field("", description="the chapter summary, for the outlines of later chapters")
    facts_kept: int = Field(
        0, description="extracted facts the chapter's text supports (committed)"
    )
    facts_dropped: int = Field(
        0, description="extracted facts grounding refused (names or quotes not in the text)"
    )
    plan_problems: list[str] = Field(
        default_factory=list, description="where the kept take leaves its scene plan"
    )

    @property
    def flagged(self) -> bool:
        return bool(self.flags)


def chapter_runner(settings: Settings) -> ThreadPoolTaskRunner:
    """The chapter's task runner: its workers bound the per-scene extraction fan-out."""
    return ThreadPoolTaskRunner(max_workers=settings.limits.extraction_concurrency)


@flow(name="chapter", flow_run_name="chapter-{outline.number}", log_prints=True)
def chapter_flow(
    book: BookInfo, outline: ChapterOutline, previous_ending: str = "", writer_guidance: str = ""
) -> ChapterResult:
    """Run it with `.with_options(task_runner=chapter_runner(settings))` to honour
    `limits.extraction_concurrency` (flows.novel does).

    `writer_guidance` (the writer's guidance file for the chapter, redo notes) steers the
    plan and every draft: it rides in the drafting prompt's guidance section, counted in
    the context budget, ahead of any revision guidance."""
    rt = runtime()
    services = rt.services()
    log = get_run_logger()
    started = time.monotonic()
    number = outline.number
    limits = rt.settings.limits
    budget = rt.settings.revision_budget()
    target_words = scene_target_words(limits.scene_token_target)
    committed = chapter_commit_state(services, number)
    guidance = ""
    iteration = 0
    for iteration in range(1, budget.iterations + 1):
        log.info("chapter %d: iteration %d of at most %d", number, iteration, budget.iterations)
        plan_ref = plan_scenes(
            services,
            PlanRequest(
                title=book.title,
                genre=book.genre,
                chapter=outline,
                scene_count=book.scenes_per_chapter,
                character_names=book.character_names,
                guidance=guidance,
                iteration=iteration,
                writer_guidance=writer_guidance,
            ),
        )
        plan = rt.content.get_model(plan_ref, ScenePlan)
        drafts: list[SceneDraft] = []
        final_refs: list[ContentRef] = []
        tail = previous_ending
        for index, scene in enumerate(plan.scenes, start=1):
            brief = SceneBrief(
                title=book.title,
                genre=book.genre,
                logline=book.logline,
                themes=book.themes,
                chapter_number=number,
                chapter_title=outline.title,
                chapter_summary=outline.summary,
                plan=tuple(plan.scenes),
                scene_number=index,
                previous_text=tail,
                previous_is_chapter=index == 1 and bool(previous_ending),
                style=rt.settings.style,
                target_words=target_words,
            )
            steering = tuple(g for g in (writer_guidance, guidance) if g)
            context = retrieve_context(
                services, number, scene, steering, fixed_prompt_tokens(brief)
            )
            draft = draft_scene(services, brief, context, iteration, rt.settings.prose)
            drafts.append(draft)
            scene_ref = draft.ref
            if limits.enrich_narrative:  # the enriched scene is what everything downstream sees
                scene_ref = enrich_scene(
                    services,
                    EnrichRequest(
                        scene=draft.ref,
                        genre=book.genre,
                        chapter_number=number,
                        scene_number=index,
                        chapter_summary=outline.summary,
                        target_words=target_words,
                        thresholds=rt.settings.prose,
                    ),
                )
            final_refs.append(scene_ref)
            tail = tail_from_sentence(rt.content.get_text(scene_ref), PREVIOUS_SCENE_TAIL_CHARS)
        refs = tuple(final_refs)
        # Scenes are independent for extraction: run them in parallel (bounded by the runner).
        futures = [
            extract_scene.submit(services, ref, number, index, book.character_names)
            for index, ref in enumerate(refs, start=1)
        ]
        extracted = tuple(future.result() for future in futures)
        # Only facts the scene's own words support reach the graph (and the checks below).
        grounded = ground_scenes(
            services,
            number,
            refs,
            extracted,
            book.character_names,
            (book.title, *book.chapter_titles, outline.title),
        )
        extractions = grounded.extractions
        texts = tuple(rt.content.get_text(ref) for ref in refs)
        with stage("prose and plan checks"):
            prose = measure_chapter(texts, target_words, rt.settings.prose)
            checks = check_scenes(texts, plan.scenes, book.character_names, rt.settings.prose)
        embeddings = embed_scenes_or_none(
            services, f"chapter_{number:03d}/iter_{iteration}/scenes", texts
        )
        chapter_text = assemble_chapter(services, number, iteration, refs)
        delta = build_chapter_delta(
            services,
            ChapterParts(
                number=number,
                title=outline.title,
                iteration=iteration,
                plan=plan_ref,
                scenes=refs,
                extractions=extractions,
                embeddings=embeddings,
                chapter_text=chapter_text,
            ),
        )
        outcome = commit_chapter(services, delta, committed)
        problems = validate_consistency(services, number, delta, extractions)
        scores = evaluate_quality(
            services, book.title, book.genre, number, outline.summary, chapter_text
        )
        decision = decide_revision(
            scores, problems, [d.metrics for d in drafts], prose, limits.revision_threshold, checks
        )
        if decision.revise and iteration < budget.iterations:
            log.warning("chapter %d: revision needed: %s", number, "; ".join(decision.reasons))
            if outcome != "deferred":
                rollback_chapter(services, number)
            found = tuple(dict.fromkeys([*decision.reasons, *(p.message for p in problems)]))
            guidance = revision_guidance(services, number, outline.summary, scores, found).guidance
            continue
        if decision.revise and budget.why:
            log.warning(
                "chapter %d: revision needed: %s; %s",
                number,
                "; ".join(decision.reasons),
                budget.why,
            )
        elif decision.revise:
            log.warning(
                "chapter %d: still needs revision after %d iterations; keeping the last draft: %s",
                number,
                iteration,
                "; ".join(decision.reasons),
            )
        if outcome == "deferred":
            commit_accepted_chapter(services, delta)
        break
    flags = degeneration_flags([d.metrics for d in drafts], prose)
    for flag in flags:
        log.error("chapter %d FLAGGED: %s", number, flag)
    summary = summarize_chapter(services, number, outline.title, chapter_text)
    store_chapter_summary(services, number, summary)
    path = finalize_chapter(services, number, outline.title, chapter_text)
    facts = [(g.kept, len(g.dropped)) for g in grounded.report.scenes]
    rows = quality_rows(
        [d.metrics for d in drafts],
        [d.attempts for d in drafts],
        prose,
        scores,
        flags,
        checks,
        facts,
    )
    publish_chapter_quality(services, number, rows)
    log.info(
        "chapter %d: finished in %.1fs -> %s (%s)",
        number,
        time.monotonic() - started,
        path,
        prose.brief(),
    )
    return ChapterResult(
        number=number,
        title=outline.title,
        iterations=iteration,
        scores=scores,
        problems=[p.message for p in problems],
        path=path,
        seconds=time.monotonic() - started,
        prose=prose,
        scene_prose=[d.metrics for d in drafts],
        draft_attempts=sum(d.attempts for d in drafts),
        flags=flags,
        ending=tail_from_sentence(texts[-1], PREVIOUS_SCENE_TAIL_CHARS),
        summary=summary.summary,
        facts_kept=grounded.report.kept,
        facts_dropped=grounded.report.dropped,
        plan_problems=[f"scene {c.scene} {p}" for c in checks for p in c.problems],
    )
