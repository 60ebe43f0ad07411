"""One writer per book project at a time, across processes.

Two runs that write the same project at once (a second `python -m flows.novel` started by
mistake, a scheduled healing or QA deployment that fires while a book is being written, a
`kg rollback` during a run) would interleave their graph writes and files: measured before
this module, two `python -m flows.novel` runs started together on one new project both
failed, one on the schema migration the other was making ("Duplicated key [schema]"), the
other because the first one's process, which served the embedded graph, had exited. And a
healing run that merges entities while a book is being written changes what its next
chapters are written from, so the book would depend on when the schedule fired.

So every command that writes a project holds `<project>/.saga/run.lock` while it runs, and a
second one refuses at once, in one line naming the holder (its process id, its command, since
when), with nothing written. The lock is an OS file lock (`flock`), which the kernel releases
when its process exits however it exits: a run killed with SIGKILL never blocks the next one,
which is the point (a lease that outlives its holder would refuse the resume for its lifetime).
It is held per process and reentrant: the novel flow runs healing and QA inside its own hold.
It excludes the processes of one machine; two machines writing one project folder on a
network share are not excluded (flock over NFS is not reliable), nor are two projects that
share one configured Neo4j database.

The lock itself is the `filelock` package's (flock on POSIX). The holder's description is a
JSON file of its own beside it (`run.holder.json`): the lock file's content belongs to the
lock, and it is only read when the lock is held by another process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import BaseModel, ValidationError

from core.content import atomic_write
from core.errors import ProjectBusyError
from core.graph_server import pid_alive

LOCK_NAME = "run.lock"
HOLDER_NAME = "run.holder.json"


class ProjectHolder(BaseModel):
    """Who holds a project's lock: shown to the command that found it taken."""

    pid: int
    command: str
    since: str  # UTC, ISO 8601 to the second


def _saga_dir(project_dir: Path) -> Path:
    return project_dir.resolve() / ".saga"


def _lock(project_dir: Path) -> FileLock:
    # One instance per path in this process (is_singleton), its holds counted across threads
    # (thread_local=False): the nested holds of one run (main, then its flow, then the healing
    # the flow calls) are one hold, and a Prefect task's thread shares it.
    return FileLock(
        _saga_dir(project_dir) / LOCK_NAME, timeout=0, is_singleton=True, thread_local=False
    )


def holder_of(project_dir: Path) -> ProjectHolder | None:
    """The description the lock's holder wrote, or None (never written, or unreadable)."""
    try:
        return ProjectHolder.model_validate_json(
            (_saga_dir(project_dir) / HOLDER_NAME).read_bytes()
        )
    except (OSError, ValidationError):
        return None


def _busy(project_dir: Path, command: str) -> ProjectBusyError:
    holder = holder_of(project_dir)
    # A holder that has just taken the lock may not have described itself yet: the file then
    # still names the previous holder, whose process is gone, and is not shown.
    who = (
        f"process {holder.pid} (`{holder.command}`, since {holder.since})"
        if holder is not None and pid_alive(holder.pid)
        else "another process"
    )
    return ProjectBusyError(
        f"{project_dir} is being written by {who}, so `{command}` changed nothing",
        hint="wait for that run to finish or stop it, then run again",
    )


@contextmanager
def project_writer(project_dir: Path, command: str) -> Iterator[None]:
    """Hold the project's lock for the block, or raise ProjectBusyError at once if another
    process holds it. Reentrant within a process (the outer hold's description stays)."""
    saga = _saga_dir(project_dir)
    saga.mkdir(parents=True, exist_ok=True)
    lock = _lock(project_dir)
    outermost = not lock.is_locked
    try:
        lock.acquire()
    except Timeout:
        raise _busy(project_dir, command) from None
    try:
        if outermost:
            holder = ProjectHolder(
                pid=os.getpid(),
                command=command,
                since=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            atomic_write(saga / HOLDER_NAME, holder.model_dump_json().encode())
        yield
    finally:
        lock.release()
