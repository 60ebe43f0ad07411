"""Ctrl-C for the worker threads: Python raises KeyboardInterrupt in the main thread only.

A run interrupted while its tasks work in threads (a chapter's scenes extracted four at a
time) ended only once each of them had finished: their LLM calls waited their turn for the
embedded server's one slot and then ran whole, so one Ctrl-C took 82 s to end `python -m
flows.novel` on the tiny model (minutes on a large one). While a command runs
(`core.cli.run_main`), SIGINT also sets `STOPPING`, and the LLM driver (core.llm.steps) raises
KeyboardInterrupt in its thread instead of starting, queueing for or reading on an answer. An
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


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    STOPPING.set()
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
        STOPPING.set()
        raise
