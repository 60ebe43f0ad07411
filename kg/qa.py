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
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Literal

from neo4j import ManagedTransaction
from pydantic import BaseModel, ConfigDict, Field

from core.settings import HealingSettings
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.records import REVISIONS, entity_as_of, entity_from_props
from kg.store import GraphStore

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


def _rows(tx: ManagedTransaction, query: str, **params: Any) -> list[dict[str, Any]]:
    return [r.data() for r in tx.run(query, **params)]


class _Index:
    """Entity ids by id, name key and alias key; first chapters; for scene references."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.names: dict[str, str] = {}
        self.first: dict[str, int | None] = {}
        self.keys: dict[str, set[str]] = defaultdict(set)
        for row in rows:
            eid = str(row["id"])
            self.names[eid] = str(row["name"] or eid)
            first = row["first_chapter"]
            self.first[eid] = int(first) if isinstance(first, int) else None
            for key in [row["name_key"], *(row["alias_keys"] or [])]:
                if key:
                    self.keys[str(key)].add(eid)

    def resolve(self, ref: str) -> set[str]:
        if ref in self.names:
            return {ref}
        return set(self.keys.get(vocab.name_key(ref), ()))


def _finding(check: CheckName, severity: Severity, message: str, ids: list[str], names: list[str],
             chapters: list[int | None]) -> Finding:
    return Finding(check=check, severity=severity, message=message, entity_ids=ids, entity_names=names,
                   chapters=sorted({c for c in chapters if c is not None}))


def trait_chapters(props: dict[str, Any]) -> dict[str, int | None]:
    """Each current trait (lower-cased) -> the chapter it was first held, replaying the
    entity's revision history (kg.records); None when the history cannot say."""
    points = {chapter for chapter, _ in json.loads(props.get(REVISIONS) or "[]")}
    if isinstance(props.get("first_chapter"), int):
        points.add(props["first_chapter"])
    found: dict[str, int | None] = {}
    for chapter in sorted(points):
        view = entity_as_of(props, chapter)
        for trait in view.traits if view else ():
            found.setdefault(trait.strip().lower(), chapter)
    for trait in props.get("traits") or []:
        found.setdefault(str(trait).strip().lower(), None)
    return found


# --- The checks (transaction functions: each sees one consistent graph) -------------------------


def contradictory_traits(tx: ManagedTransaction, antonyms: list[tuple[str, str]]) -> list[Finding]:
    traits: dict[str, dict[str, list[int | None]]] = defaultdict(lambda: defaultdict(list))
    names: dict[str, str] = {}
    for row in _rows(tx, mq.QA_TRAITS):
        props = row["props"]
        eid = str(props["id"])
        names[eid] = str(props.get("name") or eid)
        for trait, chapter in trait_chapters(props).items():
            traits[eid][trait].append(chapter)
    for row in _rows(tx, mq.QA_TRAIT_EDGES):
        eid = str(row["id"])
        names[eid] = str(row["name"])
        traits[eid][str(row["trait"]).strip().lower()].append(row["chapter"])
    findings = []
    for eid in sorted(traits):
        held = traits[eid]
        for left, right in antonyms:
            left, right = left.strip().lower(), right.strip().lower()
            if left in held and right in held:
                findings.append(
                    _finding("contradictory_traits", "warning", f"{names[eid]} is both {left!r} and {right!r}",
                             [eid], [names[eid]], [*held[left], *held[right]])
                )
    return findings


