"""The codex of a book: the world the chapters built, as of a chapter, as one page model.

One read transaction (kg/codex/cypher.py: chapters, entities, appearances; the story
relationships and the scenes from the story mirror, kg.mirror, brought current in it) plus the project's own files: each chapter's quality table
(`.saga/quality/chapter_NNN.json`) and the newest QA report (`.saga/qa/qa-*.parquet`, whose
findings are marked on the page). Everything is computed in one pass over what was read,
so building the page costs what its size demands (bench/codex_build.py measures it).

What the page says about time follows the graph: an entity is seen as it was after the
chapter (kg.records.props_as_of); a relationship is stated in the chapters that wrote it,
and it ends when the pair is later stated the opposite way (kg.vocabulary.OPPOSITE_REL_TYPES:
friends become enemies) or, for LOCATED_IN, when its source is placed somewhere else: the
same "latest holds" reading the consistency checks and the drafting context use.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from neo4j import ManagedTransaction

from core.errors import InvalidInputError
from kg import cypher as kq
from kg import vocabulary as vocab
from kg.codex import cypher as cq
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
    QualityChapter,
    SceneLine,
    StatusSpan,
    TimelineEntry,
    TimelineItem,
    relationship_caption,
    relationship_label,
)
from kg.commit import NOVEL_INFO_ID
from kg.facts import BIBLE_SOURCES, source_fact
from kg.mirror import StoryMirror, mirror_of
from kg.models import Entity
from kg.records import entity_from_props, props_as_of
from kg.store import GraphStore

#: Caps of the reads: far above any book (a 100-chapter book has a few hundred entities);
#: a graph beyond them gets a page that says what it leaves out instead of a huge one.
LIMITS = {
    "chapters": 5_000,
    "scenes": 50_000,
    "entities": 20_000,
    "relationships": 100_000,
    "appearances": 200_000,
}
#: Entity sections of the page, in order; labels not listed go to "Other entries".
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Characters", "characters", ("Character",)),
    ("Places", "places", ("Location",)),
    ("Items", "items", ("Item",)),
    ("Other entries", "other", ("Event", "Faction", "Lore", "Concept", "Trait")),
)
#: Character sheet fields (the bible's attributes), in the order a writer reads them.
SHEET_FIELDS = ("role", "motivation", "backstory", "voice")
#: Quality-table columns shown first (the rest follow in the file's order).
QUALITY_COLUMNS = (
    "words",
    "distinct_trigrams",
    "max_sentence_repeats",
    "compression_ratio",
    "mean_sentence_words",
    "max_sentence_words",
    "plan_problems",
    "facts_kept",
    "facts_dropped",
    "editor_mean",
    "coherence",
    "prose_quality",
    "plot_advancement",
    "pacing",
    "tone_consistency",
    "drafts",
    "clean",
    "failures",
)
_QA_STAMP = re.compile(r"^qa-(\d{8}T\d{6}Z)$")  # a report from before story-time names
_QA_STORY = re.compile(r"^qa-ch(\d+)-cs(\d+)$")


def anchor(prefix: str, key: str) -> str:
    """A stable HTML id for `key` (an entity id, a chapter): readable, unique, safe."""
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[:40]
    return f"{prefix}-{slug}-{hashlib.sha1(key.encode('utf-8', 'surrogatepass')).hexdigest()[:6]}"


def where(chapter: int | None, scene: int | None, source: str = "extraction") -> str:
    if source in BIBLE_SOURCES or not chapter:
        return "story bible"
    return f"ch {chapter}" + (f" sc {scene}" if scene else "")


# --- reading ------------------------------------------------------------------------------------


@dataclass
class _Read:
    as_of: int
    latest: int
    info: dict[str, Any]
    chapters: list[dict[str, Any]]
    scenes: list[dict[str, Any]]
    entities: list[dict[str, Any]]
    relationships: list[dict[str, Any]]
    appearances: list[dict[str, Any]]
    mentions: list[dict[str, Any]]
    truncated: list[str] = field(default_factory=list)


def _read_tx(tx: ManagedTransaction, as_of: int | None, mirror: StoryMirror) -> _Read:
    row = tx.run(cq.LATEST_CHAPTER).single()
    latest = int(row["latest"]) if row and row["latest"] is not None else 0
    if as_of is not None and as_of > latest:
        written = f"chapters 1-{latest}" if latest else "no chapter yet"
        raise InvalidInputError(
            f"--as-of-chapter {as_of} is past the book: the graph holds {written}"
        )
    upto = latest if as_of is None else as_of
    truncated: list[str] = []

    def capped(name: str, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(found) >= LIMITS[name]:
            truncated.append(f"only the first {LIMITS[name]} {name} are shown")
        return found[: LIMITS[name]]

    def rows(name: str, query: str) -> list[dict[str, Any]]:
        return capped(name, [r.data() for r in tx.run(query, as_of=upto, limit=LIMITS[name])])

    # The story relationships and the scenes are the bulk of a long book's page: they come from
    # the story mirror (kg.mirror), brought up to the newest change-set inside this read, so a
    # codex written after every chapter does not read the whole book's edges again each time.
    mirror.refresh(tx)
    relationships = [
        {
            "source": e.src,
            "target": e.tgt,
            "type": e.type,
            "raw_type": e.props.get("raw_type"),
            "chapter": e.chapter,
            "scene": e.props.get("scene"),
            "quote": e.props.get("quote"),
            "description": e.props.get("description"),
            "weight": e.props.get("weight"),
        }
        for e in mirror.edges_as_of(upto)
    ]
    scenes = [
        {
            "chapter": s.chapter,
            "scene": s.scene if s.scene >= 0 else None,
            "title": s.title or None,
            "location": s.location,
            "characters": list(s.characters),
            "summary": s.summary,
        }
        for s in mirror.scenes_as_of(upto)
    ]
    info_row = tx.run(kq.READ_NOVEL_INFO, id=NOVEL_INFO_ID).single()
    return _Read(
        as_of=upto,
        latest=latest,
        info=dict(info_row["props"]) if info_row else {},
        chapters=[
            c
            for c in rows("chapters", cq.CHAPTERS)
            if isinstance(c["number"], int) and c["number"] <= upto
        ],
        scenes=capped("scenes", scenes),
        entities=rows("entities", cq.ENTITIES),
        relationships=capped("relationships", relationships),
        appearances=rows("appearances", cq.APPEARANCES),
        mentions=rows("appearances", cq.MENTIONS),
        truncated=truncated,
    )


def _quality(saga_dir: Path, chapters: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """Each chapter's quality rows (scene rows, then the chapter row), where the file exists."""
    found: dict[int, list[dict[str, Any]]] = {}
    for number in chapters:
        path = saga_dir / "quality" / f"chapter_{number:03d}.json"
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            rows = [
                {
                    "part": "chapter",
                    "failures": f"unreadable quality table {path.name}",
                    "clean": False,
                }
            ]
        if isinstance(rows, list):
            found[number] = [r for r in rows if isinstance(r, dict)]
    return found


