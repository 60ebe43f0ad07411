"""One chapter as the specification's diagram: plan -> (retrieve -> draft) per scene -> extract
(parallel) -> ground -> commit -> validate -> decide: revise (exact rollback, then a new take)
or accept -> summarize -> finalize.

Orchestration only: each step is a task in tasks/. `chapter_flow` reads as the diagram; each
step is one helper below it, calling the same tasks with the same inputs in the same order, so
the Prefect task names and cache keys (and a re-run served from them) do not depend on how the
flow is laid out.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from core.content import ContentRef
from core.interrupt import stopping_workers_if_torn_down
from core.phases import Phase, PhaseTimer
from core.prose import ProseMetrics
from core.sentences import tail_from_sentence
from core.settings import RevisionBudget, Settings
from core.stages import stage
from prompts.initialization.models import ChapterOutline
from prompts.narrative.models import ScenePlan
from prompts.validation.models import QualityScores
from tasks.assembly import assemble_chapter
from tasks.commit import (
    CommitOutcome,
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
from tasks.grounding import GroundedScenes, ground_scenes
from tasks.planning import PlanRequest, plan_scenes
from tasks.retrieval import retrieve_context
from tasks.revision import revision_guidance
from tasks.runtime import Runtime, runtime
from tasks.services import Services
from tasks.summarization import summarize_chapter
from tasks.validation import (
    Problem,
    RevisionDecision,
    SceneCheck,
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
    text: ContentRef | None = Field(
        None,
        description="the chapter's text as written (content store): a deleted chapter file of a "
        "written chapter is restored from it (None in records made before it was kept)",
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
    log = get_run_logger()
    timer = PhaseTimer()
    with timer.phase("chapter") as chapter:
        job = ChapterJob.of(book, outline, previous_ending, writer_guidance)
        committed = chapter_commit_state(job.services, job.number)
        iterations = job.budget.iterations
        guidance = ""
        for iteration in range(1, iterations + 1):
            log.info("chapter %d: iteration %d of at most %d", job.number, iteration, iterations)
            plan_ref, plan = plan_chapter(job, guidance, iteration)
            drafts, refs = draft_scenes(job, plan, guidance, iteration)
            extracted = extract_scenes(job, refs)
            grounded = ground_facts(job, refs, extracted)
            take = assemble_take(job, iteration, plan_ref, plan, drafts, refs, grounded)
            outcome = commit_chapter(job.services, take.delta, committed)
            verdict = validate_take(job, take)
            if revise(job, take, verdict, outcome):
                guidance = revision_notes(job, verdict)
                continue
            accept(job, take, verdict, outcome)
            break
        return finish_chapter(job, take, verdict, chapter)


@dataclass(frozen=True)
class ChapterJob:
    """What every step of one chapter reads: the book, the chapter's outline, the run."""

    book: BookInfo
    outline: ChapterOutline
    previous_ending: str
    writer_guidance: str
    rt: Runtime
    services: Services
    budget: RevisionBudget

    @classmethod
    def of(
        cls, book: BookInfo, outline: ChapterOutline, previous_ending: str, writer_guidance: str
    ) -> ChapterJob:
        rt = runtime()
        services = rt.services()
        budget = rt.settings.revision_budget()
        return cls(book, outline, previous_ending, writer_guidance, rt, services, budget)

    @property
    def number(self) -> int:
        return self.outline.number

    @property
    def settings(self) -> Settings:
        return self.rt.settings

    @property
    def target_words(self) -> int:
        return scene_target_words(self.settings.limits.scene_token_target)


@dataclass(frozen=True)
class Take:
    """One iteration's chapter: its drafts, scenes, grounded facts, checks, text and delta."""

    iteration: int
    drafts: list[SceneDraft]
    refs: tuple[ContentRef, ...]
    texts: tuple[str, ...]
    grounded: GroundedScenes
    prose: ProseMetrics
    checks: list[SceneCheck]
    chapter_text: ContentRef
    delta: ContentRef


@dataclass(frozen=True)
class Verdict:
    """What validation found in a committed take, and whether it must be revised."""

    problems: list[Problem]
    scores: QualityScores
    decision: RevisionDecision
    last_chance: bool = False


