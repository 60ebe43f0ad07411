"""Scene drafting stage: prose for one scene with the narrative model, behind the
degeneration guard.

Every draft is measured (core.prose). A draft that breaks the thresholds (settings
`prose`) is drafted again with the narrative tier's anti-repetition sampling
(settings `tiers.narrative.anti_repetition`, sent through the gateway), up to
`prose.max_draft_attempts` drafts; if none comes clean, the cleanest one is kept and the
result says so, so the chapter is flagged instead of silently accepted.

The redraft loop is not a retry loop (no library's): the gateway already retries failed
calls; here every call succeeded, each new draft changes the sampling, and the cleanest of
all drafts is kept, which is not "call again until it succeeds".
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prefect import get_run_logger
from pydantic import BaseModel, Field

from core.content import ContentRef
from core.errors import LLMBadOutputError
from core.prose import ProseMetrics, measure
from core.settings import ProseThresholds, StyleGuide
from prompts import render_messages
from prompts.narrative.models import SceneDetail
from tasks.context import estimate_tokens
from tasks.policy import llm_task
from tasks.services import Services

#: The tier this stage asks (its models' fingerprint is in the stage's cache key).
DRAFT_TIER = "narrative"

WORDS_PER_TOKEN = 0.75
# Chat formatting around each message (role markers, separators), in tokens.
MESSAGE_OVERHEAD_TOKENS = 8


class SceneBrief(BaseModel):
    """Everything a scene prompt carries besides the retrieved world context."""

    title: str
    genre: str
    logline: str = ""
    themes: tuple[str, ...] = ()
    chapter_number: int = Field(ge=1)
    chapter_title: str = ""
    chapter_summary: str = ""
    plan: tuple[SceneDetail, ...] = Field(min_length=1)
    scene_number: int = Field(ge=1)
    previous_text: str = Field(
        "", description="the previous scene's ending, or the previous chapter's for scene 1"
    )
    previous_is_chapter: bool = False
    style: StyleGuide = Field(default_factory=StyleGuide)
    target_words: int = Field(ge=1)

    @property
    def scene(self) -> SceneDetail:
        return self.plan[self.scene_number - 1]


class SceneDraft(BaseModel):
    """One scene's kept draft and what the guard measured on it."""

    ref: ContentRef
    metrics: ProseMetrics
    attempts: int = Field(ge=1)
    anti_repetition: bool = Field(
        description="the kept draft was sampled with anti-repetition penalties"
    )

    @property
    def clean(self) -> bool:
        return self.metrics.clean


def scene_target_words(scene_token_target: int) -> int:
    return int(scene_token_target * WORDS_PER_TOKEN)


def scene_messages(brief: SceneBrief, context: str) -> list[dict[str, str]]:
    return render_messages("narrative/scene_draft", brief=brief, context=context)


