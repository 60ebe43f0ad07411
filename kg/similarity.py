"""Similarity reads "as of chapter N": scenes and chapters whose embedding is nearest a query
vector (`similar_scenes`, `similar_chapters`), and earlier scenes for a scene's text through
core.recall's hybrid retrieval over the story mirror's scene index (`hybrid_scenes_tx`).

Contract: the same graph and query give the same hits. Vector similarity ranks candidates with
numpy cosine; on Neo4j 5.11+ a vector index over scene embeddings is created and used when
possible, and any failure falls back to numpy (always correct). Embeddings are cached by
content hash in the process (`_vectors`): a hash names exactly one vector, so entries never go
stale, and the graph is still asked which scenes exist on every query.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

import cachetools
import numpy as np
from neo4j import ManagedTransaction

from core.errors import SkaldError
from kg import cypher
from kg.mirror import StoryMirror, same_model
from kg.models import SimilarityHit

if TYPE_CHECKING:
    from kg.store import GraphStore

log = logging.getLogger("skald.kg")


class _VectorCache:
    """Embeddings by content hash, shared by every store in the process.

    A hash names exactly one vector, so entries never go stale; the graph is still asked
    which scenes exist (and their hashes) on every query, so results always follow it. Bounded
    first in, first out (cachetools' FIFOCache: a read does not refresh an entry).
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self._data: cachetools.FIFOCache[str, np.ndarray] = cachetools.FIFOCache(max_entries)
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, sha: str | None) -> np.ndarray | None:
        if sha is None:
            return None
        with self._lock:
            return self._data.get(sha)

    def put(self, sha: str, vector: np.ndarray) -> None:
        with self._lock:
            self._data[sha] = vector


_vectors = _VectorCache()


def _vector_rows(
    tx: ManagedTransaction, kind: str, as_of: int
) -> list[tuple[dict[str, Any], np.ndarray]]:
    """(row, vector) for every Scene (kind "scene") or Chapter with an embedding, as of a chapter."""
    listing, by_id = (
        (cypher.SCENE_VECTORS_AS_OF, cypher.SCENE_EMBEDDINGS_BY_ID)
        if kind == "scene"
        else (cypher.CHAPTER_VECTORS_AS_OF, cypher.CHAPTER_EMBEDDINGS_BY_ID)
    )
    rows = [r.data() for r in tx.run(listing, as_of=as_of)]
    missing = [r["id"] for r in rows if _vectors.get(r["sha"]) is None]
    fetched: dict[str, np.ndarray] = {}
    if missing:
        for record in tx.run(by_id, ids=missing):
            fetched[record["id"]] = np.asarray(record["embedding"], dtype=np.float64)
    out = []
    for row in rows:
        vector = _vectors.get(row["sha"])
        if vector is None:
            vector = fetched.get(row["id"])
            if vector is None:
                continue
            if row["sha"] is not None:
                _vectors.put(row["sha"], vector)
        out.append((row, vector))
    return out


def _rank(
    rows: list[tuple[dict[str, Any], np.ndarray]],
    embedding: list[float],
    k: int,
    embedded_by: str | None,
) -> list[SimilarityHit]:
    query = np.asarray(embedding, dtype=np.float64)
    usable = [
        (row, vec)
        for row, vec in rows
        if vec.shape == query.shape and same_model(row.get("embedded_by"), embedded_by)
    ]
    if not usable or k <= 0:
        return []
    matrix = np.stack([vec for _, vec in usable])
    norms = np.linalg.norm(matrix, axis=1) * max(float(np.linalg.norm(query)), 1e-12)
    scores = matrix @ query / np.maximum(norms, 1e-12)
    order = np.argsort(-scores, kind="stable")[:k]
    return [
        SimilarityHit(
            id=usable[i][0]["id"],
            chapter=usable[i][0]["chapter"],
            scene=usable[i][0]["scene"],
            score=float(scores[i]),
            title=usable[i][0]["title"] or "",
            summary=usable[i][0]["summary"] or "",
        )
        for i in order
    ]


