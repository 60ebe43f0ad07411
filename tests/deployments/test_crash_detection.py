"""deployments/automations.yaml on a real `prefect server start` (the session's test API runs
no automation triggers): a `write-novel` run whose worker and flow process are killed together,
as when their machine goes down, is marked Crashed once its heartbeats stop, and so is its
running sub-flow; while it lives, past the automation's window, it is not.

Everything is polled with generous deadlines; nothing asserts a duration.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from core.settings import Settings
from tests.conftest import REPO_ROOT
from tests.support.cli import graph_env
from tests.support.logged_process import LoggedProcess
from tests.support.novel_runs import wipe_graph
from tests.support.novel_script import PREMISE, script_novel
from tests.support.prefect_server import PREFECT, api, start_prefect_server
from tests.support.process_guard import descendants, kill
from tests.support.scripted_llm import ScriptedLLM

AUTOMATIONS = REPO_ROOT / "deployments" / "automations.yaml"
PREFECT_YAML = REPO_ROOT / "deployments" / "prefect.yaml"
POOL = "skald-process"
#: Seconds the run lives before it is killed: longer than the automation's window, so a live
#: run that outlives it is shown not to be called Crashed.
LIVE_S = 100.0
#: Bounds for a loaded machine (never asserted as durations).
DEADLINE_S = 600.0


def test_the_automation_watches_only_runs_that_beat_often_enough() -> None:
    from prefect.events.schemas.automations import AutomationCore

    automation = AutomationCore.model_validate(yaml.safe_load(AUTOMATIONS.read_text()))
    trigger = automation.trigger
    watched = str(trigger.match_related.root["prefect.resource.id"])  # type: ignore[union-attr]
    tag = watched.removeprefix("prefect.tag.")
    within = trigger.within.total_seconds()  # type: ignore[union-attr]
    deployments = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
    tagged = [d for d in deployments if tag in d.get("tags", [])]
    assert [d["name"] for d in tagged] == ["write-novel", "heal-graph", "qa-nightly"]
    for deployment in tagged:  # three beats missed before a run is called Crashed
        env = deployment["work_pool"]["job_variables"]["env"]  # where `prefect deploy` reads it
        beat = int(env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"])
        assert 3 * beat <= within, deployment["name"]


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Until `condition()` holds; the bound only keeps a broken run from hanging."""
    end = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {DEADLINE_S:g} s"
        time.sleep(2.0)


def _state(url: str, run_id: str) -> tuple[str, str]:
    state = api(url, f"/flow_runs/{run_id}")["state"] or {}
    return state.get("type", "NONE"), state.get("message") or ""


def _sub_flows(url: str, run_id: str) -> dict[str, str]:
    """Every flow run but `run_id` (its sub-flows: initialization, chapter-N): name -> state."""
    runs: list[dict[str, Any]] = api(url, "/flow_runs/filter", {})
    return {r["name"]: (r["state"] or {}).get("type", "NONE") for r in runs if r["id"] != run_id}


def _running_sub_flow_beating(url: str, run_id: str) -> bool:
    """Whether a sub-flow of `run_id` is Running and the server recorded a heartbeat of it."""
    runs: list[dict[str, Any]] = api(url, "/flow_runs/filter", {})
    running = [
        r["id"] for r in runs if r["id"] != run_id and (r["state"] or {}).get("type") == "RUNNING"
    ]
    if not running:
        return False
    beats = api(
        url,
        "/events/filter",
        {
            "filter": {
                "event": {"name": ["prefect.flow-run.heartbeat"]},
                "resource": {"id": [f"prefect.flow-run.{i}" for i in running]},
            },
            "limit": 1,
        },
    )
    return bool(beats["events"])


