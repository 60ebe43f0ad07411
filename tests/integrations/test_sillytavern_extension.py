"""The SillyTavern extension (integrations/sillytavern/) under node's own test runner, against
the real sidecar its helper serves on loopback, on this session's graph."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from core.settings import Settings
from tests.conftest import REPO_ROOT
from tests.support.cli import graph_vars


def test_node_test_runner_passes_the_extension_tests(graph_settings: Settings) -> None:
    node = shutil.which("node")
    assert node, "node (>= 20) is needed to test integrations/sillytavern (apt-get install nodejs)"
    env = {
        **os.environ,
        "SKALD_PYTHON": sys.executable,
        **graph_vars(graph_settings),
    }
    env.pop("OPENAI_API_KEY", None)
    done = subprocess.run(
        [node, "--test", "integrations/sillytavern/"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    failed = done.stdout.find("    not ok")  # the first failing test, not the suite's summary
    assert done.returncode == 0, done.stdout[max(0, failed) :][:4000] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# pass 30" in done.stdout, done.stdout[-2000:]