def hybrid_scenes_tx(
    tx: ManagedTransaction,
    query: str,
    embedding: list[float] | None,
    k: int,
    as_of: int,
    mirror: StoryMirror,
    embedded_by: str | None = None,
) -> list[SimilarityHit]:
    """Earlier scenes for a scene query through core.recall's hybrid retrieval (BM25 over
    title + summary, the scene vectors, fused); a scene without a vector, or with another
    model's (`embedded_by`: the query's model), is found lexically. The index is the mirror's,
    grown by appending as chapters come (kept current by the caller)."""
    if k <= 0 or not mirror.scenes_as_of(as_of):
        return []
    dims = len(embedding) if embedding else 0
    index = mirror.scene_index(as_of, dims, embedded_by)
    query_vector = np.asarray(embedding, dtype=np.float32) if embedding else None
    return [
        SimilarityHit(
            id=hit.key,
            chapter=hit.meta["chapter"],
            scene=hit.meta["scene"],
            score=hit.score,
            title=hit.meta["title"],
            summary=hit.meta["summary"],
        )
        for hit in index.search(query, query_vector, k)
    ]


def similar_scenes_tx(
    tx: ManagedTransaction,
    embedding: list[float],
    k: int,
    as_of: int,
    embedded_by: str | None = None,
) -> list[SimilarityHit]:
    return _rank(_vector_rows(tx, "scene", as_of), embedding, k, embedded_by)


# --- vector index (Neo4j only, optional) ------------------------------------------------------


_VECTOR_UNSUPPORTED, _VECTOR_PENDING, _VECTOR_READY = "unsupported", "pending", "ready"
_vector_state: weakref.WeakKeyDictionary[GraphStore, str] = weakref.WeakKeyDictionary()


def vector_index_ready(store: GraphStore, dimensions: int) -> bool:
    """Create (once) and detect the Neo4j scene vector index; False means rank with numpy.

    Only Neo4j 5.11+ is asked at all. A new index fills in the background, so until it is
    ONLINE the numpy path answers; any failure turns the index off for this store.
    """
    state = _vector_state.get(store)
    if state in (_VECTOR_READY, _VECTOR_UNSUPPORTED):
        return state == _VECTOR_READY
    if not store.server.may_have_vector_index:
        _vector_state[store] = _VECTOR_UNSUPPORTED
        return False
    try:
        if state is None:
            store.write(cypher.create_scene_vector_index(dimensions))
            _vector_state[store] = _VECTOR_PENDING
        rows = store.read(cypher.VECTOR_INDEX_STATE, name=cypher.VECTOR_INDEX_NAME)
    except SkaldError as exc:  # any failure: the numpy path is always correct
        log.info("graph: no vector index (%s); ranking embeddings with numpy", exc)
        _vector_state[store] = _VECTOR_UNSUPPORTED
        return False
    if not rows or str(rows[0]["type"]).upper() != "VECTOR":
        _vector_state[store] = _VECTOR_UNSUPPORTED
    elif str(rows[0]["state"]).upper() == "ONLINE":
        _vector_state[store] = _VECTOR_READY
    return _vector_state[store] == _VECTOR_READY


def similar_scenes(
    store: GraphStore,
    embedding: list[float],
    *,
    k: int = 5,
    as_of_chapter: int,
    embedded_by: str | None = None,
) -> list[SimilarityHit]:
    """Scenes of chapters <= as_of_chapter most similar (cosine) to `embedding`, made by model
    `embedded_by` (scenes whose vectors another model made are left out; None: any)."""
    if vector_index_ready(store, len(embedding)):
        try:
            rows = store.read(
                cypher.QUERY_SCENE_VECTOR_INDEX,
                embedding=list(embedding),
                k=k,
                candidates=max(4 * k, 50),
                as_of=as_of_chapter,
                embedded_by=embedded_by,
            )
            return [
                SimilarityHit(**{**r, "title": r["title"] or "", "summary": r["summary"] or ""})
                for r in rows
            ]
        except SkaldError as exc:  # the numpy path below is always correct
            log.info("graph: vector index query failed (%s); using numpy", exc)
            _vector_state[store] = _VECTOR_UNSUPPORTED
    return store.execute_read(similar_scenes_tx, list(embedding), k, as_of_chapter, embedded_by)


def similar_chapters(
    store: GraphStore,
    embedding: list[float],
    *,
    k: int = 3,
    as_of_chapter: int,
    embedded_by: str | None = None,
) -> list[SimilarityHit]:
    """Chapters <= as_of_chapter whose chapter embedding (made by model `embedded_by`; None:
    any) is most similar to `embedding`."""

    def work(tx: ManagedTransaction) -> list[SimilarityHit]:
        return _rank(_vector_rows(tx, "chapter", as_of_chapter), embedding, k, embedded_by)

    return store.execute_read(work)