def dead_characters_acting(tx: ManagedTransaction) -> list[Finding]:
    dead = {}
    for row in _rows(tx, mq.QA_DEAD, dead=list(DEAD_STATUSES)):
        entity = entity_from_props(row["props"])
        dead[entity.id] = entity

    def died_before(eid: str, chapter: int | None) -> int | None:
        """Death chapter when `eid` is dead at `chapter` and died in an earlier chapter."""
        if chapter is None:
            return None
        covering = [i for i in dead[eid].status_intervals if i.covers(chapter)]
        if covering and covering[-1].status.lower() in DEAD_STATUSES and chapter > covering[-1].from_chapter:
            return covering[-1].from_chapter
        return None

    acts: dict[str, list[tuple[int, int, str]]] = defaultdict(list)  # id -> (death, chapter, what)
    if dead:
        for row in _rows(tx, mq.QA_ACTIONS_OF, ids=sorted(dead), types=list(ACTION_TYPES)):
            eid, chapter = str(row["id"]), row["chapter"]
            death = died_before(eid, chapter)
            if death is not None:
                acts[eid].append((death, chapter, f"{row['type']} {row['other_name']} in chapter {chapter}"))
        index = _Index(_rows(tx, mq.QA_ENTITY_INDEX))
        for scene in _rows(tx, mq.SCENES):
            chapter = scene["chapter"]
            for ref in scene["characters"] or []:
                ids = index.resolve(str(ref))
                # Only an unambiguous reference proves who was there.
                if len(ids) == 1 and (eid := next(iter(ids))) in dead:
                    death = died_before(eid, chapter)
                    if death is not None:
                        acts[eid].append((death, chapter, f"in scene {chapter}.{scene['scene']}"))
    findings = []
    for eid in sorted(acts):
        events = sorted(set(acts[eid]))
        deaths = sorted({d for d, _, _ in events})
        what = "; ".join(w for _, _, w in events)
        name = dead[eid].name
        findings.append(
            _finding("dead_character_acting", "error",
                     f"{name} is dead from chapter {', '.join(map(str, deaths))} but acts later: {what}",
                     [eid], [name], [*deaths, *(c for _, c, _ in events)])
        )
    return findings


def dangling_references(tx: ManagedTransaction) -> list[Finding]:
    findings = []
    stale: dict[str, list[str]] = defaultdict(list)
    for row in _rows(tx, mq.QA_STALE_NAMES):
        stale[str(row["entity_id"])].append(str(row["key"]))
    for eid, keys in sorted(stale.items()):
        findings.append(
            _finding("dangling_reference", "error",
                     f"name lookup(s) {', '.join(repr(k) for k in keys)} point to entity {eid!r}, which does not exist",
                     [eid], keys, [])
        )
    for row in _rows(tx, mq.QA_BROKEN_RELS):
        ends = []
        for side in ("src", "tgt"):
            label_ok = vocab.ENTITY in (row[f"{side}_labels"] or [])
            what = str(row[f"{side}_name"] or row[f"{side}_id"] or "a node without id")
            if not label_ok or row[f"{side}_id"] is None or row[f"{side}_name"] is None:
                what += " (incomplete)"
            ends.append(what)
        missing = [p for p in ("key", "chapter") if row[p] is None]
        detail = f"; missing {', '.join(missing)}" if missing else ""
        findings.append(
            _finding("dangling_reference", "error",
                     f"{row['type']} from {ends[0]} to {ends[1]} does not connect two complete entities{detail}",
                     [str(row[k]) for k in ("src_id", "tgt_id") if row[k] is not None],
                     [str(row[k]) for k in ("src_name", "tgt_name") if row[k] is not None],
                     [row["chapter"]])
        )
    # Chapter 0 (initialization) is valid without a Chapter node.
    chapters = sorted({0} | {int(r["number"]) for r in _rows(tx, mq.CHAPTER_NUMBERS) if r["number"] is not None})
    for row in _rows(tx, mq.QA_RELS_IN_MISSING_CHAPTERS, chapters=chapters):
        findings.append(
            _finding("dangling_reference", "warning",
                     f"{row['src_name']} {row['type']} {row['tgt_name']} is dated chapter {row['chapter']}, "
                     "which does not exist", [str(row["src_id"]), str(row["tgt_id"])],
                     [str(row["src_name"]), str(row["tgt_name"])], [row["chapter"]])
        )
    index = _Index(_rows(tx, mq.QA_ENTITY_INDEX))
    for scene in _rows(tx, mq.SCENES):
        chapter = scene["chapter"]
        refs = [("character", str(r)) for r in scene["characters"] or []]
        if scene["location"]:
            refs.append(("location", str(scene["location"])))
        for kind, ref in refs:
            if not index.resolve(ref):
                findings.append(
                    _finding("dangling_reference", "warning",
                             f"scene {chapter}.{scene['scene']} names {kind} {ref!r}, which is no entity", [], [ref],
                             [chapter])
                )
    return findings


