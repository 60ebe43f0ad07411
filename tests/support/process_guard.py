"""Which processes a test session started, and whether any of them outlives it.

The session process makes itself a *child subreaper* (prctl PR_SET_CHILD_SUBREAPER): a
process orphaned anywhere below it (a `uvicorn` whose `python -m flows.novel` parent was
SIGKILLed, say) is re-parented to the session instead of to PID 1, so it stays in the
session's process tree and a walk of that tree (/proc) finds every process the session
started, directly or not. At session end, after every fixture is torn down and the
in-process services that would otherwise stop at interpreter exit are stopped, anything
still in that tree has outlived what started it: the session fails and names it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    state: str
    cmdline: str

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def _stat(pid: int) -> ProcessInfo | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
        cmd = (
            (_PROC / str(pid) / "cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ')'.
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    comm = head.partition("(")[2]
    return ProcessInfo(pid=pid, ppid=int(fields[1]), state=fields[0], cmdline=cmd or f"[{comm}]")


def processes() -> dict[int, ProcessInfo]:
    found: dict[int, ProcessInfo] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (info := _stat(int(entry.name))) is not None:
            found[info.pid] = info
    return found


def descendants(pid: int) -> list[ProcessInfo]:
    """Every process below `pid` in the process tree, zombies included."""
    table = processes()
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: list[ProcessInfo] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(table[child])
        stack.extend(children.get(child, []))
    return found


def reap_zombies() -> None:
    """Collect exited children of this process that no Popen object waits for (orphans
    re-parented to the subreaper); running or Popen-owned ones are left alone."""
    for info in descendants(os.getpid()):
        if info.ppid == os.getpid() and not info.alive:
            try:
                os.waitpid(info.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def become_subreaper() -> bool:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def wait_until_gone(pids: set[int], deadline_s: float) -> list[ProcessInfo]:
    """Wait (bounded) for `pids` to exit; returns those still running at the deadline.

    A process that got its parent-death signal needs a moment to shut down; the bound only
    keeps a broken run from hanging, it is not a timing assertion.
    """
    end = time.monotonic() + deadline_s
    while True:
        reap_zombies()
        table = processes()
        left = [table[p] for p in sorted(pids) if p in table and table[p].alive]
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.2)


def kill(infos: list[ProcessInfo]) -> None:
    for info in infos:
        try:
            os.kill(info.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reap_zombies()