def latest_qa_report(saga_dir: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """(which QA run it is, its findings) from the newest `.saga/qa/qa-chNNNN-csNNNNNN.parquet`.

    The run is named by the chapter it checked through, not by the clock: the codex is the
    same bytes however long the book took to write, or how often it was interrupted. The
    newest is the one `.saga/qa/state.json` names (a rollback can leave a report for a later
    chapter behind), else the highest chapter and change-set; reports named by their UTC
    time (written before story-time names) count as older, and are labelled by the state's
    chapter as before, or by their time without a state."""
    # (story-named, chapter, change-set, UTC time): story-named reports sort after the old ones.
    reports: dict[Path, tuple[int, int, int, str]] = {}
    for p in (saga_dir / "qa").glob("qa-*.parquet"):
        if story := _QA_STORY.match(p.stem):
            reports[p] = (1, int(story.group(1)), int(story.group(2)), "")
        elif old := _QA_STAMP.match(p.stem):
            reports[p] = (0, 0, 0, old.group(1))
    if not reports:
        return None, []
    try:
        state = json.loads((saga_dir / "qa" / "state.json").read_text(encoding="utf-8"))
        current = (1, int(state["through"]), int(state["seq"]), "")
    except (OSError, ValueError, TypeError, KeyError):
        current = None
    path = next((p for p, key in reports.items() if key == current), None) or max(
        reports, key=reports.__getitem__
    )
    story_named, through, _, stamp = reports[path]
    if story_named:
        label = f"after chapter {through}"
    elif current is not None and current[1] > 0:
        label = f"after chapter {current[1]}"
    else:
        label = f"of {datetime.strptime(stamp, '%Y%m%dT%H%M%SZ'):%Y-%m-%d %H:%M} UTC"
    return label, pq.read_table(path).to_pylist()


# --- relationships and their history ------------------------------------------------------------


@dataclass(eq=False)
class _Rel:
    source: str
    target: str
    type: str
    raw_type: str | None
    statements: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[int, int | None]] = field(default_factory=list)
    ended_by: str | None = None

    @property
    def chapters(self) -> list[int]:
        return sorted({int(s["chapter"] or 0) for s in self.statements})

    @property
    def label(self) -> str:
        return relationship_label(self.type, self.raw_type)

    @property
    def caption(self) -> str:
        return relationship_caption(self.type, self.raw_type)

    def key(self) -> str:
        return "\x1f".join((self.source, self.label, self.target))


