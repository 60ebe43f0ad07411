"""The regression batch as the README runs it: a real `prefect server start` on a free loopback
port, a `process` work pool, two `python -m deployments.worker`s (one flow run at
a time each), one graph served by `python -m kg serve`, and a batch of two UNEVEN shards
submitted from another directory (the short shard ends first: before `kg serve`, the shard
that hosted the embedded graph took it away from the other when it ended).

Everything is polled with generous deadlines; nothing asserts a duration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

from tests.conftest import DIALOGUES_DIR, REPO_ROOT, child_pythonpath
from tests.support.dialogue_script import DialogueScript
from tests.support.logged_process import LoggedProcess, deployments_worker
from tests.support.prefect_server import PREFECT, api, start_prefect_server
from tests.support.scripted_llm import ScriptedLLM

POOL = "skald-regression"
SPEAKERS = ["Caroline", "Melanie", "Jon", "Gina"]
#: The uneven shards: a few turns of one dialogue, twenty of the other.
SHORT_TURNS, LONG_TURNS = 6, 20
#: Bounds for a loaded machine (never asserted as durations).
RUN_DEADLINE_S = 600.0


def _watch(api_url: str, runs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Poll the flow runs (id -> shard) to their final states."""
    deadline = time.monotonic() + RUN_DEADLINE_S
    finals: dict[str, dict[str, Any]] = {}
    while len(finals) < len(runs):
        for run_id, shard in runs.items():
            if shard in finals:
                continue
            try:
                run = api(api_url, f"/flow_runs/{run_id}")
            except OSError:  # a busy server answered late: ask again (within the deadline)
                continue
            if run["state"] and run["state"]["type"] in (
                "COMPLETED",
                "FAILED",
                "CRASHED",
                "CANCELLED",
            ):
                finals[shard] = run
        assert time.monotonic() < deadline, f"flow runs not final: {runs}, final: {list(finals)}"
        time.sleep(0.3)
    return finals


def _started_by(run: dict[str, Any], workers: dict[str, LoggedProcess]) -> list[str]:
    """The workers whose output holds the flow run's own first line: a process worker's flow
    run writes to the output of the worker that started it. (Read from the logs, not from the
    process tree while the run lives: a short shard can start and end between two polls.)"""
    line = f"Beginning flow run '{run['name']}'"
    return [name for name, worker in workers.items() if line in worker.output()]


def _dialogue(source: Path, turns: int, target: Path) -> Path:
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:turns]))
    return target


def test_two_workers_run_one_uneven_shard_each_on_a_served_graph(
    tmp_path: Path, procs: list[LoggedProcess]
) -> None:
    project, elsewhere, logs = tmp_path / "regression", tmp_path / "elsewhere", tmp_path / "logs"
    for d in (project, elsewhere, logs):
        d.mkdir()
    dialogues = tmp_path / "dialogues"
    dialogues.mkdir()
    short = _dialogue(
        DIALOGUES_DIR / "locomo-30.turns.jsonl", SHORT_TURNS, dialogues / "a-short.turns.jsonl"
    )
    long = _dialogue(
        DIALOGUES_DIR / "locomo-26.turns.jsonl", LONG_TURNS, dialogues / "b-long.turns.jsonl"
    )

    with ScriptedLLM() as llm:
        DialogueScript(SPEAKERS).install(llm)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NEO4J_", "PREFECT_"))}
        env.update(
            PYTHONPATH=child_pythonpath(),
            PREFECT_HOME=str(tmp_path / "prefect-home"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            # Workers poll often, so the second worker takes the second shard while the
            # first is busy with its one (--limit 1), however slow the machine.
            PREFECT_WORKER_QUERY_SECONDS="1",
            OPENAI_BASE_URL=llm.base_url,
            SKALD_EMBEDDING_BASE_URL=llm.base_url,
        )

        server, api_url = start_prefect_server(env, logs / "prefect-server.log")
        procs.append(server)
        graph = LoggedProcess(
            [sys.executable, "-m", "kg", "serve", "--project-dir", str(project)],
            logs / "kg-serve.log",
            env,
            new_session=True,
        )
        procs.append(graph)
        graph.wait_for("NEO4J_URI=")

        def run(*cmd: str, cwd: Path = REPO_ROOT) -> str:
            done = subprocess.run(
                list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            return done.stdout

        run(PREFECT, "work-pool", "create", POOL, "--type", "process")
        run(
            sys.executable,
            "-m",
            "deployments.regression",
            "deploy",
            "--work-pool",
            POOL,
            "--project-dir",
            str(project),
            "--dialogues",
            str(short),
            str(long),
        )
        workers = {}
        for name in ("worker-a", "worker-b"):
            worker = deployments_worker(POOL, name, logs, env)
            procs.append(worker)
            workers[name] = worker
        for worker in workers.values():
            worker.wait_for("started")

        # From another directory, without --project-dir: the deployment's stored project is used.
        out = run(
            sys.executable,
            "-m",
            "deployments.regression",
            "submit",
            "--shards",
            "2",
            "--turns",
            str(LONG_TURNS),
            "--run-id",
            "ci-batch",
            cwd=elsewhere,
        )
        assert f"project {project.resolve()}" in out
        flow_runs = re.findall(
            r"flow run ([0-9a-f-]{36}) \(.*\): shard (\d)/2 of run ci-batch", out
        )
        assert sorted(s for _, s in flow_runs) == ["0", "1"], out

        finals = _watch(api_url, dict(flow_runs))
        diagnostics = "\n".join(w.output()[-2000:] for w in workers.values())
        assert {s: r["state"]["type"] for s, r in finals.items()} == {
            "0": "COMPLETED",
            "1": "COMPLETED",
        }, diagnostics

        # Each worker ran one shard (--limit 1 each, so the two ran side by side).
        started_by = {shard: _started_by(run, workers) for shard, run in finals.items()}
        assert sorted(name for names in started_by.values() for name in names) == [
            "worker-a",
            "worker-b",
        ], (started_by, diagnostics)

        assert not (elsewhere / ".saga").exists()
        batch = project / ".saga" / "regression" / "ci-batch"
        turns = pl.read_parquet(str(batch / "shard-*" / "turns.parquet"))
        keys = sorted(zip(turns["dialogue_id"].to_list(), turns["turn_id"].to_list(), strict=True))
        expected = sorted(
            [("locomo-30", t) for t in range(1, SHORT_TURNS + 1)]
            + [("locomo-26", t) for t in range(1, LONG_TURNS + 1)]
        )
        assert turns.height == SHORT_TURNS + LONG_TURNS and keys == expected
        assert (
            turns["code"].dtype == pl.String
        )  # null in every row of the short shard: typed all the same
        assert set(turns["run_id"]) == {"ci-batch"}
        assert (batch / "shard-0-of-2" / "report.md").exists() and (
            batch / "shard-1-of-2" / "report.md"
        ).exists()

        # SIGTERM stops each worker, and the graph service, as a service manager would.
        for worker in workers.values():
            assert worker.stop() == 0, worker.output()[-2000:]
        assert graph.stop() == 0 and "graph: stopped" in graph.output()
        server.stop()
