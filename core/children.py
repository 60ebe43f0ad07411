"""Child processes that die with the process that started them, even when it is SIGKILLed.

Every child Skald starts, itself (llama-server) or through Prefect (the temporary API server
of Prefect's ephemeral mode, a `uvicorn` child), is spawned by `popen_dying_with_parent`: the
child asks the kernel (prctl PR_SET_PDEATHSIG) to send it SIGTERM when its parent goes, so
no `kill -9`, crash or forgotten atexit hook can leave an orphan behind.

Those two servers also sit in a process group of their own (`away_from_terminal`): Ctrl-C in a
terminal sends SIGINT to the whole foreground group, and a server killed by it under a run
that is still reporting its end leaves Prefect's client retrying a dead API for minutes per
state (measured: `python -m flows.novel` still hung 4 minutes after one Ctrl-C, printing
`ConnectError` tracebacks). Out of the terminal's group they hear only their parent: its
stop at exit, or the kernel's SIGTERM when it dies.

Prefect's API server must also outlive a SIGTERM sent to every process at once, as a service
manager does (systemd's default `KillMode=control-group`): killed beside its run, it left the
run retrying the dead API to report its end, 156 s and exit 1 instead of 143 with a clean end
(measured). It is started `stopped_by_parent_only`: SIGTERM blocked (a blocked signal stays
blocked across exec, and neither Python nor uvicorn unblocks it) and SIGINT ignored until
uvicorn takes it (Python leaves an ignored SIGINT ignored; uvicorn shuts down on SIGINT as on
SIGTERM, then raises it again under the handler it found: ignored, rather than a
KeyboardInterrupt traceback on the terminal). Its parent stops it with SIGINT, and the kernel
SIGKILLs it when its parent dies (a server that hears no SIGTERM has nothing else to end it
there; its SQLite database survives a kill). A service manager's SIGKILL, after its patience,
still ends it.

The kernel ties that signal to the *thread* that forked the child, not to the process. A
child forked from a short-lived worker thread (a Prefect task thread, say) would be killed
when that thread ends, so children are forked from the main thread, or from one spawner
thread that lives as long as the process.

Prefect 3.8.8 starts its ephemeral API with a plain `subprocess.Popen` in
`prefect.server.api.server.SubprocessASGIServer._run_uvicorn_command`, with no way to pass
a preexec hook. `make_prefect_children_die_with_parent` swaps the `subprocess` module that
Prefect's server module sees for one whose `Popen` is ours, when Prefect imports that module;
nothing else changes (the pin in pyproject.toml keeps that code as read).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import importlib.abc
import importlib.machinery
import os
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


@functools.cache
def _libc() -> ctypes.CDLL:
    # Loaded in the parent: a dlopen between fork and exec can deadlock on a lock another
    # thread of the parent held at fork time.
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _die_with_parent(libc: ctypes.CDLL, parent_pid: int, signum: int) -> None:
    # Runs in the child between fork and exec: ask the kernel to signal it when the parent
    # (thread) dies. If the parent already died before the request, nobody would ever ask.
    if libc.prctl(_PR_SET_PDEATHSIG, signum) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)


def _takes_sigint(pid: int) -> bool:
    """Whether process `pid` has its own SIGINT handler (`SigCgt` in /proc/<pid>/status); True
    when that cannot be read (the process is gone: sending it anything is moot)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    caught = next(
        (line.split()[1] for line in status.splitlines() if line.startswith("SigCgt")), "0"
    )
    return bool(int(caught, 16) >> (signal.SIGINT - 1) & 1)


class _StoppedByInterrupt(subprocess.Popen):  # type: ignore[type-arg]
    """A child started `stopped_by_parent_only`: its SIGTERM is blocked, so `terminate` (as
    Prefect stops its server) sends SIGINT, which uvicorn handles as it handles SIGTERM. In its
    first seconds, before uvicorn takes SIGINT, the signal is still ignored and the server serves
    nothing yet: it is killed then, or Prefect's stop would wait 5 s for it (a run interrupted
    right after it started)."""

    def terminate(self) -> None:
        self.send_signal(signal.SIGINT if _takes_sigint(self.pid) else signal.SIGKILL)


