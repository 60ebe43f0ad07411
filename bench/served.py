"""What the benchmarks that serve a sidecar share: the command that serves it on loopback, its
start with the output to a log file, waiting for the server they started, and stopping a server
process (the sidecar or the scripted LLM) when they are done."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
HEALTH_PATH = "/api/kg-sidecar/health"
#: A cold start loads the embedding model and starts the JVM graph: a minute on a loaded
#: 2-core machine; five is a server that will not come up.
START_TIMEOUT_S = 300.0


def wait_healthy(
    client: httpx.Client,
    base: str,
    running: Callable[[], bool],
    log: Path,
    bench: str,
    *,
    timeout_s: float = START_TIMEOUT_S,
    poll_s: float = 0.3,
) -> None:
    """Poll the sidecar at `base` until its health answers 200. Exit with the tail of its log
    if the process ends first (`running()` false), or saying where the log is after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not running():
            raise SystemExit(f"{bench}: the server exited: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{bench}: the server did not answer in {timeout_s:.0f} s (see {log})")
        try:
            if client.get(f"{base}{HEALTH_PATH}").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)


def serve_command(port: int, project: Path, *extra: str) -> list[str]:
    """`python -m flows.dialogue serve` on 127.0.0.1:`port` for `project`, then `extra`."""
    return [
        sys.executable,
        "-m",
        "flows.dialogue",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--project-dir",
        str(project),
        *extra,
    ]


def start_sidecar(
    port: int, project: Path, env: dict[str, str], log: Path, *extra: str
) -> subprocess.Popen[str]:
    """`serve_command` started from the repository with `env`, its output to `log` (a file:
    an unread pipe would fill and block the server; the child keeps its own handle)."""
    with log.open("w") as out:
        return subprocess.Popen(
            serve_command(port, project, *extra),
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def stop_process(proc: subprocess.Popen[Any], *, grace_s: float) -> None:
    """Ask `proc` to end (SIGTERM); kill it if it has not ended after `grace_s` seconds. Returns
    once it has ended (reaped: no zombie left)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
