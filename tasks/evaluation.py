"""Quality evaluation stage: LLM scores (0-1) for coherence, prose, plot, pacing, tone."""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from prompts import render_messages
from prompts.validation.models import QualityScores
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
EVALUATION_TIER = "medium"

# The editor reads at most this much of a chapter: small models have small windows.
MAX_CHAPTER_CHARS = 12_000


@llm_task("evaluate_quality", tier=EVALUATION_TIER)
def evaluate_quality(
    services: Services,
    title: str,
    genre: str,
    chapter_number: int,
    chapter_summary: str,
    chapter_text: ContentRef,
) -> QualityScores:
    text = services.content.get_text(chapter_text)
    scores = services.llm.structured(
        EVALUATION_TIER,
        render_messages(
            "validation/quality",
            title=title,
            genre=genre,
            chapter_number=chapter_number,
            chapter_summary=chapter_summary,
            chapter_text=text[:MAX_CHAPTER_CHARS],
        ),
        QualityScores,
        purpose="evaluate_quality",
    )
    get_run_logger().info(
        "chapter %d: quality coherence=%.2f prose=%.2f plot=%.2f pacing=%.2f tone=%.2f (mean %.2f)",
        chapter_number,
        scores.coherence,
        scores.prose_quality,
        scores.plot_advancement,
        scores.pacing,
        scores.tone_consistency,
        scores.mean,
    )
    return scores
