"""`python -m deployments.worker --pool POOL`: a Prefect process worker that stops when told.

Any of Skald's work pools (the regression shards, the healing and QA schedules) is served by
this command rather than a bare `prefect worker start`:

- it takes ONE flow run at a time by default (`--limit 1`): the embedded graph and a shard's
  memory are sized for one run per worker, and N workers then run N shards side by side;
- SIGTERM or Ctrl-C stops it within seconds, also when it was started as a background job of
  a script (`... &`, then `kill $!`) or by a service manager. A bare `prefect worker start`
  answers SIGTERM by sending itself SIGINT, which a script's background job ignores (the
  shell starts it with SIGINT ignored): it then runs on;
- the flow runs it started are stopped first (SIGTERM: Prefect's engine ends them Crashed),
  and any that could not report their end are marked Crashed through the API, found by the
  flow run id in their process environment (`PREFECT__FLOW_RUN_ID`), so a run is never left
  Running for ever and never confused with another host's process of the same pid.

Prefect has no option for either behaviour, so this wrapper supervises its worker as a child.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.children import popen_dying_with_parent
from core.cli import run_main, setup_logging
from core.errors import InvalidInputError
from core.interrupt import end_by_signal_at_exit

#: Seconds a stopping worker gives its flow runs to end after SIGTERM before SIGKILL.
STOP_GRACE_S = 10.0


def add_worker_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--pool", required=True, help="the process work pool to serve")
    parser.add_argument(
        "--limit",
        type=int,
        default=1,
        help="flow runs at once (default 1: one run, e.g. one shard, per worker)",
    )
    parser.add_argument(
        "--worker-name", default=None, help="worker name shown in Prefect (default: Prefect's)"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=STOP_GRACE_S,
        help=f"seconds the flow runs get to stop after SIGTERM before SIGKILL (default {STOP_GRACE_S:g})",
    )
    return parser


def _reset_signals_in_child() -> None:
    # A background job of a non-interactive shell starts with SIGINT ignored, and an ignored
    # signal stays ignored across exec: Prefect's worker answers SIGTERM by sending itself
    # SIGINT, which it would then never see.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_worker(pool: str, limit: int, worker_name: str | None, grace: float) -> int:
    """`prefect worker start --pool POOL --limit LIMIT` as a child; SIGTERM/SIGINT here sends
    SIGTERM to it and to every process below it (the flow runs it started sit in sessions of
    their own, out of reach of a process-group signal), then SIGKILL to what is left after
    `grace` seconds. An interrupted flow run ends Crashed; its batch resumes with `--run-id`."""
    if limit < 1:
        raise InvalidInputError("--limit must be >= 1")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    cmd = [
        str(Path(sys.executable).with_name("prefect")),
        "worker",
        "start",
        "--pool",
        pool,
        "--type",
        "process",
        "--limit",
        str(limit),
    ]
    if worker_name:
        cmd += ["--name", worker_name]
    child = popen_dying_with_parent(cmd, preexec_fn=_reset_signals_in_child)
    print(
        f"worker: pool {pool}, {limit} flow run(s) at a time, pid {child.pid} (stop with Ctrl-C or SIGTERM)",
        flush=True,
    )
    while child.poll() is None and not stop.wait(0.2):
        pass
    if child.poll() is not None:
        return ended_by_itself(child)
    # The flow runs first, while their worker still streams their last words: SIGTERM makes
    # Prefect's engine end a run Crashed; then the worker.
    runs = _descendants(child.pid)
    flow_run_ids = _flow_run_ids(runs)  # read now: the processes are about to go
    print(
        f"worker: stopping {len(runs)} process(es) of flow runs, then the worker (SIGTERM)",
        flush=True,
    )
    started = time.monotonic()
    _signal_all(runs, signal.SIGTERM)
    _wait_gone(runs, grace)
    print(
        f"worker: flow run processes gone after {time.monotonic() - started:.1f}s; stopping the worker",
        flush=True,
    )
    _signal_all([child.pid], signal.SIGTERM)
    try:
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    print(f"worker: stopped after {time.monotonic() - started:.1f}s", flush=True)
    left = (
        _alive(runs)
        + _alive(_descendants(child.pid))
        + ([child.pid] if child.poll() is None else [])
    )
    if left:
        print(
            f"worker: {len(left)} process(es) still running after {grace:g}s: SIGKILL", flush=True
        )
        _signal_all(left, signal.SIGKILL)
    child.wait()
    _mark_crashed(flow_run_ids)
    return 0


def ended_by_itself(child: subprocess.Popen[Any]) -> int:
    """The exit status of a Prefect worker that ended while nobody stopped this command. One
    killed by a signal from outside (the kernel's OOM killer, a `kill` of its pid) ends this
    command by the same signal, after one line saying so: a service manager then sees what
    happened to the worker (SIGKILL: a failed unit to restart), where `sys.exit` of its
    negative returncode gave exit status 256 minus the signal."""
    code = child.returncode
    if code >= 0:
        return code
    ended_by = signal.Signals(-code)
    print(
        f"worker: the Prefect worker (pid {child.pid}) was ended by {ended_by.name} from outside "
        "this command; start this command again to serve the pool",
        file=sys.stderr,
        flush=True,
    )
    end_by_signal_at_exit(ended_by)
    return 128 + ended_by


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _mark_crashed(flow_run_ids: list[str]) -> None:
    """A flow run of a process stopped here that did not get to report its end (SIGKILLed, or
    its engine left that to the worker) would stay Running for ever: end it Crashed."""
    if not flow_run_ids:
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        for flow_run_id in flow_run_ids:
            run = client.read_flow_run(flow_run_id)
            if run.state is not None and run.state.type in (StateType.RUNNING, StateType.PENDING):
                client.set_flow_run_state(
                    run.id,
                    Crashed(
                        message="its worker was stopped (SIGTERM); submit the batch again with its --run-id to resume"
                    ),
                    force=True,
                )
                print(f"worker: flow run {run.id} ({run.name}) marked Crashed", flush=True)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), whatever session it put itself in."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _flow_run_ids(pids: list[int]) -> list[str]:
    """The Prefect flow run ids in the environments of these processes (the worker starts each
    flow run with PREFECT__FLOW_RUN_ID set)."""
    found: set[str] = set()
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(b"PREFECT__FLOW_RUN_ID="):
                found.add(item.split(b"=", 1)[1].decode())
    return sorted(found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_worker_arguments(
        argparse.ArgumentParser(
            prog="python -m deployments.worker", description=__doc__.split("\n\n")[0]
        )
    )
    args = parser.parse_args(argv)
    setup_logging(False)
    return run_worker(args.pool, args.limit, args.worker_name, args.grace)


if __name__ == "__main__":
    run_main(main, "deployments.worker", sys.argv[1:])
