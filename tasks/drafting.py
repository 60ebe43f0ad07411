"""Scene drafting stage: prose for one scene with the narrative model."""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from core.errors import LLMBadOutputError
from core.runtime import runtime
from prompts import render_messages
from prompts.narrative.models import SceneDetail
from tasks.policy import cached_task

WORDS_PER_TOKEN = 0.75


def clean_prose(text: str) -> str:
    """Strip what chat models wrap prose in (code fences, 'Here is the scene:' lines)."""
    lines = [line for line in text.strip().splitlines() if not line.strip().startswith("```")]
    if lines and lines[0].lower().rstrip(":").startswith(("here is", "here's", "sure")):
        lines = lines[1:]
    return "\n".join(lines).strip()


@cached_task("draft_scene")
def draft_scene(
    title: str, genre: str, chapter_number: int, scene_number: int, scene_count: int, scene: SceneDetail,
    context: ContentRef, previous_scene_tail: str, guidance: str, iteration: int, llm: str,
) -> ContentRef:
    rt = runtime()
    target_tokens = rt.settings.limits.scene_token_target
    messages = render_messages(
        "narrative/scene_draft", title=title, genre=genre, chapter_number=chapter_number,
        scene_number=scene_number, scene_count=scene_count, scene=scene, context=rt.content.get_text(context),
        previous_scene_tail=previous_scene_tail, guidance=guidance,
        target_words=int(target_tokens * WORDS_PER_TOKEN),
    )
    text = clean_prose(rt.gateway.text("narrative", messages, purpose="draft_scene",
                                       max_tokens=int(target_tokens * 1.5)))
    if not text:
        raise LLMBadOutputError(f"the model returned an empty draft for chapter {chapter_number} scene {scene_number}",
                                hint="check the narrative tier's model")
    get_run_logger().info("chapter %d: drafted scene %d/%d (%d words)", chapter_number, scene_number, scene_count,
                          len(text.split()))
    return rt.content.put_text("scenes", f"chapter_{chapter_number:03d}/iter_{iteration}/scene_{scene_number:02d}", text)
