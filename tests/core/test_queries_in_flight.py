"""core.priority.QueriesInFlight: a background step waits while a memory query is in flight and
goes on when it is answered (or after its bound); a query's own work never waits for itself;
nothing waits when no query is in flight or when waiting is off. Plus the LLM clients' hook: a
background chat call's answer is processed only once the query in flight is answered (real HTTP,
the scripted server).

No timing margins: a step that should wait is seen waiting (`waiting`) before the query ends,
with bounds far above what any step needs, so a loaded machine changes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from core.llm import LLMGateway
from core.priority import QUERIES, QueriesInFlight
from core.settings import Settings
from tests.support.scripted_llm import ScriptedLLM

LONG_S = 60.0  # a bound no passing test comes near


def until(condition: Callable[[], bool], limit_s: float = LONG_S) -> bool:
    """Poll `condition` until it holds (True) or `limit_s` passes (False)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def test_a_background_step_waits_for_the_query_in_flight_and_goes_on_when_it_is_answered() -> None:
    gate = QueriesInFlight(max_wait_s=LONG_S)
    events: list[str] = []
    with gate.serving():
        thread, waited = in_thread(lambda: (gate.yield_to_queries(), events.append("step"))[0])
        assert until(lambda: gate.waiting == 1), "the step did not wait for the query"
        assert not events
        events.append("answered")
    thread.join(LONG_S)
    assert events == ["answered", "step"]
    assert waited and waited[0] > 0
    assert gate.totals()["yields"] == 1 and gate.totals()["timed_out"] == 0
    assert gate.in_flight == 0 and gate.waiting == 0


def test_a_query_never_waits_for_itself_nor_for_the_queries_beside_it() -> None:
    gate = QueriesInFlight(max_wait_s=LONG_S)
    with gate.serving():
        assert gate.yield_to_queries() == 0.0  # the query's own thread
        # ... and a thread it hands work to with a copy of its context (its embedding).
        import contextvars

        context = contextvars.copy_context()
        thread, waited = in_thread(lambda: context.run(gate.yield_to_queries))
        thread.join(LONG_S)
        assert waited == [0.0]
    assert gate.totals()["yields"] == 0


def test_no_query_in_flight_or_waiting_off_means_no_wait() -> None:
    idle = QueriesInFlight(max_wait_s=LONG_S)
    assert idle.yield_to_queries() == 0.0
    off = QueriesInFlight(max_wait_s=0.0)
    with off.serving():
        thread, waited = in_thread(off.yield_to_queries)
        thread.join(LONG_S)
    assert waited == [0.0] and off.totals()["yields"] == 0


def test_a_step_waits_at_most_its_bound_while_queries_go_on() -> None:
    gate = QueriesInFlight(max_wait_s=0.01)
    with gate.serving():  # a query that outlasts the bound: the step gives up and goes on
        thread, waited = in_thread(gate.yield_to_queries)
        thread.join(LONG_S)
        assert waited and not thread.is_alive()
        assert gate.totals()["timed_out"] == 1 and gate.in_flight == 1


def test_nested_serving_counts_until_the_last_leaves() -> None:
    gate = QueriesInFlight(max_wait_s=LONG_S)
    with gate.serving():
        with gate.serving():
            assert gate.in_flight == 2
        assert gate.in_flight == 1
    assert gate.in_flight == 0


def test_a_background_llm_answer_is_processed_after_the_query_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(QUERIES, "max_wait_s", LONG_S)
    events: list[str] = []
    with ScriptedLLM() as llm:
        llm.on(contains="ping", respond="pong")
        gateway = LLMGateway(Settings(openai_base_url=llm.base_url))
        try:
            assert gateway.text("small", [{"role": "user", "content": "ping"}]) == "pong"
            with QUERIES.serving():
                thread, answers = in_thread(
                    lambda: (
                        gateway.text("small", [{"role": "user", "content": "ping"}]),
                        events.append("answer processed"),
                    )[0]
                )
                assert until(lambda: QUERIES.waiting == 1), "the answer did not wait"
                events.append("query answered")
            thread.join(LONG_S)
        finally:
            gateway.close()
    assert events == ["query answered", "answer processed"]
    assert answers == ["pong"]
