"""Our commands in a subprocess on the session's graph: `graph_env` is the environment that
points a child process at the graph (and nothing else of the caller's SKALD_/NEO4J_/OPENAI_
settings), `graph_vars` its NEO4J_* variables alone, `run_module` runs `python -m MODULE ARGS`
from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys

from core.graph_server import graph_endpoint
from core.settings import Settings
from tests.conftest import REPO_ROOT, child_pythonpath


def graph_vars(graph_settings: Settings) -> dict[str, str]:
    """The NEO4J_* variables that point a process at the session graph."""
    ep = graph_endpoint(graph_settings)
    return {
        "NEO4J_URI": ep.uri,
        "NEO4J_USERNAME": ep.username,
        "NEO4J_PASSWORD": ep.password,
        "NEO4J_DATABASE": ep.database,
    }


def graph_env(graph_settings: Settings, **extra: str) -> dict[str, str]:
    """The caller's environment without SKALD_/NEO4J_/OPENAI_ settings, pointed at the session
    graph."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKALD_", "NEO4J_", "OPENAI_"))}
    return {**env, **graph_vars(graph_settings), "PYTHONPATH": child_pythonpath(), **extra}


def run_module(
    module: str, *args: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` from the checkout, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
