"""Per-position numpy columns that grow by appending: what the lexical, dense and feature
parts of a `HybridIndex` keep per document, read by fancy indexing rather than a Python loop.

Contract: `values` is the first `len` appended values, in order; growing never changes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Column:
    """A per-position numpy column that grows by appending (capacity doubles), so the
    features of a query's candidates are read by fancy indexing, not a Python loop."""

    __slots__ = ("_data", "_size")

    def __init__(self, dtype: Any, capacity: int = 64) -> None:
        self._data = np.zeros(capacity, dtype=dtype)
        self._size = 0

    def append(self, value: Any) -> None:
        if self._size == len(self._data):
            grown = np.zeros(2 * len(self._data), dtype=self._data.dtype)
            grown[: self._size] = self._data
            self._data = grown
        self._data[self._size] = value
        self._size += 1

    def set(self, index: int, value: Any) -> None:
        self._data[index] = value

    def drop_last(self) -> None:
        """Forget the last value appended (its slot is reused by the next append)."""
        self._size -= 1

    @property
    def values(self) -> np.ndarray:
        return self._data[: self._size]
