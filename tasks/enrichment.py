"""Narrative enrichment (spec 001 `enrich_narrative`): an optional pass, off by default
(settings `limits.enrich_narrative`), with its own tier (`tiers.enrichment`).

Each drafted scene is rewritten with sensory detail and emotional depth before anything
downstream sees it, so the enriched text is what is extracted, assembled, validated,
committed and exported. Enrichment only adds: an answer that is shorter than the draft, or
that breaks the degeneration guard when the draft did not, is discarded and the draft kept.
"""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from core.prose import measure
from core.settings import ProseThresholds
from prompts import render_messages
from tasks.drafting import clean_prose
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
ENRICHMENT_TIER = "enrichment"


@llm_task("enrich_narrative", tier=ENRICHMENT_TIER)
def enrich_scene(services: Services, scene: ContentRef, genre: str, chapter_number: int,
                 scene_number: int, chapter_summary: str,
                 target_words: int, thresholds: ProseThresholds) -> ContentRef:
    """The enriched scene (or the draft itself when the enrichment is worse)."""
    log = get_run_logger()
    draft = services.content.get_text(scene)
    messages = render_messages("narrative/enrich", genre=genre, chapter_number=chapter_number,
                               scene_number=scene_number, chapter_summary=chapter_summary, scene_text=draft)
    enriched = clean_prose(services.llm.text(ENRICHMENT_TIER, messages, purpose="enrich_narrative"))
    before, after = measure(draft, target_words, thresholds), measure(enriched, target_words, thresholds)
    if after.words < before.words:
        log.warning("chapter %d scene %d: enrichment cut the scene (%d -> %d words); keeping the draft",
                    chapter_number, scene_number, before.words, after.words)
        return scene
    if after.failures and not before.failures:
        log.warning("chapter %d scene %d: enrichment fails the degeneration guard (%s); keeping the draft",
                    chapter_number, scene_number, "; ".join(after.failures))
        return scene
    log.info("chapter %d scene %d: enriched (%d -> %d words)", chapter_number, scene_number, before.words, after.words)
    return services.content.put_text("enriched", f"chapter_{chapter_number:03d}/scene_{scene_number:02d}_{scene.sha256[:12]}",
                               enriched)
