"""Quality evaluation stage: LLM scores (0-1) for coherence, prose, plot, pacing, tone."""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from prompts import render_messages
from prompts.validation.models import QualityScores
from tasks.policy import cached_task
from tasks.runtime import runtime

# The editor reads at most this much of a chapter: small models have small windows.
MAX_CHAPTER_CHARS = 12_000


@cached_task("evaluate_quality")
def evaluate_quality(title: str, genre: str, chapter_number: int, chapter_summary: str, chapter_text: ContentRef,
                     llm: str) -> QualityScores:
    rt = runtime()
    text = rt.content.get_text(chapter_text)
    scores = rt.gateway.structured(
        "medium",
        render_messages("validation/quality", title=title, genre=genre, chapter_number=chapter_number,
                        chapter_summary=chapter_summary, chapter_text=text[:MAX_CHAPTER_CHARS]),
        QualityScores, purpose="evaluate_quality",
    )
    get_run_logger().info(
        "chapter %d: quality coherence=%.2f prose=%.2f plot=%.2f pacing=%.2f tone=%.2f (mean %.2f)",
        chapter_number, scores.coherence, scores.prose_quality, scores.plot_advancement, scores.pacing,
        scores.tone_consistency, scores.mean,
    )
    return scores
