"""Graph QA: read-only checks of the whole story graph, each returning `Finding`s.

Checks (spec 001 section 8.2, plus what SAGA leaves as a stub):

- contradictory_traits: an entity holding both traits of a configured antonym pair, from
  its `traits` list or its HAS_TRAIT relationships (case-insensitive);
- dead_character_acting: an entity whose status is dead from chapter d (status
  intervals, so a later "alive" interval revives it) and that, in a chapter after d, is
  listed in a scene or is the source of an action relationship (ACTION_TYPES:
  travelling, taking part in an event, killing, ...). Being mentioned (a MENTIONS edge,
  someone mourning them) is not acting, so those are not reported;
- dangling_reference: what points at nothing in this layout: an EntityName lookup whose
  entity node is gone (name resolution would follow it into the void), a story
  relationship whose endpoint is not a complete entity (no id/name/label, or not an
  Entity at all) or that lacks its `key`/`chapter`, a relationship dated in a chapter
  that has no Chapter node, and a scene character or location that resolves to no
  entity (by id, name or alias);
- provisional_buildup: more than settings.healing.provisional_alert_ratio of the
  entities still provisional (once the graph has MIN_ENTITIES_FOR_RATIO entities);
- before_first_appearance: a story relationship dated before one of its endpoints'
  first chapter, or a scene that lists a character before its first chapter.

Each finding names the entities (ids and names) and the chapters involved. A graph
written only through `GraphStore.commit_chapter` from consistent deltas yields none.

Two scopes. The whole graph (`run_checks(store, settings)`, the default: the nightly QA and
`python -m flows.maintenance qa`) reads everything once, in one read transaction. A set of
chapters (`chapters=`, what the novel flow runs every few chapters) reads only what those
chapters wrote: their story relationships and scenes (from the story mirror, kg.mirror), the
entities at either end, the entities they touched, and the ones their scenes name (by the
indexed name lookups): the same checks, over what changed, at a cost that does not grow
with the book. What only a whole-graph read can see (name lookups left behind by a write
outside the change-sets, relationships to nodes that are no entity) is the full scope's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from neo4j import ManagedTransaction
from pydantic import BaseModel, ConfigDict, Field

from core.settings import HealingSettings
from kg import cypher
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.mirror import Edge, MirroredReader, StoryMirror, mirror_of
from kg.qa_rows import (
    BrokenRel,
    ChangesetNode,
    ChapterNumber,
    EntityId,
    EntityNode,
    IndexEntry,
    NameLookup,
    ProvisionalCount,
    ProvisionalEntity,
    SceneCast,
    StoryRel,
    TraitEdge,
    parse,
    read,
)
from kg.records import REVISIONS, decode_value, entity_from_props

CheckName = Literal[
    "contradictory_traits",
    "dead_character_acting",
    "dangling_reference",
    "provisional_buildup",
    "before_first_appearance",
]
CHECKS: tuple[CheckName, ...] = (
    "contradictory_traits",
    "dead_character_acting",
    "dangling_reference",
    "provisional_buildup",
    "before_first_appearance",
)
Severity = Literal["error", "warning"]

DEAD_STATUSES: tuple[str, ...] = ("dead", "deceased")
#: Relationship types whose source *does* something in the chapter they are dated.
ACTION_TYPES: tuple[str, ...] = (
    "TRAVELS_TO",
    "PARTICIPATES_IN",
    "KILLED",
    "BETRAYED",
    "PROTECTS",
    "CREATED",
    "USES",
    "SEEKS",
    "LEADS",
    "SERVES",
    "MENTOR_OF",
)
#: Below this many entities a provisional ratio says nothing (a fresh story is all new).
MIN_ENTITIES_FOR_RATIO = 5
#: Entities listed by name in one provisional build-up finding.
MAX_LISTED = 50


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    check: CheckName
    severity: Severity
    message: str
    entity_ids: list[str] = Field(default_factory=list)
    entity_names: list[str] = Field(default_factory=list)
    chapters: list[int] = Field(default_factory=list)


class _Index:
    """Entity ids by id, name key and alias key; first chapters; for scene references."""

    def __init__(self, rows: list[IndexEntry]) -> None:
        self.names: dict[str, str] = {}
        self.first: dict[str, int | None] = {}
        self.keys: dict[str, set[str]] = defaultdict(set)
        for row in rows:
            self.names[row.id] = row.name or row.id
            self.first[row.id] = row.first_chapter
            for key in [row.name_key, *row.alias_keys]:
                if key:
                    self.keys[key].add(row.id)

    def resolve(self, ref: str) -> set[str]:
        if ref in self.names:
            return {ref}
        return set(self.keys.get(vocab.name_key(ref), ()))


def _finding(
    check: CheckName,
    severity: Severity,
    message: str,
    ids: list[str],
    names: list[str],
    chapters: list[int | None],
) -> Finding:
    return Finding(
        check=check,
        severity=severity,
        message=message,
        entity_ids=ids,
        entity_names=names,
        chapters=sorted({c for c in chapters if c is not None}),
    )


def trait_chapters(props: Mapping[str, Any]) -> dict[str, int | None]:
    """Each current trait (lower-cased) -> the chapter it was first held, replaying the
    entity's revision history (kg.records) once, newest entry first; None when the history
    cannot say."""
    history = json.loads(props.get(REVISIONS) or "[]")
    points = {chapter for chapter, _ in history}
    first = props.get("first_chapter")
    if isinstance(first, int):
        points.add(first)
    held_at: dict[int, list[str]] = {}
    traits = list(props.get("traits") or [])
    undo = len(history)
    for point in sorted(points, reverse=True):
        while undo and history[undo - 1][0] > point:  # undo the revisions made after `point`
            undo -= 1
            previous = history[undo][1]
            if "traits" in previous:
                value = previous["traits"]
                traits = [] if value == {"$kg": "absent"} else list(decode_value(value) or [])
        if not (isinstance(first, int) and first > point):
            held_at[point] = traits
    found: dict[str, int | None] = {}
    for point in sorted(held_at):
        for trait in held_at[point]:
            found.setdefault(str(trait).strip().lower(), point)
    for trait in props.get("traits") or []:
        found.setdefault(str(trait).strip().lower(), None)
    return found


@dataclass
class _View:
    """What the checks read, from the whole graph or from a set of chapters."""

    #: id -> the entity's properties: an open property bag (kg.qa_rows.EntityNode)
    entities: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    index: _Index = field(default_factory=lambda: _Index([]))
    story_rels: list[StoryRel] = field(default_factory=list)  # between complete entities
    trait_edges: list[TraitEdge] = field(default_factory=list)
    scenes: list[SceneCast] = field(default_factory=list)
    chapters: set[int] = field(default_factory=set)  # Chapter nodes there are (of the scope)
    scope: set[int] | None = None  # None: the whole graph
    stale_names: list[NameLookup] = field(default_factory=list)
    broken_rels: list[BrokenRel] = field(default_factory=list)


def _entities(rows: list[EntityNode]) -> dict[str, Mapping[str, Any]]:
    """Entity property maps by id (EntityNode refuses a node without an id)."""
    return {str(row.props["id"]): row.props for row in rows}


def _whole_graph_tx(tx: ManagedTransaction) -> _View:
    view = _View()
    view.entities = _entities(read(tx, EntityNode, mq.ALL_ENTITIES))
    view.index = _Index(read(tx, IndexEntry, mq.QA_ENTITY_INDEX))
    view.story_rels = read(tx, StoryRel, mq.QA_STORY_RELS)
    view.trait_edges = read(tx, TraitEdge, mq.QA_TRAIT_EDGES)
    view.scenes = read(tx, SceneCast, mq.SCENES)
    view.chapters = {
        r.number for r in read(tx, ChapterNumber, mq.CHAPTER_NUMBERS) if r.number is not None
    }
    view.stale_names = read(tx, NameLookup, mq.QA_STALE_NAMES)
    view.broken_rels = read(tx, BrokenRel, mq.QA_BROKEN_RELS)
    return view


def _edge_rows(view: _View, edges: list[Edge]) -> None:
    """`edges` (of the story mirror) as the whole-graph statements would read them: a
    relationship between complete entities into `story_rels` (and `trait_edges`), any other
    into `broken_rels`."""
    for edge in sorted(edges, key=lambda e: e.key):
        src = view.entities.get(edge.src, {"id": edge.src})
        tgt = view.entities.get(edge.tgt, {"id": edge.tgt})
        row = {
            "type": edge.type,
            "chapter": edge.props.get("chapter"),
            "key": edge.props.get("key"),
            "src_id": src.get("id"),
            "src_name": src.get("name"),
            "src_first": src.get("first_chapter"),
            "tgt_id": tgt.get("id"),
            "tgt_name": tgt.get("name"),
            "tgt_first": tgt.get("first_chapter"),
        }
        at = f"mirror edge {edge.key!r}"
        if any(p.get(k) is None for p in (src, tgt) for k in ("id", "name", "label")):
            labels = {
                "src_labels": [vocab.ENTITY] if edge.src in view.entities else [],
                "tgt_labels": [vocab.ENTITY] if edge.tgt in view.entities else [],
            }
            view.broken_rels.append(parse(BrokenRel, {**row, **labels}, at))
            continue
        view.story_rels.append(parse(StoryRel, row, at))
        if edge.type == "HAS_TRAIT":
            trait = {
                "id": edge.src,
                "name": src.get("name"),
                "trait": tgt.get("name"),
                "chapter": edge.props.get("chapter"),
            }
            view.trait_edges.append(parse(TraitEdge, trait, at))


def _chapters_tx(tx: ManagedTransaction, mirror: StoryMirror, chapters: set[int]) -> _View:
    """The view of what `chapters` wrote (see the module docstring)."""
    mirror.refresh(tx)
    view = _View(scope=set(chapters))
    # What the chapters' change-sets wrote (a relationship may be dated another chapter), and
    # what is dated in them.
    written = {
        key
        for row in read(tx, ChangesetNode, cypher.READ_CHANGESET_PROPS, chapters=sorted(chapters))
        for _, key in json.loads(row.props.get("created_rels_json") or "[]")
    }
    edges = [
        e for e in mirror.all_edges() if e.props.get("chapter") in chapters or e.key in written
    ]
    scenes = [s for s in mirror.scenes_as_of(max(chapters, default=0)) if s.chapter in chapters]
    view.scenes = [
        parse(
            SceneCast,
            {
                "id": s.id,
                "chapter": s.chapter,
                "scene": s.scene if s.scene >= 0 else None,
                "characters": s.characters,
                "location": s.location,
            },
            f"mirror scene {s.id!r}",
        )
        for s in scenes
    ]
    refs = {
        str(ref) for s in scenes for ref in (*s.characters, *([s.location] if s.location else []))
    }
    ids = {e.src for e in edges} | {e.tgt for e in edges} | {ref for ref in refs if ":" in ref}
    numbers = sorted(chapters)
    ids |= {r.id for r in read(tx, EntityId, mq.TOUCHED_IN_CHAPTERS, chapters=numbers)}
    keys = sorted({vocab.name_key(ref) for ref in refs})
    names = read(tx, NameLookup, cypher.READ_NAMES, keys=keys)
    ids |= {r.entity_id for r in names}
    view.entities = _entities(
        read(tx, EntityNode, cypher.read_nodes(vocab.ENTITY), ids=sorted(ids))
    )
    view.index = _Index(
        [parse(IndexEntry, p, f"entity {eid!r}") for eid, p in view.entities.items()]
    )
    view.stale_names = [r for r in names if r.entity_id not in view.entities]
    _edge_rows(view, edges)
    dated = sorted(set(numbers) | {r.chapter for r in view.story_rels if r.chapter is not None})
    view.chapters = {
        r.number
        for r in read(tx, ChapterNumber, mq.CHAPTERS_OF, numbers=dated)
        if r.number is not None
    }
    return view


# --- The checks (over one view) ------------------------------------------------------------------


def contradictory_traits(view: _View, antonyms: list[tuple[str, str]]) -> list[Finding]:
    traits: dict[str, dict[str, list[int | None]]] = defaultdict(lambda: defaultdict(list))
    names: dict[str, str] = {}
    for props in view.entities.values():
        if len(props.get("traits") or []) <= 1:
            continue
        eid = str(props["id"])
        names[eid] = str(props.get("name") or eid)
        for trait, chapter in trait_chapters(props).items():
            traits[eid][trait].append(chapter)
    for row in view.trait_edges:
        names[row.id] = str(row.name)
        traits[row.id][str(row.trait).strip().lower()].append(row.chapter)
    findings = []
    for eid in sorted(traits):
        held = traits[eid]
        for left, right in antonyms:
            left, right = left.strip().lower(), right.strip().lower()
            if left in held and right in held:
                findings.append(
                    _finding(
                        "contradictory_traits",
                        "warning",
                        f"{names[eid]} is both {left!r} and {right!r}",
                        [eid],
                        [names[eid]],
                        [*held[left], *held[right]],
                    )
                )
    return findings


def dead_characters_acting(view: _View) -> list[Finding]:
    dead = {}
    for props in view.entities.values():
        if any(str(s).lower() in DEAD_STATUSES for s in props.get("status_values") or []):
            entity = entity_from_props(props)
            dead[entity.id] = entity

    def died_before(eid: str, chapter: int | None) -> int | None:
        """Death chapter when `eid` is dead at `chapter` and died in an earlier chapter."""
        if chapter is None:
            return None
        covering = [i for i in dead[eid].status_intervals if i.covers(chapter)]
        if (
            covering
            and covering[-1].status.lower() in DEAD_STATUSES
            and chapter > covering[-1].from_chapter
        ):
            return covering[-1].from_chapter
        return None

    acts: dict[str, list[tuple[int, int, str]]] = defaultdict(list)  # id -> (death, chapter, what)
    if dead:
        for row in view.story_rels:
            eid, chapter = str(row.src_id), row.chapter
            if eid in dead and row.type in ACTION_TYPES:
                death = died_before(eid, chapter)
                if death is not None:
                    acts[eid].append(
                        (death, chapter, f"{row.type} {row.tgt_name} in chapter {chapter}")
                    )
        for scene in view.scenes:
            chapter = scene.chapter
            for ref in scene.characters:
                ids = view.index.resolve(ref)
                # Only an unambiguous reference proves who was there.
                if len(ids) == 1 and (eid := next(iter(ids))) in dead:
                    death = died_before(eid, chapter)
                    if death is not None:
                        acts[eid].append((death, chapter, f"in scene {chapter}.{scene.scene}"))
    findings = []
    for eid in sorted(acts):
        events = sorted(set(acts[eid]))
        deaths = sorted({d for d, _, _ in events})
        what = "; ".join(w for _, _, w in events)
        name = dead[eid].name
        findings.append(
            _finding(
                "dead_character_acting",
                "error",
                f"{name} is dead from chapter {', '.join(map(str, deaths))} but acts later: {what}",
                [eid],
                [name],
                [*deaths, *(c for _, c, _ in events)],
            )
        )
    return findings


def dangling_references(view: _View) -> list[Finding]:
    findings = []
    stale: dict[str, list[str]] = defaultdict(list)
    for row in view.stale_names:
        stale[row.entity_id].append(row.key)
    for eid, keys in sorted(stale.items()):
        findings.append(
            _finding(
                "dangling_reference",
                "error",
                f"name lookup(s) {', '.join(repr(k) for k in sorted(keys))} "
                f"point to entity {eid!r}, "
                "which does not exist",
                [eid],
                sorted(keys),
                [],
            )
        )
    for row in sorted(view.broken_rels, key=lambda r: (r.type, str(r.key), str(r.src_id))):
        ends = []
        for labels, end_id, end_name in (
            (row.src_labels, row.src_id, row.src_name),
            (row.tgt_labels, row.tgt_id, row.tgt_name),
        ):
            what = end_name or end_id or "a node without id"
            if vocab.ENTITY not in labels or end_id is None or end_name is None:
                what += " (incomplete)"
            ends.append(what)
        missing = [
            name for name, value in (("key", row.key), ("chapter", row.chapter)) if value is None
        ]
        detail = f"; missing {', '.join(missing)}" if missing else ""
        findings.append(
            _finding(
                "dangling_reference",
                "error",
                f"{row.type} from {ends[0]} to {ends[1]} "
                f"does not connect two complete entities{detail}",
                [i for i in (row.src_id, row.tgt_id) if i is not None],
                [n for n in (row.src_name, row.tgt_name) if n is not None],
                [row.chapter],
            )
        )
    # Chapter 0 (initialization) is valid without a Chapter node.
    chapters = {0} | view.chapters
    for row in view.story_rels:
        if row.chapter is None or row.chapter in chapters:
            continue
        findings.append(
            _finding(
                "dangling_reference",
                "warning",
                f"{row.src_name} {row.type} {row.tgt_name} is dated chapter {row.chapter}, "
                "which does not exist",
                [str(row.src_id), str(row.tgt_id)],
                [str(row.src_name), str(row.tgt_name)],
                [row.chapter],
            )
        )
    for scene in view.scenes:
        chapter = scene.chapter
        refs = [("character", r) for r in scene.characters]
        if scene.location:
            refs.append(("location", scene.location))
        for kind, ref in refs:
            if not view.index.resolve(ref):
                findings.append(
                    _finding(
                        "dangling_reference",
                        "warning",
                        f"scene {chapter}.{scene.scene} names {kind} {ref!r}, which is no entity",
                        [],
                        [ref],
                        [chapter],
                    )
                )
    return findings


def provisional_buildup(tx: ManagedTransaction, ratio: float) -> list[Finding]:
    counts = read(tx, ProvisionalCount, mq.QA_PROVISIONAL)
    total = counts[0].total if counts else 0
    provisional = counts[0].provisional if counts else 0
    if total < MIN_ENTITIES_FOR_RATIO or provisional / total <= ratio:
        return []
    listed = read(tx, ProvisionalEntity, mq.QA_PROVISIONAL_LIST, limit=MAX_LISTED)
    more = f" (first {len(listed)} listed)" if provisional > len(listed) else ""
    return [
        _finding(
            "provisional_buildup",
            "warning",
            f"{provisional} of {total} entities ({provisional / total:.0%}) "
            "are still provisional, above "
            f"{ratio:.0%}: healing is not confirming or merging them{more}",
            [r.id for r in listed],
            [r.name for r in listed],
            [r.first_chapter for r in listed],
        )
    ]


def before_first_appearance(view: _View) -> list[Finding]:
    findings = []
    for row in view.story_rels:
        chapter = row.chapter
        if chapter is None:
            continue
        late = [
            (str(name), first)
            for name, first in ((row.src_name, row.src_first), (row.tgt_name, row.tgt_first))
            if first is not None and chapter < first
        ]
        if not late:
            continue
        who = " and ".join(f"{name} first appears in chapter {first}" for name, first in late)
        findings.append(
            _finding(
                "before_first_appearance",
                "warning",
                f"{row.src_name} {row.type} {row.tgt_name} is dated chapter {chapter}, but {who}",
                [str(row.src_id), str(row.tgt_id)],
                [str(row.src_name), str(row.tgt_name)],
                [chapter, *(f for _, f in late)],
            )
        )
    for scene in view.scenes:
        chapter = scene.chapter
        for ref in scene.characters:
            ids = view.index.resolve(ref)
            if len(ids) != 1:
                continue
            eid = next(iter(ids))
            first = view.index.first.get(eid)
            if first is not None and isinstance(chapter, int) and chapter < first:
                findings.append(
                    _finding(
                        "before_first_appearance",
                        "warning",
                        f"scene {chapter}.{scene.scene} lists {view.index.names[eid]}, "
                        "who first appears in "
                        f"chapter {first}",
                        [eid],
                        [view.index.names[eid]],
                        [chapter, first],
                    )
                )
    return findings


def run_checks(
    store: MirroredReader,
    settings: HealingSettings,
    checks: tuple[CheckName, ...] = CHECKS,
    chapters: Collection[int] | None = None,
) -> list[Finding]:
    """Every selected check, in CHECKS order, over the whole graph (one read transaction), or
    over what `chapters` wrote (see the module docstring)."""
    if chapters is None:
        view = store.execute_read(_whole_graph_tx)
    else:
        view = store.execute_read(_chapters_tx, mirror_of(store), set(chapters))
    runners = {
        "contradictory_traits": lambda: contradictory_traits(view, list(settings.antonym_pairs)),
        "dead_character_acting": lambda: dead_characters_acting(view),
        "dangling_reference": lambda: dangling_references(view),
        "provisional_buildup": lambda: store.execute_read(
            provisional_buildup, settings.provisional_alert_ratio
        ),
        "before_first_appearance": lambda: before_first_appearance(view),
    }
    findings: list[Finding] = []
    for name in CHECKS:
        if name in checks:
            findings += runners[name]()
    return findings
