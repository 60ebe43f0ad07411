"""The embedded graph's password file (`.saga/graph/credentials.json`) lost, corrupted or not
the graph's: one line naming it and what to do, the file not made anew with a password the graph
does not hold, and the remedy that line gives opens the graph with its data.

ArcadeDB keeps the root password it was first started with (hashed, in
data/config/server-users.jsonl); each `python -m kg stats` here (`migrate` first: it may start a project) starts the project's
embedded graph in its own process, as a user's command does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from core.graph_server import GRAPH_USERS
from tests.conftest import REPO_ROOT
from tests.support.served_graph import embedded_graph_env


def _stats(project: Path, command: str = "stats") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kg", command, "--project-dir", str(project)],
        env=embedded_graph_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_a_lost_or_corrupted_password_file_is_named_with_its_remedy(tmp_path: Path) -> None:
    project = tmp_path / "book"
    project.mkdir()
    created = _stats(project, "migrate")  # a command that may start a project's graph
    assert created.returncode == 0, created.stderr[-3000:]
    assert "applied migration" in created.stderr  # a new graph: its schema made once
    graph = project / ".saga" / "graph"
    credentials, users = graph / "credentials.json", graph / GRAPH_USERS
    kept = credentials.read_bytes()

    credentials.unlink()
    line = _error_line(_stats(project))
    assert line.startswith(f"kg: error: {credentials} is missing: "), line
    assert f"restore {credentials}; or delete it and {users}" in line
    assert not credentials.exists()  # no new password the graph would refuse next time

    credentials.write_text('{"user": "root"')
    line = _error_line(_stats(project))
    assert line.startswith(f"kg: error: {credentials} is corrupted ("), line

    credentials.write_text('{"user": "root", "password": "skald-not-the-graphs"}')
    line = _error_line(_stats(project))
    assert "refused the credentials for user 'root'" in line and f"restore {credentials}" in line
    assert "NEO4J_PASSWORD" not in line  # the embedded graph's password is no setting of theirs

    credentials.write_bytes(kept)  # restored: as before
    assert _stats(project).returncode == 0

    # The remedy: both files deleted, the graph takes a new password and keeps its data.
    credentials.unlink()
    users.unlink()
    reopened = _stats(project)
    assert reopened.returncode == 0, reopened.stderr[-3000:]
    assert "applied migration" not in reopened.stderr and "(schema version" in reopened.stdout
    assert credentials.read_bytes() != kept
