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
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.cli import run_main, setup_logging
from core.errors import InvalidInputError
from deployments.worker import add_worker_arguments, run_worker
from flows.regression import RegressionParams, regression_flow

REPO_ROOT = Path(__file__).resolve().parent.parent
FLOW_NAME = "long-dialogue-regression"
DEFAULT_DEPLOYMENT = "batch"
DEFAULT_DIALOGUES = str((REPO_ROOT.parent / "shared" / "data" / "dialogues").resolve())


def default_parameters(project_dir: str, dialogues: list[str]) -> dict[str, Any]:
    # Absolute: a worker runs the flow in a working directory of its own.
    params = RegressionParams(
        project_dir=str(Path(project_dir).resolve()),
        dialogues=[str(Path(d).resolve()) for d in dialogues],
    )
    return {"params": params.model_dump(mode="json")}


def shard_parameters(base: RegressionParams, shards: int, run_id: str) -> list[dict[str, Any]]:
    """One parameter set per shard: same run id and conversation prefix, shard i/N each."""
    return [
        {
            "params": base.model_copy(
                update={"run_id": run_id, "shard": f"{i}/{shards}"}
            ).model_dump(mode="json")
        }
        for i in range(shards)
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deployments.regression",
        description="The long-dialogue regression as a Prefect deployment.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{deploy,worker,serve,submit}"
    )
    name = argparse.ArgumentParser(add_help=False)
    name.add_argument(
        "--name", default=DEFAULT_DEPLOYMENT, help=f"deployment name (default {DEFAULT_DEPLOYMENT})"
    )
    common = argparse.ArgumentParser(add_help=False, parents=[name])
    common.add_argument(
        "--project-dir", default=".", help="default project of the runs (default .)"
    )
    common.add_argument(
        "--dialogues",
        nargs="+",
        default=[DEFAULT_DIALOGUES],
        metavar="PATH",
        help="default dialogue files/directories of the runs",
    )
    deploy = sub.add_parser(
        "deploy", parents=[common], help="register the deployment on a work pool"
    )
    deploy.add_argument(
        "--work-pool", required=True, help="a process work pool (prefect work-pool create ...)"
    )
    add_worker_arguments(
        sub.add_parser(
            "worker",
            help="a process worker of the pool (python -m deployments.worker): one shard at a time, "
            "stopping with its flow runs on SIGTERM/Ctrl-C",
        )
    )
    sub.add_parser("serve", parents=[common], help="register and run flow runs in this process")
    submit = sub.add_parser("submit", parents=[name], help="start one batch as N shard flow runs")
    submit.add_argument(
        "--project-dir", default=None, help="project of the runs (default: the deployment's)"
    )
    submit.add_argument(
        "--dialogues",
        nargs="+",
        default=None,
        metavar="PATH",
        help="dialogue files/directories (default: the deployment's)",
    )
    submit.add_argument(
        "--shards", type=int, default=2, help="flow runs to split the dialogues into (default 2)"
    )
    submit.add_argument("--turns", type=int, default=20, help="turns per dialogue (default 20)")
    submit.add_argument(
        "--concurrency", type=int, default=4, help="dialogues at once per shard (default 4)"
    )
    submit.add_argument(
        "--run-id",
        default=None,
        help="run id shared by the shards (default: timestamp); an earlier run's id resumes it",
    )
    return parser


def stored_parameters(name: str) -> RegressionParams:
    """The parameters the deployment was registered with (`deploy --project-dir ...`)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
        except ObjectNotFound:
            raise InvalidInputError(
                f"no deployment {FLOW_NAME}/{name} on the Prefect API",
                hint="register it first: python -m deployments.regression deploy ...",
            ) from None
    return RegressionParams.model_validate(deployment.parameters["params"])


def submit_parameters(stored: RegressionParams, args: argparse.Namespace) -> RegressionParams:
    """The stored parameters, with what the command line gives explicitly on top."""
    update: dict[str, Any] = {"turns": args.turns, "concurrency": args.concurrency}
    if args.project_dir is not None:
        update["project_dir"] = str(Path(args.project_dir).resolve())
    if args.dialogues is not None:
        update["dialogues"] = [str(Path(d).resolve()) for d in args.dialogues]
    return stored.model_copy(update=update)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(False)
    if args.command == "worker":
        return run_worker(args.pool, args.limit, args.worker_name, args.grace)
    if args.command == "deploy":
        defaults = default_parameters(args.project_dir, args.dialogues)
        flow = regression_flow.from_source(
            source=str(REPO_ROOT), entrypoint="flows/regression.py:regression_flow"
        )
        flow.deploy(
            name=args.name,
            work_pool_name=args.work_pool,
            parameters=defaults,
            build=False,
            push=False,
            description="Replay long dialogues through the sidecar and enforce the release gates.",
            tags=["skald", "regression"],
        )
        return 0
    if args.command == "serve":
        regression_flow.serve(
            name=args.name,
            parameters=default_parameters(args.project_dir, args.dialogues),
            tags=["skald", "regression"],
        )
        return 0
    from prefect.deployments import run_deployment

    if args.shards < 1:
        raise InvalidInputError("--shards must be >= 1")
    run_id = args.run_id or f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    base = submit_parameters(stored_parameters(args.name), args)
    print(f"run {run_id}: project {base.project_dir}, dialogues {' '.join(base.dialogues)}")
    for parameters in shard_parameters(base, args.shards, run_id):
        run = run_deployment(f"{FLOW_NAME}/{args.name}", parameters=parameters, timeout=0)
        print(
            f"flow run {run.id} ({run.name}): shard {parameters['params']['shard']} of run {run_id}"
        )
    return 0


if __name__ == "__main__":
    run_main(main, "deployments.regression", sys.argv[1:])
