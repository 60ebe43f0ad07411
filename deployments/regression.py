"""`python -m deployments.regression`: the long-dialogue regression as a Prefect deployment.

    deploy   register `long-dialogue-regression/<name>` on a work pool, with the project and
             dialogues the runs use unless `submit` says otherwise:
                 prefect work-pool create skald-process --type process
                 python -m deployments.regression deploy --work-pool skald-process --project-dir DIR
    worker   run a Prefect process worker for the pool that takes ONE flow run at a time
             (`--limit 1`: each worker runs one shard) and stops, with the flow runs it
             started, within seconds of SIGTERM or Ctrl-C, also as a background job:
                 python -m deployments.regression worker --pool skald-process   # one per shard at once
    serve    register it and run its flow runs in this process (no work pool, one machine)
    submit   spread one batch over the workers: N flow runs, shard i/N each, one run id, so
             every worker replays a different slice of the dialogues at the same time:
                 python -m deployments.regression submit --shards 4 --turns 50

Each shard writes `<project>/.saga/regression/<run_id>/shard-I-of-N/` (turns.parquet, report.md,
...); `pl.read_parquet("<run_id>/shard-*/turns.parquet")` reads the whole batch. The
project directory and dialogue paths must be valid on the workers (a shared filesystem or
the same checkout), and every worker must reach the same graph: `python -m kg serve
--project-dir DIR` (the shards then find it through the project), or NEO4J_URI.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.children import popen_dying_with_parent
from core.cli import run_main, setup_logging
from core.errors import InvalidInputError
from flows.regression import RegressionParams, regression_flow

REPO_ROOT = Path(__file__).resolve().parent.parent
FLOW_NAME = "long-dialogue-regression"
DEFAULT_DEPLOYMENT = "batch"
DEFAULT_DIALOGUES = str((REPO_ROOT.parent / "shared" / "data" / "dialogues").resolve())
#: Seconds a stopping worker gives its flow runs to end after SIGTERM before SIGKILL.
STOP_GRACE_S = 10.0


def default_parameters(project_dir: str, dialogues: list[str]) -> dict[str, Any]:
    # Absolute: a worker runs the flow in a working directory of its own.
    params = RegressionParams(project_dir=str(Path(project_dir).resolve()),
                              dialogues=[str(Path(d).resolve()) for d in dialogues])
    return {"params": params.model_dump(mode="json")}


def shard_parameters(base: RegressionParams, shards: int, run_id: str) -> list[dict[str, Any]]:
    """One parameter set per shard: same run id and conversation prefix, shard i/N each."""
    return [
        {"params": base.model_copy(update={"run_id": run_id, "shard": f"{i}/{shards}"}).model_dump(mode="json")}
        for i in range(shards)
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m deployments.regression",
                                     description="The long-dialogue regression as a Prefect deployment.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{deploy,worker,serve,submit}")
    name = argparse.ArgumentParser(add_help=False)
    name.add_argument("--name", default=DEFAULT_DEPLOYMENT, help=f"deployment name (default {DEFAULT_DEPLOYMENT})")
    common = argparse.ArgumentParser(add_help=False, parents=[name])
    common.add_argument("--project-dir", default=".", help="default project of the runs (default .)")
    common.add_argument("--dialogues", nargs="+", default=[DEFAULT_DIALOGUES], metavar="PATH",
                        help="default dialogue files/directories of the runs")
    deploy = sub.add_parser("deploy", parents=[common], help="register the deployment on a work pool")
    deploy.add_argument("--work-pool", required=True, help="a process work pool (prefect work-pool create ...)")
    worker = sub.add_parser("worker", help="a process worker of the pool that runs one shard at a time, "
                            "stopping with its flow runs on SIGTERM/Ctrl-C")
    worker.add_argument("--pool", required=True, help="the work pool the deployment is on")
    worker.add_argument("--limit", type=int, default=1, help="flow runs at once (default 1: one shard per worker)")
    worker.add_argument("--worker-name", default=None, help="worker name shown in Prefect (default: Prefect's)")
    worker.add_argument("--grace", type=float, default=STOP_GRACE_S,
                        help=f"seconds the flow runs get to stop after SIGTERM before SIGKILL (default {STOP_GRACE_S:g})")
    sub.add_parser("serve", parents=[common], help="register and run flow runs in this process")
    submit = sub.add_parser("submit", parents=[name], help="start one batch as N shard flow runs")
    submit.add_argument("--project-dir", default=None, help="project of the runs (default: the deployment's)")
    submit.add_argument("--dialogues", nargs="+", default=None, metavar="PATH",
                        help="dialogue files/directories (default: the deployment's)")
    submit.add_argument("--shards", type=int, default=2, help="flow runs to split the dialogues into (default 2)")
    submit.add_argument("--turns", type=int, default=20, help="turns per dialogue (default 20)")
    submit.add_argument("--concurrency", type=int, default=4, help="dialogues at once per shard (default 4)")
    submit.add_argument("--run-id", default=None,
                        help="run id shared by the shards (default: timestamp); an earlier run's id resumes it")
    return parser


def stored_parameters(name: str) -> RegressionParams:
    """The parameters the deployment was registered with (`deploy --project-dir ...`)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
        except ObjectNotFound:
            raise InvalidInputError(f"no deployment {FLOW_NAME}/{name} on the Prefect API",
                                    hint="register it first: python -m deployments.regression deploy ...") from None
    return RegressionParams.model_validate(deployment.parameters["params"])