def test_a_killed_novel_run_is_marked_crashed_and_a_live_one_is_not(
    graph_settings: Settings, tmp_path: Path, procs: list[LoggedProcess]
) -> None:
    project, logs = tmp_path / "book", tmp_path / "logs"
    logs.mkdir()
    wipe_graph(graph_settings)
    # Slow answers: the book takes minutes, so the run is alive past the automation's window.
    with ScriptedLLM(latency_s=10.0) as llm:
        script_novel(llm)
        env = {
            k: v
            for k, v in graph_env(graph_settings).items()
            if not k.startswith("PREFECT_")  # the session API's settings: triggers off
        }
        env.update(
            OPENAI_BASE_URL=llm.base_url,
            OPENAI_API_KEY="test-key",
            SKALD_EMBEDDING_BASE_URL=llm.base_url,
            SKALD_PROJECT_DIR=str(project),
            PREFECT_HOME=str(tmp_path / "prefect-home"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
        )
        server, url = start_prefect_server(env, logs / "prefect-server.log")
        procs.append(server)

        def prefect(*args: str) -> str:
            done = subprocess.run(
                [PREFECT, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            return done.stdout

        prefect("work-pool", "create", POOL, "--type", "process")
        prefect("automation", "create", "--from-file", str(AUTOMATIONS))
        prefect(
            "--no-prompt", "deploy", "--name", "write-novel", "--prefect-file", str(PREFECT_YAML)
        )
        (deployment,) = api(url, "/deployments/filter", {})
        assert deployment["job_variables"] == {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
        started = prefect(
            "deployment", "run", "novel/write-novel", "--param", "chapters=2",
            "--param", f"premise={PREMISE}", "--param", "scenes_per_chapter=2",
        )  # fmt: skip
        match = re.search(r"UUID: ([0-9a-f-]{36})", started)
        assert match, started
        run_id = match.group(1)
        worker = LoggedProcess(
            [PREFECT, "worker", "start", "--pool", POOL, "--limit", "1"],
            logs / "worker.log",
            env,
            new_session=True,
        )
        procs.append(worker)
        _wait_for(lambda: _state(url, run_id)[0] == "RUNNING", "the run running")
        time.sleep(LIVE_S)
        # Alive past the window and still beating: nobody calls it Crashed.
        assert _state(url, run_id)[0] == "RUNNING", worker.output()[-3000:]
        assert not (project / "chapters" / "chapter_002.md").exists()

        # Its machine goes down while one of its sub-flows runs: the model holds the run's
        # requests, and the test kills it once a request waits while a sub-flow runs (the
        # initialization or a chapter; a request of the parent flow between them, e.g. a
        # chapter's outline, is let through) and the server has that sub-flow's first heartbeat
        # (the automation watches a run from its first heartbeat on). Killed at a set time
        # instead, the run once died between two sub-flows, none running.
        llm.hold()

        def sub_flow_waits_on_the_model() -> bool:
            if llm.held == 0:
                return False
            if _running_sub_flow_beating(url, run_id):
                return True
            llm.release()  # the parent flow's request: let the held ones go, hold the next
            llm.hold()
            return False

        _wait_for(
            sub_flow_waits_on_the_model, "a sub-flow waiting on the model, its heartbeat recorded"
        )
        # The worker and the flow run's process (a session of its own, started by the worker)
        # die at once, with no word to Prefect. The worker is frozen first: still running, it
        # would see its flow process die and report the run Crashed itself ("Process exited
        # ... SIGKILL"), which a loaded machine once gave it time to do between the two kills.
        os.killpg(worker.proc.pid, signal.SIGSTOP)
        kill(descendants(worker.proc.pid))
        worker.kill()
        llm.release()
        asked = llm.request_count
        _wait_for(lambda: _state(url, run_id)[0] == "CRASHED", "the killed run marked Crashed")
        assert "no heartbeat" in _state(url, run_id)[1]
        # Its sub-flow running at the kill went with it (sub-flows carry the run's tags).
        _wait_for(
            lambda: (
                "CRASHED" in (states := _sub_flows(url, run_id).values())
                and "RUNNING" not in states
            ),
            "its running sub-flow marked Crashed",
        )
        assert llm.request_count == asked  # nothing of the killed run was left alive
