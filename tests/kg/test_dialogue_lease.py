"""The conversation lease dies with its holder (issue 33): a holder that keeps heartbeating
past its short lease is never robbed; once it is SIGKILLed the conversation is free one lease
later; a live slow turn keeps its lease and commits.

No timing margins are asserted: the tests wait for events (a renewal seen in the graph, the
graph's own clock past the first expiry, a process gone), never for a duration to pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings, load_settings
from kg.dialogue import DialogueRepository, lock_key
from kg.dialogue import cypher as dq
from kg.store import GraphStore
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tests.conftest import child_pythonpath
from tests.support.dialogue_script import DialogueScript, dialogue_requests
from tests.support.scripted_llm import ScriptedLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The sidecar's default lease (SidecarOptions.lock_lease_s): the holder renews it every 2 s,
#: so a renewal may be 4 s late before the lease runs out, as in production. A shorter lease
#: here would test the machine's load instead (a starved heartbeat thread on a busy CI box).
LEASE_S = 6.0
#: Twice that in the slow-turn test: what it shows (renewals keep a turn that outlives its lease
#: alive against every claimant) does not depend on the length, and its heartbeat runs beside
#: a turn's own work in this process, where a loaded machine once held a renewal back 4 s.
SLOW_LEASE_S = 12.0

# The holder: claims the lease, says so, and keeps it by heartbeat until it is killed.
HOLDER = r"""
import sys, threading
from core.settings import load_settings
from kg.dialogue import DialogueRepository
from kg.store import GraphStore

project, conversation, owner, lease_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
store = GraphStore.open(load_settings(project))
repo = DialogueRepository(store)
claim = repo.acquire_lock(conversation, owner, lease_s=lease_s, wait_s=60)
assert claim.acquired, claim
with repo.heartbeat(conversation, owner, lease_s):
    print("held", flush=True)
    threading.Event().wait()  # a turn that never ends: only SIGKILL stops it
"""


def _lease(store: GraphStore, conversation_id: str) -> dict[str, int | str] | None:
    rows = store.write(dq.LOCK_PROBE, key=lock_key(conversation_id))
    if not rows:
        return None
    return {
        "owner": rows[0]["owner"],
        "expires_at": int(rows[0]["expires_at"]),
        "now": int(rows[0]["now"]),
    }


@pytest.fixture
def holder(graph_settings: Settings) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    conversation = f"lease-{time.time_ns()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(graph_settings.project_dir),
            conversation,
            "holder-process",
            str(LEASE_S),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    proc.conversation = conversation  # type: ignore[attr-defined]
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_heartbeating_holder_is_never_robbed_and_a_killed_one_frees_the_conversation(
    graph: GraphStore, holder: subprocess.Popen[str]
) -> None:
    repo = DialogueRepository(graph)
    conversation: str = holder.conversation  # type: ignore[attr-defined]
    first = _lease(graph, conversation)
    assert first is not None and first["owner"] == "holder-process"
    # Claim until the graph's clock is well past the lease the holder first took: without the
    # heartbeat any of these claims after that moment would have taken the lease over.
    refused_after_expiry = 0
    while refused_after_expiry < 3:
        claim = repo.claim_lock(conversation, "claimant", LEASE_S)
        assert not claim.acquired and claim.holder == "holder-process", "a live holder was robbed"
        now = _lease(graph, conversation)
        assert now is not None and now["owner"] == "holder-process"
        if int(now["now"]) > int(first["expires_at"]) + 2 * LEASE_S * 1000:
            refused_after_expiry += 1
        time.sleep(0.2)
    renewed = _lease(graph, conversation)
    assert renewed is not None and int(renewed["expires_at"]) > int(
        first["expires_at"]
    )  # the heartbeat moved it

    # The look-alike: the same holder, dead. Its lease is no longer renewed and runs out.
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    claim = repo.acquire_lock(conversation, "claimant", lease_s=LEASE_S, wait_s=120)
    assert claim.acquired and claim.stolen_from == "holder-process"
    assert repo.release_lock(conversation, "claimant")


@pytest.fixture(scope="module")
def slow_llm() -> Iterator[ScriptedLLM]:
    # Each LLM request takes half the lease below; a turn makes at least three in a row.
    with ScriptedLLM(latency_s=SLOW_LEASE_S / 2) as llm:
        DialogueScript(["Caroline", "Melanie"]).install(llm)
        yield llm


def test_a_slow_live_turn_keeps_its_lease_against_every_claimant_and_commits(
    graph_settings: Settings, slow_llm: ScriptedLLM
) -> None:
    settings = load_settings(
        graph_settings.project_dir,
        openai_base_url=slow_llm.base_url,
        embedding_base_url=slow_llm.base_url,
    )
    service = DialogueService(
        settings, options=SidecarOptions(lock_lease_s=SLOW_LEASE_S, lock_wait_s=0)
    )
    try:
        conversation = f"slow-{time.time_ns()}"
        request = dialogue_requests("locomo-26", conversation, 1)[0]
        repo = DialogueRepository(service.store)
        outcome: list[object] = []
        turn = threading.Thread(target=lambda: outcome.append(service.commit(request)))
        turn.start()
        while _lease(service.store, conversation) is None and turn.is_alive():
            time.sleep(0.01)
        refusals = 0
        while turn.is_alive():  # another sidecar claims the conversation the whole time
            claim = repo.claim_lock(
                conversation, "other-sidecar", lease_s=SLOW_LEASE_S, turn_key=request.key
            )
            if claim.acquired:  # only once the turn committed (and so released it)
                assert claim.stored is not None, "a live slow turn was robbed of its lease"
                assert repo.release_lock(conversation, "other-sidecar")
                break
            refusals += 1
            time.sleep(0.05)
        turn.join()
        result = outcome[0]
        assert result.committed, result.reason  # type: ignore[attr-defined]
        assert result.trace.total_ms > SLOW_LEASE_S * 1000 and refusals > 0  # type: ignore[attr-defined] - outlived its lease
        assert _lease(service.store, conversation) is None  # the commit released it
    finally:
        service.close()


def test_a_claim_refused_at_its_create_leaves_the_graph_as_it_was(
    store: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another owner's live lease that the peek did not see (a claimant racing it): the CREATE
    fails on the key's uniqueness, the compare-and-set finds the live holder, and nothing of the
    refused claim stays. (Run auto-commit, that CREATE left an empty KGTurn node behind on
    ArcadeDB 26.10: its Bolt auto-commit keeps the writes a failing statement made before it
    failed. The claim's CREATE therefore stays in a managed transaction, which rolls back.)"""
    repo = DialogueRepository(store)
    conversation = f"claim-{time.time_ns()}"
    assert repo.claim_lock(conversation, "owner-a", LEASE_S).acquired
    before = store.read(dq.TURN_NODE_AUDIT)
    real_read = GraphStore.read

    def peek_sees_nothing(self: GraphStore, query: str, **params: Any) -> Any:
        return [] if query == dq.LOCK_PEEK else real_read(self, query, **params)

    monkeypatch.setattr(GraphStore, "read", peek_sees_nothing)
    claim = repo.claim_lock(conversation, "owner-b", LEASE_S)
    monkeypatch.undo()
    assert not claim.acquired and claim.holder == "owner-a"
    assert store.read(dq.TURN_NODE_AUDIT) == before
    lease = _lease(store, conversation)
    assert lease is not None and lease["owner"] == "owner-a"
    assert repo.release_lock(conversation, "owner-a")
