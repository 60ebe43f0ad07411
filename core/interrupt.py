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
"""

from __future__ import annotations

import signal
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
