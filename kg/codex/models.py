"""What a codex page shows, as pydantic models: built from the graph (kg.codex.novel,
kg.codex.dialogue), rendered by kg.codex.render. One page model for a book and for a
conversation: the story's time axis is its chapters or the conversation's turns.

A relationship has two names here: its `label` (the type, with the model's own words for a
RELATES_TO) for the hover and the side panel, and its `caption`, drawn on the canvas, which
is the label itself when it is at most CAPTION_LIMIT characters and otherwise a word-boundary
cut of it ending in an ellipsis (`relationship_caption`), so an extracted type that is a whole
sentence does not run across the picture. The cut is written here rather than taken from
`textwrap.shorten`, which breaks only at spaces: for LOVES_HER_BROTHER_BUT_RESENTS_HIS_SUCCESS
or a camel-case type it gives nothing but the ellipsis.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kg import vocabulary as vocab

Axis = Literal["chapter", "turn"]
#: The longest label drawn on the graph's canvas, ellipsis included.
CAPTION_LIMIT = 40
ELLIPSIS = "\u2026"
#: Where a label may be cut: before a run of spaces, underscores, hyphens or slashes, and
#: between a lower-case letter (or digit) and the capital that starts the next camel-case word.
_WORD_BREAK = re.compile(r"[\s_\-/]+|(?<=[a-z0-9])(?=[A-Z])")
_TRAILING = " _-/,;:."


def relationship_label(rel_type: str, raw_type: str | None) -> str:
    """The full name of a relationship: its type, and for the catch-all RELATES_TO the words
    the model used ("RELATES_TO (mentor of)")."""
    return f"{rel_type} ({raw_type})" if rel_type == vocab.RELATES_TO and raw_type else rel_type


def shorten_label(text: str, limit: int = CAPTION_LIMIT) -> str:
    """`text` on one line (whitespace runs become one space) and, when longer than `limit`,
    cut at the last word break that leaves room for the ellipsis, separators and stray
    punctuation before the cut dropped; one word longer than `limit` is cut inside it."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    breaks = [m.start() for m in _WORD_BREAK.finditer(text) if 0 < m.start() < limit]
    kept = text[: breaks[-1]].rstrip(_TRAILING) if breaks else ""
    return (kept or text[: limit - 1]) + ELLIPSIS


def relationship_caption(rel_type: str, raw_type: str | None, limit: int = CAPTION_LIMIT) -> str:
    """What the canvas draws for a relationship: its full label when that fits in `limit`;
    otherwise, cut to fit, the model's own words for a RELATES_TO (they say what the relation
    is; the catch-all type does not) or the type itself."""
    label = relationship_label(rel_type, raw_type)
    if len(" ".join(label.split())) <= limit:
        return shorten_label(label, limit)
    return shorten_label(raw_type if rel_type == vocab.RELATES_TO and raw_type else rel_type, limit)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StatusSpan(_Model):
    """`status` holds from `start` through `end` (inclusive; None: still)."""

    status: str
    start: int
    end: int | None = None
    quote: str | None = Field(None, description="the words that tell the change")


class Evidence(_Model):
    """One fact about an entity and where the text states it."""

    where: str = Field(description="'ch 2 sc 1', 'story bible', 'turn 14'")
    statement: str
    quote: str | None = None
    at: int | None = Field(None, description="chapter or turn, for ordering")


class EntityCard(_Model):
    id: str
    anchor: str
    name: str
    kind: str
    aliases: list[str] = Field(default_factory=list)
    description: str = ""
    traits: list[str] = Field(default_factory=list)
    fields: list[tuple[str, str]] = Field(
        default_factory=list, description="sheet fields: role, motivation, ..."
    )
    provisional: bool = False
    statuses: list[StatusSpan] = Field(default_factory=list)
    first: str = Field("", description="where it first appears, in words")
    first_quote: str | None = None
    appears_in: list[int] = Field(default_factory=list, description="chapters (turns) it is in")
    relations: list[str] = Field(
        default_factory=list, description="its relationships as of the page, in words"
    )
    facts: list[Evidence] = Field(default_factory=list)
    findings: list[str] = Field(default_factory=list, description="QA findings that name it")


