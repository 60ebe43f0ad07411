"""A process-wide copy of the story's relationships and scenes, kept current from the change-sets.

Reads "as of chapter N" need, per character, the latest relationship of each kind with each
other entity, and the earlier scenes (hybrid retrieval, the duplicate-scene check). Asking
the graph for them means traversing an entity's whole history (a protagonist gains a few
relationships every chapter) or listing every scene: work that grows with the book. The
mirror holds the story edges (Entity -> Entity relationships of the story types) and the
scene rows in memory: one scan the first time, then only what each new change-set created
or changed (by key and by id, through indexes) and what healing recorded on it
(kg.commit.amendments). Whether it is current is decided by the history chain
(kg.commit.history): the newest change-set it has seen must still be there with the same
chain, and any amendment since must be one it can replay; anything else (a rollback, a
graph from another time) makes it scan again. The graph stays the record: the mirror is
rebuilt from it whenever in doubt, and holds nothing the graph does not.

One mirror per graph endpoint and database, shared by every store of the process; a lock
guards it. `scene_index` keeps a hybrid (BM25 + vector) index of the scenes up to a chapter
that grows with the book by appending, instead of being rebuilt for every query.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from neo4j import ManagedTransaction

from core.graph_server import GraphEndpoint
from kg import cypher
from kg import vocabulary as vocab
from kg.commit import history
from kg.ports import GraphReader
from kg.records import RelationshipRow

if TYPE_CHECKING:
    from core.recall import HybridIndex

log = logging.getLogger("skald.kg")
_STORY_TYPES = frozenset(vocab.ENTITY_REL_TYPES)


@dataclass(frozen=True)
class Edge:
    key: str
    type: str
    src: str
    tgt: str
    props: dict[str, Any]

    @property
    def chapter(self) -> int:
        value = self.props.get("chapter")
        return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class SceneRow:
    id: str
    chapter: int
    scene: int
    title: str
    summary: str
    text_ref: str | None
    text_sha: str | None
    vector: np.ndarray | None
    characters: tuple[str, ...] = ()
    location: str | None = None
    embedded_by: str | None = None  # the model that made `vector` (None: not recorded)

    @classmethod
    def of(cls, props: dict[str, Any]) -> SceneRow:
        vector = props.get("embedding")
        return cls(
            id=str(props["id"]),
            chapter=int(props.get("chapter") or 0),
            scene=int(props["index"]) if props.get("index") is not None else -1,
            title=str(props.get("title") or ""),
            summary=str(props.get("summary") or ""),
            text_ref=props.get("text_ref"),
            text_sha=props.get("text_sha"),
            vector=np.asarray(vector, dtype=np.float64) if vector else None,
            characters=tuple(str(c) for c in props.get("characters") or ()),
            location=props.get("location"),
            embedded_by=props.get("embedded_by"),
        )


def same_model(embedded_by: str | None, model: str | None) -> bool:
    """Whether a vector made by `embedded_by` can be compared with one made by `model`: vectors
    of two embedding models are not comparable. Not recorded (vectors from before it was) or
    not asked: taken as the same (the lengths are checked still)."""
    return embedded_by is None or model is None or embedded_by == model


@dataclass
class _SceneIndex:
    generation: int
    dimensions: int
    embedded_by: str | None  # the model whose vectors it holds (None: any)
    through: int  # scenes of chapters <= through are in the index
    index: HybridIndex


@dataclass
class StoryMirror:
    edges: dict[str, Edge] = field(default_factory=dict)
    by_entity: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    scenes: dict[str, SceneRow] = field(default_factory=dict)
    seen: dict[str, Any] | None = None  # the newest change-set when last refreshed
    amendments_seen: int = 0
    generation: int = 0  # +1 on every full scan: what was built on the old copy is dropped
    scans: int = 0
    applied: int = 0  # change-sets followed without a scan
    lock: threading.RLock = field(default_factory=threading.RLock)
    _scene_index: _SceneIndex | None = None

    # --- keeping current -------------------------------------------------------------------

    def refresh(self, tx: ManagedTransaction) -> None:
        """Bring the copy up to the graph's newest change-set (inside the caller's read)."""
        with self.lock:
            if self.seen is None:
                self._scan(tx, "first read")
                return
            rows = self._changesets_from(tx, self.seen["seq"])
            if (
                not rows
                or rows[0]["seq"] != self.seen["seq"]
                or rows[0]["chain_sha"] != self.seen["chain_sha"]
                or (rows[0]["seq"] and not rows[0]["chain_sha"])
            ):
                self._scan(tx, "the history changed (a rollback, or a graph without the chain)")
                return
            if rows[0]["amendments_sha"] != self.seen["amendments_sha"]:
                if not self._replay_amendments(tx, rows[0]["chapter"], self.amendments_seen):
                    self._scan(tx, "amendments it cannot follow")
                    return
            for row in rows[1:]:
                if not row["chain_sha"]:
                    self._scan(tx, "a change-set without the chain")
                    return
                props = self._changeset(tx, row["chapter"])
                self._apply_changeset(tx, props)
                self.amendments_seen = 0
                if not self._replay_amendments(tx, row["chapter"], 0, props):
                    self._scan(tx, "amendments it cannot follow")
                    return
                self.applied += 1
            self.seen = rows[-1]

    @staticmethod
    def _changesets_from(tx: ManagedTransaction, seq: int) -> list[dict[str, Any]]:
        """Change-sets number `seq` (a placeholder for 0) and on, one indexed read each: the
        numbers are contiguous (kg.commit.history), and usually one or two are new."""
        first = (
            history.by_seq(tx, seq)
            if seq
            else {"seq": 0, "chain_sha": None, "amendments_sha": None}
        )
        if first is None:
            return []
        rows = [first]
        while (following := history.by_seq(tx, rows[-1]["seq"] + 1)) is not None:
            rows.append(following)
        return rows

    def _changeset(self, tx: ManagedTransaction, chapter: int) -> dict[str, Any]:
        found = [r["props"] for r in tx.run(cypher.READ_CHANGESET_PROPS, chapters=[chapter])]
        return found[0] if found else {}

    def _scan(self, tx: ManagedTransaction, why: str) -> None:
        self.edges.clear()
        self.by_entity.clear()
        self.scenes.clear()
        for row in tx.run(cypher.MIRROR_ALL_EDGES):
            self._add_edge(row["type"], row["src"], row["tgt"], row["props"], row["eid"])
        for row in tx.run(cypher.MIRROR_ALL_SCENES):
            scene = SceneRow.of(row["props"])
            self.scenes[scene.id] = scene
        newest = history.newest(tx)
        self.seen = newest or {"seq": 0, "chain_sha": None, "amendments_sha": None}
        self.amendments_seen = (
            len(json.loads(self._changeset(tx, newest["chapter"]).get("amendments_json") or "[]"))
            if newest
            else 0
        )
        self.generation += 1
        self.scans += 1
        self._scene_index = None
        log.info(
            "graph mirror: scanned %d story relationships and %d scenes (%s)",
            len(self.edges),
            len(self.scenes),
            why,
        )

    def _add_edge(
        self, rel_type: str, src: str, tgt: str, props: dict[str, Any], fallback_key: str = ""
    ) -> None:
        key = str(props.get("key") or fallback_key)
        self._drop_edge(key)
        self.edges[key] = Edge(key=key, type=rel_type, src=src, tgt=tgt, props=dict(props))
        self.by_entity[src].add(key)
        self.by_entity[tgt].add(key)

    def _drop_edge(self, key: str) -> None:
        edge = self.edges.pop(key, None)
        if edge is not None:
            for end in (edge.src, edge.tgt):
                keys = self.by_entity.get(end)
                if keys is not None:
                    keys.discard(key)

    def _fetch_edges(self, tx: ManagedTransaction, keys_by_type: dict[str, list[str]]) -> None:
        for rel_type, keys in sorted(keys_by_type.items()):
            if rel_type not in _STORY_TYPES or not keys:
                continue
            for row in tx.run(cypher.mirror_edges_by_key(rel_type), keys=sorted(set(keys))):
                self._add_edge(rel_type, row["src"], row["tgt"], row["props"])

    def _fetch_scenes(self, tx: ManagedTransaction, ids: list[str]) -> None:
        if ids:
            for row in tx.run(cypher.MIRROR_SCENES_BY_ID, ids=sorted(set(ids))):
                scene = SceneRow.of(row["props"])
                self.scenes[scene.id] = scene

    def _apply_changeset(self, tx: ManagedTransaction, props: dict[str, Any]) -> None:
        keys: dict[str, list[str]] = defaultdict(list)
        for rel_type, key in json.loads(props.get("created_rels_json") or "[]"):
            keys[rel_type].append(key)
        for rel_type, *_, key, _before in json.loads(props.get("updated_rels_json") or "[]"):
            keys[rel_type].append(key)
        self._fetch_edges(tx, keys)
        nodes = [
            *json.loads(props.get("created_nodes_json") or "[]"),
            *(
                [label, node_id]
                for label, node_id, _ in json.loads(props.get("updated_nodes_json") or "[]")
            ),
        ]
        self._fetch_scenes(tx, [node_id for label, node_id in nodes if label == vocab.SCENE])

    def _replay_amendments(
        self, tx: ManagedTransaction, chapter: int, start: int, props: dict[str, Any] | None = None
    ) -> bool:
        """Apply a change-set's amendments from number `start` on; False when it cannot follow."""
        props = props if props is not None else self._changeset(tx, chapter)
        entries = json.loads(props.get("amendments_json") or "[]")
        if len(entries) < start:
            return False
        for entry in entries[start:]:
            for rel in entry.get("deleted_rels", []):
                self._drop_edge(str(rel["props"].get("key", "")))
            for labels, node in entry.get("deleted_nodes", []):
                gone = str(node.get("id"))
                for key in list(self.by_entity.pop(gone, set())):
                    self._drop_edge(key)
                if vocab.SCENE in labels:
                    self.scenes.pop(gone, None)
            keys: dict[str, list[str]] = defaultdict(list)
            for rel_type, key in entry.get("created_rels", []):
                keys[rel_type].append(key)
            self._fetch_edges(tx, keys)
        self.amendments_seen = len(entries)
        return True

    # --- reading ---------------------------------------------------------------------------

    def rows_of(self, entity_ids: set[str], as_of: int) -> list[RelationshipRow]:
        """The story relationships of the entities up to the chapter, as kg.retrieval's rows
        (an edge between two of them twice)."""
        with self.lock:
            rows = []
            for eid in sorted(entity_ids):
                for key in sorted(self.by_entity.get(eid, ())):
                    edge = self.edges[key]
                    chapter = edge.props.get("chapter")
                    if not isinstance(chapter, int) or chapter > as_of:
                        continue
                    for outgoing, other in ((True, edge.tgt), (False, edge.src)):
                        if (edge.src if outgoing else edge.tgt) == eid:
                            rows.append(
                                RelationshipRow.model_construct(
                                    id=eid,
                                    type=edge.type,
                                    outgoing=outgoing,
                                    props=edge.props,
                                    other=other,
                                )
                            )
            return rows

    def all_edges(self) -> list[Edge]:
        with self.lock:
            return list(self.edges.values())

    def edges_as_of(self, as_of: int) -> list[Edge]:
        """The story relationships stated up to the chapter (a chapter that is no number never
        counts, as `r.chapter <= $as_of` in Cypher), in story order: chapter, then key."""
        with self.lock:
            found = [
                e
                for e in self.edges.values()
                if isinstance(e.props.get("chapter"), int) and e.chapter <= as_of
            ]
        return sorted(found, key=lambda e: (e.chapter, e.key))

    def scenes_as_of(self, as_of: int) -> list[SceneRow]:
        with self.lock:
            found = [s for s in self.scenes.values() if s.chapter <= as_of]
        return sorted(found, key=lambda s: (s.chapter, s.scene, s.id))

    def scene_index(
        self, as_of: int, dimensions: int, embedded_by: str | None = None
    ) -> HybridIndex:
        """A hybrid index of the scenes of chapters <= as_of (title and summary; vectors of
        `dimensions` made by model `embedded_by`, None: any), grown by appending while chapters
        come in order."""
        from core.recall import HybridIndex

        with self.lock:
            cached = self._scene_index
            if (
                cached is None
                or cached.generation != self.generation
                or cached.dimensions != dimensions
                or cached.embedded_by != embedded_by
                or cached.through > as_of
            ):
                cached = _SceneIndex(
                    self.generation,
                    dimensions,
                    embedded_by,
                    0,
                    HybridIndex(max(dimensions, 1), neighbours=False),
                )  # a summary stands alone
                self._scene_index = cached
            if as_of > cached.through:
                fresh = [s for s in self.scenes_as_of(as_of) if s.chapter > cached.through]
                _append_scenes(cached.index, fresh, dimensions, embedded_by)
                cached.through = as_of
            return cached.index