def _walk(group: list[_Rel], rivals: Callable[[_Rel, _Rel], bool], names: dict[str, str]) -> None:
    """Spans of rels that replace each other: in each chapter, a rel stated there starts (if it
    was not active) and ends every active rival not stated there."""
    chapters: dict[int, list[_Rel]] = defaultdict(list)
    for rel in group:
        for chapter in rel.chapters:
            chapters[chapter].append(rel)
    active: dict[int, int] = {}  # id(rel) -> start
    by_id = {id(rel): rel for rel in group}
    for chapter in sorted(chapters):
        stated = chapters[chapter]
        for rel in stated:
            active.setdefault(id(rel), chapter)
        for rid, start in list(active.items()):
            rel = by_id[rid]
            if any(other is rel for other in stated):
                continue
            winner = next((other for other in stated if rivals(rel, other)), None)
            if winner is not None:
                rel.spans.append((start, chapter))
                rel.ended_by = (
                    f"{names.get(winner.source, winner.source)} {winner.label} "
                    f"{names.get(winner.target, winner.target)} in chapter {chapter}"
                )
                del active[rid]
    for rid, start in active.items():
        by_id[rid].spans.append((start, None))


def relationships(rows: list[dict[str, Any]], names: dict[str, str]) -> list[_Rel]:
    """Rows (one per relationship and chapter) -> one rel per (source, type, target) with its
    statements in order and its active spans."""
    rels: dict[tuple[str, str, str | None, str], _Rel] = {}
    for row in rows:
        raw = row["raw_type"] if row["type"] == vocab.RELATES_TO else None
        key = (row["source"], row["type"], raw, row["target"])
        rel = rels.get(key)
        if rel is None:
            rel = rels[key] = _Rel(row["source"], row["target"], row["type"], raw)
        rel.statements.append(row)
    for rel in rels.values():
        rel.statements.sort(key=lambda s: (s["chapter"] or 0, s["scene"] or 0))
    opposite = vocab.OPPOSITES
    pairs: dict[frozenset[str], list[_Rel]] = defaultdict(list)
    places: dict[str, list[_Rel]] = defaultdict(list)
    alone: list[_Rel] = []
    for rel in rels.values():
        if rel.type in opposite:
            pairs[frozenset((rel.source, rel.target))].append(rel)
        elif rel.type == "LOCATED_IN":
            places[rel.source].append(rel)
        else:
            alone.append(rel)
    for group in pairs.values():
        _walk(group, lambda a, b: b.type in opposite[a.type], names)
    for group in places.values():
        _walk(group, lambda a, b: b.target != a.target, names)
    for rel in alone:
        rel.spans.append((rel.chapters[0], None))
    return sorted(
        rels.values(),
        key=lambda r: (
            r.chapters[0],
            names.get(r.source, r.source),
            r.label,
            names.get(r.target, r.target),
        ),
    )


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


