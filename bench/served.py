"""What the benchmarks that serve a sidecar share: waiting for the server they started."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

HEALTH_PATH = "/api/kg-sidecar/health"


def wait_healthy(client: httpx.Client, base: str, server: subprocess.Popen[str], log: Path, bench: str) -> None:
    """Poll the sidecar at `base` until its health answers 200; exit with the tail of its log
    if the process ends first."""
    while True:
        if server.poll() is not None:
            raise SystemExit(f"{bench}: the server exited: {log.read_text()[-2000:]}")
        try:
            if client.get(f"{base}{HEALTH_PATH}").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
