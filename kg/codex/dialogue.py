"""The codex of a sidecar conversation: its entities, its relations with their event history,
its milestones, as the same page model as a book's (the time axis is the conversation's
committed turns).

One read transaction of five statements, each on the indexed `conversation_id`
(kg/codex/cypher.py), its rows as frozen models (kg.codex.records.read_dialogue_tx). A
relation is never deleted in the sidecar, only ended, so the graph draws every relation the
conversation ever had: active ones solid, ended ones dashed, each with its events (EVOLVE,
REPLACE, DELETE, with weights and the quoted words of the turn).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from core.errors import InvalidInputError
from kg import vocabulary as vocab
from kg.codex.models import (
    CodexGraph,
    CodexPage,
    CodexStats,
    EdgeEvent,
    EntityCard,
    EntitySection,
    Evidence,
    GraphEdge,
    GraphNode,
    TimelineEntry,
    TimelineItem,
    relationship_caption,
    relationship_label,
)
from kg.codex.novel import SECTIONS, anchor
from kg.codex.records import (
    DialogueEntityRow,
    DialogueEventRow,
    DialogueRead,
    DialogueRelationRow,
    read_dialogue_tx,
)
from kg.ports import GraphReader


def _turn(turn_id: object) -> str:
    return f"turn {turn_id}"


def _event_text(event: DialogueEventRow) -> str:
    action = event.action or ""
    weights = ""
    if event.weight_after is not None:
        before = event.weight_before
        weights = (
            f" {before:.2f}\u2192{event.weight_after:.2f}"
            if before is not None
            else f" at {event.weight_after:.2f}"
        )
    if action == "REPLACE":
        what = f"REPLACE {event.from_type or 'any'} with {event.to_type}"
    elif action == "DELETE":
        what = f"DELETE {event.from_type}"
    else:
        what = f"{action} {event.to_type or event.from_type or ''}".strip()
    reason = f" ({event.reason})" if event.reason else ""
    return f"{what}{weights}{reason}"


@dataclass
class _Page:
    """What the page is built from: the conversation's entities (by id) with their names and
    anchors, its turns (seq -> turn id, as the rows tell it), and what accumulates per
    entity and per turn."""

    entities: dict[str, DialogueEntityRow]
    names: dict[str, str]
    anchors: dict[str, str]
    turn_of: dict[int, str]
    facts: dict[str, list[Evidence]] = field(default_factory=lambda: defaultdict(list))
    relation_lines: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    timeline: dict[int, TimelineEntry] = field(default_factory=dict)

    @classmethod
    def of(cls, read: DialogueRead) -> _Page:
        entities = {e.entity_id: e for e in read.entities}
        turn_of: dict[int, str] = {}
        for row in (*read.events, *read.milestones):
            if row.seq is not None:
                turn_of[row.seq] = str(row.turn_id)
        for e in read.entities:
            for seq, turn in ((e.first_seq, e.first_turn), (e.last_seq, e.last_turn)):
                if seq is not None:
                    turn_of.setdefault(seq, str(turn))
        for r in read.relations:
            for seq, turn in ((r.since_seq, r.since_turn), (r.ended_seq, r.ended_turn)):
                if seq is not None:
                    turn_of.setdefault(seq, str(turn))
        return cls(
            entities=entities,
            names={eid: e.name or eid for eid, e in entities.items()},
            anchors={eid: anchor("e", eid) for eid in entities},
            turn_of=turn_of,
        )

    def entry(self, seq: int) -> TimelineEntry:
        if seq not in self.timeline:
            turn = self.turn_of.get(seq, str(seq))
            self.timeline[seq] = TimelineEntry(at=seq, anchor=f"t-{seq}", heading=f"Turn {turn}")
        return self.timeline[seq]


def build_dialogue_codex(reader: GraphReader, conversation_id: str) -> CodexPage:
    """The codex page of one sidecar conversation."""
    read = reader.execute_read(read_dialogue_tx, conversation_id)
    if read.head is None and not read.entities:
        raise InvalidInputError(
            f"conversation {conversation_id!r} has no memory in this graph",
            hint="check --conversation-id and --project-dir (or NEO4J_URI)",
        )
    page = _Page.of(read)
    remembered = read.head.memory_seq if read.head else 0
    committed = read.head.turn_seq if read.head else 0
    last = max([committed, *page.turn_of], default=0)
    edges = _relations(page, read)
    _milestones(page, read)
    sections = _sections(page)
    turn_of = page.turn_of
    graph = CodexGraph(
        axis="turn",
        first=min([*turn_of, 1]),
        last=max(last, 1),
        labels={str(seq): _turn(turn) for seq, turn in sorted(turn_of.items())},
        nodes=[
            GraphNode(
                id=eid,
                name=page.names[eid],
                kind=e.kind or vocab.FALLBACK_LABEL,
                anchor=page.anchors[eid],
                first=e.first_seq,
            )
            for eid, e in page.entities.items()
        ],
        edges=edges,
    )
    return CodexPage(
        kind="dialogue",
        title=f"Conversation {conversation_id}",
        subtitle=f"{remembered} turns remembered, {committed} committed with their facts",
        as_of=graph.last,
        graph=graph,
        sections=sections,
        timeline=[page.timeline[s] for s in sorted(page.timeline)],
        notes=list(read.truncated),
        stats=CodexStats(entities=len(page.entities), relationships=len(edges), chapters=committed),
    )


def _relations(page: _Page, read: DialogueRead) -> list[GraphEdge]:
    """Each relation on the timeline (begun, ended) and as evidence of both its entities; then
    one drawn edge per (source, type, target): a relation ended and started again is one
    line with several spells, not a fan of parallel edges."""
    events_of: dict[str, list[DialogueEventRow]] = defaultdict(list)
    enders: dict[tuple[str, str, int], list[DialogueEventRow]] = defaultdict(list)
    for event in read.events:
        events_of[event.rel_id].append(event)
        if event.action in ("REPLACE", "DELETE") and event.seq is not None:
            enders[(event.source, event.target, event.seq)].append(event)
    names, anchors = page.names, page.anchors
    ended_by: dict[DialogueRelationRow, str | None] = {}
    drawn: dict[tuple[str, str, str], list[DialogueRelationRow]] = defaultdict(list)
    for rel in read.relations:
        source, target = rel.source, rel.target
        if source not in page.entities or target not in page.entities:
            continue
        label = relationship_label(rel.type, rel.raw_type)
        drawn[(source, label, target)].append(rel)
        ended = rel.ended_seq
        history = events_of.get(rel.rel_id, [])
        # What ended it: a DELETE logs the ended relation's id; a REPLACE logs the new one's.
        ender = (
            None
            if ended is None
            else next(
                (
                    e
                    for e in enders.get((source, target, ended), [])
                    if e.from_type in (rel.type, None)
                ),
                None,
            )
        )
        ended_by[rel] = (
            None
            if ended is None
            else (_event_text(ender) if ender else "ended") + f" at {_turn(rel.ended_turn)}"
        )
        first_quote = next((e.quote for e in history if e.quote), None)
        text = f"{names[source]} {label} {names[target]}"
        page.entry(rel.since_seq or 0).new_relationships.append(
            TimelineItem(text=text, quote=first_quote, anchor=anchors[source])
        )
        if ended is not None:
            page.entry(ended).ended_relationships.append(
                TimelineItem(
                    text=f"{text} ended",
                    quote=ender.quote if ender else None,
                    anchor=anchors[source],
                )
            )
        for e in history:
            evidence = Evidence(
                where=_turn(e.turn_id),
                statement=f"{_event_text(e)} ({names[source]} \u2192 {names[target]})",
                quote=e.quote,
                at=e.seq,
            )
            page.facts[source].append(evidence)
            if target != source:
                page.facts[target].append(evidence)
    return [_edge(page, key, spells, events_of, ended_by) for key, spells in drawn.items()]


def _edge(
    page: _Page,
    key: tuple[str, str, str],
    spells: list[DialogueRelationRow],
    events_of: dict[str, list[DialogueEventRow]],
    ended_by: dict[DialogueRelationRow, str | None],
) -> GraphEdge:
    """The drawn edge of one (source, type, target), its spells in order; its line on both
    entities' cards."""
    source, label, target = key
    names = page.names
    spells.sort(key=lambda r: (r.since_seq or 0, r.rel_id))
    latest = spells[-1]
    history = sorted(
        (e for r in spells for e in events_of.get(r.rel_id, [])),
        key=lambda e: e.seq or 0,
    )
    state = (
        f"since {_turn(latest.since_turn)}"
        + (f", ended {_turn(latest.ended_turn)}" if latest.ended_seq is not None else "")
        + (f", weight {latest.weight:.2f}" if latest.weight is not None else "")
    )
    if len(spells) > 1:
        state = f"{len(spells)} spells; the latest {state}"
    page.relation_lines[source].append(f"{label} \u2192 {names[target]} ({state})")
    page.relation_lines[target].append(f"{label} \u2190 {names[source]} ({state})")
    return GraphEdge(
        id=anchor("r", "\x1f".join(key)),
        source=source,
        target=target,
        type=latest.type,
        label=label,
        caption=relationship_caption(latest.type, latest.raw_type),
        ended_by=ended_by[latest],
        weight=latest.weight,
        spans=[(r.since_seq or 0, r.ended_seq) for r in spells],
        events=[
            EdgeEvent(at=e.seq, where=_turn(e.turn_id), what=_event_text(e), quote=e.quote)
            for e in history
        ],
    )