def _spawn(
    args: Any, kwargs: dict[str, Any], away_from_terminal: bool, stopped_by_parent_only: bool
) -> subprocess.Popen[Any]:
    preexec = kwargs.pop("preexec_fn", None)
    libc, parent = _libc(), os.getpid()
    on_parent_death = signal.SIGKILL if stopped_by_parent_only else signal.SIGTERM

    def preexec_fn() -> None:
        _die_with_parent(libc, parent, on_parent_death)
        if away_from_terminal:
            os.setpgid(0, 0)
        if stopped_by_parent_only:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if preexec is not None:
            preexec()

    popen = _StoppedByInterrupt if stopped_by_parent_only else subprocess.Popen
    return popen(args, preexec_fn=preexec_fn, **kwargs)  # noqa: S603 - callers' argv


def popen_dying_with_parent(
    args: Any,
    *,
    away_from_terminal: bool = False,
    stopped_by_parent_only: bool = False,
    **kwargs: Any,
) -> subprocess.Popen[Any]:
    """`subprocess.Popen(args, **kwargs)` whose child gets SIGTERM when this process dies;
    `away_from_terminal` puts it in a process group of its own, out of reach of Ctrl-C (for a
    server this process stops itself; not for a child whose own Ctrl-C handling is wanted);
    `stopped_by_parent_only` makes it deaf to SIGTERM from anyone: `terminate` sends SIGINT,
    which it must handle itself, and this process's death SIGKILLs it (for a server that must
    outlive a SIGTERM sent to this process and it at once; see the module's docstring)."""
    if threading.current_thread() is threading.main_thread():
        return _spawn(args, kwargs, away_from_terminal, stopped_by_parent_only)
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            # One worker that lives until interpreter shutdown: children forked from it die
            # with the process, not with whichever worker thread happened to need them.
            _spawner = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="skald-spawner"
            )
        spawner = _spawner
    return spawner.submit(_spawn, args, kwargs, away_from_terminal, stopped_by_parent_only).result()


class _SubprocessDyingWithParent(types.ModuleType):
    """The `subprocess` module, except that `Popen` children die with their parent, sit away
    from the terminal's Ctrl-C and are stopped by their parent only (the module serves only
    Prefect's API server)."""

    def __init__(self) -> None:
        super().__init__("subprocess")
        self.Popen = functools.partial(
            popen_dying_with_parent, away_from_terminal=True, stopped_by_parent_only=True
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


_PREFECT_SERVER_MODULE = "prefect.server.api.server"


def _patch_prefect_server(module: types.ModuleType) -> None:
    if not isinstance(module.subprocess, _SubprocessDyingWithParent):
        module.subprocess = _SubprocessDyingWithParent()


class _PatchPrefectServerOnImport(importlib.abc.MetaPathFinder):
    """Patches Prefect's server module when Prefect imports it (only a run that starts the
    ephemeral API does), so a CLI that never needs it does not pay the import (~3 s)."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _PREFECT_SERVER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        load = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            load(module)
            _patch_prefect_server(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def make_prefect_children_die_with_parent() -> None:
    """Make Prefect's ephemeral API server (its `uvicorn` child) die with this process."""
    module = sys.modules.get(_PREFECT_SERVER_MODULE)
    if module is not None:
        _patch_prefect_server(module)
    elif not any(isinstance(f, _PatchPrefectServerOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchPrefectServerOnImport())


def stop_prefect_temporary_server() -> None:
    """Stop Prefect's temporary API server now, once its clients have sent what they hold.

    A run that ends on one line for the user (an error, Ctrl-C) prints it last. Prefect stops
    its temporary server only at interpreter exit, after that line, and the server, terminated
    in the middle of its own background work, may print a traceback ending in CancelledError
    under it. Stopping it here (SIGTERM, then a wait for it to exit) puts whatever it prints
    before the line. Only in ephemeral mode (no PREFECT_API_URL): a configured API, or the one a
    test harness registers under the same instance, belongs to someone else.
    """
    module = sys.modules.get(_PREFECT_SERVER_MODULE)
    if module is None:  # never imported: no temporary server was started
        return
    from prefect.settings import get_current_settings

    if get_current_settings().api.url is not None:
        return
    server = module.SubprocessASGIServer()  # ephemeral mode's one instance (made if absent)
    if server.server_process is not None:
        # Logs and events still queued go out first: sent after the stop they would fail
        # loudly ("Error logging to API"). Each waits at most 5 s, as Prefect's own flush.
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)
        EventsWorker.drain_all(timeout=5)
    server.stop()