def plan_chapter(job: ChapterJob, guidance: str, iteration: int) -> tuple[ContentRef, ScenePlan]:
    plan_ref = plan_scenes(
        job.services,
        PlanRequest(
            title=job.book.title,
            genre=job.book.genre,
            chapter=job.outline,
            scene_count=job.book.scenes_per_chapter,
            character_names=job.book.character_names,
            guidance=guidance,
            iteration=iteration,
            writer_guidance=job.writer_guidance,
        ),
    )
    return plan_ref, job.rt.content.get_model(plan_ref, ScenePlan)


def draft_scenes(
    job: ChapterJob, plan: ScenePlan, guidance: str, iteration: int
) -> tuple[list[SceneDraft], tuple[ContentRef, ...]]:
    """Retrieve -> draft (-> enrich) per scene, each scene drafted after the previous one's tail;
    returns the drafts and the scenes everything downstream sees."""
    drafts: list[SceneDraft] = []
    final_refs: list[ContentRef] = []
    tail = job.previous_ending
    for index, scene in enumerate(plan.scenes, start=1):
        brief = SceneBrief(
            title=job.book.title,
            genre=job.book.genre,
            logline=job.book.logline,
            themes=job.book.themes,
            chapter_number=job.number,
            chapter_title=job.outline.title,
            chapter_summary=job.outline.summary,
            plan=tuple(plan.scenes),
            scene_number=index,
            previous_text=tail,
            previous_is_chapter=index == 1 and bool(job.previous_ending),
            style=job.settings.style,
            target_words=job.target_words,
        )
        steering = tuple(g for g in (job.writer_guidance, guidance) if g)
        context = retrieve_context(
            job.services, job.number, scene, steering, fixed_prompt_tokens(brief)
        )
        draft = draft_scene(job.services, brief, context, iteration, job.settings.prose)
        drafts.append(draft)
        scene_ref = enrich(job, draft.ref, index)
        final_refs.append(scene_ref)
        tail = tail_from_sentence(job.rt.content.get_text(scene_ref), PREVIOUS_SCENE_TAIL_CHARS)
    return drafts, tuple(final_refs)


def enrich(job: ChapterJob, scene: ContentRef, index: int) -> ContentRef:
    """The enriched scene when `limits.enrich_narrative` asks for one (what everything
    downstream then sees), else the draft."""
    if not job.settings.limits.enrich_narrative:
        return scene
    return enrich_scene(
        job.services,
        EnrichRequest(
            scene=scene,
            genre=job.book.genre,
            chapter_number=job.number,
            scene_number=index,
            chapter_summary=job.outline.summary,
            target_words=job.target_words,
            thresholds=job.settings.prose,
        ),
    )


def extract_scenes(job: ChapterJob, refs: tuple[ContentRef, ...]) -> tuple[ContentRef, ...]:
    # Scenes are independent for extraction: run them in parallel (bounded by the runner).
    futures = [
        extract_scene.submit(job.services, ref, job.number, index, job.book.character_names)
        for index, ref in enumerate(refs, start=1)
    ]
    with stopping_workers_if_torn_down():
        return tuple(future.result() for future in futures)


def ground_facts(
    job: ChapterJob, refs: tuple[ContentRef, ...], extracted: tuple[ContentRef, ...]
) -> GroundedScenes:
    # Only facts the scene's own words support reach the graph (and the checks below).
    return ground_scenes(
        job.services,
        job.number,
        refs,
        extracted,
        job.book.character_names,
        (job.book.title, *job.book.chapter_titles, job.outline.title),
    )


def assemble_take(
    job: ChapterJob,
    iteration: int,
    plan_ref: ContentRef,
    plan: ScenePlan,
    drafts: list[SceneDraft],
    refs: tuple[ContentRef, ...],
    grounded: GroundedScenes,
) -> Take:
    """The prose and plan checks, the scenes' embeddings, the chapter text and its delta."""
    texts = tuple(job.rt.content.get_text(ref) for ref in refs)
    with stage("prose and plan checks"):
        prose = measure_chapter(texts, job.target_words, job.settings.prose)
        checks = check_scenes(texts, plan.scenes, job.book.character_names, job.settings.prose)
    embeddings = embed_scenes_or_none(
        job.services, f"chapter_{job.number:03d}/iter_{iteration}/scenes", texts
    )
    chapter_text = assemble_chapter(job.services, job.number, iteration, refs)
    delta = build_chapter_delta(
        job.services,
        ChapterParts(
            number=job.number,
            title=job.outline.title,
            iteration=iteration,
            plan=plan_ref,
            scenes=refs,
            extractions=grounded.extractions,
            embeddings=embeddings,
            chapter_text=chapter_text,
        ),
    )
    return Take(iteration, drafts, refs, texts, grounded, prose, checks, chapter_text, delta)


