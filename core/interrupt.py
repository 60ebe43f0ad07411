"""Ctrl-C for the worker threads: Python raises KeyboardInterrupt in the main thread only.

A run interrupted while its tasks work in threads (a chapter's scenes extracted four at a
time) ended only once each of them had finished: their LLM calls waited their turn for the
embedded server's one slot and then ran whole, so one Ctrl-C took 82 s to end `python -m
flows.novel` on the tiny model (minutes on a large one). While a command runs
(`core.cli.run_main`), SIGINT also sets `STOPPING`, and the LLM driver (core.llm.steps) raises
KeyboardInterrupt in its thread instead of starting, queueing for or reading on an answer. A
call still waiting for its answer's first byte (a large model reads a long prompt for minutes)
is cut as well: what sets `STOPPING` also runs the callbacks registered with `on_stop`, and the
LLM endpoints' one shuts their connections down (core.llm.routing). An
interrupted task's step is not cached, so the resumed run asks it again, as the uninterrupted run
would have. KeyboardInterrupt rather than an error: a task that falls back on an error must not
finish (and cache) a fallback because of Ctrl-C.

SIGTERM and SIGHUP, which end a command through SystemExit
(`core.graph_server.exit_cleanly_on_termination`), set `STOPPING` as well: a service manager
waits only so long (systemd: 90 s) before SIGKILL. A process whose SIGINT is ignored (a
background job of a shell script) or handled by someone else is left as it is.

A command stopped by a signal ends by that signal once it has stopped cleanly
(`end_by_signal_at_exit`), not with the exit status 128 + the signal that a shell shows for it.
The two differ to whoever waits for the process. A shell script running `for p in ...; do
python -m flows.novel ...; done` goes on to its next command after a Ctrl-C that the command
answered with exit 130, and stops when the command died by SIGINT (bash's wait-and-cooperative-
exit rule; measured). systemd counts a main process that died by SIGTERM as stopped cleanly and
one that exited 143 as failed (systemd.service(5), SuccessExitStatus=: "programs should perform
cleanup and kill themselves with the same signal"). Python does this itself for a
KeyboardInterrupt nobody catches (since 3.8); a command that catches it to print its one line,
or turns SIGTERM into SystemExit to close the graph's files, must do it itself.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOPPING = threading.Event()
#: What `stop_workers` runs besides setting `STOPPING` (in registration order, each once per
#: registration). Run from a signal handler too, so each must be quick and take no lock that
#: the main thread may hold.
_ON_STOP: list[Callable[[], None]] = []


def on_stop(callback: Callable[[], None]) -> None:
    """Run `callback` whenever the run is stopped (`stop_workers`), e.g. to cut a blocking wait
    that no flag can reach."""
    if callback not in _ON_STOP:
        _ON_STOP.append(callback)


def stop_workers() -> None:
    """Tell every thread the run is stopping: set `STOPPING` and run the `on_stop` callbacks."""
    STOPPING.set()
    for callback in tuple(_ON_STOP):
        callback()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    stop_workers()
    raise KeyboardInterrupt


def tell_threads_on_sigint() -> Callable[[], None]:
    """From the main thread: make SIGINT set `STOPPING` too. Returns what undoes it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return lambda: None
    STOPPING.clear()
    signal.signal(signal.SIGINT, _on_sigint)
    return lambda: signal.signal(signal.SIGINT, previous)


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt in this thread once the run was interrupted."""
    if STOPPING.is_set():
        raise KeyboardInterrupt


@contextmanager
def stopping_workers_if_torn_down() -> Iterator[None]:
    """Around the main thread's wait on worker threads' futures. During a flow run Prefect
    answers SIGTERM with its own handler (TerminationSignal, raised here) rather than the one
    that sets `STOPPING`, and its task runner then waits for every worker before the flow ends:
    a run sent SIGTERM while a chapter's scenes were extracted took 59 s to exit on the tiny
    model. Whatever tears the run down here (that signal, SystemExit, KeyboardInterrupt: any
    BaseException that is no Exception) stops the workers' LLM calls too; an ordinary error
    leaves them to finish, as before."""
    try:
        yield
    except Exception:
        raise
    except BaseException:
        stop_workers()
        raise


#: The signal this process ends by once its exit functions have run (`end_by_signal_at_exit`).
_ENDING_SIGNAL: list[int] = []


def end_by_signal_at_exit(signum: int) -> None:
    """Make this process end by `signum` (its default action) when it exits, after every exit
    function (the graph's files closed, Prefect's logs sent) and with standard output flushed.
    The caller then exits as it would have (SystemExit 128 + signum), which is also what
    happens should the signal not end the process."""
    if not _ENDING_SIGNAL:
        # Registered now, so it is the last registered and runs first; it runs the others
        # itself (atexit runs them last-registered first, and has no hook after them).
        atexit.register(_end_by_signal)
    _ENDING_SIGNAL[:] = [signum]


def ending_signal() -> int | None:
    """The signal this process will end by (`end_by_signal_at_exit`), if any."""
    return _ENDING_SIGNAL[0] if _ENDING_SIGNAL else None


def disarm_end_by_signal() -> None:
    """Exit normally after all (for a process that goes on after catching the SystemExit)."""
    _ENDING_SIGNAL.clear()


def _end_by_signal() -> None:
    if not _ENDING_SIGNAL:
        return
    signum = _ENDING_SIGNAL[0]
    atexit.unregister(_end_by_signal)
    # CPython's atexit runs the functions registered before this one here, once; the outer
    # run then finds none left (atexit has no public way to run them, nor to run last).
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader has gone
            pass
    if signum != signal.SIGKILL:  # whose action is fixed: it cannot be set or blocked
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
