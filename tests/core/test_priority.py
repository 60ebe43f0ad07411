"""core.priority: a BackgroundPool's workers run nicer than the thread that made them (and
the threads they start inherit it); nice 0 leaves them as they are."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from core.priority import BackgroundPool, lower_this_thread

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice is Linux's"
)


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_background_workers_are_niced_and_their_threads_inherit_it() -> None:
    base = _nice()
    pool = BackgroundPool(2, "test-background", 5)
    try:
        assert pool.submit(_nice).result() == min(19, base + 5)

        def started_by_a_worker() -> int:
            seen: list[int] = []
            child = threading.Thread(target=lambda: seen.append(_nice()))
            child.start()
            child.join()
            return seen[0]

        assert pool.submit(started_by_a_worker).result() == min(19, base + 5)
    finally:
        pool.shutdown()
    # The caller's own priority is untouched.
    assert _nice() == base


def test_nice_zero_leaves_the_workers_at_the_callers_priority() -> None:
    base = _nice()
    pool = BackgroundPool(1, "test-same", 0)
    try:
        assert pool.submit(_nice).result() == base
    finally:
        pool.shutdown()
    assert lower_this_thread(0) is False
