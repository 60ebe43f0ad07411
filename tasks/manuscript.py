"""Importing an existing manuscript: split a markdown file into chapters and scenes, and
turn what extraction found into initialization artifacts (the story bible's first version).

Splitting rules (stated in the README): chapters start at markdown headings. With two or
more level-2 headings (`## ...`), those are the chapters and a level-1 heading is the book's
title (the layout `exports/manuscript.md` has); otherwise level-1 headings are the chapters.
Within a chapter, a line of `***`, `* * *` or `---` separates scenes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, Field

from core.content import ContentRef
from core.errors import InvalidInputError, LLMBadOutputError
from kg import vocabulary as vocab
from prompts.initialization.models import (
    ActOutline,
    ChapterOutline,
    ChapterOutlines,
    CharacterSheet,
    CharacterSheets,
    GlobalOutline,
    OutlineLocation,
    OutlineRelationship,
    OutlineRelationships,
)
from prompts.knowledge.models import ChapterSummary, SceneExtraction
from tasks.persist import InitArtifacts
from tasks.services import Services

_HEADING = re.compile(r"^(#{1,2})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_SCENE_BREAK = re.compile(r"^\s*(?:\*\s*\*\s*\*|-{3,}|_{3,})\s*$", re.MULTILINE)
_CHAPTER_PREFIX = re.compile(
    r"^\s*chapter\s+(?:\d+|[ivxlc]+)\s*[:.\-\u2013\u2014]?\s*", re.IGNORECASE
)
MAX_CHARACTERS = 12
MAX_LOCATIONS = 6
MAX_RELATIONSHIPS = 8


class ManuscriptChapter(BaseModel):
    number: int = Field(ge=1)
    title: str
    scenes: list[str] = Field(min_length=1)


class Manuscript(BaseModel):
    title: str
    chapters: list[ManuscriptChapter] = Field(min_length=1)
    preamble: str = Field(
        "",
        description="text before the first chapter heading (a dedication, an epigraph, a "
        "prologue without a heading): not imported, so the import says so",
    )


def split_manuscript(text: str, fallback_title: str) -> Manuscript:
    """Chapters (by heading) and scenes (by scene-break line); InvalidInputError if none."""
    text = text.removeprefix("\ufeff")  # a byte-order mark would hide the first heading
    headings = list(_HEADING.finditer(text))
    level2 = [h for h in headings if h.group(1) == "##"]
    chapter_level = "##" if len(level2) >= 2 else "#"
    title_heading = (
        next((h for h in headings if h.group(1) == "#"), None) if chapter_level == "##" else None
    )
    starts = [h for h in headings if h.group(1) == chapter_level]
    chapters: list[ManuscriptChapter] = []
    for index, heading in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        body = text[heading.end() : end]
        if (
            chapter_level == "##"
            and title_heading is not None
            and title_heading.start() > heading.start()
        ):
            body = body[: max(0, title_heading.start() - heading.end())]
        scenes = [s.strip() for s in _SCENE_BREAK.split(body) if s.strip()]
        if not scenes:
            continue
        title = _CHAPTER_PREFIX.sub("", heading.group(2)).strip() or f"Chapter {len(chapters) + 1}"
        chapters.append(ManuscriptChapter(number=len(chapters) + 1, title=title, scenes=scenes))
    if not chapters:
        raise InvalidInputError(
            "the manuscript has no chapters: no markdown heading followed by text was found",
            hint="start each chapter with a heading line such as '# Chapter 1: The Letter'",
        )
    book_title = title_heading.group(2).strip() if title_heading is not None else fallback_title
    before = text[: starts[0].start()]
    if title_heading is not None and title_heading.start() < starts[0].start():
        before = before[: title_heading.start()] + before[title_heading.end() :]
    return Manuscript(title=book_title, chapters=chapters, preamble=before.strip())


def imported_artifacts(
    services: Services,
    title: str,
    genre: str,
    chapters: Sequence[ManuscriptChapter],
    extractions: Sequence[Sequence[SceneExtraction]],
    summaries: Sequence[ChapterSummary],
) -> InitArtifacts:
    """The story bible's first version from what extraction found, as initialization artifacts."""
    people, places, rels = _found_world(extractions)
    characters = people[:MAX_CHARACTERS]
    if not characters:
        found = sum(len(scene.entities) for chapter in extractions for scene in chapter)
        raise LLMBadOutputError(
            f"extraction found no character in the manuscript ({found} entities, none of kind "
            "Character)",
            hint="the model is too weak for an import: set OPENAI_BASE_URL to a "
            "stronger endpoint (or tiers.small.models)",
        )
    logline = summaries[0].summary if summaries else title
    outline = GlobalOutline(
        title=title,
        logline=logline,
        setting=", ".join(p.name for p in places),
        themes=[],
        acts=[{"number": 1, "summary": " ".join(s.summary for s in summaries)}],
    )
    act = ActOutline(
        summary=outline.acts[0].summary,
        key_events=[e for s in summaries for e in s.key_events][:12],
    )
    chapter_outlines = ChapterOutlines(
        chapters=[
            ChapterOutline(
                number=c.number, title=c.title, summary=s.summary, key_beats=s.key_events[:8]
            )
            for c, s in zip(chapters, summaries, strict=True)
        ]
    )
    world = OutlineRelationships(
        relationships=rels[:MAX_RELATIONSHIPS],
        locations=places[:MAX_LOCATIONS],
    )
    store = services.content
    return InitArtifacts(
        characters=store.put_json(
            "character_sheets", "characters", CharacterSheets(characters=characters)
        ),
        global_outline=store.put_json("global_outline", "outline", outline),
        act_outlines=(store.put_json("act_outlines", "act_01", act),),
        chapter_outlines=(store.put_json("chapter_outlines", "act_01", chapter_outlines),),
        relationships=store.put_json("outline_relationships", "relationships", world),
    )


