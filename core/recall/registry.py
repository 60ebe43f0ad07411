"""Which `HybridIndex`es a process keeps: a bounded LRU per (graph, memory) (`IndexRegistry`).

Contract: `get` hands back the index for a key, building it with the factory when absent; the
least recently used are dropped (and rebuilt from the graph by the caller if asked for again)
past a count or a budget of documents, never the one just asked for. The LRU is core.lru's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from core.lru import LRU


class IndexRegistry:
    """Bounded LRU of indexes per (graph, memory): the least recently used are dropped (and
    rebuilt from the graph if asked for again) while there are more than `max_indexes` or
    they hold more than `max_documents` documents together (`len(index)`), so the memory
    they take is bounded by what they hold, not by how many memories a process has seen.
    The index just asked for is never dropped."""

    def __init__(self, max_indexes: int = 32, max_documents: int | None = None) -> None:
        # At least one: the index just asked for is kept whatever the bound.
        self._indexes = LRU(max(max_indexes, 1))
        self._max_documents = max_documents
        self._lock = threading.Lock()

    @property
    def evictions(self) -> int:
        """How many indexes were dropped, by count or by the budget of documents."""
        return self._indexes.evictions

    def get(self, graph: str, memory: str, factory: Callable[[], Any]) -> Any:
        with self._lock:
            key = (graph, memory)
            index = self._indexes.get(key)
            if index is None:
                index = factory()
                self._indexes[key] = index
            while len(self._indexes) > 1 and self._over_budget():
                self._indexes.popitem()
            return index

    def peek(self, graph: str, memory: str) -> Any | None:
        """The cached index, if there is one (nothing built, recency unchanged)."""
        with self._lock:
            return self._indexes.peek((graph, memory))

    def _over_budget(self) -> bool:
        return (
            self._max_documents is not None
            and sum(len(i) for i in self._indexes.peek_values()) > self._max_documents
        )

    def documents(self) -> int:
        with self._lock:
            return sum(len(i) for i in self._indexes.peek_values())

    def cached(self) -> list[Any]:
        """The indexes held now (recency unchanged)."""
        with self._lock:
            return list(self._indexes.peek_values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._indexes)
