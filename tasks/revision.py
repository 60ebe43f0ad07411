"""Revision stage: guidance for the redraft of a rejected chapter."""

from __future__ import annotations

from prompts import render_messages
from prompts.validation.models import QualityScores, RevisionGuidance
from tasks.policy import cached_task
from tasks.runtime import runtime


@cached_task("revision_guidance")
def revision_guidance(chapter_number: int, chapter_summary: str, scores: QualityScores,
                      problems: tuple[str, ...], llm: str) -> RevisionGuidance:
    rt = runtime()
    shown = scores.model_dump(exclude={"feedback"})
    return rt.gateway.structured(
        "medium",
        render_messages("validation/revision_guidance", chapter_number=chapter_number, chapter_summary=chapter_summary,
                        scores=", ".join(f"{k} {v:.2f}" for k, v in shown.items()), feedback=scores.feedback,
                        problems=problems),
        RevisionGuidance, purpose="revision_guidance",
    )
