"""Shared fixtures: one embedded ArcadeDB (or NEO4J_URI) and one Prefect test API per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings, load_settings
from kg.store import GraphStore

REPO_ROOT = Path(__file__).resolve().parent.parent
DIALOGUES_DIR = REPO_ROOT.parent / "shared" / "data" / "dialogues"

# Tests never talk to a real provider by accident: each test that needs an LLM points
# OPENAI_BASE_URL at the scripted server (or, for smoke tests, the local llama-server).
for _var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "SKALD_EMBEDDING_BASE_URL"):
    os.environ.pop(_var, None)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@pytest.fixture(scope="session")
def graph_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project dir whose embedded graph lives for the whole test session."""
    return tmp_path_factory.mktemp("graph-project")


@pytest.fixture(scope="session")
def graph_settings(graph_project: Path) -> Iterator[Settings]:
    """Settings for the session graph: NEO4J_URI when set, else embedded ArcadeDB."""
    from core.graph_server import graph_endpoint

    settings = load_settings(graph_project)
    graph_endpoint(settings)  # start once, up front
    yield settings


@pytest.fixture(scope="module")
def graph(graph_settings: Settings) -> Iterator[GraphStore]:
    """One connection to the session graph per test module."""
    store = GraphStore.open(graph_settings)
    yield store
    store.close()


@pytest.fixture
def store(graph: GraphStore) -> GraphStore:
    """The session graph, wiped: every test using it starts from an empty (migrated) graph."""
    graph.wipe()
    return graph


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """One temporary Prefect API for every test that runs real flows in-process."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
