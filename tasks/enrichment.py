"""Narrative enrichment (spec 001 `enrich_narrative`): an optional pass, off by default
(settings `limits.enrich_narrative`), with its own tier (`tiers.enrichment`).

Each drafted scene is rewritten with sensory detail and emotional depth before anything
downstream sees it, so the enriched text is what is extracted, assembled, validated,
committed and exported. Enrichment only adds: an answer that is shorter than the draft, or
that breaks the degeneration guard when the draft did not, is discarded and the draft kept.
"""

from __future__ import annotations

from prefect import get_run_logger
from pydantic import BaseModel, ConfigDict, Field

from core.content import ContentRef
from core.prose import measure
from core.settings import ProseThresholds
from prompts import render_messages
from tasks.drafting import clean_prose
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
ENRICHMENT_TIER = "enrichment"


class EnrichRequest(BaseModel):
    """One drafted scene to enrich: the stage's parameter (frozen, so Prefect hashes its
    fields, in a stable JSON form, into the cache key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scene: ContentRef
    genre: str
    chapter_number: int = Field(ge=1)
    scene_number: int = Field(ge=1)
    chapter_summary: str
    target_words: int = Field(ge=1)
    thresholds: ProseThresholds


@llm_task("enrich_narrative", tier=ENRICHMENT_TIER)
def enrich_scene(services: Services, request: EnrichRequest) -> ContentRef:
    """The enriched scene (or the draft itself when the enrichment is worse)."""
    log = get_run_logger()
    scene, chapter, number = request.scene, request.chapter_number, request.scene_number
    draft = services.content.get_text(scene)
    messages = render_messages(
        "narrative/enrich",
        genre=request.genre,
        chapter_number=chapter,
        scene_number=number,
        chapter_summary=request.chapter_summary,
        scene_text=draft,
    )
    enriched = clean_prose(services.llm.text(ENRICHMENT_TIER, messages, purpose="enrich_narrative"))
    before = measure(draft, request.target_words, request.thresholds)
    after = measure(enriched, request.target_words, request.thresholds)
    if after.words < before.words:
        log.warning(
            "chapter %d scene %d: enrichment cut the scene (%d -> %d words); keeping the draft",
            chapter,
            number,
            before.words,
            after.words,
        )
        return scene
    if after.failures and not before.failures:
        log.warning(
            "chapter %d scene %d: enrichment fails the degeneration guard (%s); keeping the draft",
            chapter,
            number,
            "; ".join(after.failures),
        )
        return scene
    log.info(
        "chapter %d scene %d: enriched (%d -> %d words)", chapter, number, before.words, after.words
    )
    name = f"chapter_{chapter:03d}/scene_{number:02d}_{scene.sha256[:12]}"
    return services.content.put_text("enriched", name, enriched)