def provisional_buildup(tx: ManagedTransaction, ratio: float) -> list[Finding]:
    counts = _rows(tx, mq.QA_PROVISIONAL)
    total = int(counts[0]["total"] or 0) if counts else 0
    provisional = int(counts[0]["provisional"] or 0) if counts else 0
    if total < MIN_ENTITIES_FOR_RATIO or provisional / total <= ratio:
        return []
    listed = _rows(tx, mq.QA_PROVISIONAL_LIST, limit=MAX_LISTED)
    more = f" (first {len(listed)} listed)" if provisional > len(listed) else ""
    return [
        _finding("provisional_buildup", "warning",
                 f"{provisional} of {total} entities ({provisional / total:.0%}) are still provisional, above "
                 f"{ratio:.0%}: healing is not confirming or merging them{more}",
                 [str(r["id"]) for r in listed], [str(r["name"]) for r in listed],
                 [r["first_chapter"] for r in listed])
    ]


def before_first_appearance(tx: ManagedTransaction) -> list[Finding]:
    findings = []
    for row in _rows(tx, mq.QA_BEFORE_FIRST_APPEARANCE):
        chapter = row["chapter"]
        late = [
            (str(row[f"{s}_name"]), row[f"{s}_first"])
            for s in ("src", "tgt")
            if row[f"{s}_first"] is not None and chapter < row[f"{s}_first"]
        ]
        who = " and ".join(f"{name} first appears in chapter {first}" for name, first in late)
        findings.append(
            _finding("before_first_appearance", "warning",
                     f"{row['src_name']} {row['type']} {row['tgt_name']} is dated chapter {chapter}, but {who}",
                     [str(row["src_id"]), str(row["tgt_id"])], [str(row["src_name"]), str(row["tgt_name"])],
                     [chapter, *(f for _, f in late)])
        )
    index = _Index(_rows(tx, mq.QA_ENTITY_INDEX))
    for scene in _rows(tx, mq.SCENES):
        chapter = scene["chapter"]
        for ref in scene["characters"] or []:
            ids = index.resolve(str(ref))
            if len(ids) != 1:
                continue
            eid = next(iter(ids))
            first = index.first.get(eid)
            if first is not None and isinstance(chapter, int) and chapter < first:
                findings.append(
                    _finding("before_first_appearance", "warning",
                             f"scene {chapter}.{scene['scene']} lists {index.names[eid]}, who first appears in "
                             f"chapter {first}", [eid], [index.names[eid]], [chapter, first])
                )
    return findings


def run_checks(store: GraphStore, settings: HealingSettings,
               checks: tuple[CheckName, ...] = CHECKS) -> list[Finding]:
    """Every selected check, in CHECKS order, against one read transaction each."""
    runners = {
        "contradictory_traits": lambda tx: contradictory_traits(tx, list(settings.antonym_pairs)),
        "dead_character_acting": dead_characters_acting,
        "dangling_reference": dangling_references,
        "provisional_buildup": lambda tx: provisional_buildup(tx, settings.provisional_alert_ratio),
        "before_first_appearance": before_first_appearance,
    }
    findings: list[Finding] = []
    for name in CHECKS:
        if name in checks:
            findings += store.execute_read(runners[name])
    return findings
