"""Extraction stage: entities, relationships and status changes from one scene.

On the embedded 135M model the answer gets EMBEDDED_EXTRACTION_MAX_TOKENS, half of
`local_max_tokens`: the grammar (core.llm.schemas) then allows one entity, relationship and
status change a scene, with strings long enough for a whole quoted sentence. A configured
endpoint gets the tier's budget. Why (what the longer budget cost and kept):
docs/decisions/extraction-token-budget.md.
"""

from __future__ import annotations

from core.content import ContentRef
from prompts import render_messages
from prompts.knowledge.models import SceneExtraction
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
EXTRACTION_TIER = "small"

EMBEDDED_EXTRACTION_MAX_TOKENS = 512


@llm_task("extract_scene", tier=EXTRACTION_TIER)
def extract_scene(
    services: Services,
    scene: ContentRef,
    chapter_number: int,
    scene_number: int,
    known_names: tuple[str, ...],
) -> ContentRef:
    text = services.content.get_text(scene)
    extraction = services.llm.structured(
        EXTRACTION_TIER,
        render_messages(
            "knowledge/extraction",
            scene_text=text,
            chapter_number=chapter_number,
            scene_number=scene_number,
            known_names=known_names,
        ),
        SceneExtraction,
        purpose="extract_scene",
        max_tokens=(
            EMBEDDED_EXTRACTION_MAX_TOKENS
            if services.settings.embedded_tier(EXTRACTION_TIER)
            else None
        ),
    )
    name = f"chapter_{chapter_number:03d}/scene_{scene_number:02d}_{scene.sha256[:12]}"
    return services.content.put_json("extracted", name, extraction)
