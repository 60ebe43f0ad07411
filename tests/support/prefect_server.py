"""A real `prefect server start` beside a test, on a free loopback port, with Prefect's own
defaults (the session's API turns the automations' triggers off; a server of one's own has them),
and its REST API read with plain HTTP. Deadlines are bounds for a loaded machine, never asserted
as durations."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from core.graph_server import free_port
from tests.support.logged_process import START_DEADLINE_S, LoggedProcess

PREFECT = str(Path(sys.executable).with_name("prefect"))


def api(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """GET `path` (POST `body` when given) on the API at `url`, the JSON answer."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read() or b"null")


def start_prefect_server(env: dict[str, str], log: Path) -> tuple[LoggedProcess, str]:
    """`prefect server start` under `env` (its PREFECT_API_URL is set to the new server's, in
    place), healthy; the process and its API URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env["PREFECT_API_URL"] = url
    server = LoggedProcess(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        log,
        env,
        new_session=True,
    )
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        assert server.proc.poll() is None, f"prefect server exited: {server.output()[-3000:]}"
        try:
            if api(url, "/health") is True:
                return server, url
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise AssertionError(f"prefect server not healthy: {server.output()[-3000:]}")
        time.sleep(0.5)
