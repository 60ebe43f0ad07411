"""`python -m flows.novel` and `python -m kg` as a user runs them, in subprocesses on the
session's graph (via NEO4J_URI) and the session's Prefect API: the environment, the commands,
a whole book on an empty graph, the graph wiped; and the graph's export, read in this process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from core.settings import Settings, load_settings
from tests.conftest import REPO_ROOT, prefect_api_env
from tests.support.cli import graph_env
from tests.support.scripted_llm import ScriptedLLM


def run_env(
    llm: ScriptedLLM, settings: Settings, prefect_home: Path, **extra: str
) -> dict[str, str]:
    """The environment of a novel run on the session graph and API; `extra` overrides any of it."""
    run = {
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "test-key",
        "SKALD_EMBEDDING_BASE_URL": llm.base_url,
        "PREFECT_HOME": str(prefect_home),
        "SKALD_LIMITS__LLM_MAX_ATTEMPTS": "2",
        **prefect_api_env(),  # `prefect_home` starts the session's API
    }
    return graph_env(settings, **{**run, **extra})


def novel(
    project: Path, env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "flows.novel", "--project-dir", str(project), *args]
    return subprocess.run(
        cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def kg(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kg", *args, "--project-dir", str(project)]
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def export(project: Path, env: dict[str, str], name: str) -> str:
    """The graph `env` points at, as `python -m kg export --project-dir project` writes it
    (the same store call and kg.transfer.dumps_export), read in this process and kept beside
    the project as `<project>-<name>.json`. A `python -m kg` per export cost a Python start-up
    each, a dozen per test file; the command itself is tested in tests/kg/test_kg_cli.py."""
    from kg.store import GraphStore
    from kg.transfer import write_export

    settings = load_settings(
        project,
        neo4j_uri=env["NEO4J_URI"],
        neo4j_username=env["NEO4J_USERNAME"],
        neo4j_password=env["NEO4J_PASSWORD"],
        neo4j_database=env["NEO4J_DATABASE"],
    )
    store = GraphStore.open(settings)
    try:
        out = write_export(store.export_data(), project.parent / f"{project.name}-{name}.json")
    finally:
        store.close()
    return out.read_text(encoding="utf-8")


def write_book(
    llm: ScriptedLLM,
    settings: Settings,
    prefect_home: Path,
    project: Path,
    *args: str,
    **extra: str,
) -> dict[str, str]:
    """On an empty graph, `python -m flows.novel` for `project` with `args`, which must succeed;
    returns the run's environment for the next commands."""
    wipe_graph(settings)
    env = run_env(llm, settings, prefect_home, **extra)
    result = novel(project, env, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    return env


def wipe_graph(settings: Settings) -> None:
    from kg.store import GraphStore

    store = GraphStore.open(settings, migrate=False)
    try:
        store.wipe()
    finally:
        store.close()
