"""The kill loop the crash harness's three parts share (novel, sidecar, regression batch).

A real run is started as the leader of its own session (`start_new_session=True`), so the whole
process group it owns (the Prefect API server it spawns, uvicorn workers, anything else) is
killed with one `os.killpg(SIGKILL)`: nothing survives to finish the work behind our back. The
scripted LLM server is NOT in that group: it is the harness's, it counts every call, and the
calls spent beyond the uninterrupted run's are the price of the crashes.

Kill moments come from `random.Random(seed)`, so a seed names one sequence of crashes and a
failure can be replayed with the same seed. No library does "kill a process group at seeded
random moments and resume"; the loop is a dozen lines, so it is written here.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GroupRun:
    """One start of a command as the leader of its own process group."""

    cmd: Sequence[str]
    cwd: Path
    env: Mapping[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GroupRun:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(self.cmd),
                cwd=self.cwd,
                env=dict(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_group(self) -> None:
        """SIGKILL to every process of the group (the leader may already be gone)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None, "not started"
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.returncode is None:
                self.kill_group()


@dataclass
class KillRecord:
    attempt: int
    delay_s: float
    killed: bool  # False: the run finished before the moment came
    exit_code: int | None


@dataclass
class KillSeries:
    seed: int
    kills: list[KillRecord] = field(default_factory=list)
    final_exit: int | None = None

    @property
    def landed(self) -> int:
        return sum(1 for k in self.kills if k.killed)


def kill_moments(seed: int, count: int, low_s: float, high_s: float) -> list[float]:
    """`count` delays in [low_s, high_s], the same for the same seed on every machine."""
    rng = random.Random(seed)
    return [round(rng.uniform(low_s, high_s), 3) for _ in range(count)]


def run_with_kills(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    seed: int,
    kills: int,
    low_s: float,
    high_s: float,
    timeout_s: float = 1800.0,
) -> KillSeries:
    """Start `cmd`, SIGKILL its process group after each seeded delay (restarting it each time),
    then let the last start run to its end. A start that ends before its kill moment ends the
    series early (the run is done; later kills would have nothing to interrupt)."""
    series = KillSeries(seed=seed)
    for attempt, delay in enumerate(kill_moments(seed, kills, low_s, high_s), start=1):
        run = GroupRun(cmd, cwd, env, log).start()
        deadline = time.monotonic() + delay
        while run.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        if run.running():
            run.kill_group()
            series.kills.append(KillRecord(attempt, delay, True, None))
            continue
        series.kills.append(KillRecord(attempt, delay, False, run.wait()))
        series.final_exit = run.proc.returncode if run.proc else None
        return series
    series.final_exit = GroupRun(cmd, cwd, env, log).start().wait(timeout=timeout_s)
    return series


def tree_digest(root: Path, patterns: Sequence[str]) -> dict[str, str]:
    """SHA-256 of every file under `root` matching any glob of `patterns`, by relative path."""
    out: dict[str, str] = {}
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                out[path.relative_to(root).as_posix()] = hashlib.sha256(
                    path.read_bytes()
                ).hexdigest()
    return dict(sorted(out.items()))


def differing(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """Relative paths whose digests differ, or that exist on one side only, sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
