"""core.priority: a BackgroundPool's workers run nicer than the thread that made the pool, as
batch threads (and the threads they start inherit both), whichever thread's submit started them;
nice 0 leaves them as they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from core.priority import (
    BackgroundPool,
    lower_threads,
    nice_this_thread_to,
    process_threads,
    this_thread_nice,
)
from tests.conftest import REPO_ROOT, child_pythonpath

T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice is Linux's"
)


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


def _nice_and_policy() -> tuple[int, int]:
    return _nice(), _policy()


def test_background_workers_are_niced_and_their_threads_inherit_it() -> None:
    base = _nice()
    pool = BackgroundPool(2, "test-background", 5)
    try:
        # Niced, and batch threads (their wake-ups do not preempt a running query).
        assert pool.submit(_nice_and_policy).result() == (min(19, base + 5), os.SCHED_BATCH)

        def started_by_a_worker() -> tuple[int, int]:
            seen: list[tuple[int, int]] = []
            child = threading.Thread(target=lambda: seen.append(_nice_and_policy()))
            child.start()
            child.join()
            return seen[0]

        assert pool.submit(started_by_a_worker).result() == (min(19, base + 5), os.SCHED_BATCH)
    finally:
        pool.shutdown()
    # The caller's own priority and policy are untouched.
    assert (_nice(), _policy()) == (base, os.SCHED_OTHER)


def test_nice_zero_leaves_the_workers_at_the_callers_priority() -> None:
    base = _nice()
    pool = BackgroundPool(1, "test-same", 0)
    try:
        # The look-alike of the niced pool: neither nicer nor a batch thread (the memory query's).
        assert pool.submit(_nice_and_policy).result() == (base, os.SCHED_OTHER)
    finally:
        pool.shutdown()


def _in_thread_niced(by: int, work: Callable[[], T]) -> T:
    """`work()` on a new thread made `by` nicer than this one first (a thread cannot be made
    less nice again, so the test's own thread never is)."""
    done: list[T] = []

    def run() -> None:
        assert nice_this_thread_to(min(19, _nice() + by))
        done.append(work())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return done[0]


def test_a_pools_workers_are_niced_from_its_makers_priority_not_their_submitters() -> None:
    # A turn's thread (niced 3) submits the first slots, which starts the slot pool's workers
    # from that thread: they still run 5 below the server, not 3 + 5.
    base = _nice()
    pool = BackgroundPool(2, "test-slots", 5)
    try:
        assert _in_thread_niced(3, lambda: pool.submit(_nice).result()) == min(19, base + 5)
    finally:
        pool.shutdown()
    # The look-alike: a pool made on a niced thread counts from that thread's priority.
    made_niced = _in_thread_niced(3, lambda: BackgroundPool(1, "test-made-niced", 5))
    try:
        assert made_niced.submit(_nice).result() == min(19, base + 3 + 5)
    finally:
        made_niced.shutdown()
    assert _nice() == base == this_thread_nice()


def test_nice_this_thread_to_never_makes_a_thread_less_nice() -> None:
    base = _nice()
    assert _in_thread_niced(0, lambda: _nice()) == base
    # Asked for less than it has, a niced thread stays where it is and says so.
    assert _in_thread_niced(4, lambda: (nice_this_thread_to(base), _nice())) == (
        False,
        min(19, base + 4),
    )


def test_lower_threads_nices_the_threads_named_and_no_other() -> None:
    base = _nice()
    release = threading.Event()
    seen: list[tuple[int, int]] = []
    before = process_threads()
    waiting = threading.Thread(target=lambda: (release.wait(), seen.append(_nice_and_policy())))
    waiting.start()
    try:
        # Other threads of the test process may come and go meanwhile: only the one started here
        # is certain to be new.
        assert waiting.native_id in process_threads() - before
        assert lower_threads({waiting.native_id}, 3) == 1
    finally:
        release.set()
        waiting.join()
    assert seen == [(min(19, base + 3), os.SCHED_BATCH)]
    # The look-alike: the calling thread, not among them.
    assert (_nice(), _policy()) == (base, os.SCHED_OTHER)
    # A thread id that is no thread (above Linux's largest, 2**22) takes nothing. (Not the
    # joined thread's: join() returns before its OS thread has quite gone.)
    assert lower_threads({2**30}, 3) == 0


_GRAPH_THREADS = """
import json, os, sys
from pathlib import Path
from neo4j import GraphDatabase
from core.graph_server import EmbeddedArcadeDB

db = EmbeddedArcadeDB.for_dir(Path(sys.argv[1]))
db.server_nice = int(sys.argv[2])
endpoint = db.serve()
with GraphDatabase.driver(endpoint.uri, auth=(endpoint.username, endpoint.password)) as driver:
    driver.execute_query("RETURN 1", database_=endpoint.database)  # a Bolt connection's thread
    nice, policy = {}, {}
    for tid in os.listdir("/proc/self/task"):
        comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        name = comm.split("-")[0].split("#")[0]
        nice.setdefault(name, set()).add(os.getpriority(os.PRIO_PROCESS, int(tid)))
        policy.setdefault(name, set()).add(os.sched_getscheduler(int(tid)))
print(json.dumps({
    "base": os.getpriority(os.PRIO_PROCESS, 0),
    "nice": {k: sorted(v) for k, v in nice.items()},
    "policy": {k: sorted(v) for k, v in policy.items()},
}))
db.stop()
"""


@pytest.mark.parametrize("server_nice", [4, 0])
def test_an_embedded_graph_started_niced_runs_its_bolt_connections_niced(
    tmp_path: Path, server_nice: int
) -> None:
    """The sidecar starts its graph with `prefer_clients`: the threads the server's start
    creates run niced, and so do the Bolt connections' threads its listener starts later. The
    JVM's own threads (its VM thread), started before, keep the process's priority."""
    done = subprocess.run(
        [sys.executable, "-c", _GRAPH_THREADS, str(tmp_path / "graph"), str(server_nice)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    base, nice, policy = seen["base"], seen["nice"], seen["policy"]
    assert nice["BOLT"] == [min(19, base + server_nice)]
    assert policy["BOLT"] == [os.SCHED_BATCH if server_nice else os.SCHED_OTHER]
    assert nice["VM Thread"] == [base]
    assert policy["VM Thread"] == [os.SCHED_OTHER]


@pytest.mark.skipif(
    os.environ.get("NEO4J_URI") is not None, reason="the first project needs the embedded graph"
)
def test_prefer_clients_applies_to_the_projects_embedded_graph_only(tmp_path: Path) -> None:
    from core.graph_server import EmbeddedArcadeDB, prefer_clients
    from core.settings import load_settings

    embedded = load_settings(tmp_path)
    prefer_clients(embedded, 5)
    assert EmbeddedArcadeDB.for_dir(embedded.saga_dir / "graph").server_nice == 5
    # The look-alike: a configured Neo4j is another server; no embedded graph is touched.
    other = load_settings(tmp_path / "other", neo4j_uri="bolt://127.0.0.1:7687")
    prefer_clients(other, 5)
    assert EmbeddedArcadeDB.for_dir(other.saga_dir / "graph").server_nice == 0
