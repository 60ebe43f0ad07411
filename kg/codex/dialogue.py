"""The codex of a sidecar conversation: its entities, its relations with their event history,
its milestones, as the same page model as a book's (the time axis is the conversation's
committed turns).

One read transaction of five statements, each on the indexed `conversation_id`
(kg/codex/cypher.py). A relation is never deleted in the sidecar, only ended, so the graph
draws every relation the conversation ever had: active ones solid, ended ones dashed, each
with its events (EVOLVE, REPLACE, DELETE, with weights and the quoted words of the turn).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from neo4j import ManagedTransaction

from core.errors import InvalidInputError
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
    GraphEdge,
    GraphNode,
    TimelineEntry,
    TimelineItem,
    relationship_caption,
    relationship_label,
)
from kg.codex.novel import SECTIONS, anchor
from kg.store import GraphStore

LIMITS = {"entities": 20_000, "relations": 50_000, "events": 200_000, "milestones": 50_000}


@dataclass
class _Read:
    head: dict[str, Any]
    entities: list[dict[str, Any]]
    relations: list[dict[str, Any]]
    events: list[dict[str, Any]]
    milestones: list[dict[str, Any]]
    truncated: list[str]


def _read_tx(tx: ManagedTransaction, conversation_id: str) -> _Read:
    truncated: list[str] = []

    def rows(name: str, query: str) -> list[dict[str, Any]]:
        found = [
            r.data() for r in tx.run(query, conversation_id=conversation_id, limit=LIMITS[name])
        ]
        if len(found) >= LIMITS[name]:
            truncated.append(f"only the first {LIMITS[name]} {name} are shown")
        return found

    head = tx.run(cq.DIALOGUE_HEAD, conversation_id=conversation_id).single()
    return _Read(
        head=head.data() if head else {},
        entities=rows("entities", cq.DIALOGUE_ENTITIES),
        relations=rows("relations", cq.DIALOGUE_RELATIONS),
        events=rows("events", cq.DIALOGUE_EVENTS),
        milestones=rows("milestones", cq.DIALOGUE_MILESTONES),
        truncated=truncated,
    )


def _turn(turn_id: Any) -> str:
    return f"turn {turn_id}"


def _event_text(event: dict[str, Any]) -> str:
    action = event.get("action") or ""
    weights = ""
    if event.get("weight_after") is not None:
        before = event.get("weight_before")
        weights = (
            f" {before:.2f}\u2192{event['weight_after']:.2f}"
            if before is not None
            else f" at {event['weight_after']:.2f}"
        )
    if action == "REPLACE":
        what = f"REPLACE {event.get('from_type') or 'any'} with {event.get('to_type')}"
    elif action == "DELETE":
        what = f"DELETE {event.get('from_type')}"
    else:
        what = f"{action} {event.get('to_type') or event.get('from_type') or ''}".strip()
    reason = f" ({event['reason']})" if event.get("reason") else ""
    return f"{what}{weights}{reason}"


def build_dialogue_codex(store: GraphStore, conversation_id: str) -> CodexPage:
    """The codex page of one sidecar conversation."""
    read = store.execute_read(_read_tx, conversation_id)
    if not read.head and not read.entities:
        raise InvalidInputError(
            f"conversation {conversation_id!r} has no memory in this graph",
            hint="check --conversation-id and --project-dir (or NEO4J_URI)",
        )
    entities = {str(e["entity_id"]): e for e in read.entities}
    names = {eid: str(e["name"] or eid) for eid, e in entities.items()}
    anchors = {eid: anchor("e", eid) for eid in entities}
    turn_of: dict[int, str] = {}  # seq -> turn id, as the rows tell it
    for row in (*read.events, *read.milestones):
        if row.get("seq") is not None:
            turn_of[int(row["seq"])] = str(row["turn_id"])
    for e in read.entities:
        for seq, turn in ((e["first_seq"], e["first_turn"]), (e["last_seq"], e["last_turn"])):
            if seq is not None:
                turn_of.setdefault(int(seq), str(turn))
    for r in read.relations:
        for seq, turn in ((r["since_seq"], r["since_turn"]), (r["ended_seq"], r["ended_turn"])):
            if seq is not None:
                turn_of.setdefault(int(seq), str(turn))
    last = max([int(read.head.get("turn_seq") or 0), *turn_of], default=0)

    events_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    enders: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for event in read.events:
        events_of[str(event.get("rel_id"))].append(event)
        if event.get("action") in ("REPLACE", "DELETE") and event.get("seq") is not None:
            enders[(str(event.get("source")), str(event.get("target")), int(event["seq"]))].append(
                event
            )
    relations = [
        r for r in read.relations if str(r["source"]) in entities and str(r["target"]) in entities
    ]
    edges = []
    facts: dict[str, list[Evidence]] = defaultdict(list)
    relation_lines: dict[str, list[str]] = defaultdict(list)
    timeline: dict[int, TimelineEntry] = {}

    def entry(seq: int) -> TimelineEntry:
        if seq not in timeline:
            turn = turn_of.get(seq, str(seq))
            timeline[seq] = TimelineEntry(at=seq, anchor=f"t-{seq}", heading=f"Turn {turn}")
        return timeline[seq]

    # One drawn edge per (source, type, target): a relation ended and started again is one
    # line with several spells, not a fan of parallel edges.
    drawn: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for rel in relations:
        source, target = str(rel["source"]), str(rel["target"])
        label = relationship_label(str(rel["type"]), rel["raw_type"])
        drawn[(source, label, target)].append(rel)
        since = int(rel["since_seq"] or 0)
        ended = int(rel["ended_seq"]) if rel["ended_seq"] is not None else None
        history = events_of.get(str(rel["rel_id"]), [])
        # What ended it: a DELETE logs the ended relation's id; a REPLACE logs the new one's.
        ender = (
            None
            if ended is None
            else next(
                (
                    e
                    for e in enders.get((source, target, ended), [])
                    if e.get("from_type") in (rel["type"], None)
                ),
                None,
            )
        )
        rel["ended_by"] = (
            None
            if ended is None
            else (_event_text(ender) if ender else "ended") + f" at {_turn(rel['ended_turn'])}"
        )
        first_quote = next((e.get("quote") for e in history if e.get("quote")), None)
        text = f"{names[source]} {label} {names[target]}"
        entry(since).new_relationships.append(
            TimelineItem(text=text, quote=first_quote, anchor=anchors[source])
        )
        if ended is not None:
            entry(ended).ended_relationships.append(
                TimelineItem(
                    text=f"{text} ended",
                    quote=ender.get("quote") if ender else None,
                    anchor=anchors[source],
                )
            )
        for e in history:
            evidence = Evidence(
                where=_turn(e.get("turn_id")),
                statement=f"{_event_text(e)} ({names[source]} \u2192 {names[target]})",
                quote=e.get("quote"),
                at=e.get("seq"),
            )
            facts[source].append(evidence)
            if target != source:
                facts[target].append(evidence)
    for (source, label, target), spells in drawn.items():
        spells.sort(key=lambda r: (int(r["since_seq"] or 0), str(r["rel_id"])))
        latest = spells[-1]
        history = sorted(
            (e for r in spells for e in events_of.get(str(r["rel_id"]), [])),
            key=lambda e: int(e.get("seq") or 0),
        )
        edges.append(
            GraphEdge(
                id=anchor("r", "\x1f".join((source, label, target))),
                source=source,
                target=target,
                type=str(latest["type"]),
                label=label,
                caption=relationship_caption(str(latest["type"]), latest["raw_type"]),
                ended_by=latest["ended_by"],
                weight=latest["weight"],
                spans=[
                    (
                        int(r["since_seq"] or 0),
                        int(r["ended_seq"]) if r["ended_seq"] is not None else None,
                    )
                    for r in spells
                ],
                events=[
                    EdgeEvent(
                        at=e.get("seq"),
                        where=_turn(e.get("turn_id")),
                        what=_event_text(e),
                        quote=e.get("quote"),
                    )
                    for e in history
                ],
            )
        )
        state = (
            f"since {_turn(latest['since_turn'])}"
            + (f", ended {_turn(latest['ended_turn'])}" if latest["ended_seq"] is not None else "")
            + (f", weight {latest['weight']:.2f}" if latest["weight"] is not None else "")
        )
        if len(spells) > 1:
            state = f"{len(spells)} spells; the latest {state}"
        relation_lines[source].append(f"{label} \u2192 {names[target]} ({state})")
        relation_lines[target].append(f"{label} \u2190 {names[source]} ({state})")

    for m in read.milestones:
        seq = int(m["seq"] or 0)
        named = [str(x) for x in m["entity_ids"] or [] if str(x) in entities]
        entry(seq).milestones.append(
            TimelineItem(
                text=str(m["text"] or ""),
                quote=m["quote"],
                anchor=anchors[named[0]] if named else None,
            )
        )
        for eid in named:
            facts[eid].append(
                Evidence(
                    where=_turn(m["turn_id"]),
                    statement=f"milestone: {m['text']}",
                    quote=m["quote"],
                    at=seq,
                )
            )

    cards: dict[str, list[EntityCard]] = defaultdict(list)
    section_of = {label: key for _, key, labels in SECTIONS for label in labels}
    for eid, e in entities.items():
        first_seq = int(e["first_seq"]) if e["first_seq"] is not None else None
        if first_seq is not None:
            entry(first_seq).new_entities.append(
                TimelineItem(text=f"{names[eid]} ({e['kind']})", anchor=anchors[eid])
            )
        fields = [
            ("first seen", _turn(e["first_turn"])),
            ("last seen", _turn(e["last_turn"])),
            ("turns naming it", str(e["mentions"] or 0)),
        ]
        cards[section_of.get(str(e["kind"]), "other")].append(
            EntityCard(
                id=eid,
                anchor=anchors[eid],
                name=names[eid],
                kind=str(e["kind"] or vocab.FALLBACK_LABEL),
                aliases=[str(a) for a in e["aliases"] or []],
                description=str(e["bio_summary"] or ""),
                traits=[str(t) for t in e["bio_traits"] or []],
                fields=fields,
                first=_turn(e["first_turn"]) if e["first_turn"] is not None else "",
                appears_in=[],
                relations=relation_lines.get(eid, []),
                facts=sorted(
                    facts[eid], key=lambda f: (f.at if f.at is not None else -1, f.statement)
                ),
            )
        )
    sections = [
        EntitySection(title=title, anchor=key, cards=cards[key])
        for title, key, _ in SECTIONS
        if cards.get(key)
    ]
    graph = CodexGraph(
        axis="turn",
        first=min([*turn_of, 1]),
        last=max(last, 1),
        labels={str(seq): _turn(turn) for seq, turn in sorted(turn_of.items())},
        nodes=[
            GraphNode(
                id=eid,
                name=names[eid],
                kind=str(e["kind"] or vocab.FALLBACK_LABEL),
                anchor=anchors[eid],
                first=int(e["first_seq"]) if e["first_seq"] is not None else None,
            )
            for eid, e in entities.items()
        ],
        edges=edges,
    )
    remembered = int(read.head.get("memory_seq") or 0)
    committed = int(read.head.get("turn_seq") or 0)
    return CodexPage(
        kind="dialogue",
        title=f"Conversation {conversation_id}",
        subtitle=f"{remembered} turns remembered, {committed} committed with their facts",
        as_of=graph.last,
        graph=graph,
        sections=sections,
        timeline=[timeline[s] for s in sorted(timeline)],
        notes=read.truncated,
        stats=CodexStats(entities=len(entities), relationships=len(edges), chapters=committed),
    )
