"""The codex of a book: the world the chapters built, as of a chapter, as one page model.

One read transaction (kg.codex.records.read_novel_tx: chapters, entities, appearances; the
story relationships and the scenes from the story mirror, kg.mirror, brought current in it),
its rows as frozen models, plus the project's own files (kg.codex.quality: each chapter's
quality table and the newest QA report, whose findings are marked on the page). Everything
is computed in one pass over what was read, so building the page costs what its size
demands (bench/codex_build.py measures it).

What the page says about time follows the graph: an entity is seen as it was after the
chapter (kg.records.props_as_of); a relationship holds in the spans kg.codex.relations
gives it.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.grounding import bare_chapter_title
from kg.codex.models import (
    CodexGraph,
    CodexPage,
    CodexStats,
    EdgeEvent,
    EntityCard,
    EntitySection,
    Evidence,
    FindingView,
    GraphEdge,
    GraphNode,
    SceneLine,
    StatusSpan,
    TimelineEntry,
    TimelineItem,
)
from kg.codex.quality import (
    QualityRow,
    chapter_flags,
    chapter_quality,
    latest_qa_report,
    quality_table,
)
from kg.codex.records import NovelRead, read_novel_tx
from kg.codex.relations import Relation, relationships, span_text
from kg.facts import BIBLE_SOURCES, source_fact
from kg.mirror import MirroredReader, mirror_of
from kg.models import Entity
from kg.records import entity_from_props, props_as_of

#: Entity sections of the page, in order; labels not listed go to "Other entries".
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Characters", "characters", ("Character",)),
    ("Places", "places", ("Location",)),
    ("Items", "items", ("Item",)),
    ("Other entries", "other", ("Event", "Faction", "Lore", "Concept", "Trait")),
)
#: Character sheet fields (the bible's attributes), in the order a writer reads them.
SHEET_FIELDS = ("role", "motivation", "backstory", "voice")


def anchor(prefix: str, key: str) -> str:
    """A stable HTML id for `key` (an entity id, a chapter): readable, unique, safe."""
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[:40]
    return f"{prefix}-{slug}-{hashlib.sha1(key.encode('utf-8', 'surrogatepass')).hexdigest()[:6]}"


def where(chapter: int | None, scene: int | None, source: str = "extraction") -> str:
    if source in BIBLE_SOURCES or not chapter:
        return "story bible"
    return f"ch {chapter}" + (f" sc {scene}" if scene else "")


# --- the page -----------------------------------------------------------------------------------


def _statuses(entity: Entity) -> list[StatusSpan]:
    quotes = {
        (s.value, s.chapter): s.quote for s in entity.sources if s.fact == "status" and s.quote
    }
    return [
        StatusSpan(
            status=i.status,
            start=i.from_chapter,
            end=i.to_chapter,
            quote=quotes.get((i.status, i.from_chapter)),
        )
        for i in entity.status_intervals
    ]


def _sheet_fields(entity: Entity) -> list[tuple[str, str]]:
    def text(value: Any) -> str:
        return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)

    attributes = entity.attributes
    ordered = [k for k in SHEET_FIELDS if k in attributes] + sorted(
        k for k in attributes if k not in SHEET_FIELDS
    )
    return [
        (k.replace("_", " "), text(attributes[k])) for k in ordered if text(attributes[k]).strip()
    ]


def _first_seen(entity: Entity) -> tuple[str, str | None]:
    mentions = sorted(
        (s.chapter or 0, s.scene or 0, s.quote)
        for s in entity.sources
        if s.type not in BIBLE_SOURCES and s.fact in (None, "mention") and s.chapter
    )
    if entity.first_chapter == 0 or any(s.type in BIBLE_SOURCES for s in entity.sources):
        return "story bible", None
    if mentions:
        chapter, scene, quote = mentions[0]
        return where(chapter, scene), quote
    return (f"chapter {entity.first_chapter}", None) if entity.first_chapter else ("", None)


def _section_of(label: str) -> str:
    return next((anchor_ for _, anchor_, labels in SECTIONS if label in labels), "other")


@dataclass(frozen=True)
class _World:
    """The book as of the page's chapter: its entities by id, their names and anchors, and the
    relations between them."""

    entities: dict[str, Entity]
    names: dict[str, str]
    anchors: dict[str, str]
    rels: list[Relation]

    @classmethod
    def of(cls, read: NovelRead) -> _World:
        entities: dict[str, Entity] = {}
        for row in read.entities:
            state = props_as_of(row.props, read.as_of)
            if state is not None:
                entity = entity_from_props(state)
                entities[entity.id or state["id"]] = entity
        names = {eid: e.name for eid, e in entities.items()}
        rels = relationships(
            [r for r in read.relationships if r.source in entities and r.target in entities],
            names,
        )
        return cls(entities, names, {eid: anchor("e", eid) for eid in entities}, rels)


def build_novel_codex(
    reader: MirroredReader, saga_dir: Path, as_of: int | None = None, *, project_name: str = ""
) -> CodexPage:
    """The codex page of the book in `reader`'s graph as of chapter `as_of` (None: the
    latest). `saga_dir` holds the quality tables and the QA reports."""
    read = reader.execute_read(read_novel_tx, as_of, mirror_of(reader))
    world = _World.of(read)
    chapter_titles = {int(c.number or 0): bare_chapter_title(c.title or "") for c in read.chapters}
    qa_run_at, qa_rows = latest_qa_report(saga_dir)
    findings = [_finding(f, world) for f in qa_rows]
    findings_of: dict[str, list[str]] = defaultdict(list)
    for f in qa_rows:
        for eid in f.get("entity_ids") or []:
            findings_of[str(eid)].append(f"{f.get('severity')}: {f.get('message')}")
    quality_rows = chapter_quality(saga_dir, sorted(chapter_titles))
    quality, columns = quality_table(quality_rows, chapter_titles)
    info = read.info
    return CodexPage(
        kind="novel",
        title=str(info.title or project_name or "Untitled"),
        subtitle=" \u2022 ".join(str(x) for x in (info.logline, info.genre) if x),
        as_of=read.as_of,
        graph=_graph(world, read.as_of, findings_of),
        sections=_sections(world, _chapters_of(read, world), findings_of),
        timeline=_timeline(read, world, quality_rows, findings),
        quality=quality,
        quality_columns=columns,
        findings=findings,
        qa_run_at=qa_run_at,
        notes=list(read.truncated),
        stats=CodexStats(
            entities=len(world.entities), relationships=len(world.rels), chapters=len(read.chapters)
        ),
    )


def _finding(f: dict[str, Any], world: _World) -> FindingView:
    """A QA finding (a row of the report) with the entities it names linked to their cards."""
    return FindingView(
        check=str(f.get("check", "")),
        severity=str(f.get("severity", "")),
        message=str(f.get("message", "")),
        chapters=[int(c) for c in f.get("chapters") or []],
        entities=[
            TimelineItem(text=world.names.get(eid, name), anchor=world.anchors.get(eid))
            for eid, name in zip(
                f.get("entity_ids") or [], f.get("entity_names") or [], strict=False
            )
        ],
    )


def _chapters_of(read: NovelRead, world: _World) -> dict[str, set[int]]:
    """The chapters each entity appears in or is mentioned by."""
    in_chapters: dict[str, set[int]] = defaultdict(set)
    for row in (*read.appearances, *read.mentions):
        if row.id in world.entities:
            in_chapters[row.id].add(row.chapter)
    return in_chapters


def _evidence(world: _World) -> tuple[dict[str, list[Evidence]], dict[str, list[str]]]:
    """Every fact of each entity with its evidence, and the lines of its relations."""
    names = world.names
    facts: dict[str, list[Evidence]] = defaultdict(list)
    relation_lines: dict[str, list[str]] = defaultdict(list)
    for eid, entity in world.entities.items():
        for source in entity.sources:
            fact = source_fact(source)
            facts[eid].append(
                Evidence(
                    where=where(fact.chapter, fact.scene, fact.source),
                    statement=fact.statement,
                    quote=fact.quote,
                    at=fact.chapter,
                )
            )
    for rel in world.rels:
        spans = span_text(rel.spans)
        relation_lines[rel.source].append(f"{rel.label} \u2192 {names[rel.target]} ({spans})")
        relation_lines[rel.target].append(f"{rel.label} \u2190 {names[rel.source]} ({spans})")
        for s in rel.statements:
            at = s.chapter
            place = where(at, s.scene, "extraction" if at else "outline")
            for who, statement in (
                (rel.source, f"{rel.label} \u2192 {names[rel.target]}"),
                (rel.target, f"{rel.label} \u2190 {names[rel.source]}"),
            ):
                facts[who].append(Evidence(where=place, statement=statement, quote=s.quote, at=at))
    return facts, relation_lines


def _sections(
    world: _World, in_chapters: dict[str, set[int]], findings_of: dict[str, list[str]]
) -> list[EntitySection]:
    """The entity cards, by section, each section in order of first appearance and name."""
    facts, relation_lines = _evidence(world)
    cards: dict[str, list[EntityCard]] = defaultdict(list)
    for eid, entity in world.entities.items():
        first, first_quote = _first_seen(entity)
        cards[_section_of(entity.label)].append(
            EntityCard(
                id=eid,
                anchor=world.anchors[eid],
                name=entity.name,
                kind=entity.label,
                aliases=entity.aliases,
                description=entity.description,
                traits=entity.traits,
                fields=_sheet_fields(entity),
                provisional=bool(entity.is_provisional),
                statuses=_statuses(entity),
                first=first,
                first_quote=first_quote,
                appears_in=sorted(in_chapters.get(eid, ())),
                relations=relation_lines.get(eid, []),
                facts=sorted(
                    facts[eid],
                    key=lambda f: (f.at if f.at is not None else -1, f.where, f.statement),
                ),
                findings=findings_of.get(eid, []),
            )
        )
    entities = world.entities
    return [
        EntitySection(
            title=title,
            anchor=key,
            cards=sorted(
                cards[key], key=lambda c: (entities[c.id].first_chapter or 0, c.name.casefold())
            ),
        )
        for title, key, _ in SECTIONS
        if cards.get(key)
    ]


def _graph(world: _World, upto: int, findings_of: dict[str, list[str]]) -> CodexGraph:
    """The graph the page draws: every entity, every relation with its spans and history."""
    return CodexGraph(
        axis="chapter",
        first=0,
        last=upto,
        nodes=[
            GraphNode(
                id=eid,
                name=e.name,
                kind=e.label,
                anchor=world.anchors[eid],
                first=e.first_chapter,
                statuses=_statuses(e),
                flagged=eid in findings_of,
            )
            for eid, e in sorted(world.entities.items(), key=lambda item: item[0])
        ],
        edges=[
            GraphEdge(
                id=anchor("r", rel.key()),
                source=rel.source,
                target=rel.target,
                type=rel.type,
                label=rel.label,
                caption=rel.caption,
                spans=rel.spans,
                ended_by=rel.ended_by,
                weight=rel.statements[-1].weight,
                events=[
                    EdgeEvent(
                        at=s.chapter,
                        where=where(s.chapter, s.scene),
                        what=s.description or rel.label,
                        quote=s.quote,
                    )
                    for s in rel.statements
                ],
            )
            for rel in world.rels
        ],
    )


# --- the timeline -------------------------------------------------------------------------------


def _timeline(
    read: NovelRead,
    world: _World,
    quality: dict[int, list[QualityRow]],
    findings: list[FindingView],
) -> list[TimelineEntry]:
    """One entry per chapter (and the story bible's): its scenes, who appears and who is
    new, what changed, the relationships begun and ended, its flags and QA findings."""
    entries = _chapter_entries(read, world)
    _add_cast(entries, read, world)
    _add_relationships(entries, world)
    for number, rows in quality.items():
        if (found := entries.get(number)) is not None:
            found.flags = chapter_flags(rows)
    for finding in findings:
        for number in finding.chapters:
            if (found := entries.get(number)) is not None:
                found.findings.append(f"{finding.severity}: {finding.message}")
    return [entries[n] for n in sorted(entries)]


def _item(
    world: _World, eid: str, text: str | None = None, quote: str | None = None
) -> TimelineItem:
    return TimelineItem(
        text=text or world.names.get(eid, eid), quote=quote, anchor=world.anchors.get(eid)
    )


def _chapter_entries(read: NovelRead, world: _World) -> dict[int, TimelineEntry]:
    """The chapters' entries with their scenes, and the story bible's where it holds anything."""
    entries: dict[int, TimelineEntry] = {}
    for c in read.chapters:
        number = int(c.number or 0)
        entries[number] = TimelineEntry(
            at=number,
            anchor=f"ch-{number}",
            heading=f"Chapter {number}",
            title=bare_chapter_title(c.title or ""),
            summary=c.summary,
            key_events=list(c.key_events),
        )
    bible_entities = [eid for eid, e in world.entities.items() if e.first_chapter == 0]
    if bible_entities or any(0 in rel.chapters for rel in world.rels):
        entries[0] = TimelineEntry(
            at=0,
            anchor="ch-0",
            heading="Story bible",
            title="What the book starts from (the outline and your edits)",
        )
    for scene in read.scenes:
        found = entries.get(scene.chapter)
        if found is not None:
            found.scenes.append(
                SceneLine(
                    index=int(scene.scene or 0),
                    title=scene.title or "",
                    location=scene.location or "",
                    characters=list(scene.characters),
                    summary=scene.summary or "",
                )
            )
    return entries


def _add_cast(entries: dict[int, TimelineEntry], read: NovelRead, world: _World) -> None:
    """Who appears in and is mentioned by each chapter, who is new, whose status changed."""
    entities, names = world.entities, world.names
    by_chapter: dict[int, set[str]] = defaultdict(set)
    for row in read.appearances:
        if row.id in entities:
            by_chapter[row.chapter].add(row.id)
    mentioned: dict[int, set[str]] = defaultdict(set)
    for row in read.mentions:
        if row.id in entities:
            mentioned[row.chapter].add(row.id)
    for number, found in entries.items():
        order = sorted(by_chapter.get(number, ()), key=lambda eid: names[eid].casefold())
        found.appears = [_item(world, eid) for eid in order]
        found.mentioned = [
            _item(world, eid, f"{names[eid]} ({entities[eid].label})")
            for eid in sorted(mentioned.get(number, ()), key=lambda eid: names[eid].casefold())
        ]
    for eid in sorted(entities, key=lambda e: names[e].casefold()):
        entity = entities[eid]
        if (
            entity.first_chapter is not None
            and (found := entries.get(entity.first_chapter)) is not None
        ):
            found.new_entities.append(
                _item(world, eid, f"{entity.name} ({entity.label})", _first_seen(entity)[1])
            )
        for span in _statuses(entity):
            if span.start > 0 and (found := entries.get(span.start)) is not None:
                found.status_changes.append(
                    _item(world, eid, f"{entity.name}: {span.status}", span.quote)
                )


def _add_relationships(entries: dict[int, TimelineEntry], world: _World) -> None:
    """Each relation's spans: begun in the chapter a span starts, ended where it ends."""
    names, anchors = world.names, world.anchors
    for rel in world.rels:
        text = f"{names[rel.source]} {rel.label} {names[rel.target]}"
        for start, end in rel.spans:
            if (found := entries.get(start)) is not None:
                quote = next(
                    (s.quote for s in rel.statements if (s.chapter or 0) == start and s.quote),
                    None,
                )
                found.new_relationships.append(
                    TimelineItem(text=text, quote=quote, anchor=anchors.get(rel.source))
                )
            if end is not None and (found := entries.get(end)) is not None:
                now = f" (now {rel.ended_by.rsplit(' in chapter', 1)[0]})" if rel.ended_by else ""
                found.ended_relationships.append(
                    TimelineItem(text=f"{text} ended{now}", anchor=anchors.get(rel.source))
                )
