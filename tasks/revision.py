"""Revision stage: guidance for the redraft of a rejected chapter."""

from __future__ import annotations

from prompts import render_messages
from prompts.validation.models import QualityScores, RevisionGuidance
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
REVISION_TIER = "medium"


@llm_task("revision_guidance", tier=REVISION_TIER)
def revision_guidance(
    services: Services,
    chapter_number: int,
    chapter_summary: str,
    scores: QualityScores,
    problems: tuple[str, ...],
) -> RevisionGuidance:
    shown = scores.model_dump(exclude={"feedback"})
    return services.llm.structured(
        REVISION_TIER,
        render_messages(
            "validation/revision_guidance",
            chapter_number=chapter_number,
            chapter_summary=chapter_summary,
            scores=", ".join(f"{k} {v:.2f}" for k, v in shown.items()),
            feedback=scores.feedback,
            problems=problems,
        ),
        RevisionGuidance,
        purpose="revision_guidance",
    )
