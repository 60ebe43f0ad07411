"""core.lru: the one LRU (cachetools'), its recency-neutral reads and its eviction count."""

from __future__ import annotations

from core.lru import LRU


def test_a_read_makes_an_entry_recent_and_the_oldest_goes_first() -> None:
    cache = LRU(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # "a" now the most recent
    cache["c"] = 3
    assert sorted(cache) == ["a", "c"] and cache.evictions == 1
    # Look-alike: without the read, "a" is the oldest and goes.
    other = LRU(2)
    other["a"], other["b"] = 1, 2
    other["c"] = 3
    assert sorted(other) == ["b", "c"] and other.evictions == 1


def test_peek_leaves_recency_alone() -> None:
    cache = LRU(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.peek("a") == 1 and cache.peek("x", "none") == "none"
    assert cache.peek_values() == [1, 2]
    cache["c"] = 3
    assert "a" not in cache and cache.evictions == 1


def test_setdefault_refreshes_an_existing_entry_and_pop_counts_no_eviction() -> None:
    cache = LRU(2)
    cache.setdefault("a", []).append(1)
    cache["b"] = [2]
    cache.setdefault("a", []).append(3)
    cache["c"] = [4]
    assert cache.peek("a") == [1, 3] and "b" not in cache
    assert cache.pop("a") == [1, 3] and cache.evictions == 1
