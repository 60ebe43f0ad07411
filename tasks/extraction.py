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
from tasks.policy import cached_task
from tasks.runtime import runtime

EMBEDDED_EXTRACTION_MAX_TOKENS = 512


@cached_task("extract_scene")
def extract_scene(scene: ContentRef, chapter_number: int, scene_number: int, known_names: tuple[str, ...],
                  llm: str) -> ContentRef:
    rt = runtime()
    text = rt.content.get_text(scene)
    extraction = rt.gateway.structured(
        "small",
        render_messages("knowledge/extraction", scene_text=text, chapter_number=chapter_number,
                        scene_number=scene_number, known_names=known_names),
        SceneExtraction, purpose="extract_scene",
        max_tokens=EMBEDDED_EXTRACTION_MAX_TOKENS if rt.settings.embedded_tier("small") else None,
    )
    name = f"chapter_{chapter_number:03d}/scene_{scene_number:02d}_{scene.sha256[:12]}"
    return rt.content.put_json("extracted", name, extraction)
