"""`python -m kg serve`: the embedded graph as a process of its own that outlives its clients,
and what a client meets when the process serving an embedded graph goes away.

Each server here is a real `python -m kg serve` process on a project of its own; the client
is a GraphStore in this process that found it through `server.json`, as any second process
of a project does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import GraphOwnerGoneError
from core.graph_server import EmbeddedArcadeDB, GraphEndpoint, owner_exited, owner_gone
from kg.store import GraphStore
from tests.conftest import REPO_ROOT
from tests.support.logged_process import START_DEADLINE_S
from tests.support.served_graph import Served, embedded_graph_env


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait()


def test_a_served_graph_outlives_clients_and_a_client_names_a_lost_owner_then_reconnects(
    tmp_path: Path, servers: list[Served]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    first = Served(project, tmp_path / "serve-1.log")
    servers.append(first)
    out = first.wait_ready()
    env_file = project / ".saga" / "graph" / "neo4j.env"
    assert f"set -a; . {env_file.resolve()}; set +a" in out
    settings = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert set(settings) == {"NEO4J_URI", "NEO4J_USERNAME", "NEO4J_PASSWORD", "NEO4J_DATABASE"}
    assert f"NEO4J_URI={settings['NEO4J_URI']} " in out and settings["NEO4J_PASSWORD"] not in out
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"

    # A second server on the same project is refused in one line: the graph is served already.
    second = subprocess.run(
        [sys.executable, "-m", "kg", "serve", "--project-dir", str(project)],
        cwd=REPO_ROOT,
        env=embedded_graph_env(),
        capture_output=True,
        text=True,
        timeout=START_DEADLINE_S,
    )
    assert second.returncode != 0
    assert f"already served by process {first.proc.pid}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr

    # A client of this process finds it through the project, and a client that stops leaves it running.
    endpoint = EmbeddedArcadeDB.for_dir(project / ".saga" / "graph").endpoint()
    assert endpoint.owner_pid == first.proc.pid and endpoint.uri == settings["NEO4J_URI"]
    with GraphStore(endpoint) as short_lived:
        assert short_lived.stats().schema_version > 0  # `serve` migrated it
    store = GraphStore(endpoint).connect()
    try:
        assert store.stats().nodes >= 0
        assert owner_gone(store.endpoint) is None  # the look-alike: the owner is alive

        assert first.stop(signal.SIGTERM) == 0
        assert "graph: stopped" in first.output()
        assert not env_file.exists() and not (project / ".saga" / "graph" / "server.json").exists()

        with pytest.raises(GraphOwnerGoneError) as lost:
            store.stats()
        line = str(lost.value)
        assert "\n" not in line and f"process {first.proc.pid}, which exited mid-run" in line
        assert f"python -m kg serve --project-dir {project.resolve()}" in line

        # A new owner: the same store reconnects to it on its next use.
        third = Served(project, tmp_path / "serve-2.log")
        servers.append(third)
        third.wait_ready()
        assert store.stats().nodes >= 0
        assert store.endpoint.owner_pid == third.proc.pid
    finally:
        store.close()
    # Ctrl-C stops it as cleanly as SIGTERM.
    assert third.stop(signal.SIGINT) == 0 and "graph: stopped" in third.output()


def test_serve_refuses_bad_ports_and_a_configured_neo4j(tmp_path: Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "kg", "serve", "--project-dir", str(tmp_path), "--bolt-port", "0"],
        cwd=REPO_ROOT,
        env=embedded_graph_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--bolt-port must be a port number" in bad.stderr
    neo4j = subprocess.run(
        [sys.executable, "-m", "kg", "serve", "--project-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        env={**embedded_graph_env(), "NEO4J_URI": "bolt://127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert neo4j.returncode != 0 and "NEO4J_URI is set" in neo4j.stderr
    assert not (tmp_path / ".saga" / "graph" / "server.json").exists()


def test_an_exited_owner_is_told_from_a_live_one_before_any_transaction(tmp_path: Path) -> None:
    # GraphStore asks this before each transaction: against a dead owner's port the driver
    # would retry the transaction for 30 s before failing.
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()

    def served_by(pid: int | None, *, embedded: bool = True) -> GraphEndpoint:
        return GraphEndpoint("bolt://127.0.0.1:9", "root", "pw", "skald", embedded, tmp_path, pid)

    assert owner_exited(served_by(exited.pid))
    # The look-alikes: a live owner, this process, no owner, a Neo4j server.
    assert not owner_exited(served_by(os.getppid()))
    assert not owner_exited(served_by(os.getpid()))
    assert not owner_exited(served_by(None))
    assert not owner_exited(served_by(exited.pid, embedded=False))