def _append_scenes(
    index: HybridIndex, scenes: list[SceneRow], dimensions: int, embedded_by: str | None
) -> None:
    """Add in story order; runs of scenes with and without a usable vector (of `dimensions`,
    made by model `embedded_by`) go in separate batches."""
    from core.recall import MemoryDoc

    def usable(s: SceneRow) -> bool:
        return (
            s.vector is not None
            and s.vector.shape == (dimensions,)
            and same_model(s.embedded_by, embedded_by)
        )

    def doc(s: SceneRow) -> MemoryDoc:
        return MemoryDoc(
            key=s.id,
            text=f"{s.title}. {s.summary}".strip(". "),
            group=str(s.chapter),
            meta={
                "chapter": s.chapter,
                "scene": s.scene if s.scene >= 0 else None,
                "title": s.title,
                "summary": s.summary,
            },
        )

    run: list[SceneRow] = []

    def flush() -> None:
        if not run:
            return
        index.add(
            [doc(s) for s in run], np.stack([s.vector for s in run]) if usable(run[0]) else None
        )  # type: ignore[misc]
        run.clear()

    for scene in scenes:
        if run and usable(scene) != usable(run[0]):
            flush()
        run.append(scene)
    flush()


class _Graph(Protocol):
    """What names a graph: a store (kg.store.GraphStore, which imports this module) has it."""

    endpoint: GraphEndpoint


class MirroredReader(GraphReader, Protocol):
    """A graph reader that names its graph: what a read through the graph's story mirror
    (`mirror_of`) needs. A store (kg.store.GraphStore) is one."""

    @property
    def endpoint(self) -> GraphEndpoint: ...


_mirrors: dict[tuple[str, str], StoryMirror] = {}
_mirrors_lock = threading.Lock()


def mirror_of(store: _Graph) -> StoryMirror:
    """The process's mirror of the graph `store` talks to."""
    key = (store.endpoint.uri, store.endpoint.database)
    with _mirrors_lock:
        found = _mirrors.get(key)
        if found is None:
            found = _mirrors[key] = StoryMirror()
        return found


def forget(store: _Graph) -> None:
    """Drop the process's mirror of this graph (after writes no change-set records: an import,
    a wipe); the next read scans again."""
    with _mirrors_lock:
        _mirrors.pop((store.endpoint.uri, store.endpoint.database), None)
