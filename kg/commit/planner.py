"""Commit planning: read every node a chapter delta may touch, resolve each reference (id,
then name/alias match, then derived id; otherwise a new provisional entity), merge the
delta into full property maps with revision entries, and list the node, relationship and
name writes (see kg/commit/__init__.py)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from neo4j import ManagedTransaction

from kg import vocabulary as vocab
from kg.commit.ids import NOVEL_INFO_ID, chapter_id, embedding_sha, scene_id
from kg.commit.ops import GraphOps
from kg.models import (
    AttrValue,
    ChapterDelta,
    Entity,
    EntitySource,
    Relationship,
    StatusChange,
    StatusInterval,
)
from kg.records import (
    CORE_FIELDS,
    add_revision,
    entity_from_props,
    entity_props,
    max_present,
    min_present,
    name_rows,
    same_value,
    unique,
)

_LABEL_ORDER = {label: i for i, label in enumerate(vocab.ENTITY_LABELS)}
_CONFIRMING_SOURCES = frozenset({"user", "outline"})
_SOURCE_RANK = {"extraction": 1, "merge": 2, "enrichment": 2, "outline": 3, "user": 4}


def _source_rank(sources: list[EntitySource]) -> int:
    return max((_SOURCE_RANK[s.type] for s in sources), default=0)


@dataclass
class NodeWrite:
    lookup: str  # label carrying the `id` uniqueness constraint
    labels: tuple[str, ...]
    id: str
    props: dict[str, Any]
    before: dict[str, Any] | None  # None: the node is created by this commit


@dataclass
class RelWrite:
    type: str
    src: tuple[str, str]  # (lookup label, id)
    tgt: tuple[str, str]
    key: str
    props: dict[str, Any]
    before: dict[str, Any] | None = None


class ChapterPlanner:
    def __init__(
        self, tx: ManagedTransaction, delta: ChapterDelta, ops: GraphOps, *, lock_reads: bool = True
    ) -> None:
        self.tx, self.delta, self.ops = tx, delta, ops
        self.read_for_update = ops.lock_nodes if lock_reads else ops.read_nodes
        self.chapter = delta.chapter
        self.existing: dict[str, dict[str, Any]] = {}  # entity id -> pre-commit properties
        self.graph_names: dict[str, list[tuple[str, str, str]]] = defaultdict(
            list
        )  # key -> (id, kind, label)
        self.local_names: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
        self.work: dict[str, Entity] = {}  # touched entity id -> its state after this commit
        self.resolved: dict[str, str] = {}

    # -- reading the pre-state
    def prefetch(self) -> None:
        """Read (for update) every entity the delta may resolve to: lookup keys, then nodes."""
        keys: set[str] = set()
        for e in self.delta.entities:
            keys.update(vocab.name_key(n) for n in (e.name, *e.aliases))
        delta_keys = set(keys)
        refs: list[tuple[str, str | None, str]] = []
        for r in self.delta.relationships:
            hint_src, hint_tgt = vocab.endpoint_hint(r.type)
            refs += [(r.source, r.source_label, hint_src), (r.target, r.target_label, hint_tgt)]
        refs += [(u.entity, u.label, "Character") for u in self.delta.property_updates]
        refs += [(s.entity, s.label, "Character") for s in self.delta.status_changes]
        keys.update(vocab.name_key(ref) for ref, _, _ in refs)
        for row in self.ops.read_names(self.tx, sorted(keys)):
            self.graph_names[row["key"]].append((row["entity_id"], row["kind"], row["label"]))

        ids = {eid for rows in self.graph_names.values() for eid, _, _ in rows}
        for e in self.delta.entities:
            if e.id:
                ids.add(e.id)
            ids.add(vocab.entity_id(e.label, e.name))
        for ref, label, hint in refs:
            # A reference is looked up as an id (and by its derived id) unless its name already
            # matched in the graph or names an entity of this delta; store-made ids always
            # contain ':', so those are always checked.
            key = vocab.name_key(ref)
            if ":" in ref or (key not in self.graph_names and key not in delta_keys):
                ids.update((ref, vocab.entity_id(label or hint, ref)))
        self.existing = self.read_for_update(self.tx, vocab.ENTITY, sorted(ids))

    # -- resolution
    def _provisional(self, eid: str) -> bool:
        if eid in self.work:
            return bool(self.work[eid].is_provisional)
        return bool(self.existing.get(eid, {}).get("is_provisional", False))

    def _match(self, keys: list[str], label: str | None) -> str | None:
        """Best entity whose name or alias key is one of `keys` (the first is the name)."""
        best: tuple[Any, ...] | None = None
        for position, key in enumerate(keys):
            for eid, kind, found_label in (
                *self.local_names.get(key, ()),
                *self.graph_names.get(key, ()),
            ):
                if label is not None and found_label != label:
                    continue
                if eid not in self.work and eid not in self.existing:
                    continue  # a stale lookup node: its entity is gone
                exact = position == 0 and kind == "name"
                rank = (
                    0 if exact else 1,
                    _LABEL_ORDER.get(found_label, 99),
                    1 if self._provisional(eid) else 0,
                    eid,
                )
                if best is None or rank < best:
                    best = rank
        return None if best is None else str(best[-1])

    def _register(self, eid: str, entity: Entity) -> None:
        previous = self.work.get(eid)
        self.work[eid] = entity
        if (
            previous is not None
            and previous.name == entity.name
            and previous.aliases == entity.aliases
        ):
            return  # same names: already indexed
        self.local_names[vocab.name_key(entity.name)].append((eid, "name", entity.label))
        for alias in entity.aliases:
            self.local_names[vocab.name_key(alias)].append((eid, "alias", entity.label))

    def _state(self, eid: str) -> Entity | None:
        if eid in self.work:
            return self.work[eid]
        if eid in self.existing:
            return entity_from_props(self.existing[eid])
        return None

    def _default_source(self, name: str) -> EntitySource:
        return EntitySource(type=self.delta.source_type, chapter=self.chapter, original_name=name)

    def _seen_in_chapter(self, entity: Entity) -> Entity:
        first, last = entity.first_chapter, entity.last_chapter
        if first is not None and last is not None and first <= self.chapter <= last:
            return entity
        return entity.model_copy(
            update={
                "first_chapter": min_present(entity.first_chapter, self.chapter),
                "last_chapter": max_present(entity.last_chapter, self.chapter),
            }
        )

    def resolve_ref(self, ref: str, label: str | None, hint: str) -> str:
        """Entity id for a reference by id or name; unresolved ones become provisional."""
        if ref in self.work or ref in self.existing:
            eid = ref
        else:
            key = vocab.name_key(ref)
            eid = self._match([key], label) or vocab.entity_id(label or hint, ref)
        state = self._state(eid)
        if state is None:
            state = Entity(
                id=eid,
                label=label or hint,
                name=ref,
                sources=[self._default_source(ref)],
                is_provisional=True,
            )
        self._register(eid, self._seen_in_chapter(state))
        self.resolved.setdefault(ref, eid)
        return eid

    def add_entity(self, e: Entity) -> str:
        keys = [vocab.name_key(n) for n in (e.name, *e.aliases)]
        eid = e.id or self._match(keys, e.label) or vocab.entity_id(e.label, e.name)
        state = self._state(eid)
        merged = self._new_entity(e, eid) if state is None else self._merge(state, e)
        self._register(eid, self._seen_in_chapter(merged))
        self.resolved.setdefault(e.name, eid)
        if e.id:
            self.resolved.setdefault(e.id, eid)
        return eid

    def _new_entity(self, e: Entity, eid: str) -> Entity:
        sources = e.sources or [self._default_source(e.name)]
        provisional = e.is_provisional
        if provisional is None:
            provisional = not any(s.type in _CONFIRMING_SOURCES for s in sources)
        return e.model_copy(
            update={
                "id": eid,
                "sources": sources,
                "is_provisional": provisional,
                "aliases": unique([a for a in e.aliases if a != e.name]),
            }
        )

    def _merge(self, state: Entity, e: Entity) -> Entity:
        new_sources = e.sources or [self._default_source(e.name)]
        sources = list(state.sources) + [s for s in new_sources if s not in state.sources]
        # The first name wins (user/outline names are committed first); others become aliases.
        aliases = unique([a for a in (*state.aliases, e.name, *e.aliases) if a != state.name])
        description = state.description
        # A description is replaced only by a source at least as authoritative as the best
        # one behind the entity: extraction never overwrites what the user or outline said.
        if e.description and (
            not description or _source_rank(new_sources) >= _source_rank(state.sources)
        ):
            description = e.description
        provisional = bool(state.is_provisional)
        if e.is_provisional is False or any(s.type in _CONFIRMING_SOURCES for s in e.sources):
            provisional = False
        intervals = list(state.status_intervals) + [
            i for i in e.status_intervals if i not in state.status_intervals
        ]
        return state.model_copy(
            update={
                "aliases": aliases,
                "description": description,
                "traits": unique([*state.traits, *e.traits]),
                "attributes": {**state.attributes, **e.attributes},
                "sources": sources,
                "is_provisional": provisional,
                "raw_label": state.raw_label or e.raw_label,
                "first_chapter": min_present(state.first_chapter, e.first_chapter),
                "last_chapter": max_present(state.last_chapter, e.last_chapter),
                "status_intervals": sorted(intervals, key=lambda i: i.from_chapter),
            }
        )

    def apply_changes(self, eid: str, changes: dict[str, AttrValue | None]) -> None:
        entity = self.work[eid]
        update: dict[str, Any] = {}
        attributes = dict(entity.attributes)
        for key, value in changes.items():
            if key in CORE_FIELDS:
                update[key] = value
            elif value is None:
                attributes.pop(key, None)
            else:
                attributes[key] = value
        if "name" in update and update["name"] != entity.name:
            # Keep the old name as an alias so references to it still resolve.
            update.setdefault("aliases", entity.aliases)
            update["aliases"] = [entity.name, *(update["aliases"] or [])]
        for key, empty in (
            ("aliases", []),
            ("traits", []),
            ("description", ""),
            ("is_provisional", False),
        ):
            if key in update and update[key] is None:
                update[key] = empty
        if "aliases" in update:
            name = update.get("name", entity.name)
            update["aliases"] = unique([a for a in update["aliases"] if a != name])
        update["attributes"] = attributes
        # Validate the result as a whole: a bad core value fails the commit with a clear message.
        self._register(eid, Entity.model_validate({**entity.model_dump(), **update}))

    def apply_status(
        self, eid: str, status: str, chapter: int, evidence: EntitySource | None = None
    ) -> None:
        entity = self.work[eid]
        if evidence is not None and evidence not in entity.sources:
            entity = entity.model_copy(update={"sources": [*entity.sources, evidence]})
            self._register(eid, entity)
        if entity.status_as_of(chapter) == status:
            return
        later = [i.from_chapter for i in entity.status_intervals if i.from_chapter > chapter]
        intervals: list[StatusInterval] = []
        for interval in entity.status_intervals:
            if interval.from_chapter == chapter:
                continue  # superseded by the new status for the same chapter
            if interval.from_chapter < chapter and (
                interval.to_chapter is None or interval.to_chapter >= chapter
            ):
                interval = interval.model_copy(update={"to_chapter": chapter - 1})
            intervals.append(interval)
        intervals.append(
            StatusInterval(
                status=status, from_chapter=chapter, to_chapter=min(later) - 1 if later else None
            )
        )
        intervals.sort(key=lambda i: i.from_chapter)
        self._register(eid, entity.model_copy(update={"status_intervals": intervals}))

    # -- the whole plan
    def plan(
        self,
    ) -> tuple[list[NodeWrite], list[RelWrite], list[dict[str, Any]], list[dict[str, Any]]]:
        """Every write of the delta, each reference resolved in order: entities before the
        relationships, property updates and status changes that name them. (node writes,
        relationship writes, name rows to delete, name rows to create)."""
        d = self.delta
        self.prefetch()
        for e in d.entities:
            self.add_entity(e)
        rels: dict[str, RelWrite] = {}
        for r in d.relationships:
            rel = self._story_rel(r)
            # A repeated relationship in one delta is one fact: the last mention wins.
            rels[rel.key] = rel
        for u in d.property_updates:
            self.apply_changes(self.resolve_ref(u.entity, u.label, "Character"), u.changes)
        for s in d.status_changes:
            self._status_change(s)
        nodes, names_delete, names_create = self._entity_writes()
        infra, pre_existing = self._infra_nodes()
        nodes += infra
        pre_existing |= {(vocab.ENTITY, eid) for eid in self.existing}
        self._structural_rels(rels)
        return nodes, self._changed_rels(rels, pre_existing), names_delete, names_create

    def _story_rel(self, r: Relationship) -> RelWrite:
        hint_src, hint_tgt = vocab.endpoint_hint(r.type)
        src = self.resolve_ref(r.source, r.source_label, hint_src)
        tgt = self.resolve_ref(r.target, r.target_label, hint_tgt)
        rel_chapter = self.chapter if r.chapter is None else r.chapter
        key = vocab.rel_key(src, r.type, tgt, rel_chapter, r.raw_type)
        props: dict[str, Any] = {
            "key": key,
            "chapter": rel_chapter,
            "weight": r.weight,
            "description": r.description,
        }
        for name in ("raw_type", "scene", "confidence", "quote"):
            if getattr(r, name) is not None:
                props[name] = getattr(r, name)
        return RelWrite(r.type, (vocab.ENTITY, src), (vocab.ENTITY, tgt), key, props)

    def _status_change(self, s: StatusChange) -> None:
        status_chapter = self.chapter if s.chapter is None else s.chapter
        evidence = None
        if s.quote:
            evidence = EntitySource(
                type=self.delta.source_type,
                chapter=status_chapter,
                scene=s.scene,
                quote=s.quote,
                fact="status",
                value=s.status,
            )
        self.apply_status(
            self.resolve_ref(s.entity, s.label, "Character"), s.status, status_chapter, evidence
        )

    def _entity_writes(
        self,
    ) -> tuple[list[NodeWrite], list[dict[str, Any]], list[dict[str, Any]]]:
        """The entities that changed, with the name rows to delete and to create."""
        nodes: list[NodeWrite] = []
        names_delete: list[dict[str, Any]] = []
        names_create: list[dict[str, Any]] = []
        for eid, entity in self.work.items():
            props = entity_props(entity.model_copy(update={"id": eid}))
            before = self.existing.get(eid)
            if before is not None:
                props = add_revision(before, props, self.chapter)
            if before is not None and same_value(before, props):
                continue
            nodes.append(NodeWrite(vocab.ENTITY, (vocab.ENTITY, entity.label), eid, props, before))
            old = {(r["entity_id"], r["key"]): r for r in name_rows(before)} if before else {}
            new = {(r["entity_id"], r["key"]): r for r in name_rows(props)}
            names_delete += [
                {"entity_id": k[0], "key": k[1]} for k, row in old.items() if new.get(k) != row
            ]
            names_create += [row for k, row in new.items() if old.get(k) != row]
        return nodes, names_delete, names_create

    def _structural_rels(self, rels: dict[str, RelWrite]) -> None:
        """The chapter's HAS_SCENE edges, and one structural edge per entity it involves."""
        ch = self.chapter
        cid = chapter_id(ch)
        chapter_node = (vocab.CHAPTER, cid)
        for scene in self.delta.scenes:
            sid = scene_id(ch, scene.index)
            key = vocab.rel_key(cid, vocab.HAS_SCENE, sid, ch)
            rels[key] = RelWrite(
                vocab.HAS_SCENE, chapter_node, (vocab.SCENE, sid), key, {"key": key, "chapter": ch}
            )
        # One structural edge per entity the chapter involves (spec 001 section 16):
        # Character -[:APPEARS_IN]-> Chapter, Chapter -[:MENTIONS]-> any other entity.
        # Chapter 0 (initialization) has no Chapter node, so no structural edges either.
        for eid, entity in self.work.items() if ch > 0 else ():
            if entity.label == "Character":
                key = vocab.rel_key(eid, vocab.APPEARS_IN, cid, ch)
                rels[key] = RelWrite(
                    vocab.APPEARS_IN,
                    (vocab.ENTITY, eid),
                    chapter_node,
                    key,
                    {"key": key, "chapter": ch},
                )
            else:
                key = vocab.rel_key(cid, vocab.MENTIONS, eid, ch)
                rels[key] = RelWrite(
                    vocab.MENTIONS,
                    chapter_node,
                    (vocab.ENTITY, eid),
                    key,
                    {"key": key, "chapter": ch},
                )

    def _changed_rels(
        self, rels: dict[str, RelWrite], pre_existing: set[tuple[str, str]]
    ) -> list[RelWrite]:
        """The relationships to write, each with its before-state (None: new); those already
        as planned are left out."""
        keys_by_type: dict[str, list[str]] = defaultdict(list)
        for rel in rels.values():
            # Only a relationship between two nodes that already exist can already exist.
            if rel.src in pre_existing and rel.tgt in pre_existing:
                keys_by_type[rel.type].append(rel.key)
        existing_rels = self.ops.read_rels(self.tx, keys_by_type)
        rel_writes = []
        for rel in rels.values():
            rel.before = existing_rels.get(rel.key)
            if rel.before is None or not same_value(rel.before, rel.props):
                rel_writes.append(rel)
        return rel_writes

    def _infra_nodes(self) -> tuple[list[NodeWrite], set[tuple[str, str]]]:
        """Chapter, scene and novel-info writes, and which of those nodes existed before."""
        d, ch = self.delta, self.chapter
        cid = chapter_id(ch)
        wanted: list[tuple[str, str, dict[str, Any]]] = []
        chapter_props: dict[str, Any] = {
            "id": cid,
            "number": ch,
            "title": d.title,
            "summary": d.summary,
            "scene_count": len(d.scenes),
        }
        for name in ("text_ref", "text_sha", "embedding", "embedded_by"):
            if getattr(d, name) is not None:
                chapter_props[name] = getattr(d, name)
        if d.embedding is not None:
            chapter_props["embedding_sha"] = embedding_sha(d.embedding)
        if ch > 0 and d.changeset is None:  # a story-bible sync is not a chapter
            wanted.append((vocab.CHAPTER, cid, chapter_props))
        for scene in d.scenes:
            props = {
                "id": scene_id(ch, scene.index),
                "chapter": ch,
                "index": scene.index,
                "title": scene.title,
                "summary": scene.summary,
                "characters": list(scene.characters),
            }
            for name in ("text_ref", "text_sha", "location", "embedding", "embedded_by"):
                if getattr(scene, name) is not None:
                    props[name] = getattr(scene, name)
            if scene.embedding is not None:
                # Content hash of the vector: retrieval caches vectors by it (see kg.retrieval).
                props["embedding_sha"] = embedding_sha(scene.embedding)
            wanted.append((vocab.SCENE, props["id"], props))
        info = dict(d.novel_info or {})
        if ch == 0:
            # The initialization phase is not a chapter: its title and summary describe the novel.
            for key in ("title", "summary"):
                if getattr(d, key) and key not in info:
                    info[key] = getattr(d, key)
        if d.novel_info is not None or info:
            wanted.append((vocab.NOVEL_INFO, NOVEL_INFO_ID, {**info, "id": NOVEL_INFO_ID}))

        by_label: dict[str, list[str]] = defaultdict(list)
        for label, nid, _ in wanted:
            by_label[label].append(nid)
        before_all: dict[tuple[str, str], dict[str, Any]] = {}
        for label, ids in by_label.items():
            for nid, props in self.read_for_update(self.tx, label, ids).items():
                before_all[(label, nid)] = props
        writes = []
        for label, nid, props in wanted:
            before = before_all.get((label, nid))
            # Infrastructure nodes may pre-exist (e.g. planned chapters): keep their other properties.
            merged = {**before, **props} if before else props
            if before is None or not same_value(before, merged):
                writes.append(NodeWrite(label, (label,), nid, merged, before))
        return writes, set(before_all)