def prompt_tokens(messages: list[dict[str, str]]) -> int:
    return sum(estimate_tokens(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def fixed_prompt_tokens(brief: SceneBrief) -> int:
    """Tokens of the scene prompt without the retrieved context: what the context envelope
    must leave room for. The context block's own heading is counted too."""
    return prompt_tokens(scene_messages(brief, "")) + estimate_tokens(
        "What the story world knows so far:\n\n"
    )


#: A Markdown heading line ("## Scene 2", " # CHAPTER ONE"): up to three spaces, 1-6 '#', a space.
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s|$)")
#: A title a small model marks with doubled angle brackets ("<<Remnants from Beyond>>") at the
#: start of a line: a heading in all but its syntax, never prose (a guillemet "«" stays: some
#: languages quote speech with it).
_MARKED_TITLE = re.compile(r"^\s*<<[^<>]{1,200}>>\s*")
#: An HTML tag a chat model writes into prose ("<br><br>", "</p >", '<span class="x">'): only the
#: elements of text markup, lower case, with attributes only as name=value, so that prose with
#: angle brackets ("5 < 7 > 3", "the sign said <CLOSED>", "I <3 you") is never taken for one.
#: A pattern rather than an HTML parser: a parser reads every "<" as markup, and the task here is
#: to leave everything but these tags exactly as written.
_HTML_TAGS = re.compile(
    r"(?: *</?(?:a|b|big|blockquote|br|center|code|div|em|font|h[1-6]|hr|i|li|ol|p|pre|s|small"
    r"|span|strong|sub|sup|u|ul)(?:\s+[a-z-]+=(?:\"[^\"<>]*\"|'[^'<>]*'|[^\s<>]+))*\s*/?> *)+"
)


def _without_html_tags(line: str) -> str:
    """`line` with each run of HTML tags (and the spaces around it) as one space, trimmed."""
    cleaned, tags = _HTML_TAGS.subn(" ", line)
    return cleaned.strip() if tags else line


#: What a model wraps a title line in: emphasis, quotes, guillemets, angle or square brackets.
_TITLE_WRAPPING = "*_\"'“”‘’<>«»[]() "


def _title_key(line: str) -> str:
    """A line reduced to compare with a title: no emphasis marks, quotes or brackets around it
    (a tiny model writes '"The Lost Night"' or '[The Lost Night]'; a "<<...>>" line is gone
    before, `_MARKED_TITLE`), case or leading article."""
    words = line.strip().strip(_TITLE_WRAPPING).strip().rstrip(".").casefold().split()
    if words and words[0] in ("a", "an", "the"):
        words = words[1:]
    return " ".join(words)


def _unmarked_lines(text: str) -> Iterator[str]:
    """The lines of `text` without HTML tags and without a "<<title>>" at their start; a line
    that was only such a title is left out."""
    for raw in text.strip().splitlines():
        line = _without_html_tags(raw)
        if not _MARKED_TITLE.fullmatch(line):
            yield _MARKED_TITLE.sub("", line, count=1)


def clean_prose(text: str, *, titles: tuple[str, ...] = ()) -> str:
    """Strip what chat models wrap prose in: code fences, 'Here is the scene:' lines, HTML tags
    (a run of tags becomes one space; the manuscript is Markdown, where a stray "</p >" is
    markup) and Markdown headings (the chapter file has its own title; a scene's "### CHAPTER
    ONE" or "## Scene 2" would show in the manuscript as a chapter inside the chapter). A line
    that is only one of `titles` (the book's or the chapter's, with or without its article: a
    small model echoes "The Lighthouse's Secret" for "A Lighthouse's Secret") goes too; a
    sentence that names a title stays. A title marked "<<...>>" at the start of a line goes,
    whatever it says, and the prose after it on that line stays."""
    title_keys = {_title_key(title) for title in titles} - {""}
    lines = [
        line
        for line in _unmarked_lines(text)
        if not line.strip().startswith("```")
        and not _HEADING.match(line)
        and _title_key(line) not in title_keys
    ]
    if lines and lines[0].lower().rstrip(":").startswith(("here is", "here's", "sure")):
        lines = lines[1:]
    return "\n".join(lines).strip()


def _cleanest(drafts: list[tuple[str, ProseMetrics, bool]]) -> tuple[str, ProseMetrics, bool]:
    return min(
        drafts,
        key=lambda d: (len(d[1].failures), -d[1].distinct_trigrams, d[1].max_sentence_repeats),
    )


def _log_attempt(
    brief: SceneBrief, attempt: int, attempts: int, metrics: ProseMetrics | None
) -> None:
    """Say how a draft fared: kept, failing the degeneration guard, or without prose (None)."""
    log, chapter, scene = get_run_logger(), brief.chapter_number, brief.scene_number
    again = attempt < attempts
    if metrics is None:
        log.warning(
            "chapter %d scene %d: draft %d has no prose (only a heading or a title)%s",
            chapter,
            scene,
            attempt,
            "; drafting again" if again else "",
        )
    elif metrics.clean:
        log.info(
            "chapter %d: drafted scene %d/%d (attempt %d, %s)",
            chapter,
            scene,
            len(brief.plan),
            attempt,
            metrics.brief(),
        )
    else:
        log.warning(
            "chapter %d scene %d: draft %d fails the degeneration guard (%s); %s",
            chapter,
            scene,
            attempt,
            "; ".join(metrics.failures),
            "drafting again with anti-repetition sampling" if again else "no attempts left",
        )


@llm_task("draft_scene", tier=DRAFT_TIER)
def draft_scene(
    services: Services,
    brief: SceneBrief,
    context: ContentRef,
    iteration: int,
    thresholds: ProseThresholds,
) -> SceneDraft:
    log = get_run_logger()
    target_tokens = services.settings.limits.scene_token_target
    messages = scene_messages(brief, services.content.get_text(context))
    chapter, scene = brief.chapter_number, brief.scene_number
    penalize = services.llm.sends_anti_repetition_first(DRAFT_TIER)
    drafts: list[tuple[str, ProseMetrics, bool]] = []
    empty = 0
    for attempt in range(1, thresholds.max_draft_attempts + 1):
        text = clean_prose(
            services.llm.text(
                DRAFT_TIER,
                messages,
                purpose="draft_scene",
                max_tokens=int(target_tokens * 1.5),
                anti_repetition=penalize,
                # Another take each attempt: the same prompt and sample get the same answer.
                sample=attempt - 1,
            ),
            titles=(brief.title, brief.chapter_title),
        )
        metrics = measure(text, brief.target_words, thresholds) if text else None
        _log_attempt(brief, attempt, thresholds.max_draft_attempts, metrics)
        if metrics is None:
            # Only a heading or the title, which clean_prose takes out (seen with the embedded
            # 135M model): another sample usually writes the scene.
            empty += 1
            continue
        drafts.append((text, metrics, penalize))
        if metrics.clean:
            break
        penalize = True
    if not drafts:
        raise LLMBadOutputError(
            f"the model wrote no prose for chapter {chapter} scene {scene} in {empty} drafts "
            "(only headings or titles)",
            hint="check the narrative tier's model, or raise prose.max_draft_attempts",
        )
    text, metrics, penalized = drafts[-1] if drafts[-1][1].clean else _cleanest(drafts)
    if not metrics.clean:
        log.error(
            "chapter %d scene %d: DEGENERATE after %d drafts, keeping the cleanest (%s)",
            chapter,
            scene,
            len(drafts),
            "; ".join(metrics.failures),
        )
    name = f"chapter_{chapter:03d}/iter_{iteration}/scene_{scene:02d}"
    ref = services.content.put_text("scenes", name, text)
    return SceneDraft(
        ref=ref, metrics=metrics, attempts=len(drafts) + empty, anti_repetition=penalized
    )
