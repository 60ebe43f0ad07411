"""Chapter outline stage (spec 001 `generate_chapter_outline`): before a chapter is planned,
its outline is refreshed from the global/act outline, the summaries of the chapters written
so far, the story bible and the writer's guidance. Chapters past the initial plan are
outlined the same way (with no planned outline to start from).

Cached by its inputs: the outline of chapter N is asked again only when an earlier
chapter's summary, the bible's characters, the outline or the guidance changed.

The story so far is the most recent chapter summaries that fit `STORY_SO_FAR_SHARE` of the
large tier's context window (`story_so_far`): a hundred chapters of summaries would outgrow
any window, and the global and act outlines in the same prompt stand for the earlier ones.
The caller logs what was left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger
from pydantic import BaseModel, ConfigDict, Field

from core.grounding import usable_title
from prompts import render_messages
from prompts.initialization.models import ChapterOutline
from prompts.narrative.models import ChapterOutlineRefresh
from tasks.context import estimate_tokens
from tasks.planning import tidy_outline
from tasks.policy import llm_task
from tasks.services import Services

#: The tier that outlines (its models' fingerprint is in the stage's cache key).
OUTLINE_TIER = "large"
#: The share of the large tier's context window the story so far may take in an outline prompt.
STORY_SO_FAR_SHARE = 0.35


def story_so_far(summaries: Sequence[str], budget_tokens: int) -> tuple[tuple[str, ...], int]:
    """The most recent summaries that fit `budget_tokens`, oldest first, and how many older
    ones were left out (0: all of them fit, and the tuple is `summaries` itself)."""
    kept: list[str] = []
    used = 0
    for line in reversed(summaries):
        cost = estimate_tokens(line) + 1
        if used + cost > budget_tokens:
            break
        kept.append(line)
        used += cost
    kept.reverse()
    return tuple(kept), len(summaries) - len(kept)


class OutlineRequest(BaseModel):
    """What a chapter's outline is written from: the stage's parameter (frozen, so Prefect
    hashes its fields, in a stable JSON form, into the cache key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    genre: str
    number: int = Field(ge=1)
    global_outline: str
    act_number: int = Field(ge=1)
    act: str
    characters: tuple[str, ...] = Field(description="the bible's character lines")
    summaries: tuple[str, ...] = Field(description="the story so far (story_so_far), oldest first")
    planned: ChapterOutline | None = Field(None, description="the planned outline, if any")
    guidance: str = Field("", description="the writer's guidance for the chapter")
    earlier_titles: tuple[str, ...] = Field(
        (), description="the titles of the chapters before it, which its own must not repeat"
    )
    character_names: tuple[str, ...] = Field(
        (), description="the bible's character names: a point of view is one, or reads as one"
    )


@llm_task("generate_chapter_outline", tier=OUTLINE_TIER)
def generate_chapter_outline(services: Services, request: OutlineRequest) -> ChapterOutline:
    """The chapter's outline for planning; fields the model leaves blank keep the planned ones."""
    r = request
    answer = services.llm.structured(
        OUTLINE_TIER,
        render_messages(
            "narrative/chapter_outline",
            title=r.title,
            genre=r.genre,
            number=r.number,
            global_outline=r.global_outline,
            act_number=r.act_number,
            act=r.act,
            characters=r.characters,
            summaries=r.summaries,
            planned=r.planned,
            guidance=r.guidance,
        ),
        ChapterOutlineRefresh,
        purpose="chapter_outline",
    )
    number, planned, act, title = r.number, r.planned, r.act, r.title
    base = planned or ChapterOutline(number=number, title=f"Chapter {number}", summary=act or title)
    taken = (title, *r.earlier_titles)
    fallback, _ = usable_title(base.title, f"Chapter {number}", taken=taken)
    chapter_title, problem = usable_title(answer.title, fallback, taken=taken)
    if problem and answer.title.strip():
        get_run_logger().warning(
            "chapter %d: the outline's title %r is not used (%s)",
            number,
            answer.title[:80],
            problem,
        )
    answered, dropped = tidy_outline(
        ChapterOutline(
            number=number,
            title=chapter_title,
            summary=answer.summary,
            pov=answer.pov,
            setting=answer.setting,
            key_beats=answer.key_beats,
        ),
        r.character_names,
        taken,
    )
    if dropped:
        get_run_logger().warning(
            "chapter %d: the outline's %s not used", number, "; ".join(dropped)
        )
    refreshed = answered.model_copy(
        update={
            "summary": answered.summary.strip() or base.summary,
            "pov": answered.pov or base.pov,
            "setting": answered.setting or base.setting,
            "key_beats": answered.key_beats or base.key_beats,
        }
    )
    get_run_logger().info(
        "chapter %d: outline %s: %s", number, "refreshed" if planned else "written", refreshed.title
    )
    return refreshed