def _milestones(page: _Page, read: DialogueRead) -> None:
    """Each milestone on its turn, and as evidence of the entities it names."""
    for m in read.milestones:
        seq = m.seq or 0
        named = [x for x in m.entity_ids if x in page.entities]
        page.entry(seq).milestones.append(
            TimelineItem(
                text=m.text or "",
                quote=m.quote,
                anchor=page.anchors[named[0]] if named else None,
            )
        )
        for eid in named:
            page.facts[eid].append(
                Evidence(
                    where=_turn(m.turn_id), statement=f"milestone: {m.text}", quote=m.quote, at=seq
                )
            )


def _sections(page: _Page) -> list[EntitySection]:
    """The entity cards by section (each entity new on the turn first naming it)."""
    cards: dict[str, list[EntityCard]] = defaultdict(list)
    section_of = {label: key for _, key, labels in SECTIONS for label in labels}
    for eid, e in page.entities.items():
        if e.first_seq is not None:
            page.entry(e.first_seq).new_entities.append(
                TimelineItem(text=f"{page.names[eid]} ({e.kind})", anchor=page.anchors[eid])
            )
        cards[section_of.get(str(e.kind), "other")].append(
            EntityCard(
                id=eid,
                anchor=page.anchors[eid],
                name=page.names[eid],
                kind=e.kind or vocab.FALLBACK_LABEL,
                aliases=list(e.aliases),
                description=e.bio_summary or "",
                traits=list(e.bio_traits),
                fields=[
                    ("first seen", _turn(e.first_turn)),
                    ("last seen", _turn(e.last_turn)),
                    ("turns naming it", str(e.mentions or 0)),
                ],
                first=_turn(e.first_turn) if e.first_turn is not None else "",
                appears_in=[],
                relations=page.relation_lines.get(eid, []),
                facts=sorted(
                    page.facts[eid], key=lambda f: (f.at if f.at is not None else -1, f.statement)
                ),
            )
        )
    return [
        EntitySection(title=title, anchor=key, cards=cards[key])
        for title, key, _ in SECTIONS
        if cards.get(key)
    ]
