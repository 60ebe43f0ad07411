"""The maintenance deployments: deployments/prefect.yaml registered against a temporary
Prefect API with the real CLI (`prefect --no-prompt deploy --all`), one run triggered
and executed by a real `process` worker, and the `serve` deployments' schedules.

The run is the QA deployment on the session graph (seeded through the real commit
path): the worker's flow process finds the graph the test process serves (its
`server.json`) and writes the Parquet report into the project directory.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from core.settings import Settings
from kg.store import GraphStore
from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support.story_seed import plant_qa_problems, seed_story

POOL = "skald-process"
PREFECT = str(Path(sys.executable).with_name("prefect"))


@pytest.fixture
def seeded(graph_settings: Settings) -> Iterator[Settings]:
    store = GraphStore.open(graph_settings)
    try:
        store.wipe()
        seed_story(store)
        plant_qa_problems(store)
    finally:
        store.close()
    yield graph_settings


def _env(project_dir: Path) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ)
    env.update(
        PREFECT_API_URL=str(PREFECT_API_URL.value()),
        SKALD_PROJECT_DIR=str(project_dir),
        PYTHONPATH=child_pythonpath(),
    )
    return env


async def _ensure_pool() -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        except ObjectAlreadyExists:
            pass


async def _deployments() -> dict[str, dict[str, object]]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = {}
        for d in await client.read_deployments():
            flow = await client.read_flow(d.flow_id)
            found[f"{flow.name}/{d.name}"] = {
                "pool": d.work_pool_name,
                "crons": sorted(s.schedule.cron for s in d.schedules),  # type: ignore[union-attr]
                "parameters": d.parameters,
                "entrypoint": d.entrypoint,
            }
        return found


async def _wait_final(flow_run_id: object, timeout: float) -> str:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while True:
            run = await client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
            if run.state is not None and run.state.is_final():
                return run.state.type.value
            if time.monotonic() > deadline:
                return run.state.type.value if run.state else "NONE"
            await asyncio.sleep(1.0)


@pytest.mark.usefixtures("prefect_api")
def test_prefect_yaml_deploys_and_a_worker_runs_qa(seeded: Settings) -> None:
    from prefect.deployments import run_deployment

    project = seeded.project_dir
    env = _env(project)
    asyncio.run(_ensure_pool())
    deploy = subprocess.run(
        [PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-2000:]

    registered = asyncio.run(_deployments())
    assert registered["graph-healing/heal-graph"] == {
        "pool": POOL,
        "crons": ["30 2 * * *"],
        "parameters": {"project_dir": str(project)},
        "entrypoint": "flows/maintenance.py:heal_flow",
    }
    assert registered["graph-qa/qa-nightly"] == {
        "pool": POOL,
        "crons": ["0 3 * * *"],
        "parameters": {"project_dir": str(project)},
        "entrypoint": "flows/maintenance.py:qa_flow",
    }

    # Reports are named by the chapter and change-set they checked (not the clock), and the
    # session's project may hold one for this very graph from another test: start clean.
    for old in (project / ".saga" / "qa").glob("qa-*.parquet"):
        old.unlink()
    flow_run = run_deployment("graph-qa/qa-nightly", timeout=0)
    worker = subprocess.run(
        [PREFECT, "worker", "start", "--pool", POOL, "--run-once", "--limit", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    state = asyncio.run(_wait_final(flow_run.id, timeout=60))
    assert state == "COMPLETED", worker.stdout[-3000:] + worker.stderr[-3000:]
    reports = sorted((project / ".saga" / "qa").glob("qa-*.parquet"))
    assert [r.name[:12] for r in reports] == ["qa-ch0005-cs"]
    findings = pq.read_table(reports[0]).to_pylist()
    assert {f["check"] for f in findings} == {
        "contradictory_traits",
        "dead_character_acting",
        "dangling_reference",
        "provisional_buildup",
        "before_first_appearance",
    }


def test_serve_builds_both_scheduled_deployments(tmp_path: Path) -> None:
    from flows.maintenance import DEFAULT_QA_CRON, heal_flow, qa_flow

    heal = heal_flow.to_deployment(
        name="heal-graph", cron="0 */6 * * *", parameters={"project_dir": str(tmp_path)}
    )
    qa = qa_flow.to_deployment(
        name="qa-nightly", cron=DEFAULT_QA_CRON, parameters={"project_dir": str(tmp_path)}
    )
    assert [s.schedule.cron for s in heal.schedules] == ["0 */6 * * *"]  # type: ignore[union-attr]
    assert [s.schedule.cron for s in qa.schedules] == ["0 3 * * *"]  # type: ignore[union-attr]
    assert heal.parameters == qa.parameters == {"project_dir": str(tmp_path)}
    assert heal.entrypoint is not None and heal.entrypoint.endswith("heal_flow")
