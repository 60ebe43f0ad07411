"""The one least-recently-used cache of the project: cachetools' `LRUCache`, plus the two
things its callers need that it does not offer, a read that leaves recency alone (`peek`,
`peek_values`) and a count of evictions (`evictions`).

Contract: a mapping bounded to `maxsize` entries; reading an entry by `[]`, `get` or
`setdefault` makes it the most recently used, inserting one past `maxsize` first drops the
least recently used (`popitem`, counted); `peek` and `peek_values` change nothing. Not
thread-safe (as cachetools): callers hold their own lock. cachetools because it is already a
dependency (core.embedder) and a kept library; the subclass only reads through the base
class's `Cache.__getitem__`, which cachetools' own `popitem` uses for the same purpose.
"""

from __future__ import annotations

from typing import Any

import cachetools


class LRU(cachetools.LRUCache):  # type: ignore[type-arg]
    """cachetools.LRUCache with `peek`, `peek_values` and `evictions`."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.evictions = 0

    def popitem(self) -> tuple[Any, Any]:
        """Drop the least recently used entry (also what an insertion past `maxsize` calls)."""
        item = super().popitem()
        self.evictions += 1
        return item

    def peek(self, key: Any, default: Any = None) -> Any:
        """The entry for `key` (or `default`), its recency unchanged."""
        return cachetools.Cache.__getitem__(self, key) if key in self else default

    def peek_values(self) -> list[Any]:
        """Every entry, in insertion order, recency unchanged."""
        return [cachetools.Cache.__getitem__(self, key) for key in self]
