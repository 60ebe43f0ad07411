"""The embedded model serves memory queries first (core.embedder QueriesFirstLock,
`QUERIES.serving()`), and its recent calls (encode_recent) answer the bytes the model computes.

No timing: a waiting thread is seen through the lock's own gauge, and every wait that a
failure would turn into a hang has a generous failsafe deadline.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from core.embedder import RECENT_MAX_TEXTS, QueriesFirstLock, local_embedder
from core.priority import QUERIES, serving_query
from core.settings import Settings, load_settings
from kg.dialogue import DialogueRepository
from tasks.dialogue.models import MemoryQueryResult
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tests.support.dialogue_script import dialogue_requests
from tests.support.scripted_llm import ScriptedLLM

FAILSAFE_S = 120.0


def _until(condition: Callable[[], bool]) -> None:
    """Wait for `condition` (polling); fail after the failsafe deadline instead of hanging."""
    deadline = time.monotonic() + FAILSAFE_S
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


def _holder(
    lock: QueriesFirstLock, is_interactive: bool, order: list[str], name: str
) -> threading.Thread:
    def run() -> None:
        with lock.hold(is_interactive):
            order.append(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _keep_busy(lock: QueriesFirstLock) -> threading.Event:
    """Hold `lock` as a background caller on a thread until the returned event is set."""
    release, held = threading.Event(), threading.Event()

    def busy() -> None:
        with lock.hold(False):
            held.set()
            release.wait(FAILSAFE_S)

    threading.Thread(target=busy, daemon=True).start()
    assert held.wait(FAILSAFE_S)
    return release


def test_an_interactive_waiter_goes_before_a_background_one_that_came_first() -> None:
    lock, order = QueriesFirstLock(), []
    release = _keep_busy(lock)
    # Five background callers wait first: without the preference the query would be first
    # about one time in six.
    background = [_holder(lock, False, order, f"commit-{i}") for i in range(5)]
    _until(lambda: lock.waiting[False] == 5)
    query = _holder(lock, True, order, "query")
    _until(lambda: lock.waiting[True] == 1)
    release.set()
    for thread in (query, *background):
        thread.join(FAILSAFE_S)
    assert order[0] == "query" and sorted(order[1:]) == [f"commit-{i}" for i in range(5)]


def test_background_waiters_run_in_turn_when_no_query_waits() -> None:
    lock, order = QueriesFirstLock(), []
    release = _keep_busy(lock)
    waiters = [_holder(lock, False, order, f"commit-{i}") for i in range(2)]
    _until(lambda: lock.waiting[False] == 2)
    release.set()
    for thread in waiters:
        thread.join(FAILSAFE_S)
    assert sorted(order) == ["commit-0", "commit-1"]


def test_serving_a_query_marks_only_its_own_context() -> None:
    assert not serving_query()
    with QUERIES.serving():
        assert serving_query()
    assert not serving_query()


def test_recent_calls_answer_the_models_own_bytes() -> None:
    embedder = local_embedder()
    texts = [
        f"Caroline: I went to the support group yesterday ({uuid.uuid4().hex[:6]}).",
        "I went to the support group yesterday.",
    ]
    fresh = embedder.encode(texts)
    first = embedder.encode_recent(texts)
    first[:] = 0.0  # the caller's copy: what is remembered stays as computed
    assert embedder.encode_recent(texts).tobytes() == fresh.tobytes()
    assert embedder.encode_recent(texts[:1]).tobytes() == embedder.encode(texts[:1]).tobytes()
    bulk = [f"turn {i} {uuid.uuid4().hex[:6]}" for i in range(RECENT_MAX_TEXTS + 1)]
    assert np.array_equal(embedder.encode_recent(bulk), embedder.encode(bulk))
    assert tuple(bulk) not in embedder._recent, "a bulk call must not be remembered"
    assert tuple(texts) in embedder._recent


@pytest.fixture(scope="module")
def local_embedding_service(
    graph_settings: Settings, scripted: ScriptedLLM
) -> Iterator[DialogueService]:
    """Chat on the scripted server, embeddings by the embedded model (the default)."""
    settings = load_settings(graph_settings.project_dir, openai_base_url=scripted.base_url)
    assert settings.embedding_base_url is None
    service = DialogueService(settings, options=SidecarOptions(lock_wait_s=5))
    yield service
    service.close()


def test_the_memory_query_embeds_ahead_of_waiting_background_work(
    local_embedding_service: DialogueService,
) -> None:
    """The session is busy and a background embedding waits: the memory query's embedding
    waits as interactive, and the query answers."""
    conversation = f"test-queries-first-{uuid.uuid4().hex[:8]}"
    first, second = dialogue_requests("locomo-26", conversation, 2)
    assert local_embedding_service.commit(first).committed
    lock = local_embedder()._session_lock
    answers: list[MemoryQueryResult] = []
    release = _keep_busy(lock)
    try:
        background = threading.Thread(
            target=lambda: local_embedder().encode([f"later {uuid.uuid4().hex}"]), daemon=True
        )
        background.start()
        _until(lambda: lock.waiting[False] == 1)
        body = {
            "conversation_id": conversation,
            "messages": [m.model_dump(exclude_none=True) for m in second.messages],
        }
        query = threading.Thread(
            target=lambda: answers.append(local_embedding_service.memory_query(body)), daemon=True
        )
        query.start()
        _until(lambda: lock.waiting[True] == 1)
    finally:
        release.set()
    query.join(FAILSAFE_S)
    background.join(FAILSAFE_S)
    assert len(answers) == 1 and answers[0].ok and answers[0].stored_turns == 1, answers


def test_the_memory_query_embeds_while_its_graph_read_runs(
    local_embedding_service: DialogueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's embedding does not wait for its graph read (the two overlap): with the read
    held back and the model busy, the query's embedding is already waiting for the model."""
    conversation = f"test-query-overlap-{uuid.uuid4().hex[:8]}"
    first, second = dialogue_requests("locomo-26", conversation, 2)
    assert local_embedding_service.commit(first).committed
    messages = [m.model_dump(exclude_none=True) for m in second.messages]
    # A first query fills this process's index of the conversation, so the next one has turns
    # to search and embeds its messages (new words: nothing remembered answers them).
    assert local_embedding_service.memory_query(
        {"conversation_id": conversation, "messages": messages}
    ).ok
    reading, read_on = threading.Event(), threading.Event()
    snapshot = DialogueRepository.snapshot

    def held_back(repo: DialogueRepository, *args: Any, **kwargs: Any) -> Any:
        reading.set()
        assert read_on.wait(FAILSAFE_S)
        return snapshot(repo, *args, **kwargs)

    monkeypatch.setattr(DialogueRepository, "snapshot", held_back)
    lock = local_embedder()._session_lock
    answers: list[MemoryQueryResult] = []
    release = _keep_busy(lock)
    try:
        fresh = [{**messages[0], "content": f"{messages[0]['content']} ({uuid.uuid4().hex[:6]})"}]
        query = threading.Thread(
            target=lambda: answers.append(
                local_embedding_service.memory_query(
                    {"conversation_id": conversation, "messages": fresh}
                )
            ),
            daemon=True,
        )
        query.start()
        assert reading.wait(FAILSAFE_S)
        _until(lambda: lock.waiting[True] == 1)
    finally:
        read_on.set()
        release.set()
    query.join(FAILSAFE_S)
    assert len(answers) == 1 and answers[0].ok and answers[0].stored_turns == 1, answers
