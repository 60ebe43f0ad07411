"""The deployments of deployments/prefect.yaml, registered against a temporary Prefect API with
the real CLI (`prefect --no-prompt deploy`), their runs triggered and executed by a real
`process` worker; and the `serve` deployments' schedules.

- QA on the session graph (seeded through the real commit path): the worker's flow process
  finds the graph the test process serves (its `server.json`) and writes the Parquet report
  into the project directory.
- The novel, as a writer starts it from the UI: the worker's run writes the book against the
  scripted LLM, and `python -m flows.novel` afterwards replays it from the same cache.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from core.settings import Settings
from kg.store import GraphStore
from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support.novel_runs import novel, run_env, wipe_graph
from tests.support.novel_script import PREMISE, script_novel
from tests.support.prefect_server import PREFECT
from tests.support.scripted_llm import ScriptedLLM
from tests.support.story_seed import plant_qa_problems, seed_story

POOL = "skald-process"


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


def _env(project_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ if base is None else base)
    env.update(
        PREFECT_API_URL=str(PREFECT_API_URL.value()),
        SKALD_PROJECT_DIR=str(project_dir),
        PYTHONPATH=child_pythonpath(),
    )
    return env


def _prefect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PREFECT, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )


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
    deploy = _prefect(
        env, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"
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
    worker = _prefect(env, "worker", "start", "--pool", POOL, "--run-once", "--limit", "1")
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


def _book_files(project: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(project)): path.read_bytes()
        for folder in ("chapters", "characters", "outline", "world", "exports")
        for path in sorted((project / folder).rglob("*"))
        if path.is_file()
    }


@pytest.mark.usefixtures("prefect_api")
def test_a_worker_writes_the_novel_and_the_cli_replays_it(
    graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    project = tmp_path / "book"
    wipe_graph(graph_settings)
    asyncio.run(_ensure_pool())
    with ScriptedLLM() as llm:
        script_novel(llm)
        env = _env(project, run_env(llm, graph_settings, prefect_home))
        deploy = _prefect(
            env,
            "--no-prompt",
            "deploy",
            "--name",
            "write-novel",
            "--prefect-file",
            "deployments/prefect.yaml",
        )
        assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-2000:]
        registered = asyncio.run(_deployments())["novel/write-novel"]
        assert registered["parameters"] == {"project_dir": str(project)}
        assert registered["crons"] == []  # started by a writer, never by the clock

        flow_run = run_deployment(
            "novel/write-novel",
            parameters={"chapters": 2, "premise": PREMISE, "scenes_per_chapter": 2, "acts": 2},
            timeout=0,
        )
        worker = _prefect(env, "worker", "start", "--pool", POOL, "--run-once", "--limit", "1")
        state = asyncio.run(_wait_final(flow_run.id, timeout=60))
        assert state == "COMPLETED", worker.stdout[-3000:] + worker.stderr[-3000:]
        written = _book_files(project)
        assert {"chapters/chapter_001.md", "chapters/chapter_002.md"} <= set(written)
        assert "exports/manuscript.epub" in written

        # The CLI continues the same book: the deployment run filled the project's own cache
        # with what the CLI would have asked, so it asks nothing and writes the same bytes.
        asked = llm.request_count
        replay = novel(project, env, "--chapters", "2", "--scenes-per-chapter", "2")
        assert replay.returncode == 0, replay.stderr[-3000:]
        assert llm.request_count == asked
        assert _book_files(project) == written


@pytest.mark.usefixtures("prefect_api")
def test_a_novel_run_without_a_premise_for_a_new_project_fails_and_writes_nothing(
    tmp_path: Path,
) -> None:
    from flows.novel import novel_flow

    project = tmp_path / "new-book"
    state = novel_flow(str(project), 2, return_state=True)
    assert state.is_failed()
    assert "a new project needs a premise" in str(state.message)
    assert not (project / ".saga" / "project.json").exists()
    assert not (project / "chapters").exists()


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
