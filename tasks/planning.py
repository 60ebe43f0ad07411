"""Scene planning stage: decompose a chapter outline into scenes (POV, setting, beats)."""

from __future__ import annotations

from collections.abc import Callable

from prefect import get_run_logger
from pydantic import BaseModel, ConfigDict, Field

from core.content import ContentRef
from core.errors import LLMBadOutputError
from core.grounding import distinct_texts, name_problem, normalise, usable_title
from prompts import render_messages
from prompts.initialization.models import ChapterOutline
from prompts.narrative.models import SceneDetail, ScenePlan
from tasks.policy import llm_task
from tasks.services import Services

#: The tier that plans (its models' fingerprint is in the stage's cache key).
PLAN_TIER = "large"
MAX_PLAN_CALLS = 3
#: A setting is a short description ("the lamp room at the top of the lighthouse, at dusk").
SETTING_WORDS = 40


class PlanRequest(BaseModel):
    """What a chapter's scenes are planned from: the stage's parameter (frozen, so Prefect
    hashes its fields, in a stable JSON form, into the cache key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    genre: str
    chapter: ChapterOutline
    scene_count: int = Field(ge=1)
    character_names: tuple[str, ...]
    guidance: str = Field("", description="revision guidance after a rejected draft")
    iteration: int = Field(ge=1)
    writer_guidance: str = Field("", description="the writer's steering (guidance file, redo)")


@llm_task("plan_scenes", tier=PLAN_TIER)
def plan_scenes(services: Services, request: PlanRequest) -> ContentRef:
    """Plan exactly `scene_count` scenes, asking again for any the model left out."""
    title, genre, chapter = request.title, request.genre, request.chapter
    scene_count, character_names = request.scene_count, request.character_names
    guidance, iteration = request.guidance, request.iteration
    writer_guidance = request.writer_guidance
    scenes: list[SceneDetail] = []
    for _ in range(MAX_PLAN_CALLS):
        remaining = scene_count - len(scenes)
        if remaining <= 0:
            break
        plan = services.llm.structured(
            PLAN_TIER,
            render_messages(
                "narrative/scene_plan",
                title=title,
                genre=genre,
                chapter=chapter,
                character_names=character_names,
                guidance=guidance.strip(),
                writer_guidance=writer_guidance,
                planned=[s.title for s in scenes],
                scene_count=remaining,
            ),
            ScenePlan,
            purpose="plan_scenes",
        )
        scenes.extend(plan.scenes[:remaining])
    if len(scenes) < scene_count:
        raise LLMBadOutputError(
            f"the model planned {len(scenes)} of {scene_count} scenes for chapter {chapter.number}",
            hint="use a stronger model for the large tier or fewer --scenes-per-chapter",
        )
    log = get_run_logger()
    scenes, dropped = tidy_plan(scenes, character_names, (title, chapter.title))
    if dropped:
        log.warning(
            "chapter %d: the scene plan's %s not used", chapter.number, "; ".join(dropped[:6])
        )
    log.info("chapter %d: planned %d scenes (iteration %d)", chapter.number, len(scenes), iteration)
    name = f"chapter_{chapter.number:03d}/iter_{iteration}"
    return services.content.put_json("chapter_plan", name, ScenePlan(scenes=scenes))


def _reads_as_person(known: tuple[str, ...], titles: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a name is a bible name, or else reads as one (capitalised, no title, see
    core.grounding.name_problem)."""
    known_names = {normalise(n) for n in known}

    def person(name: str) -> bool:
        return normalise(name) in known_names or (
            any(ch.isupper() for ch in name) and name_problem(name, titles) is None
        )

    return person


def tidy_outline(
    chapter: ChapterOutline, known: tuple[str, ...], titles: tuple[str, ...] = ()
) -> tuple[ChapterOutline, list[str]]:
    """A chapter's outline as the bible keeps it, without what a small model puts where a name,
    a place or a beat goes: a point of view that is a sentence ("This chapter begins with a
    brief description..."), a setting with no words (",1:"), a beat said twice; and what was
    left out, said. The scene plan is tidied the same way (`tidy_plan`)."""
    dropped: list[str] = []
    pov = chapter.pov.strip()
    if pov and not _reads_as_person(known, titles)(pov):
        dropped.append(f"point of view {pov[:40]!r}")
        pov = ""
    setting, problem = usable_title(chapter.setting, "", SETTING_WORDS)
    if problem and chapter.setting.strip():
        dropped.append(f"setting {chapter.setting[:40]!r} ({problem})")
    beats = [b for b in chapter.key_beats if b.strip()]
    # A beat that is a field's name is the template echoed ("Title", "Summary"), not a beat.
    unique = distinct_texts(beats, unwanted=ChapterOutline.model_fields)
    if len(unique) < len(beats):
        dropped.append(
            f"{len(beats) - len(unique)} beat(s) said twice, with no words or a field's name"
        )
    tidy = chapter.model_copy(update={"pov": pov, "setting": setting, "key_beats": unique})
    return tidy, dropped


def tidy_plan(
    scenes: list[SceneDetail],
    known: tuple[str, ...],
    titles: tuple[str, ...] = (),
) -> tuple[list[SceneDetail], list[str]]:
    """The plan without what cannot be a title, a character, a setting or a beat (a small model's
    loops, "2016: 2016: 2016", the book's title taken for a person, "fleets", an earlier scene's
    title again, a beat that is a title or only numbers), so neither the draft's
    prompt nor the plan checks (tasks/validation) go by it; and what was left out, said. A
    bible name always stays; any other character must read as a name (capitalised, see
    core.grounding.name_problem). `titles`: the book's and the chapter's."""
    person = _reads_as_person(known, titles)
    tidy: list[SceneDetail] = []
    dropped: list[str] = []
    for number, scene in enumerate(scenes, 1):
        # A small model titles every scene alike ("Sailing Saga of Lies" three times).
        earlier = [s.title for s in tidy]
        title, problem = usable_title(scene.title, f"Scene {number}", taken=earlier)
        if problem:
            dropped.append(f"scene {number} title {scene.title[:40]!r} ({problem})")
        # A beat that is a title or a numbering ("3.1, 3.2, 3.4") says nothing of what happens.
        beats = distinct_texts(scene.beats, unwanted=(*titles, scene.title))
        if len(beats) < len(scene.beats):
            dropped.append(
                f"scene {number}: {len(scene.beats) - len(beats)} beat(s) said twice, "
                "with no words or a title"
            )
        people = [c for c in scene.characters if person(c)]
        dropped += [
            f"scene {number} character {c[:40]!r}" for c in scene.characters if c not in people
        ]
        pov = scene.pov if person(scene.pov) else ""
        if scene.pov and not pov:
            dropped.append(f"scene {number} point of view {scene.pov[:40]!r}")
        setting, problem = usable_title(scene.setting, "", SETTING_WORDS)
        if problem and scene.setting.strip():
            dropped.append(f"scene {number} setting {scene.setting[:40]!r} ({problem})")
        tidy.append(
            scene.model_copy(
                update={
                    "title": title,
                    "characters": people,
                    "pov": pov,
                    "setting": setting,
                    "beats": beats,
                }
            )
        )
    return tidy, dropped