def submit_parameters(stored: RegressionParams, args: argparse.Namespace) -> RegressionParams:
    """The stored parameters, with what the command line gives explicitly on top."""
    update: dict[str, Any] = {"turns": args.turns, "concurrency": args.concurrency}
    if args.project_dir is not None:
        update["project_dir"] = str(Path(args.project_dir).resolve())
    if args.dialogues is not None:
        update["dialogues"] = [str(Path(d).resolve()) for d in args.dialogues]
    return stored.model_copy(update=update)


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
    cmd = [str(Path(sys.executable).with_name("prefect")), "worker", "start", "--pool", pool, "--type", "process",
           "--limit", str(limit)]
    if worker_name:
        cmd += ["--name", worker_name]
    child = popen_dying_with_parent(cmd, preexec_fn=_reset_signals_in_child)
    print(f"worker: pool {pool}, {limit} flow run(s) at a time, pid {child.pid} (stop with Ctrl-C or SIGTERM)",
          flush=True)
    while child.poll() is None and not stop.wait(0.2):
        pass
    if child.poll() is not None:
        return child.returncode
    # The flow runs first, while their worker still streams their last words: SIGTERM makes
    # Prefect's engine end a run Crashed; then the worker.
    runs = _descendants(child.pid)
    print(f"worker: stopping {len(runs)} process(es) of flow runs, then the worker (SIGTERM)", flush=True)
    started = time.monotonic()
    _signal_all(runs, signal.SIGTERM)
    _wait_gone(runs, grace)
    print(f"worker: flow run processes gone after {time.monotonic() - started:.1f}s; stopping the worker", flush=True)
    _signal_all([child.pid], signal.SIGTERM)
    try:
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    print(f"worker: stopped after {time.monotonic() - started:.1f}s", flush=True)
    left = _alive(runs) + _alive(_descendants(child.pid)) + ([child.pid] if child.poll() is None else [])
    if left:
        print(f"worker: {len(left)} process(es) still running after {grace:g}s: SIGKILL", flush=True)
        _signal_all(left, signal.SIGKILL)
    child.wait()
    _mark_crashed([str(pid) for pid in runs])
    return 0


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _mark_crashed(infrastructure_pids: list[str]) -> None:
    """A flow run of a process stopped here that did not get to report its end (SIGKILLed, or
    its engine left that to the worker) would stay Running for ever: end it Crashed."""
    if not infrastructure_pids:
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        unfinished = client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))))
        for run in unfinished:
            if run.infrastructure_pid in infrastructure_pids:
                client.set_flow_run_state(run.id, Crashed(
                    message="its worker was stopped (SIGTERM); submit the batch again with its --run-id to resume"),
                    force=True)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(False)
    if args.command == "worker":
        return run_worker(args.pool, args.limit, args.worker_name, args.grace)
    if args.command == "deploy":
        defaults = default_parameters(args.project_dir, args.dialogues)
        flow = regression_flow.from_source(source=str(REPO_ROOT), entrypoint="flows/regression.py:regression_flow")
        flow.deploy(name=args.name, work_pool_name=args.work_pool, parameters=defaults, build=False, push=False,
                    description="Replay long dialogues through the sidecar and enforce the release gates.",
                    tags=["skald", "regression"])
        return 0
    if args.command == "serve":
        regression_flow.serve(name=args.name, parameters=default_parameters(args.project_dir, args.dialogues),
                              tags=["skald", "regression"])
        return 0
    from prefect.deployments import run_deployment

    if args.shards < 1:
        raise InvalidInputError("--shards must be >= 1")
    run_id = args.run_id or f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    base = submit_parameters(stored_parameters(args.name), args)
    print(f"run {run_id}: project {base.project_dir}, dialogues {' '.join(base.dialogues)}")
    for parameters in shard_parameters(base, args.shards, run_id):
        run = run_deployment(f"{FLOW_NAME}/{args.name}", parameters=parameters, timeout=0)
        print(f"flow run {run.id} ({run.name}): shard {parameters['params']['shard']} of run {run_id}")
    return 0


if __name__ == "__main__":
    run_main(main, "deployments.regression", sys.argv[1:])
