"""Summarization stage: a chapter summary for the story bible and later context."""

from __future__ import annotations

from core.content import ContentRef
from core.grounding import distinct_texts
from prompts import render_messages
from prompts.knowledge.models import ChapterSummary
from tasks.evaluation import MAX_CHAPTER_CHARS
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
SUMMARY_TIER = "small"


@llm_task("summarize_chapter", tier=SUMMARY_TIER)
def summarize_chapter(
    services: Services, chapter_number: int, chapter_title: str, chapter_text: ContentRef
) -> ChapterSummary:
    text = services.content.get_text(chapter_text)
    summary = services.llm.structured(
        SUMMARY_TIER,
        render_messages(
            "knowledge/summary",
            chapter_number=chapter_number,
            chapter_title=chapter_title,
            chapter_text=text[:MAX_CHAPTER_CHARS],
        ),
        ChapterSummary,
        purpose="summarize_chapter",
    )
    # The bible and the codex list each event once, without the model's own numbering.
    return summary.model_copy(update={"key_events": distinct_texts(summary.key_events)})
