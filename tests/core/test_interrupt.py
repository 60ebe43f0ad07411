"""Ctrl-C reaches the LLM calls of worker threads (core.interrupt): queued calls are never sent,
and the call in flight stops even before the model's first byte."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.interrupt import (
    STOPPING,
    disarm_end_by_signal,
    ending_signal,
    tell_threads_on_sigint,
)
from core.llm import LLMGateway, RetryPolicy
from core.settings import RunLimits, Settings
from tests.support.scripted_llm import ScriptedLLM

PROMPT = [{"role": "user", "content": "Extract the scene's facts."}]


@pytest.fixture
def sigint_as_a_terminal_has_it() -> Iterator[None]:
    # A pytest-xdist worker may ignore SIGINT; a command started from a terminal does not.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        STOPPING.clear()


def _three_calls_on_one_slot(
    server: ScriptedLLM, *, interrupt: bool
) -> tuple[list[BaseException | None], int]:
    """Three calls at once to a server taken one request at a time (`llm_slots = 1`), the first
    held by the server until released, the other two waiting for the slot in Skald; Ctrl-C
    arrives (if `interrupt`) while the first waits on the model. Returns each call's exception
    and how many requests the server received."""
    settings = Settings(
        openai_base_url=server.base_url,
        embedding_base_url=server.base_url,
        limits=RunLimits(llm_slots=1, llm_max_attempts=1),
    )
    gateway = LLMGateway(settings, retry=RetryPolicy(backoff_base_s=0.005))
    before = server.request_count
    server.hold()
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(gateway.text, "small", PROMPT) for _ in range(3)]
        deadline = time.monotonic() + 120  # a bound for a hang, not a margin
        while server.held < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.held == 1, "the first call never reached the server"
        if interrupt:
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)  # what Ctrl-C does to the main thread
            # Every call ends while the server still holds the first: none waits for the model.
            errors = [f.exception(timeout=120) for f in futures]
            server.release()
        else:
            server.release()
            errors = [f.exception(timeout=120) for f in futures]
    return errors, server.request_count - before


def test_ctrl_c_stops_the_calls_of_worker_threads_and_sends_no_queued_one(
    sigint_as_a_terminal_has_it: None,
) -> None:
    restore = tell_threads_on_sigint()
    try:
        with ScriptedLLM() as server:
            # The look-alike first: not interrupted, the three calls are all answered, one at a
            # time.
            errors, sent = _three_calls_on_one_slot(server, interrupt=False)
            assert (errors, sent) == ([None, None, None], 3)
            assert server.max_in_flight == 1
            # Interrupted while the first waits on the model's first byte: its connection is cut,
            # and the two waiting for the slot are never sent.
            errors, sent = _three_calls_on_one_slot(server, interrupt=True)
            assert [type(e) for e in errors] == [KeyboardInterrupt] * 3
            assert sent == 1
            assert STOPPING.is_set()
    finally:
        restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_command_whose_sigint_is_ignored_keeps_it_ignored() -> None:
    # A background job of a shell script has SIGINT ignored: Ctrl-C is not for it.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        restore = tell_threads_on_sigint()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        restore()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        # The true case beside it: the default handler is replaced, then given back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        restore = tell_threads_on_sigint()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_sigterm_to_a_command_stops_its_worker_threads_too() -> None:
    # SIGTERM (a service manager's stop) ends the command through SystemExit
    # (`exit_cleanly_on_termination`); its worker threads must not run their queued calls first.
    from core.graph_server import exit_cleanly_on_termination

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        exit_cleanly_on_termination()
        assert not STOPPING.is_set()
        with pytest.raises(SystemExit) as ended:
            signal.raise_signal(signal.SIGTERM)
        assert ended.value.code == 143
        assert STOPPING.is_set()
        # ... and the process ends by SIGTERM itself once its exit functions have run.
        assert ending_signal() == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)
        STOPPING.clear()
        disarm_end_by_signal()  # this test process exits normally


def test_a_wait_torn_down_by_a_signal_stops_the_workers_and_an_error_does_not() -> None:
    from prefect.exceptions import TerminationSignal

    from core.interrupt import stopping_workers_if_torn_down

    try:
        # The look-alike first: an ordinary error in the wait leaves the workers to finish.
        with pytest.raises(ValueError), stopping_workers_if_torn_down():
            raise ValueError("a task failed")
        assert not STOPPING.is_set()
        # SIGTERM during a flow run comes as Prefect's TerminationSignal.
        with pytest.raises(TerminationSignal), stopping_workers_if_torn_down():
            raise TerminationSignal(signal.SIGTERM)
        assert STOPPING.is_set()
    finally:
        STOPPING.clear()