class EntitySection(_Model):
    title: str
    anchor: str
    cards: list[EntityCard]


class GraphNode(_Model):
    id: str
    name: str
    kind: str
    anchor: str
    first: int | None = None
    statuses: list[StatusSpan] = Field(default_factory=list)
    flagged: bool = False


class EdgeEvent(_Model):
    at: int | None = None
    where: str
    what: str
    quote: str | None = None


class GraphEdge(_Model):
    id: str
    source: str
    target: str
    type: str
    label: str = Field(description="the full type, shown on hover and in the side panel")
    caption: str = Field(
        description=f"the label drawn on the canvas, at most {CAPTION_LIMIT} characters"
    )
    #: [start, end): active from `start` until it ended in `end` (None: still active).
    spans: list[tuple[int, int | None]]
    ended_by: str | None = Field(None, description="what ended it, in words")
    weight: float | None = None
    events: list[EdgeEvent] = Field(default_factory=list)


class CodexGraph(_Model):
    axis: Axis
    first: int
    last: int
    nodes: list[GraphNode] = Field(default_factory=list)
    edges: list[GraphEdge] = Field(default_factory=list)
    labels: dict[str, str] = Field(
        default_factory=dict, description="axis position -> its name ('turn 12')"
    )


class TimelineItem(_Model):
    text: str
    quote: str | None = None
    anchor: str | None = Field(None, description="the card it is about")


class SceneLine(_Model):
    index: int
    title: str = ""
    location: str = ""
    characters: list[str] = Field(default_factory=list)
    summary: str = ""


class TimelineEntry(_Model):
    at: int
    anchor: str
    heading: str = Field(description="'Chapter 3', 'Story bible', 'Turn 12'")
    title: str = ""
    summary: str = ""
    key_events: list[str] = Field(default_factory=list)
    scenes: list[SceneLine] = Field(default_factory=list)
    appears: list[TimelineItem] = Field(
        default_factory=list, description="characters (speakers) in it"
    )
    mentioned: list[TimelineItem] = Field(
        default_factory=list, description="places, items and the rest"
    )
    new_entities: list[TimelineItem] = Field(default_factory=list)
    status_changes: list[TimelineItem] = Field(default_factory=list)
    new_relationships: list[TimelineItem] = Field(default_factory=list)
    ended_relationships: list[TimelineItem] = Field(default_factory=list)
    milestones: list[TimelineItem] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list, description="quality flags of the chapter")
    findings: list[str] = Field(default_factory=list, description="QA findings dated in it")


class QualityChapter(_Model):
    """A chapter's row of its quality table (.saga/quality/chapter_NNN.json)."""

    chapter: int
    title: str = ""
    values: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return bool(self.flags)


class FindingView(_Model):
    check: str
    severity: str
    message: str
    chapters: list[int] = Field(default_factory=list)
    entities: list[TimelineItem] = Field(default_factory=list)


class CodexStats(_Model):
    entities: int = 0
    relationships: int = 0
    chapters: int = 0


class CodexPage(_Model):
    kind: Literal["novel", "dialogue"]
    title: str
    subtitle: str = ""
    as_of: int = Field(description="the last chapter (turn) the page shows")
    graph: CodexGraph
    sections: list[EntitySection] = Field(default_factory=list)
    timeline: list[TimelineEntry] = Field(default_factory=list)
    quality: list[QualityChapter] = Field(default_factory=list)
    quality_columns: list[str] = Field(default_factory=list)
    findings: list[FindingView] = Field(default_factory=list)
    qa_run_at: str | None = Field(
        None, description='which QA run the marked findings are of ("after chapter 4")'
    )
    notes: list[str] = Field(
        default_factory=list, description="what the page leaves out, said plainly"
    )
    stats: CodexStats = Field(default_factory=CodexStats)