def _found_world(
    extractions: Sequence[Sequence[SceneExtraction]],
) -> tuple[list[CharacterSheet], list[OutlineLocation], list[OutlineRelationship]]:
    """The characters, locations and relationships extraction found, one each a normalized
    name (a relationship: its source, type and target), in the order first found. A
    character's traits and description gather over its scenes; a location's and a
    relationship's are their first."""
    people: dict[str, CharacterSheet] = {}
    places: dict[str, OutlineLocation] = {}
    rels: dict[tuple[str, str, str], OutlineRelationship] = {}
    for chapter in extractions:
        for scene in chapter:
            for found in scene.entities:
                key = vocab.normalize_name(found.name)
                if found.kind == "Character":
                    known = people.get(key)
                    traits = list(
                        dict.fromkeys([*(known.traits if known else []), *found.trait_names])
                    )[:8]
                    description = max(
                        (known.description if known else ""), found.description, key=len
                    )
                    people[key] = CharacterSheet(
                        name=known.name if known else found.name.strip(),
                        role="",
                        description=description,
                        traits=traits,
                    )
                elif found.kind == "Location" and key not in places:
                    places[key] = OutlineLocation(
                        name=found.name.strip(), description=found.description
                    )
            for rel in scene.relationships:
                key3 = (
                    vocab.normalize_name(rel.source),
                    rel.type.upper(),
                    vocab.normalize_name(rel.target),
                )
                rels.setdefault(
                    key3,
                    OutlineRelationship(
                        source=rel.source,
                        target=rel.target,
                        type=rel.type,
                        description=rel.description,
                    ),
                )
    return list(people.values()), list(places.values()), list(rels.values())


def scene_refs(services: Services, chapter: ManuscriptChapter) -> tuple[ContentRef, ...]:
    store = services.content
    return tuple(
        store.put_text("imported", f"chapter_{chapter.number:03d}/scene_{i:02d}", text)
        for i, text in enumerate(chapter.scenes, start=1)
    )
