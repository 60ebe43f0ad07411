"""The dense part of a `HybridIndex`: unit sentence embeddings by position, compared with a
query's by exact cosine; past EXACT_DENSE_MAX documents a usearch HNSW index (approximate,
search cost ~log n) proposes a wide candidate set that exact cosine orders.

Contract: `append` receives one entry per document, in position order (None: the document has
no usable vector); `ranking` orders positions by exact cosine, best first, ties by position,
and a position's cosine never depends on which others are computed with it (nor on BLAS's
threads), so rankings are the same bit for bit however the index was built. usearch because
it is a kept HNSW library with a deterministic one-thread build.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.recall.columns import Column

#: Up to this many documents dense search compares the query with every vector (exact, and
#: independent of the order the index was built in); past it an HNSW index proposes
#: max(DENSE_WIDEN x limit, DENSE_MIN_CANDIDATES) candidates that exact cosine orders.
EXACT_DENSE_MAX = 20_000
DENSE_WIDEN = 4
DENSE_MIN_CANDIDATES = 400
#: Rows per block of `exact_cosines` (bounds its float64 temporaries to a few MB).
COSINE_BLOCK_ROWS = 2048


def _import_onnxruntime_before_usearch() -> None:
    """Load onnxruntime (the embedded embedder's runtime) before usearch, when it is installed.

    Measured with usearch 2.26.6 and onnxruntime 1.32.0: `python -c "import usearch,
    onnxruntime"` dies with SIGSEGV inside onnxruntime's module init (in libstdc++'s
    `codecvt`), while `import onnxruntime, usearch` works. A sidecar builds a conversation's
    index (usearch) before it embeds the first query (onnxruntime), so without this the
    process crashes on its first recall unless something else happened to load first.
    """
    try:
        import onnxruntime  # noqa: F401
    except ImportError:  # an embedding endpoint is configured and the runtime is not installed
        pass


class Matrix:
    """Unit vectors by position (zeros where a document has none), growing by doubling."""

    def __init__(self, dimensions: int) -> None:
        self._data = np.zeros((64, dimensions), dtype=np.float32)
        self._size = 0
        self._held = Column(np.bool_)
        self.count = 0  # vectors held

    def __len__(self) -> int:
        return self._size

    def append(self, vector: np.ndarray | None) -> None:
        if self._size == len(self._data):
            grown = np.zeros((2 * len(self._data), self._data.shape[1]), dtype=np.float32)
            grown[: self._size] = self._data
            self._data = grown
        if vector is not None:
            v = np.asarray(vector, dtype=np.float64).reshape(-1)
            norm = float(np.sqrt(np.sum(v * v)))
            self._data[self._size] = v / norm if norm > 0 else 0.0
            self.count += 1
        self._held.append(vector is not None)
        self._size += 1

    def held(self) -> np.ndarray:
        """Positions that hold a vector, ascending."""
        return np.flatnonzero(self._held.values).astype(np.int64)

    def held_mask(self) -> np.ndarray:
        """Per position, whether it holds a vector."""
        return self._held.values

    def rows(self, positions: np.ndarray) -> np.ndarray:
        return self._data[np.asarray(positions, dtype=np.int64)]

    def prefix(self, count: int) -> np.ndarray:
        """The first `count` rows, as a view (no copy: the exact search reads them all)."""
        return self._data[:count]


def exact_cosines(matrix: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Each row's dot product with `unit`, computed row by row in float64 (the products of two
    float32 are exact there; numpy sums each row the same way whatever the other rows): the
    value of a row never depends on which rows are computed with it, nor on BLAS's threads."""
    v = np.asarray(unit, dtype=np.float64).reshape(-1)
    out = np.empty(len(matrix), dtype=np.float64)
    # One float64 buffer for every block, cast into, multiplied and summed in place: the same
    # operations in the same order as a fresh `block * v` per block (the same bits), without
    # allocating and faulting in two 6 MB temporaries a block (2.5x faster at 10k rows).
    buffer = np.empty((min(COSINE_BLOCK_ROWS, len(matrix)), len(v)), dtype=np.float64)
    for start in range(0, len(matrix), COSINE_BLOCK_ROWS):
        block = buffer[: min(COSINE_BLOCK_ROWS, len(matrix) - start)]
        block[...] = matrix[start : start + len(block)]
        np.multiply(block, v, out=block)
        np.sum(block, axis=1, out=out[start : start + len(block)])
    return out


class DenseIndex:
    """Unit vectors by position, exact cosine search, and an HNSW index past EXACT_DENSE_MAX."""

    def __init__(self, dimensions: int) -> None:
        _import_onnxruntime_before_usearch()
        from usearch.index import Index

        self.dimensions = dimensions
        self._vectors = Matrix(dimensions)
        self._hnsw: Any = None
        self._hnsw_class = Index

    def append(self, vectors: list[np.ndarray | None]) -> None:
        """One entry per document after the ones held, in position order (None: no vector)."""
        first = len(self._vectors)
        for vector in vectors:
            self._vectors.append(vector)
        keys = [first + i for i, vector in enumerate(vectors) if vector is not None]
        if self._hnsw is None and len(self._vectors) > EXACT_DENSE_MAX:
            # Past exact search's size: an HNSW index proposes candidates (see ranking), filled
            # with every vector so far in position order, then grown with each batch.
            self._hnsw = self._hnsw_class(ndim=self.dimensions, metric="cos", dtype="f16")
            keys = self._vectors.held().tolist()
        if self._hnsw is not None and keys:
            positions = np.asarray(keys, dtype=np.int64)
            # One thread: a multi-threaded HNSW build depends on scheduling.
            self._hnsw.add(positions.astype(np.uint64), self._vectors.rows(positions), threads=1)

    def held(self, positions: np.ndarray) -> np.ndarray:
        """Whether each of `positions` holds a vector."""
        return self._vectors.held_mask()[positions]

    @property
    def count(self) -> int:
        """How many documents hold a vector."""
        return self._vectors.count

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The unit vectors at `positions` (zeros where a document has none)."""
        return self._vectors.rows(positions)

    def ranking(self, vector: np.ndarray | None, limit: int) -> list[int]:
        """Positions by exact cosine to `vector`, best first, ties by position. Up to
        EXACT_DENSE_MAX documents every vector is compared; past it HNSW (approximate, its graph
        shaped by insertion order) proposes a wide candidate set that exact cosine orders."""
        unit = self.unit(vector)
        if unit is None or not self._vectors.count:
            return []
        if self._hnsw is None:
            positions = self._vectors.held()
        else:
            wide = min(max(DENSE_WIDEN * limit, DENSE_MIN_CANDIDATES), len(self._hnsw))
            matches = self._hnsw.search(unit.astype(np.float32), wide)
            positions = np.unique(np.asarray(matches.keys, dtype=np.int64))
        if not len(positions):
            return []
        if self._hnsw is None and len(positions) == len(self._vectors):
            matrix = self._vectors.prefix(len(positions))  # every row, in place: no 15 MB copy
        else:
            matrix = self._vectors.rows(positions)
        cosine = exact_cosines(matrix, unit)
        order = np.lexsort((positions, -cosine))[:limit]
        return [int(p) for p in positions[order]]

    def unit(self, vector: np.ndarray | None) -> np.ndarray | None:
        if vector is None or vector.shape[-1] != self.dimensions:
            return None
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else None