def validate_take(job: ChapterJob, take: Take) -> Verdict:
    """Consistency against the graph, the editor's scores, then the revision decision."""
    problems = validate_consistency(job.services, job.number, take.delta, take.grounded.extractions)
    scores = evaluate_quality(
        job.services,
        job.book.title,
        job.book.genre,
        job.number,
        job.outline.summary,
        take.chapter_text,
    )
    decision = decide_revision(
        scores,
        problems,
        [d.metrics for d in take.drafts],
        take.prose,
        job.settings.limits.revision_threshold,
        take.checks,
    )
    last = take.iteration >= job.budget.iterations
    return Verdict(problems, scores, decision, last_chance=last)


def revise(job: ChapterJob, take: Take, verdict: Verdict, outcome: CommitOutcome) -> bool:
    """True when the take must be written again: it is rolled back (exactly) first."""
    if not verdict.decision.revise or verdict.last_chance:
        return False
    get_run_logger().warning(
        "chapter %d: revision needed: %s", job.number, "; ".join(verdict.decision.reasons)
    )
    if outcome != "deferred":
        rollback_chapter(job.services, job.number)
    return True


def revision_notes(job: ChapterJob, verdict: Verdict) -> str:
    """The guidance for the next take, from the reasons and the problems found."""
    reasons = verdict.decision.reasons
    found = tuple(dict.fromkeys([*reasons, *(p.message for p in verdict.problems)]))
    return revision_guidance(
        job.services, job.number, job.outline.summary, verdict.scores, found
    ).guidance


def accept(job: ChapterJob, take: Take, verdict: Verdict, outcome: CommitOutcome) -> None:
    """Keep the take (saying why when it still needs revision) and commit a deferred delta."""
    log = get_run_logger()
    why = job.budget.why
    if verdict.decision.revise and why:
        log.warning(
            "chapter %d: revision needed: %s; %s",
            job.number,
            "; ".join(verdict.decision.reasons),
            why,
        )
    elif verdict.decision.revise:
        log.warning(
            "chapter %d: still needs revision after %d iterations; keeping the last draft: %s",
            job.number,
            take.iteration,
            "; ".join(verdict.decision.reasons),
        )
    if outcome == "deferred":
        commit_accepted_chapter(job.services, take.delta)


def finish_chapter(job: ChapterJob, take: Take, verdict: Verdict, chapter: Phase) -> ChapterResult:
    """Flags, summary, the chapter file and its quality artifact, then the result."""
    log = get_run_logger()
    number, services, scene_prose = job.number, job.services, [d.metrics for d in take.drafts]
    flags = degeneration_flags(scene_prose, take.prose)
    for flag in flags:
        log.error("chapter %d FLAGGED: %s", number, flag)
    summary = summarize_chapter(services, number, job.outline.title, take.chapter_text)
    store_chapter_summary(services, number, summary)
    path = finalize_chapter(services, number, job.outline.title, take.chapter_text)
    report = take.grounded.report
    facts = [(g.kept, len(g.dropped)) for g in report.scenes]
    attempts = [d.attempts for d in take.drafts]
    rows = quality_rows(
        scene_prose, attempts, take.prose, verdict.scores, flags, take.checks, facts
    )
    publish_chapter_quality(services, number, rows)
    log.info(
        "chapter %d: finished in %.1fs -> %s (%s)",
        number,
        chapter.seconds,
        path,
        take.prose.brief(),
    )
    return ChapterResult(
        number=number,
        title=job.outline.title,
        iterations=take.iteration,
        scores=verdict.scores,
        problems=[p.message for p in verdict.problems],
        path=path,
        seconds=chapter.seconds,
        prose=take.prose,
        scene_prose=scene_prose,
        draft_attempts=sum(attempts),
        flags=flags,
        ending=tail_from_sentence(take.texts[-1], PREVIOUS_SCENE_TAIL_CHARS),
        summary=summary.summary,
        facts_kept=report.kept,
        facts_dropped=report.dropped,
        plan_problems=[f"scene {c.scene} {p}" for c in take.checks for p in c.problems],
        text=take.chapter_text,
    )
