"""SIGTERM, SIGINT and SIGHUP around the embedded graph's start (core.graph_server): a signal that
arrives while the graph starts is held and acted on once the start is over; the JVM leaves the
signals to Python (-Xrs), so none reaches Python from a JVM thread.

The process tests start a graph of their own in a child process and send the signal from inside
the start, right after the JVM is up: no timing is involved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.graph_server import _signals_held
from tests.conftest import REPO_ROOT

# The child: the graph's start with a signal sent to the process right after its JVM started
# (the moment that crashed in JPype's native code before the signals were held).
SIGNAL_INSIDE_THE_START = """
import os, signal, sys, threading
from pathlib import Path
import core.graph_server as graph_server

# The dispositions of a command started from a terminal, whatever this test's runner left
# ignored (nohup ignores SIGHUP; an ignored signal is inherited and stays ignored).
for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_DFL)

start_jvm = graph_server._start_jvm
def start_jvm_then_signal(*args, **kwargs):
    start_jvm(*args, **kwargs)
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
graph_server._start_jvm = start_jvm_then_signal

db = graph_server.EmbeddedArcadeDB.for_dir(Path(sys.argv[1]))
if sys.argv[3] == "main":
    db.endpoint()
else:
    worker = threading.Thread(target=db.endpoint)
    worker.start()
    worker.join()
print("still running after the start", flush=True)
"""


def _run_child(tmp_path: Path, signal_name: str, thread: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("ARCADEDB_JVM_ERROR_FILE", None)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            SIGNAL_INSIDE_THE_START,
            str(tmp_path / "graph"),
            signal_name,
            thread,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a hang, not a timing margin: the child normally ends in seconds
    )


def _crash_logs(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.rglob("hs_err_pid*.log"))


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_the_graph_starts_ends_the_process_once_the_graph_is_up(
    tmp_path: Path, signal_name: str
) -> None:
    done = _run_child(tmp_path, signal_name, "main")
    output = done.stdout + done.stderr
    # Ended by the signal itself, as a service manager counts a clean stop (core.interrupt),
    # once the exit functions had stopped the graph (below), not by a crash.
    assert done.returncode == -getattr(signal, signal_name), output
    assert _crash_logs(tmp_path) == [], output
    assert "still running after the start" not in done.stdout
    # The start finished (its database exists) and the exit then stopped the graph cleanly:
    # the stop removes the discovery file that tells other processes where the graph runs.
    assert (tmp_path / "graph" / "data" / "databases" / "skald").is_dir()
    assert not (tmp_path / "graph" / "server.json").exists()


def test_a_sigterm_after_a_start_in_another_thread_ends_the_process_by_the_signal(
    tmp_path: Path,
) -> None:
    """No handler can be set from another thread, so nothing is held: the signal still takes
    the process the ordinary way (the JVM left it to Python's default), never through a crash."""
    done = _run_child(tmp_path, "SIGTERM", "thread")
    output = done.stdout + done.stderr
    assert done.returncode == -signal.SIGTERM, output
    assert _crash_logs(tmp_path) == [], output


@pytest.fixture
def own_handlers() -> Iterator[list[int]]:
    """SIGTERM, SIGINT and SIGHUP handlers that record what they get; restored after."""
    seen: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    for sig in before:
        signal.signal(sig, lambda signum, frame: seen.append(signum))
    yield seen
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_signals_held_during_the_start_reach_their_handlers_once_after_it(
    own_handlers: list[int],
) -> None:
    with _signals_held():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGHUP)
        assert own_handlers == []  # held, not handled
    # In the order they came, a repeat once.
    assert own_handlers == [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    signal.raise_signal(signal.SIGINT)  # the handlers are back in place
    assert own_handlers == [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGINT]


def test_a_start_with_no_signal_leaves_the_handlers_as_they_were(own_handlers: list[int]) -> None:
    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    with _signals_held():
        pass
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert own_handlers == []
