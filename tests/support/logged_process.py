"""A command of ours running beside a test, its output in a log file: wait for a line of it,
stop it with a signal as a service manager would, or kill it. Deadlines are bounds for a loaded
machine, never asserted as durations."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO_ROOT

START_DEADLINE_S = 240.0
STOP_DEADLINE_S = 60.0


class LoggedProcess:
    """`cmd` started with stdout and stderr appended to `log`; `new_session`: in a process
    group of its own, so `kill` takes its children too."""

    def __init__(
        self,
        cmd: list[str],
        log: Path,
        env: dict[str, str],
        *,
        cwd: Path = REPO_ROOT,
        new_session: bool = False,
    ) -> None:
        self.log = log
        self.new_session = new_session
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=new_session,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, deadline_s: float = START_DEADLINE_S) -> str:
        """The output once it holds `text`; fails if the process exits or the deadline passes."""
        deadline = time.monotonic() + deadline_s
        while text not in (output := self.output()):
            assert self.proc.poll() is None, (
                f"{self.log.name}: exited {self.proc.returncode}: {output[-3000:]}"
            )
            assert time.monotonic() < deadline, f"{self.log.name}: no {text!r}: {output[-3000:]}"
            time.sleep(0.2)
        return output

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Signal the process itself and wait for its exit code; fails (after killing it) if
        it ignores the signal."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.log.name} ignored {sig.name}: {self.output()[-3000:]}"
            ) from None

    def kill(self) -> None:
        if self.new_session:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            self.proc.kill()
        self.proc.wait()


def deployments_worker(pool: str, name: str, log_dir: Path, env: dict[str, str]) -> LoggedProcess:
    """`python -m deployments.worker --pool POOL --worker-name NAME`, as the README runs it, in a
    session of its own; its log is `<log_dir>/<name>.log`."""
    return LoggedProcess(
        [sys.executable, "-m", "deployments.worker", "--pool", pool, "--worker-name", name],
        log_dir / f"{name}.log",
        env,
        new_session=True,
    )
