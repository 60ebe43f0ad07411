"""Scene planning stage: decompose a chapter outline into scenes (POV, setting, beats)."""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from core.errors import LLMBadOutputError
from prompts import render_messages
from prompts.initialization.models import ChapterOutline
from prompts.narrative.models import SceneDetail, ScenePlan
from tasks.policy import cached_task
from tasks.runtime import runtime

MAX_PLAN_CALLS = 3


@cached_task("plan_scenes")
def plan_scenes(
    title: str, genre: str, chapter: ChapterOutline, scene_count: int,
    character_names: tuple[str, ...], guidance: str, iteration: int, llm: str, writer_guidance: str = "",
) -> ContentRef:
    """Plan exactly `scene_count` scenes, asking again for any the model left out.

    `guidance` is revision guidance after a rejected draft; `writer_guidance` is the writer's
    own steering for the chapter (guidance/chapter_NNN.md and redo notes)."""
    rt = runtime()
    scenes: list[SceneDetail] = []
    for _ in range(MAX_PLAN_CALLS):
        remaining = scene_count - len(scenes)
        if remaining <= 0:
            break
        extra = "" if not scenes else (
            "\nScenes already planned: " + "; ".join(s.title for s in scenes) + f". Plan the next {remaining}."
        )
        plan = rt.gateway.structured(
            "large",
            render_messages("narrative/scene_plan", title=title, genre=genre, chapter=chapter,
                            character_names=character_names, guidance=(guidance + extra).strip(),
                            writer_guidance=writer_guidance,
                            scene_count=remaining),
            ScenePlan, purpose="plan_scenes",
        )
        scenes.extend(plan.scenes[:remaining])
    if len(scenes) < scene_count:
        raise LLMBadOutputError(f"the model planned {len(scenes)} of {scene_count} scenes for chapter {chapter.number}",
                                hint="use a stronger model for the large tier or fewer --scenes-per-chapter")
    get_run_logger().info("chapter %d: planned %d scenes (iteration %d)", chapter.number, len(scenes), iteration)
    return rt.content.put_json("chapter_plan", f"chapter_{chapter.number:03d}/iter_{iteration}", ScenePlan(scenes=scenes))
