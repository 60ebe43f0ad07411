"""The embedded graph's start leaves the process's standard error as it found it, but for the
notice the JVM prints at every start (core.graph_server.INCUBATOR_NOTICE): a command's failure
is then one line, not that notice and the line. Each test starts a graph of its own in a child
process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core.graph_server import INCUBATOR_NOTICE
from tests.conftest import REPO_ROOT

# The child: the graph's start, with a line of its own written to standard error from inside
# the start (before the JVM), which must come through; argv[2] "unfiltered" starts the JVM
# without the filter, the control that shows the JVM does print the notice.
START = """
import contextlib, os, sys
from pathlib import Path
import arcadedb_embedded.jvm as jvm
import core.graph_server as graph_server

if sys.argv[2] == "unfiltered":
    graph_server._incubator_notice_dropped = contextlib.nullcontext
start_jvm = jvm.start_jvm
def start_jvm_after_a_line(*args, **kwargs):
    os.write(2, b"a line of the process's own\\n")
    return start_jvm(*args, **kwargs)
jvm.start_jvm = start_jvm_after_a_line

graph_server.EmbeddedArcadeDB.for_dir(Path(sys.argv[1])).endpoint()
print("started", flush=True)
"""


def _start(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("ARCADEDB_JVM_ERROR_FILE", None)
    return subprocess.run(
        [sys.executable, "-c", START, str(tmp_path / "graph"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_jvms_notice_is_dropped_and_every_other_line_kept(tmp_path: Path) -> None:
    done = _start(tmp_path, "filtered")
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-2000:]
    assert INCUBATOR_NOTICE.decode() not in done.stderr
    assert "a line of the process's own" in done.stderr


def test_without_the_filter_the_jvm_prints_its_notice(tmp_path: Path) -> None:
    # The control: the line the filter drops is there to drop.
    done = _start(tmp_path, "unfiltered")
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-2000:]
    assert INCUBATOR_NOTICE.decode() in done.stderr
