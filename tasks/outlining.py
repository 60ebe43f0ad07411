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

from core.grounding import usable_title
from prompts import render_messages
from prompts.initialization.models import ChapterOutline
from prompts.narrative.models import ChapterOutlineRefresh
from tasks.context import estimate_tokens
from tasks.policy import cached_task
from tasks.runtime import runtime

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


@cached_task("generate_chapter_outline")
def generate_chapter_outline(
    title: str, genre: str, number: int, global_outline: str, act_number: int, act: str,
    characters: tuple[str, ...], summaries: tuple[str, ...], planned: ChapterOutline | None, guidance: str, llm: str,
) -> ChapterOutline:
    """The chapter's outline for planning; fields the model leaves blank keep the planned ones."""
    rt = runtime()
    answer = rt.gateway.structured(
        "large",
        render_messages("narrative/chapter_outline", title=title, genre=genre, number=number,
                        global_outline=global_outline, act_number=act_number, act=act, characters=characters,
                        summaries=summaries, planned=planned, guidance=guidance),
        ChapterOutlineRefresh, purpose="chapter_outline",
    )
    base = planned or ChapterOutline(number=number, title=f"Chapter {number}", summary=act or title)
    chapter_title, problem = usable_title(answer.title, base.title)
    if problem and answer.title.strip():
        get_run_logger().warning("chapter %d: the outline's title %r is not used (%s)", number,
                                 answer.title[:80], problem)
    refreshed = ChapterOutline(
        number=number,
        title=chapter_title,
        summary=answer.summary.strip() or base.summary,
        pov=answer.pov.strip() or base.pov,
        setting=answer.setting.strip() or base.setting,
        key_beats=[b for b in answer.key_beats if b.strip()] or base.key_beats,
    )
    get_run_logger().info("chapter %d: outline %s: %s", number, "refreshed" if planned else "written", refreshed.title)
    return refreshed
