"""One writer per project across processes (core.project_lock): a second process that would
write a project another one is writing refuses at once, in one line naming the holder, and
changes nothing; a holder killed with SIGKILL blocks nobody; holds nest within a process.

The holder is a real process (`python -c`, the module's own `project_writer`) that says "held"
and then waits for its stdin to close: every step waits for an event, never for a time.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import ProjectBusyError
from core.project_lock import holder_of, project_writer

REPO_ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import sys
from pathlib import Path
from core.project_lock import project_writer
with project_writer(Path(sys.argv[1]), "a holder of the test"):
    print("held", flush=True)
    sys.stdin.read()
print("released", flush=True)
"""


def _env() -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SKALD_", "NEO4J_"))},
        "PYTHONPATH": str(REPO_ROOT),
    }


class Holder:
    """A process holding a project's lock until `release()` or `kill()`."""

    def __init__(self, project: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(project)],
            cwd=REPO_ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line == "held\n", f"the holder did not take the lock: {line!r}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def release(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        assert self.process.stdout.readline() == "released\n"
        assert self.process.wait(timeout=120) == 0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=120)
        assert self.process.returncode == -signal.SIGKILL


def _hold_once(project: Path) -> subprocess.CompletedProcess[str]:
    """Another process that takes the lock and lets it go at once, or fails to take it."""
    return subprocess.run(
        [sys.executable, "-c", HOLD, str(project)],
        cwd=REPO_ROOT,
        env=_env(),
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Holder]:
    held = Holder(tmp_path / "book")
    yield held
    if held.process.poll() is None:
        held.kill()


def _tree(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_a_second_process_is_refused_while_another_holds_the_project(
    tmp_path: Path, holder: Holder
) -> None:
    project = tmp_path / "book"
    with pytest.raises(ProjectBusyError) as refused, project_writer(project, "a second run"):
        pytest.fail("the lock was taken twice")
    line = str(refused.value)
    assert f"is being written by process {holder.pid} (`a holder of the test`, since " in line
    assert "`a second run` changed nothing" in line and "\n" not in line
    assert refused.value.exit_code == 3
    # The look-alike: once the holder is done, the same call goes through.
    holder.release()
    with project_writer(project, "a second run"):
        described = holder_of(project)
        assert described is not None and described.pid == os.getpid()


def test_a_holder_killed_with_sigkill_blocks_nobody(tmp_path: Path, holder: Holder) -> None:
    project = tmp_path / "book"
    holder.kill()
    # Its lock file and description are still there; the kernel released the lock itself.
    assert (project / ".saga" / "run.lock").exists()
    described = holder_of(project)
    assert described is not None and described.pid == holder.pid
    with project_writer(project, "the resumed run"):
        described = holder_of(project)
        assert described is not None and described.command == "the resumed run"


def test_holds_nest_within_a_process_and_end_with_the_outermost(tmp_path: Path) -> None:
    project = tmp_path / "book"
    with project_writer(project, "the outer run"):
        with project_writer(project, "its healing"):
            described = holder_of(project)
            assert described is not None and described.command == "the outer run"
        # Still held by the outer block: another process is refused.
        refused = _hold_once(project)
        assert refused.returncode != 0 and "ProjectBusyError" in refused.stderr
    # Released: another process takes it.
    taken = _hold_once(project)
    assert taken.returncode == 0 and taken.stdout == "held\nreleased\n", taken.stderr[-2000:]


@pytest.mark.parametrize(
    "command",
    [
        [
            "flows.novel",
            "--project-dir",
            "{project}",
            "--premise",
            "A last winter.",
            "--chapters",
            "1",
        ],
        ["flows.maintenance", "qa", "--project-dir", "{project}"],
        ["flows.maintenance", "heal", "--project-dir", "{project}"],
        ["kg", "--project-dir", "{project}", "rollback", "--chapter", "1"],
    ],
    ids=["novel", "qa", "heal", "kg-rollback"],
)
def test_the_commands_that_write_a_project_refuse_in_one_line_and_change_nothing(
    tmp_path: Path, holder: Holder, command: list[str]
) -> None:
    project = tmp_path / "book"
    before = _tree(project)
    done = subprocess.run(
        [sys.executable, "-m", *(arg.format(project=project) for arg in command)],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"is being written by process {holder.pid} (`a holder of the test`" in last
    assert last.endswith("(wait for that run to finish or stop it, then run again)")
    assert _tree(project) == before  # no graph started, no file written


def test_a_deployment_run_that_finds_the_project_busy_fails_in_prefect(
    tmp_path: Path, holder: Holder, prefect_api: str
) -> None:
    from flows.maintenance import qa_flow

    state = qa_flow(str(tmp_path / "book"), return_state=True)
    assert state.is_failed()
    assert f"is being written by process {holder.pid}" in (state.message or "")
