"""`python -m deployments.worker` against the session's Prefect API: how it ends when its
Prefect worker is killed from outside (the kernel's OOM killer, a `kill` of that pid), and the
look-alike, the command itself stopped by a service manager's SIGTERM."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from tests.conftest import child_pythonpath, prefect_api_env
from tests.support.logged_process import STOP_DEADLINE_S, LoggedProcess, deployments_worker

POOL = "skald-worker-test"
OUTSIDE = "was ended by SIGKILL from outside this command"


def _worker(tmp_path: Path, name: str, procs: list[LoggedProcess]) -> tuple[LoggedProcess, int]:
    """The command, started, and the pid of the Prefect worker it runs."""
    env = {**os.environ, **prefect_api_env(), "PYTHONPATH": child_pythonpath()}
    worker = deployments_worker(POOL, name, tmp_path, env)
    procs.append(worker)
    started = worker.wait_for("(stop with Ctrl-C or SIGTERM)")
    found = re.search(r"time, pid (\d+) \(stop with", started)
    assert found, started[-3000:]
    return worker, int(found.group(1))


def test_a_prefect_worker_killed_from_outside_ends_the_command_by_the_same_signal(
    prefect_api: str, tmp_path: Path, procs: list[LoggedProcess]
) -> None:
    """A service manager must see that the worker was killed (a failed unit it may restart),
    not an exit status of 256 minus the signal (sys.exit of a negative returncode)."""
    worker, prefect_worker = _worker(tmp_path, "killed", procs)
    os.kill(prefect_worker, signal.SIGKILL)
    assert worker.proc.wait(timeout=STOP_DEADLINE_S) == -signal.SIGKILL, worker.output()[-3000:]
    assert f"the Prefect worker (pid {prefect_worker}) {OUTSIDE}" in worker.output()


def test_the_command_stopped_by_sigterm_stops_its_worker_and_exits_0(
    prefect_api: str, tmp_path: Path, procs: list[LoggedProcess]
) -> None:
    """The look-alike: its own Prefect worker ends too, stopped by the command, not from outside."""
    worker, _ = _worker(tmp_path, "stopped", procs)
    assert worker.stop(signal.SIGTERM) == 0, worker.output()[-3000:]
    assert "worker: stopped after" in worker.output()
    assert OUTSIDE.split(" by ")[0] not in worker.output()
