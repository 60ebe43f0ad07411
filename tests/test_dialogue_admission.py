"""Queries first (tasks.dialogue.admission): a memory query never waits for a turn's non-LLM
steps; those wait for the queries in flight (bounded) and for a free slot. And the embedder's
recent calls (core.embedder encode_recent) answer the exact bytes the model computes.

No timing: a waiting thread is seen through the gate's own counters, and every wait that a
failure would turn into a hang has a generous failsafe deadline.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import numpy as np
import pytest

from core.settings import Settings
from tasks.dialogue.admission import Admission
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tests.test_dialogue_scripted import dialogue_requests

FAILSAFE_S = 60.0


def _until(condition: Callable[[], bool]) -> None:
    """Wait for `condition` (polling); fail after the failsafe deadline instead of hanging."""
    deadline = time.monotonic() + FAILSAFE_S
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


def _enter_in_thread(gate: Callable[[], AbstractContextManager[None]]) -> tuple[threading.Event, threading.Event]:
    """Enter `gate` on a thread; returns (entered, leave): set `leave` to let it go."""
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with gate():
            entered.set()
            leave.wait(FAILSAFE_S)

    threading.Thread(target=hold, daemon=True).start()
    return entered, leave


def test_a_background_step_waits_for_the_query_in_flight() -> None:
    admission = Admission(background_slots=4, query_wait_s=FAILSAFE_S * 10)
    with admission.query():
        entered, leave = _enter_in_thread(admission.background)
        _until(lambda: admission.background_waiting == 1)
        assert not entered.is_set() and admission.background_running == 0
    assert entered.wait(FAILSAFE_S), "the background step did not start once the query ended"
    leave.set()


def test_without_a_wait_for_queries_a_background_step_runs_beside_one() -> None:
    admission = Admission(background_slots=4, query_wait_s=0.0)
    with admission.query():
        entered, leave = _enter_in_thread(admission.background)
        assert entered.wait(FAILSAFE_S), "query_wait_s 0: the step must not wait for the query"
        leave.set()


def test_background_steps_are_bounded_and_queries_are_not() -> None:
    admission = Admission(background_slots=1, query_wait_s=0.0)
    first, leave_first = _enter_in_thread(admission.background)
    assert first.wait(FAILSAFE_S)
    second, leave_second = _enter_in_thread(admission.background)
    _until(lambda: admission.background_waiting == 1)
    assert not second.is_set() and admission.background_running == 1
    with admission.query():  # in this thread: it would block here if queries took a slot
        assert admission.queries_in_flight == 1
    leave_first.set()
    assert second.wait(FAILSAFE_S), "the second step did not start when the first one left"
    leave_second.set()


def test_admission_refuses_a_bound_of_zero() -> None:
    with pytest.raises(ValueError, match="background_slots"):
        Admission(background_slots=0, query_wait_s=0.0)


def test_embedder_recent_calls_answer_the_models_own_bytes() -> None:
    from core.embedder import RECENT_MAX_TEXTS, LocalEmbedder

    embedder = LocalEmbedder()
    texts = ["Caroline: I went to the support group yesterday.", "I went to the support group yesterday."]
    fresh = embedder.encode(texts)
    first = embedder.encode_recent(texts)
    first[:] = 0.0  # the caller's copy: what is remembered stays as computed
    again = embedder.encode_recent(texts)
    assert again.tobytes() == fresh.tobytes()
    assert embedder.encode_recent(texts[:1]).tobytes() == embedder.encode(texts[:1]).tobytes()
    bulk = [f"turn {i}" for i in range(RECENT_MAX_TEXTS + 1)]
    remembered = len(embedder._recent)
    assert np.array_equal(embedder.encode_recent(bulk), embedder.encode(bulk))
    assert len(embedder._recent) == remembered, "a bulk call must not be remembered"


@pytest.fixture
def one_slot_service(settings: Settings) -> Iterator[DialogueService]:
    svc = DialogueService(settings, options=SidecarOptions(lock_wait_s=5, background_slots=1, query_wait_s=0))
    yield svc
    svc.close()


def test_a_memory_query_answers_while_every_background_slot_is_held(one_slot_service: DialogueService) -> None:
    """The only slot is held (as a commit's transaction would hold it): the query still answers,
    and a commit waits for the slot, then commits."""
    conversation = f"test-admission-{uuid.uuid4().hex[:8]}"
    first, second = dialogue_requests("locomo-26", conversation, 2)
    assert one_slot_service.commit(first).committed
    entered, leave = _enter_in_thread(one_slot_service.admission.background)
    assert entered.wait(FAILSAFE_S)
    try:
        answered = one_slot_service.memory_query(
            {"conversation_id": conversation, "messages": [m.model_dump(exclude_none=True) for m in second.messages]})
        assert answered.ok and answered.stored_turns == 1, answered.reason
        results: list[bool] = []
        committing = threading.Thread(target=lambda: results.append(one_slot_service.commit(second).committed))
        committing.start()
        _until(lambda: one_slot_service.admission.background_waiting == 1)
        assert not results
    finally:
        leave.set()
    committing.join(FAILSAFE_S)
    assert results == [True]