def build_novel_codex(
    store: GraphStore, saga_dir: Path, as_of: int | None = None, *, project_name: str = ""
) -> CodexPage:
    """The codex page of the book in `store` as of chapter `as_of` (None: the latest).
    `saga_dir` holds the quality tables and the QA reports."""
    read = store.execute_read(_read_tx, as_of, mirror_of(store))
    upto = read.as_of
    entities: dict[str, Entity] = {}
    for row in read.entities:
        state = props_as_of(row["props"], upto)
        if state is not None:
            entity = entity_from_props(state)
            entities[entity.id or state["id"]] = entity
    names = {eid: e.name for eid, e in entities.items()}
    anchors = {eid: anchor("e", eid) for eid in entities}
    rels = relationships(
        [r for r in read.relationships if r["source"] in entities and r["target"] in entities],
        names,
    )
    in_chapters: dict[str, set[int]] = defaultdict(set)
    for row in (*read.appearances, *read.mentions):
        if row["id"] in entities and row["chapter"] is not None:
            in_chapters[row["id"]].add(int(row["chapter"]))
    chapter_titles = {int(c["number"]): c["title"] or "" for c in read.chapters}

    qa_run_at, qa_rows = latest_qa_report(saga_dir)
    findings = [
        FindingView(
            check=str(f.get("check", "")),
            severity=str(f.get("severity", "")),
            message=str(f.get("message", "")),
            chapters=[int(c) for c in f.get("chapters") or []],
            entities=[
                TimelineItem(text=names.get(eid, name), anchor=anchors.get(eid))
                for eid, name in zip(
                    f.get("entity_ids") or [], f.get("entity_names") or [], strict=False
                )
            ],
        )
        for f in qa_rows
    ]
    findings_of: dict[str, list[str]] = defaultdict(list)
    for f in qa_rows:
        for eid in f.get("entity_ids") or []:
            findings_of[str(eid)].append(f"{f.get('severity')}: {f.get('message')}")

    # Cards, with every fact's evidence.
    facts: dict[str, list[Evidence]] = defaultdict(list)
    relation_lines: dict[str, list[str]] = defaultdict(list)
    for eid, entity in entities.items():
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
    for rel in rels:
        span_text = _span_text(rel.spans)
        relation_lines[rel.source].append(f"{rel.label} \u2192 {names[rel.target]} ({span_text})")
        relation_lines[rel.target].append(f"{rel.label} \u2190 {names[rel.source]} ({span_text})")
        for s in rel.statements:
            at, scene = s["chapter"], s["scene"]
            place = where(at, scene, "extraction" if at else "outline")
            facts[rel.source].append(
                Evidence(
                    where=place,
                    statement=f"{rel.label} \u2192 {names[rel.target]}",
                    quote=s["quote"],
                    at=at,
                )
            )
            facts[rel.target].append(
                Evidence(
                    where=place,
                    statement=f"{rel.label} \u2190 {names[rel.source]}",
                    quote=s["quote"],
                    at=at,
                )
            )
    cards: dict[str, list[EntityCard]] = defaultdict(list)
    for eid, entity in entities.items():
        first, first_quote = _first_seen(entity)
        cards[_section_of(entity.label)].append(
            EntityCard(
                id=eid,
                anchor=anchors[eid],
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
    sections = [
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

    graph = CodexGraph(
        axis="chapter",
        first=0,
        last=upto,
        nodes=[
            GraphNode(
                id=eid,
                name=e.name,
                kind=e.label,
                anchor=anchors[eid],
                first=e.first_chapter,
                statuses=_statuses(e),
                flagged=eid in findings_of,
            )
            for eid, e in sorted(entities.items(), key=lambda item: item[0])
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
                weight=rel.statements[-1].get("weight"),
                events=[
                    EdgeEvent(
                        at=s["chapter"],
                        where=where(s["chapter"], s["scene"]),
                        what=s["description"] or rel.label,
                        quote=s["quote"],
                    )
                    for s in rel.statements
                ],
            )
            for rel in rels
        ],
    )
    quality_rows = _quality(saga_dir, sorted(chapter_titles))
    timeline = _timeline(read, entities, anchors, rels, names, quality_rows, findings)
    quality, columns = _quality_table(quality_rows, chapter_titles)
    info = read.info
    title = str(info.get("title") or project_name or "Untitled")
    subtitle = " \u2022 ".join(str(x) for x in (info.get("logline"), info.get("genre")) if x)
    return CodexPage(
        kind="novel",
        title=title,
        subtitle=subtitle,
        as_of=upto,
        graph=graph,
        sections=sections,
        timeline=timeline,
        quality=quality,
        quality_columns=columns,
        findings=findings,
        qa_run_at=qa_run_at,
        notes=read.truncated,
        stats=CodexStats(
            entities=len(entities), relationships=len(rels), chapters=len(read.chapters)
        ),
    )


def _span_text(spans: list[tuple[int, int | None]]) -> str:
    parts = []
    for start, end in spans:
        since = "story bible" if start == 0 else f"ch {start}"
        parts.append(f"since {since}" if end is None else f"{since}, ended ch {end}")
    return "; ".join(parts)


def _timeline(
    read: _Read,
    entities: dict[str, Entity],
    anchors: dict[str, str],
    rels: list[_Rel],
    names: dict[str, str],
    quality: dict[int, list[dict[str, Any]]],
    findings: list[FindingView],
) -> list[TimelineEntry]:
    def item(eid: str, text: str | None = None, quote: str | None = None) -> TimelineItem:
        return TimelineItem(text=text or names.get(eid, eid), quote=quote, anchor=anchors.get(eid))

    entries: dict[int, TimelineEntry] = {}
    for c in read.chapters:
        number = int(c["number"])
        entries[number] = TimelineEntry(
            at=number,
            anchor=f"ch-{number}",
            heading=f"Chapter {number}",
            title=c["title"] or "",
            summary=c["summary"] or "",
            key_events=[str(e) for e in c["key_events"] or []],
        )
    bible_entities = [eid for eid, e in entities.items() if e.first_chapter == 0]
    if bible_entities or any(0 in rel.chapters for rel in rels):
        entries[0] = TimelineEntry(
            at=0,
            anchor="ch-0",
            heading="Story bible",
            title="What the book starts from (the outline and your edits)",
        )

    def entry(number: int) -> TimelineEntry | None:
        return entries.get(number)

    for scene in read.scenes:
        found = entry(int(scene["chapter"]))
        if found is not None:
            found.scenes.append(
                SceneLine(
                    index=int(scene["scene"] or 0),
                    title=scene["title"] or "",
                    location=scene["location"] or "",
                    characters=[str(c) for c in scene["characters"] or []],
                    summary=scene["summary"] or "",
                )
            )
    by_chapter: dict[int, set[str]] = defaultdict(set)
    for row in read.appearances:
        if row["id"] in entities:
            by_chapter[int(row["chapter"])].add(row["id"])
    mentioned: dict[int, set[str]] = defaultdict(set)
    for row in read.mentions:
        if row["id"] in entities:
            mentioned[int(row["chapter"])].add(row["id"])
    for number, found in entries.items():
        order = sorted(by_chapter.get(number, ()), key=lambda eid: names[eid].casefold())
        found.appears = [item(eid) for eid in order]
        found.mentioned = [
            item(eid, f"{names[eid]} ({entities[eid].label})")
            for eid in sorted(mentioned.get(number, ()), key=lambda eid: names[eid].casefold())
        ]
    for eid in sorted(entities, key=lambda e: names[e].casefold()):
        entity = entities[eid]
        if entity.first_chapter is not None and (found := entry(entity.first_chapter)) is not None:
            found.new_entities.append(
                item(eid, f"{entity.name} ({entity.label})", _first_seen(entity)[1])
            )
        for span in _statuses(entity):
            if span.start > 0 and (found := entry(span.start)) is not None:
                found.status_changes.append(item(eid, f"{entity.name}: {span.status}", span.quote))
    for rel in rels:
        text = f"{names[rel.source]} {rel.label} {names[rel.target]}"
        for start, end in rel.spans:
            if (found := entry(start)) is not None:
                quote = next(
                    (
                        s["quote"]
                        for s in rel.statements
                        if (s["chapter"] or 0) == start and s["quote"]
                    ),
                    None,
                )
                found.new_relationships.append(
                    TimelineItem(text=text, quote=quote, anchor=anchors.get(rel.source))
                )
            if end is not None and (found := entry(end)) is not None:
                now = f" (now {rel.ended_by.rsplit(' in chapter', 1)[0]})" if rel.ended_by else ""
                found.ended_relationships.append(
                    TimelineItem(text=f"{text} ended{now}", anchor=anchors.get(rel.source))
                )
    for number, rows in quality.items():
        if (found := entry(number)) is not None:
            found.flags = _flags(rows)
    for finding in findings:
        for number in finding.chapters:
            if (found := entry(number)) is not None:
                found.findings.append(f"{finding.severity}: {finding.message}")
    return [entries[n] for n in sorted(entries)]


def _flags(rows: list[dict[str, Any]]) -> list[str]:
    """Why a chapter is flagged: its chapter row's failures (the degeneration guard) and the
    scenes' plan problems."""
    flags = []
    for row in rows:
        part = str(row.get("part", ""))
        if part == "chapter":
            if row.get("clean") is False and row.get("failures"):
                flags += [f for f in str(row["failures"]).split("; ") if f]
        elif row.get("plan_problems"):
            flags.append(f"{part}: {row['plan_problems']}")
    return flags


def _quality_table(
    quality: dict[int, list[dict[str, Any]]], titles: dict[int, str]
) -> tuple[list[QualityChapter], list[str]]:
    chapters: list[QualityChapter] = []
    seen: dict[str, None] = {}
    for number in sorted(quality):
        row = next((r for r in quality[number] if r.get("part") == "chapter"), None)
        if row is None:
            continue
        values = {
            k: v
            for k, v in row.items()
            if k != "part" and (v is None or isinstance(v, str | int | float))
        }
        seen.update(dict.fromkeys(values))
        chapters.append(
            QualityChapter(
                chapter=number,
                title=titles.get(number, ""),
                values=values,
                flags=_flags(quality[number]),
            )
        )
    columns = [c for c in QUALITY_COLUMNS if c in seen] + [
        c for c in seen if c not in QUALITY_COLUMNS
    ]
    return chapters, columns
