"""`python -m kg serve` beside a test: the embedded graph of a project as a process of its own,
and the environment of a process that must find a project's embedded graph (no NEO4J_*)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import child_pythonpath
from tests.support.logged_process import LoggedProcess


def embedded_graph_env() -> dict[str, str]:
    """The caller's environment without NEO4J_* settings: a child uses its project's embedded
    graph, served by whichever process owns it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEO4J_")}
    env["PYTHONPATH"] = child_pythonpath()
    return env


class Served(LoggedProcess):
    """One `python -m kg serve` process, its output in a log file."""

    def __init__(self, project: Path, log: Path, *extra: str) -> None:
        cmd = [sys.executable, "-m", "kg", "serve", "--project-dir", str(project), *extra]
        super().__init__(cmd, log, embedded_graph_env())

    def wait_ready(self) -> str:
        return self.wait_for("NEO4J_URI=")
