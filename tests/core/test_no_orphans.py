"""Children die with their parent (core.children), and the session sees every process it
started, orphans included (tests/support/process_guard.py). The end-to-end case, SIGKILL of a
running `python -m flows.novel`, is in
test_novel_e2e.py::test_sigkill_during_chapter_two_then_resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support import process_guard

# A parent with three `sleep` children: one spawned dying-with-parent from the main thread,
# one from a worker thread that has ended by the time the parent is killed, one plain.
PARENT = """
import json, subprocess, sys, threading
from core.children import popen_dying_with_parent

main = popen_dying_with_parent(["sleep", "600"])
box = {}
worker = threading.Thread(target=lambda: box.update(p=popen_dying_with_parent(["sleep", "600"])))
worker.start(); worker.join()
plain = subprocess.Popen(["sleep", "600"])
print(json.dumps({"main": main.pid, "worker": box["p"].pid, "plain": plain.pid}), flush=True)
sys.stdin.read()
"""


def test_children_die_with_a_sigkilled_parent_but_a_plain_child_survives() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        # The worker thread is gone, yet its child lives: it is tied to the process.
        assert process_guard.wait_until_gone({pids["worker"]}, deadline_s=0) != []
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert process_guard.wait_until_gone({pids["main"], pids["worker"]}, deadline_s=60) == []
        survivors = process_guard.wait_until_gone({pids["plain"]}, deadline_s=0)
        assert [p.pid for p in survivors] == [pids["plain"]]
        # ...and the session still sees that orphan: it was re-parented to us, the subreaper.
        assert pids["plain"] in {p.pid for p in process_guard.descendants(os.getpid())}
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        process_guard.kill(
            [p for p in process_guard.descendants(os.getpid()) if p.cmdline == "sleep 600"]
        )


def test_the_guard_sees_orphans_of_the_session_but_not_other_processes() -> None:
    shell = subprocess.run(
        ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(shell.stdout)
    try:
        ours = {p.pid: p for p in process_guard.descendants(os.getpid())}
        assert orphan in ours and ours[orphan].ppid == os.getpid()
        assert os.getppid() not in ours and 1 not in ours  # what started pytest is not its own
    finally:
        process_guard.kill([process_guard.ProcessInfo(orphan, os.getpid(), "S", "sleep 600")])
    assert process_guard.wait_until_gone({orphan}, deadline_s=0) == []


def test_a_server_child_sits_away_from_the_terminals_ctrl_c_and_a_plain_one_does_not() -> None:
    from core.children import popen_dying_with_parent

    server = popen_dying_with_parent(["sleep", "600"], away_from_terminal=True)
    plain = popen_dying_with_parent(["sleep", "600"])
    try:
        # Ctrl-C reaches the terminal's foreground process group: ours, and the plain child's.
        assert os.getpgid(plain.pid) == os.getpgid(0)
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)
    finally:
        for child in (server, plain):
            child.kill()
            child.wait()


# A server stand-in: `ready` once it has (or, with "ignore", has not) taken SIGINT as uvicorn does.
_SERVER = """
import signal, sys, time
if sys.argv[1] == "handle":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
print("ready", flush=True)
time.sleep(600)
"""


def _pending(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("ShdPnd")), 16)


def test_a_server_stopped_by_its_parent_only_outlives_sigterm_and_stops_on_terminate() -> None:
    from core.children import popen_dying_with_parent

    servers = {
        how: popen_dying_with_parent(
            [sys.executable, "-c", _SERVER, how],
            away_from_terminal=True,
            stopped_by_parent_only=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        for how in ("handle", "ignore")
    }
    try:
        for server in servers.values():
            assert server.stdout is not None and server.stdout.readline() == "ready\n"
        # A service manager's SIGTERM stays pending (blocked), so it cannot have ended it.
        serving = servers["handle"]
        os.kill(serving.pid, signal.SIGTERM)
        assert _pending(serving.pid) & (1 << (signal.SIGTERM - 1))
        assert serving.poll() is None
        # Its parent's stop is SIGINT, which the server handles: a clean exit.
        serving.terminate()
        assert serving.wait(timeout=60) == 0
        # The look-alike: a server that has not taken SIGINT yet (still starting) would ignore
        # it, so it is killed instead of waited for.
        starting = servers["ignore"]
        starting.terminate()
        assert starting.wait(timeout=60) == -signal.SIGKILL
    finally:
        for server in servers.values():
            if server.poll() is None:
                server.kill()
                server.wait()
