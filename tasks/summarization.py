"""Summarization stage: a chapter summary for the story bible and later context."""

from __future__ import annotations

from core.content import ContentRef
from prompts import render_messages
from prompts.knowledge.models import ChapterSummary
from tasks.evaluation import MAX_CHAPTER_CHARS
from tasks.policy import cached_task
from tasks.runtime import runtime


@cached_task("summarize_chapter")
def summarize_chapter(chapter_number: int, chapter_title: str, chapter_text: ContentRef, llm: str) -> ChapterSummary:
    rt = runtime()
    text = rt.content.get_text(chapter_text)
    return rt.gateway.structured(
        "small",
        render_messages("knowledge/summary", chapter_number=chapter_number, chapter_title=chapter_title,
                        chapter_text=text[:MAX_CHAPTER_CHARS]),
        ChapterSummary, purpose="summarize_chapter",
    )
