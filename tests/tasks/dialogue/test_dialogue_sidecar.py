"""The dialogue sidecar end to end: the real graph server, the scripted model over real HTTP.

Every test uses its own conversation id, so tests do not depend on each other; graph exports
compare the whole graph, so nothing else writes to it while a test runs (tests run serially).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.errors import GraphWriteError
from core.settings import Settings, load_settings
from core.timex import parse_when
from kg import vocabulary as vocab
from kg.dialogue import (
    BioPatchWrite,
    DialogueRepository,
    EntityWrite,
    LostLockError,
    RelationActionWrite,
    TurnWrite,
)
from kg.dialogue import cypher as dialogue_cypher
from tasks.dialogue.ingest import ingest
from tasks.dialogue.models import TurnCommitRequest, TurnResult, TurnState
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tasks.dialogue.replay import load_dialogue
from tests.conftest import DIALOGUES_DIR, REPO_ROOT
from tests.support.cli import graph_vars
from tests.support.dialogue_script import (
    DialogueScript,
    dialogue_requests,
    participants,
)
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest

FULL_TIMELINE = [
    "RECEIVED",
    "RETRIEVING",
    "INJECTING",
    "ACTING",
    "EXTRACTING",
    "JUDGING",
    "HISTORIANING",
    "PREPARED",
    "COMMITTING",
    "COMMITTED",
]


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


@pytest.fixture()
def scripted(server: ScriptedLLM) -> ScriptedLLM:
    server.reset()
    DialogueScript(participants("locomo-26")).install(server)
    return server


@pytest.fixture()
def settings(graph_settings: Settings, scripted: ScriptedLLM) -> Settings:
    return load_settings(
        graph_settings.project_dir,
        openai_base_url=scripted.base_url,
        embedding_base_url=scripted.base_url,
        slot_models={"judge": "settings-judge"},
    )


@pytest.fixture()
def service(settings: Settings) -> Iterator[DialogueService]:
    svc = DialogueService(settings, options=SidecarOptions(lock_wait_s=2.0))
    yield svc
    svc.close()


def _conv(name: str) -> str:
    return f"test-{name}-{uuid.uuid4().hex[:8]}"


def _requests(
    conversation_id: str, turns: int, dialogue: str = "locomo-26"
) -> list[TurnCommitRequest]:
    return dialogue_requests(dialogue, conversation_id, turns)


def _export(service: DialogueService, path: Path) -> bytes:
    service.store.export_json(path)
    return path.read_bytes()


def _facts_export(service: DialogueService, path: Path) -> list[dict]:
    """The export without turn memory (KGMemory rows and their counters): the graph facts."""
    service.store.export_json(path)
    memory = {vocab.KG_MEMORY, vocab.KG_CONVERSATION}
    return [n for n in json.loads(path.read_text())["nodes"] if not memory & set(n["labels"])]


def _cli_export(settings: Settings, path: Path) -> bytes:
    """`python -m kg export`, as an operator would run it (finds the session's graph server)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kg",
            "export",
            "--out",
            str(path),
            "--project-dir",
            str(settings.project_dir),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return path.read_bytes()


def test_first_20_turns_of_locomo26_commit_and_a_replay_writes_nothing(
    service: DialogueService, settings: Settings, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    conv = _conv("locomo26")
    requests = _requests(conv, 20)
    first = [service.commit(r) for r in requests]
    assert [r.state for r in first] == [TurnState.COMMITTED] * 20, [
        r.reason for r in first if not r.committed
    ]
    assert not any(r.idempotent_hit for r in first)
    assert [s.state.value for s in first[5].trace.states] == FULL_TIMELINE  # type: ignore[union-attr]
    assert [r.seq for r in first] == list(range(1, 21))
    assert first[-1].injection_packet and "Caroline" in first[-1].injection_packet.text

    repo = DialogueRepository(service.store)
    events = repo.events(conv)
    applied = [a for r in first for a in r.actions if a.applied]
    assert len(events) == len(applied) > 20
    assert len({e["event_id"] for e in events}) == len(events)
    assert {e["action"] for e in events} >= {"EVOLVE", "REPLACE"}
    assert len(repo.milestones(conv)) == sum(len(r.milestones) for r in first) > 0
    assert len(repo.turns(conv)) == 20

    before = _export(service, tmp_path / "before.json")
    calls = scripted.request_count
    again = [service.commit(r) for r in requests]
    assert all(r.idempotent_hit and r.committed for r in again)
    assert [r.actions for r in again] == [r.actions for r in first]
    assert scripted.request_count == calls  # a replay makes no model call
    assert _export(service, tmp_path / "after.json") == before

    # Persisted, not remembered: a new service (a restarted sidecar) sees the same records.
    restarted = DialogueService(settings)
    try:
        hit = restarted.commit(requests[3])
        assert hit.idempotent_hit and hit.seq == 4
    finally:
        restarted.close()
    assert _export(service, tmp_path / "after-restart.json") == before


def test_a_different_payload_under_a_committed_key_is_a_conflict(service: DialogueService) -> None:
    conv = _conv("conflict")
    request = _requests(conv, 1)[0]
    assert service.commit(request).committed
    changed = request.model_copy(
        update={"messages": [request.messages[0].model_copy(update={"content": "edited"})]}
    )
    result = service.commit(changed)
    assert (result.code, result.error_kind, result.committed) == (
        "INVALID_REQUEST",
        "conflict",
        False,
    )
    assert "idempotency conflict" in (result.reason or "")
    # Another model for a retry is the same payload: still the stored result.
    rerouted = request.model_copy(
        update={"config": request.config.model_copy(update={"token_budget": 300})}
    )
    assert service.commit(rerouted).idempotent_hit


def test_forced_extractor_failure_rolls_back_and_the_graph_is_byte_identical(
    service: DialogueService, settings: Settings, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    conv = _conv("extractor-fault")
    requests = _requests(conv, 4)
    for request in requests[:3]:
        assert service.commit(request).committed
    before = _cli_export(settings, tmp_path / "before.json")

    scripted.on(schema="TurnExtraction", fault="http_401", times=1)
    fatal = service.commit(requests[3])
    assert (fatal.state, fatal.code, fatal.error_kind) == (
        TurnState.ROLLED_BACK,
        "ROLLED_BACK",
        "llm",
    )
    assert fatal.retryable is False and "401" in (fatal.reason or "")
    assert [s.state.value for s in fatal.trace.states][-2:] == ["EXTRACTING", "ROLLED_BACK"]  # type: ignore[union-attr]

    scripted.on(schema="TurnExtraction", fault="http_500", times=settings.limits.llm_max_attempts)
    transient = service.commit(requests[3])
    assert transient.state == TurnState.ROLLED_BACK and transient.retryable is True
    assert _cli_export(settings, tmp_path / "after.json") == before

    retried = service.commit(requests[3], attempt="retry")  # the faults are used up
    assert retried.committed and retried.trace and retried.trace.attempt == "retry"


def test_an_llm_request_that_timed_out_rolls_back_as_a_timeout_and_a_500_as_llm(
    settings: Settings, scripted: ScriptedLLM
) -> None:
    # The scripted server answers a "timeout" fault after 2 s; the client gives up after 0.3 s.
    limits = settings.limits.model_copy(update={"llm_timeout_s": 0.3, "llm_max_attempts": 1})
    impatient = DialogueService(settings.model_copy(update={"limits": limits}))
    try:
        request = _requests(_conv("llm-timeout"), 1)[0]
        scripted.on(schema="TurnExtraction", fault="timeout", times=1)
        timed_out = impatient.commit(request)
        assert (
            timed_out.state,
            timed_out.error_kind,
            timed_out.timed_out,
            timed_out.retryable,
        ) == (TurnState.ROLLED_BACK, "timeout", True, True)
        # The look-alike: the model unavailable for another reason is an llm failure, not a timeout.
        scripted.on(schema="TurnExtraction", fault="http_500", times=1)
        refused = impatient.commit(request)
        assert (refused.state, refused.error_kind, refused.timed_out, refused.retryable) == (
            TurnState.ROLLED_BACK,
            "llm",
            False,
            True,
        )
        assert impatient.commit(request).committed  # the faults are used up
    finally:
        impatient.close()


def test_a_failure_inside_the_commit_transaction_writes_nothing_and_frees_the_lock(
    service: DialogueService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = _conv("tx-fault")
    requests = _requests(conv, 3)
    assert service.commit(requests[0]).committed
    before = _export(service, tmp_path / "before.json")
    # The turn record is the transaction's last statement: everything before it must vanish.
    monkeypatch.setattr(
        dialogue_cypher,
        "CREATE_TURN_RECORDS",
        "CREATE (t:KGTurn) SET t = $props RETURN 1/0 AS boom",
    )
    failed = service.commit(requests[1])
    assert (failed.state, failed.error_kind, failed.retryable) == (
        TurnState.ROLLED_BACK,
        "graph",
        True,
    )
    assert _export(service, tmp_path / "after.json") == before
    monkeypatch.undo()
    assert service.commit(requests[1]).committed  # the lease was released
    assert service.commit(requests[2]).seq == 3


def _action(
    action: str,
    source: str,
    target: str,
    rel: str,
    *,
    delta: float = 0.0,
    weight: float = 0.5,
    from_type: str | None = None,
    quote: str = "",
) -> dict[str, Any]:
    return {
        "action": action,
        "source": source,
        "target": target,
        "type": rel,
        "from_type": from_type,
        "weight_delta": delta,
        "weight": weight,
        "reason": f"{action} {rel}",
        "quote": quote,
    }


def test_relation_actions_log_events_and_patch_bios_and_milestones(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    conv = _conv("actions")
    # What Ann says each turn, and what a careful model extracts from it, quoting her.
    said = {
        "turn one": "This is turn one: Bob is my friend now. People call me Annie; I paint and I am kind and shy.",
        "turn two": "This is turn two. Annie and Bob are friends still, and I love Bob now. I am bold, not shy.",
        "turn three": "This is turn three. I do not love Bob anymore, and I was never an enemy of Bob.",
    }
    plans = {
        "turn one": {
            "entities": [
                {
                    "name": "Ann",
                    "kind": "Character",
                    "aliases": ["Annie"],
                    "quote": "People call me Annie",
                },
                {
                    "name": "Bob",
                    "kind": "Character",
                    "aliases": [],
                    "quote": "Bob is my friend now",
                },
            ],
            "actions": [
                _action(
                    "EVOLVE", "Ann", "Bob", "FRIEND_OF", delta=0.2, quote="Bob is my friend now"
                )
            ],
            "bio_patches": [
                {
                    "entity": "Annie",
                    "summary": "A painter.",
                    "traits_add": ["kind", "shy"],
                    "traits_remove": [],
                    "quote": "I paint and I am kind and shy",
                }
            ],
            "facts": ["Ann paints."],
        },
        "turn two": {
            "entities": [],
            "actions": [
                _action(
                    "EVOLVE",
                    "Annie",
                    "Bob",
                    "friends with",
                    delta=0.1,
                    quote="Annie and Bob are friends still",
                ),
                _action(
                    "REPLACE",
                    "Ann",
                    "Bob",
                    "LOVES",
                    weight=0.9,
                    from_type="FRIEND_OF",
                    quote="I love Bob now",
                ),
            ],
            "bio_patches": [
                {
                    "entity": "Ann",
                    "summary": None,
                    "traits_add": ["bold"],
                    "traits_remove": ["shy"],
                    "quote": "I am bold, not shy",
                }
            ],
            "facts": [],
        },
        "turn three": {
            "entities": [],
            "actions": [
                _action("DELETE", "Ann", "Bob", "LOVES", quote="I do not love Bob anymore"),
                _action("DELETE", "Ann", "Bob", "ENEMY_OF", quote="I was never an enemy of Bob"),
            ],
            "bio_patches": [],
            "facts": [],
        },
    }

    def extractor(request: ScriptedRequest) -> dict[str, Any]:
        return next(plan for marker, plan in plans.items() if marker in request.text)

    scripted.on(schema="TurnExtraction", respond=extractor)
    scripted.on(
        schema="HistorianReport", contains="This is turn", respond={"events": [], "milestones": []}
    )
    scripted.on(
        schema="HistorianReport",
        contains="turn two",
        respond={
            "events": ["Ann fell for Bob."],
            "milestones": [
                {
                    "text": "Ann and Bob became a couple",
                    "entities": ["Annie", "Bob"],
                    "importance": 0.9,
                    "quote": "I love Bob now",
                }
            ],
        },
    )
    results = []
    for i, marker in enumerate(plans, start=1):
        request = TurnCommitRequest(
            conversation_id=conv,
            turn_id=i,
            messages=[{"role": "user", "name": "Ann", "content": said[marker]}],
        )
        results.append(service.commit(request))
    assert all(r.committed for r in results), [r.reason for r in results]

    first, second, third = (r.actions for r in results)
    assert (first[0].weight_before, first[0].weight_after, first[0].note) == (None, 0.7, "created")
    assert (second[0].weight_before, second[0].weight_after) == (0.7, 0.8)
    assert (
        second[1].from_type,
        second[1].to_type,
        second[1].weight_before,
        second[1].weight_after,
    ) == ("FRIEND_OF", "LOVES", 0.8, 0.9)
    assert third[0].applied and third[0].weight_before == 0.9
    assert not third[1].applied and third[1].event_id is None  # nothing to end: no event

    repo = DialogueRepository(service.store)
    relations = {r.type: r for r in repo.relations(conv)}
    assert (relations["FRIEND_OF"].status, relations["FRIEND_OF"].weight) == ("ended", 0.8)
    assert (relations["LOVES"].status, relations["LOVES"].ended_turn) == ("ended", "3")
    events = repo.events(conv)
    assert [(e["action"], e.get("from_type"), e.get("to_type")) for e in events] == [
        ("EVOLVE", None, "FRIEND_OF"),
        ("EVOLVE", "FRIEND_OF", "FRIEND_OF"),
        ("REPLACE", "FRIEND_OF", "LOVES"),
        ("DELETE", "LOVES", None),
    ]
    assert [e["turn_id"] for e in events] == ["1", "2", "2", "3"]
    ann = next(e for e in repo.entities(conv) if e.name == "Ann")
    assert ann.aliases == ["Annie"] and ann.bio_summary == "A painter."
    assert ann.bio_traits == ["kind", "bold"]
    milestones = repo.milestones(conv)
    assert [(m.turn_id, m.text, m.quote) for m in milestones] == [
        ("2", "Ann and Bob became a couple", "I love Bob now")
    ]
    assert [e.get("quote") for e in events] == [
        "Bob is my friend now",
        "Annie and Bob are friends still",
        "I love Bob now",
        "I do not love Bob anymore",
    ]
    assert sorted(milestones[0].entity_ids) == ["entity:ann", "entity:bob"]


def _said(
    conversation_id: str, turn: int, speaker: str, text: str, window: list[tuple[str, str]]
) -> TurnCommitRequest:
    return TurnCommitRequest.model_validate(
        {
            "conversation_id": conversation_id,
            "turn_id": turn,
            "messages": [{"role": "user", "name": speaker, "content": text}],
            "window": [{"role": "user", "name": n, "content": c} for n, c in window],
        }
    )


def _visited_lisbon(quote: str) -> dict[str, Any]:
    """The extraction of a turn where Caroline says she visited Lisbon (`quote`: her words)."""
    return {
        "entities": [{"name": "Lisbon", "kind": "Location", "aliases": [], "quote": quote}],
        "actions": [
            {
                "action": "EVOLVE",
                "source": "Caroline",
                "target": "Lisbon",
                "type": "VISITED",
                "weight_delta": 0.2,
                "weight": 0.5,
                "reason": "a trip",
                "quote": quote,
            }
        ],
        "bio_patches": [],
        "facts": [],
    }


def test_a_blocked_turn_whose_text_cannot_be_remembered_fails_retryable_and_its_retry_keeps_it(
    service: DialogueService, scripted: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = _conv("gate-full")
    requests = _requests(conv, 2)
    assert service.commit(requests[0]).committed
    no_actions = {"entities": [], "actions": [], "bio_patches": [], "facts": []}
    remember = DialogueRepository.remember

    def disk_full(self: DialogueRepository, conversation_id: str, rows: list[Any]) -> int:
        raise GraphWriteError("graph write failed and was rolled back: only 3 MiB free")

    # The gate blocks the turn's facts, and its text meets a graph that cannot write: the turn
    # fails as the graph did, retryable (blocked and not retryable, a front end would never
    # send it again and memory would never hold it).
    monkeypatch.setattr(DialogueRepository, "remember", disk_full)
    scripted.on(schema="TurnExtraction", times=1, respond=no_actions)
    failed = service.commit(requests[1])
    assert failed.state == TurnState.ROLLED_BACK and not failed.committed
    assert (failed.error_kind, failed.retryable) == ("graph", True), failed.reason
    assert "only 3 MiB free" in (failed.reason or "")
    repo = DialogueRepository(service.store)
    assert repo.memory_count(conv) == (1, 1)

    # Sent again once the graph writes: blocked by the gate as before, and remembered.
    monkeypatch.setattr(DialogueRepository, "remember", remember)
    scripted.on(schema="TurnExtraction", times=1, respond=no_actions)
    again = service.commit(requests[1])
    assert (again.error_kind, again.retryable) == ("gate", False), again.reason
    assert repo.memory_count(conv) == (2, 2)


def test_the_commit_gate_blocks_identity_conflicts_and_turns_without_actions(
    service: DialogueService, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    conv = _conv("gate")
    requests = _requests(conv, 4)
    assert service.commit(requests[0]).committed
    before = _facts_export(service, tmp_path / "before.json")

    # The model reports the chat's own two speakers as an identity conflict: the graph shows no
    # name bound twice, so it is dismissed (with why) and the turn commits.
    speaker = requests[1].messages[0].speaker
    scripted.on(
        schema="JudgeVerdict",
        times=1,
        respond={
            "identity_conflicts": [
                {"entity": speaker, "conflicts_with": "Caroline", "reason": "two people"}
            ],
            "contradictions": [],
        },
    )
    speakers = service.commit(requests[2])
    assert speakers.committed and speakers.gate and speakers.gate.identity_conflicts == 0, (
        speakers.reason
    )
    assert speakers.judge and speakers.judge.dismissed == [
        f"{speaker} vs Caroline: a participant of the chat (the chat names its speakers)"
    ]
    assert service.rewind(conv, requests[2].turn).ok

    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
    )
    empty = service.commit(requests[1])
    assert empty.error_kind == "gate" and "no relation actions" in (empty.reason or "")
    assert empty.nothing_new and empty.gate and empty.gate.nothing_new  # not a failure: nothing new
    # The gate governs graph facts only: no fact was written, but the turn is remembered
    # (once, however often it was blocked) and recall returns it.
    assert _facts_export(service, tmp_path / "after.json") == before
    repo = DialogueRepository(service.store)
    assert repo.memory_count(conv) == (2, 2)
    text = requests[1].messages[0].content
    assert "swamped with the kids" in text
    hits = service.recall(conv, "Who is swamped with kids and work?", 1)
    assert hits and hits[0].key == requests[1].key and not hits[0].committed
    assert hits[0].source_refs == [m.message_id for m in requests[1].messages if m.message_id]

    # A conflict the model invents about something the turn does not touch is not grounded.
    scripted.on(
        schema="JudgeVerdict",
        times=1,
        respond={
            "identity_conflicts": [
                {"entity": "Gandalf", "conflicts_with": "Saruman", "reason": "?"}
            ],
            "contradictions": [{"statement": "x", "contradicts": "y", "severity": "low"}],
        },
    )
    passed = service.commit(requests[1])
    assert passed.committed and passed.judge and passed.judge.contradictions
    assert repo.memory_count(conv) == (2, 2)  # committed later: the same row, now marked committed
    assert [r.committed for r in repo.memory_since(conv)[2]] == [True, True]
    # ... and recall, whose cached index held the row as blocked, says so too.
    hits = service.recall(conv, "Who is swamped with kids and work?", 1)
    assert hits and hits[0].key == requests[1].key and hits[0].committed

    # A name the graph binds to a place, bound to a person by this turn: blocked, with the facts
    # of both sides; the turn's text is still remembered.
    lisbon = {
        "name": "Lisbon",
        "kind": "Location",
        "aliases": [],
        "quote": "I finally visited Lisbon last week",
    }
    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond=_visited_lisbon("I finally visited Lisbon last week"),
    )
    visited = service.commit(
        _said(conv, 10, "Caroline", "I finally visited Lisbon last week, what a city!", [])
    )
    assert visited.committed, visited.reason
    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={
            "entities": [
                {**lisbon, "kind": "Character", "quote": "Lisbon is the name of my new puppy"}
            ],
            "actions": [
                {
                    "action": "EVOLVE",
                    "source": "Melanie",
                    "target": "Lisbon",
                    "type": "OWNS",
                    "weight_delta": 0.2,
                    "weight": 0.5,
                    "reason": "a puppy",
                    "quote": "Lisbon is the name of my new puppy",
                }
            ],
            "bio_patches": [],
            "facts": [],
        },
    )
    puppy = service.commit(
        _said(
            conv,
            11,
            "Melanie",
            "Lisbon is the name of my new puppy, Caroline!",
            [("Caroline", "I finally visited Lisbon last week, what a city!")],
        )
    )
    assert (puppy.state, puppy.error_kind, puppy.nothing_new) == (
        TurnState.ROLLED_BACK,
        "gate",
        False,
    )
    assert puppy.reason == "commit gate: identity conflicts (Lisbon)"
    conflict = puppy.judge.identity_conflicts[0]  # type: ignore[union-attr]
    assert conflict.reason == "known as a Location, proposed as a Character"
    assert conflict.graph_evidence[0] == "'Lisbon' names Lisbon (Location) since turn 10"
    assert conflict.turn_evidence == ["Lisbon is the name of my new puppy"]


def test_a_busy_conversation_gives_in_progress_and_an_expired_lease_is_taken_over(
    settings: Settings, tmp_path: Path
) -> None:
    impatient = DialogueService(settings, options=SidecarOptions(lock_wait_s=0.3))
    try:
        repo = DialogueRepository(impatient.store)
        conv = _conv("busy")
        assert repo.claim_lock(conv, "another-process", lease_s=60).acquired
        before = _export(impatient, tmp_path / "before.json")
        started = time.monotonic()
        busy = impatient.commit(_requests(conv, 1)[0])
        assert (busy.code, busy.error_kind, busy.retryable) == ("IN_PROGRESS", "busy", True)
        assert "another-process" in (busy.reason or "") and time.monotonic() - started >= 0.25
        assert _export(impatient, tmp_path / "after.json") == before
        repo.delete_conversation(conv)

        crashed = _conv("crashed")
        assert repo.claim_lock(crashed, "crashed-process", lease_s=0.5).acquired
        time.sleep(0.7)
        taken = impatient.commit(_requests(crashed, 1)[0])
        assert taken.committed
        assert repo.claim_lock(crashed, "someone", lease_s=1).acquired  # released after the commit
    finally:
        impatient.close()


def test_a_holder_whose_lease_was_taken_over_cannot_commit(service: DialogueService) -> None:
    repo = DialogueRepository(service.store)
    conv = _conv("fence")
    assert repo.claim_lock(conv, "slow", lease_s=0.3).acquired
    time.sleep(0.5)
    claim = repo.claim_lock(conv, "fast", lease_s=30)
    assert claim.acquired and claim.stolen_from == "slow"
    write = TurnWrite(
        key=f"{conv}:1",
        conversation_id=conv,
        turn_id="1",
        payload_hash="h",
        text="x",
        committed_at="2026-01-01T00:00:00Z",
    )
    with pytest.raises(LostLockError):
        repo.commit_turn(write, "slow", lambda seq, applied: "{}")
    assert repo.turns(conv) == []
    assert repo.release_lock(conv, "fast")


def test_bio_patches_of_one_turn_apply_in_order_a_repeat_building_on_the_first(
    service: DialogueService,
) -> None:
    # The patches go to the graph in one UNWIND statement: the second patch to Ann must see
    # what her first one wrote, Bob's patch in between is his own.
    repo = DialogueRepository(service.store)
    conv = _conv("bio-order")
    assert repo.claim_lock(conv, "writer", lease_s=30).acquired
    write = TurnWrite(
        key=f"{conv}:1",
        conversation_id=conv,
        turn_id="1",
        payload_hash="h",
        text="x",
        committed_at="2026-01-01T00:00:00Z",
        entities=[
            EntityWrite(entity_id="ann", name="Ann", kind="person"),
            EntityWrite(entity_id="bob", name="Bob", kind="person"),
        ],
        bio_patches=[
            BioPatchWrite(entity_id="ann", summary="A painter.", traits_add=["shy", "kind"]),
            BioPatchWrite(entity_id="bob", traits_add=["bold"]),
            BioPatchWrite(entity_id="ann", traits_add=["calm"], traits_remove=["shy"]),
        ],
    )
    assert (
        repo.commit_turn(write, "writer", lambda seq, applied: ("{}", "{}")).status == "committed"
    )
    bios = {e.entity_id: (e.bio_summary, e.bio_traits) for e in repo.entities(conv)}
    assert bios == {"ann": ("A painter.", ["kind", "calm"]), "bob": ("", ["bold"])}


def test_relation_actions_of_one_turn_build_on_each_other_and_on_the_turns_before(
    service: DialogueService,
) -> None:
    """Each relation action sees every earlier one of its turn (a relation created, then moved,
    ended, replaced) and of the turns before; an action whose end is not an entity creates
    nothing, and one that finds nothing to end is not applied. (Guards any change to how the
    commit runs the actions: a batched form was tried, see bench/sidecar_load.py.)"""
    repo = DialogueRepository(service.store)
    conv = _conv("action-order")
    people = [
        EntityWrite(entity_id=e, name=e.title(), kind="person") for e in ("ann", "bob", "dan")
    ]

    def act(action: str, target: str, rel_type: str, **values: Any) -> RelationActionWrite:
        return RelationActionWrite(
            action=action, source_id="ann", target_id=target, type=rel_type, **values
        )

    turns = {
        "1": [
            act("EVOLVE", "bob", "FRIEND_OF", weight_delta=0.2),  # created at 0.7
            act("EVOLVE", "bob", "FRIEND_OF", weight_delta=0.1),  # the one just created: 0.8
            act("EVOLVE", "dan", "KNOWS", weight_delta=0.0),  # created at 0.5
            act("REPLACE", "dan", "LOVES", weight=0.9, from_type="KNOWS"),  # KNOWS ended
            act("DELETE", "dan", "LOVES"),  # the LOVES just created, ended
            act("EVOLVE", "nobody", "KNOWS"),  # no such entity: nothing created
            act("EVOLVE", "nobody", "KNOWS"),  # and so nothing to move either
        ],
        "2": [
            act("EVOLVE", "bob", "FRIEND_OF", weight_delta=-0.3),  # turn 1's, read: 0.5
            act("REPLACE", "bob", "ENEMY_OF", weight=0.4),  # FRIEND_OF ended
            act("DELETE", "dan", "LOVES"),  # ended in turn 1: not applied
        ],
    }
    applied: dict[str, list[tuple[Any, ...]]] = {}
    for turn_id, actions in turns.items():
        assert repo.claim_lock(conv, "writer", lease_s=30).acquired
        write = TurnWrite(
            key=f"{conv}:{turn_id}",
            conversation_id=conv,
            turn_id=turn_id,
            payload_hash="h",
            text="x",
            committed_at="2026-01-01T00:00:00Z",
            entities=people if turn_id == "1" else [],
            actions=actions,
        )
        outcome = repo.commit_turn(write, "writer", lambda seq, applied: ("{}", "{}"))
        assert outcome.status == "committed"
        applied[turn_id] = [
            (a.action, a.rel_id, a.weight_before, a.weight_after, a.applied)
            for a in outcome.applied
        ]
    r = f"{conv}:1#r"
    assert applied["1"] == [
        ("EVOLVE", f"{r}0", None, 0.7, True),
        ("EVOLVE", f"{r}0", 0.7, 0.8, True),
        ("EVOLVE", f"{r}2", None, 0.5, True),
        ("REPLACE", f"{r}3", 0.5, 0.9, True),
        ("DELETE", f"{r}3", 0.9, 0.0, True),
        ("EVOLVE", f"{r}5", None, 0.5, True),
        ("EVOLVE", f"{r}6", None, 0.5, True),
    ]
    assert applied["2"] == [
        ("EVOLVE", f"{r}0", 0.8, 0.5, True),
        ("REPLACE", f"{conv}:2#r1", 0.5, 0.4, True),
        ("DELETE", None, None, None, False),
    ]
    rows = service.store.read(dialogue_cypher.ALL_RELATIONS, conversation_id=conv)
    stamps = ("type", "weight", "status", "since_seq", "updated_seq", "ended_seq")
    found = {row["props"]["rel_id"]: tuple(row["props"].get(k) for k in stamps) for row in rows}
    assert found == {
        f"{r}0": ("FRIEND_OF", 0.5, "ended", 1, 2, 2),
        f"{r}2": ("KNOWS", 0.5, "ended", 1, 1, 1),
        f"{r}3": ("LOVES", 0.9, "ended", 1, 1, 1),
        f"{conv}:2#r1": ("ENEMY_OF", 0.4, "active", 2, 2, None),
    }


def test_model_routing_overrides_reach_the_model_server(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    request = _requests(_conv("routing"), 1)[0]
    request = request.model_copy(
        update={
            "config": request.config.model_copy(
                update={
                    "models": request.config.models.model_copy(
                        update={"extractor": "request-extractor"}
                    )
                }
            )
        }
    )
    result = service.commit(request)
    assert result.committed
    models = {r.schema_name: r.model for r in scripted.requests if r.schema_name}
    assert models["TurnExtraction"] == "request-extractor"
    assert models["JudgeVerdict"] == "settings-judge"
    assert models["HistorianReport"] == service.settings.default_model
    routes = {s.slot: (s.route, s.model) for s in result.trace.slots}  # type: ignore[union-attr]
    assert routes["extractor"] == ("request", "request-extractor")
    assert routes["judge"] == ("settings", "settings-judge")
    assert routes["historian"] == ("tier", service.settings.default_model)
    extractor = next(s for s in result.trace.slots if s.slot == "extractor")  # type: ignore[union-attr]
    assert extractor.llm_calls == 1 and extractor.prompt_tokens > 0


def test_the_actor_generates_the_reply_in_generate_mode(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    scripted.on(
        contains="Write Melanie's next message", respond="Melanie: That sounds amazing, Caroline!"
    )
    conv = _conv("actor")
    request = TurnCommitRequest.model_validate(
        {
            "conversation_id": conv,
            "turn_id": 1,
            "messages": [
                {
                    "role": "user",
                    "name": "Caroline",
                    "content": "I went to a support group yesterday.",
                }
            ],
            "config": {"actor": {"mode": "generate", "speaker": "Melanie"}},
        }
    )
    result = service.commit(request)
    assert result.committed and result.reply == "That sounds amazing, Caroline!"
    stored = DialogueRepository(service.store).snapshot(conv).new_turns[0]
    assert stored.text.endswith("Melanie: That sounds amazing, Caroline!")
    extractor_prompt = next(r for r in scripted.requests if r.schema_name == "TurnExtraction").text
    assert "Melanie: That sounds amazing" in extractor_prompt


def test_config_db_is_honoured_only_for_the_served_graph(service: DialogueService) -> None:
    ep = service.store.endpoint
    base = json.loads(_requests(_conv("db"), 1)[0].model_dump_json())
    same = {
        **base,
        "config": {"db": {"uri": ep.uri, "username": ep.username, "database": ep.database}},
    }
    assert service.commit(same).committed
    other = {
        **base,
        "turn_id": 2,
        "config": {"db": {"uri": "bolt://10.0.0.1:7687", "password": "secret"}},
    }
    refused = service.commit(other)
    assert refused.code == "INVALID_REQUEST" and "allow-request-db" in (refused.reason or "")
    assert "secret" not in refused.model_dump_json()


def test_recall_surfaces_the_turn_that_holds_the_fact(service: DialogueService) -> None:
    conv = _conv("recall")
    results = [service.commit(r) for r in _requests(conv, 8)]
    assert all(r.committed for r in results)
    hits = service.recall(conv, "When did Caroline go to the LGBTQ support group?", 3)
    assert "D1:3" in [ref for h in hits for ref in h.source_refs]
    # The retriever feeds earlier turns into later injection packets.
    assert results[-1].injection_packet and results[-1].injection_packet.recalled_turns


def test_a_transcript_turn_without_a_time_is_committed_undated_and_a_live_one_dated_now(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    """`ingest --extract` and a replay commit a chat log's turns as `transcript`: a turn no time
    reaches is stored undated and its "yesterday" names no day. Dated when committed, an old
    log told the model that everything in it was said today."""
    conv = _conv("undated")
    said = "I finally visited Lisbon yesterday, what a city!"
    asked = "Do you remember where I went yesterday?"
    results = []
    nothing = {"entities": [], "actions": [], "bio_patches": [], "facts": []}
    for turn, text, transcript in ((1, said, True), (2, asked, True), (3, asked, False)):
        scripted.on(
            schema="TurnExtraction",
            times=1,
            respond=_visited_lisbon("I finally visited Lisbon yesterday") if turn == 1 else nothing,
        )
        request = _said(conv, turn, "Caroline", text, []).model_copy(
            update={"transcript": transcript}
        )
        results.append(service.commit(request))
    assert results[0].committed, results[0].reason
    # Turns 2 and 3 carry no action: the gate holds them back, and remembers their text.
    rows = DialogueRepository(service.store).memory_rows(conv, 1, 10)
    assert [r.turn_id for r in rows] == ["1", "2", "3"]
    assert [r.when for r in rows[:2]] == ["", ""]
    today = {datetime.now(UTC).date(), (datetime.now(UTC) - timedelta(minutes=5)).date()}
    assert parse_when(rows[2].when) in today
    transcript_packet, live_packet = (r.injection_packet for r in results[1:])
    assert transcript_packet is not None and said in transcript_packet.text
    assert "yesterday =" not in transcript_packet.text
    # The look-alike: a message being said now counts its "yesterday" from today.
    assert live_packet is not None and "yesterday =" in live_packet.text


def test_an_extracting_ingest_counts_the_turns_it_added_and_its_rerun_adds_none(
    service: DialogueService,
) -> None:
    """`ingest --extract` runs each turn through the pipeline, which remembers it; its report
    still says the turns this run added (it said 0 added, every turn "already there")."""
    full = load_dialogue(DIALOGUES_DIR / "locomo-26.turns.jsonl")
    spec = full.model_copy(update={"turns": full.turns[:4]})
    conv = _conv("extract-count")
    (first,) = ingest(service, [(spec, conv)], extract=True)
    assert (first.turns, first.added, first.already) == (4, 4, 0), first
    assert sum(first.extract_outcomes.values()) == 4
    # The look-alike: the same ingest again adds nothing.
    (again,) = ingest(service, [(spec, conv)], extract=True)
    assert (again.added, again.already) == (0, 4), again


def test_results_round_trip_as_json(service: DialogueService) -> None:
    result = service.commit(_requests(_conv("json"), 1)[0])
    again = TurnResult.model_validate_json(result.model_dump_json())
    assert again == result


def test_a_turn_past_its_deadline_rolls_back_as_a_timeout(
    settings: Settings, tmp_path: Path
) -> None:
    hasty = DialogueService(settings, options=SidecarOptions(turn_timeout_s=0.001))
    try:
        conv = _conv("timeout")
        before = _export(hasty, tmp_path / "before.json")
        result = hasty.commit(_requests(conv, 1)[0])
        assert (result.state, result.error_kind, result.timed_out, result.retryable) == (
            TurnState.ROLLED_BACK,
            "timeout",
            True,
            True,
        )
        assert "deadline" in (result.reason or "")
        assert _export(hasty, tmp_path / "after.json") == before
        assert (
            DialogueRepository(hasty.store).claim_lock(conv, "next", lease_s=1).acquired
        )  # lock freed
    finally:
        hasty.close()


def test_the_prefect_turn_flow_runs_each_slot_as_a_task(
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    prefect_api: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.dialogue import close_services, dialogue_turn_flow

    for name, value in {
        **graph_vars(graph_settings),
        "OPENAI_BASE_URL": scripted.base_url,
        "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
    }.items():
        monkeypatch.setenv(name, value)
    request = _requests(_conv("flow"), 1)[0]
    try:
        state = dialogue_turn_flow(request, str(tmp_path), return_state=True)
    finally:
        close_services()
    result = TurnResult.model_validate(state.result())
    assert result.committed and [s.state.value for s in result.trace.states] == FULL_TIMELINE  # type: ignore[union-attr]
    slots = sorted(["retriever", "injector", "actor", "extractor", "judge", "historian"])
    # Task runs reach Prefect's API as events the server records in the background: on a loaded
    # machine some are listed only later, so read until all six are there (or a generous bound).
    deadline = time.monotonic() + 600
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
                )
            )
            names = sorted(r.name.rsplit("-", 1)[0] for r in runs)
            if len(names) >= len(slots) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert names == slots


def test_recall_follows_an_edit_of_the_last_turn_in_every_reader(
    service: DialogueService, settings: Settings, scripted: ScriptedLLM
) -> None:
    """An edit of the last turn comes back at the same position under the same key: another
    reader's cached index (another process) must not keep recalling the old text."""
    conv = _conv("edit-last")
    window = [("Seraphina", "Welcome back, Tester.")]
    first = _said(
        conv, 1, "Tester", "My sister Ilse moved to Bergen to study marine biology.", window
    )
    rainy = _said(
        conv,
        3,
        "Tester",
        "The weather has been rainy all week, so I stayed in and read a novel.",
        window,
    )
    sunny = _said(
        conv,
        3,
        "Tester",
        "The weather has been sunny all week, so I went hiking up to the old lighthouse.",
        window,
    )
    other = DialogueService(
        settings, store=service.store, gateway=service.gateway
    )  # its own recall cache
    try:
        for request in (first, rainy):
            assert service.commit(request).state in (TurnState.COMMITTED, TurnState.ROLLED_BACK)
        question = "What did I do this week when the weather was sunny?"
        assert any(
            "rainy" in t.text for t in other.recall(conv, question, 5)
        )  # the other reader caches it
        replaced = service.commit(sunny, replace=True)
        assert (
            replaced.state in (TurnState.COMMITTED, TurnState.ROLLED_BACK)
            and replaced.code != "INVALID_REQUEST"
        )
        for reader in (service, other):
            texts = [t.text for t in reader.recall(conv, question, 5)]
            assert any("hiking" in t for t in texts) and not any("rainy" in t for t in texts), texts
    finally:
        other.close()


def test_a_memory_query_during_a_pending_edit_never_injects_the_old_text(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    conv = _conv("pending-edit")
    window = [("Seraphina", "Welcome back, Tester.")]
    for request in (
        _said(conv, 1, "Tester", "My sister Ilse moved to Bergen to study marine biology.", window),
        _said(
            conv,
            3,
            "Tester",
            "The weather has been rainy all week, so I stayed in and read a novel.",
            window,
        ),
    ):
        service.commit(request)
    query = {
        "conversation_id": conv,
        "messages": [
            {
                "role": "user",
                "name": "Tester",
                "content": "What did I do this week when the weather was rainy?",
            }
        ],
    }
    # Look-alike first: with no pending write, the remembered text is recalled.
    plain = service.memory_query(query)
    assert plain.ok and "rainy all week" in plain.injection_packet.text  # type: ignore[union-attr]
    edited = (
        "Tester: The weather has been sunny all week, so I went hiking up to the old lighthouse."
    )
    during = service.memory_query({**query, "pending_turns": [{"turn_id": 3, "text": edited}]})
    assert during.ok and during.held_back == ["3"]
    assert "rainy all week" not in during.injection_packet.text  # type: ignore[union-attr]
    assert "Ilse" in during.injection_packet.text  # type: ignore[union-attr]  # the rest of memory still comes
    # A turn whose pending text is what memory holds already is recalled as usual.
    same = service.memory_query(
        {
            **query,
            "pending_turns": [
                {
                    "turn_id": 3,
                    "text": "Tester: The weather has been rainy all week, so I stayed in and read a novel.",
                }
            ],
        }
    )
    assert same.held_back == [] and "rainy all week" in same.injection_packet.text  # type: ignore[union-attr]
    # A turn's text is all its messages: longer than one message may be (64K characters).
    long_turn = f"Tester: {'a' * 40_000}\nTester: {'b' * 40_000}"
    longer = service.memory_query({**query, "pending_turns": [{"turn_id": 3, "text": long_turn}]})
    assert longer.ok and longer.held_back == ["3"], longer.reason
    # Bad input: one line, nothing lost.
    bad = service.memory_query({**query, "pending_turns": [{"turn_id": 3, "text": 5}]})
    assert (
        bad.code == "INVALID_REQUEST"
        and "pending_turns" in (bad.reason or "")
        and "\n" not in (bad.reason or "")
    )


def test_an_edit_whose_slots_fail_still_leaves_the_new_text_in_memory(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    """A replace rewinds the old turn, then runs the slots: when the model is down the turn
    rolls back (retryable), and memory must hold the new text, not neither."""
    conv = _conv("edit-fails")
    window = [("Seraphina", "Welcome back, Tester.")]
    service.commit(
        _said(conv, 1, "Tester", "My sister Ilse moved to Bergen to study marine biology.", window)
    )
    service.commit(
        _said(
            conv,
            3,
            "Tester",
            "The weather has been rainy all week, so I stayed in and read a novel.",
            window,
        )
    )
    sunny = _said(
        conv,
        3,
        "Tester",
        "The weather has been sunny all week, so I went hiking up to the old lighthouse.",
        window,
    )
    scripted.on(schema="TurnExtraction", fault="http_500")  # every extraction fails from now on
    failed = service.commit(sunny, replace=True)
    assert (failed.state, failed.retryable) == (TurnState.ROLLED_BACK, True), failed.reason
    repo = DialogueRepository(service.store)
    _, rows = repo.memory_page(conv, 0, 10)
    assert [(r["turn_id"], "sunny" in r["text"]) for r in rows] == [("1", False), ("3", True)]
    assert not rows[1]["committed"]  # remembered, its facts not committed: the retry does that
    texts = [t.text for t in service.recall(conv, "What did I do when the weather was sunny?", 5)]
    assert any("hiking" in t for t in texts) and not any("rainy" in t for t in texts), texts
    # Look-alike: a plain commit that fails remembers nothing (its client retries it).
    failed_plain = service.commit(
        _said(conv, 5, "Tester", "I met an old friend at the harbour today.", window)
    )
    assert failed_plain.retryable and [r["turn_id"] for r in repo.memory_page(conv, 0, 10)[1]] == [
        "1",
        "3",
    ]


def test_a_memory_query_recalls_the_speaker_a_message_is_about_not_its_sender(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    """Melanie asking Caroline about Caroline's adoption must recall what Caroline said, not
    Melanie's own remark on the same subject: the sender's "Melanie:" label is not a mention."""
    conv = _conv("about-whom")
    caroline = (
        "I've been researching adoption agencies all month, it's a huge step toward my own family."
    )
    melanie = "A friend of mine adopted last year and the adoption went smoothly, so I keep thinking about it."
    for turn, (speaker, text) in enumerate((("Caroline", caroline), ("Melanie", melanie)), start=1):
        service.commit(_said(conv, turn, speaker, text, []))

    def first_recalled(content: str) -> str:
        query = {
            "conversation_id": conv,
            "messages": [{"role": "user", "name": "Melanie", "content": content}],
        }
        answer = service.memory_query(query)
        assert answer.ok and answer.recalled, answer
        return answer.recalled[0].speaker

    assert first_recalled("How is your adoption going?") == "Caroline"
    # The look-alike: a question about the sender's own words recalls the sender's.
    assert first_recalled("What did I say about my friend's adoption last year?") == "Melanie"


def test_a_memory_query_that_calls_its_listener_by_name_still_recalls_what_it_asks_about(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    """ "Thanks, Caroline. Where does Ilse live now?" speaks to Caroline, not of her: recall
    must not favour Caroline's lines (it recalled none of Melanie's, where Ilse is)."""
    conv = _conv("vocative")
    lines = (
        ("Melanie", "My sister Ilse moved to Bergen last spring to study marine biology."),
        ("Caroline", "That sounds wonderful, I love the sea!"),
        ("Melanie", "I baked sourdough bread this morning."),
        ("Caroline", "I went to a pottery class today and made a bowl."),
        ("Caroline", "Where does the time go, right?"),
    )
    for turn, (speaker, text) in enumerate(lines, start=1):
        service.commit(_said(conv, turn, speaker, text, []))

    def first(content: str) -> tuple[str, str]:
        message = {"role": "user", "name": "Melanie", "content": content}
        answer = service.memory_query({"conversation_id": conv, "messages": [message]})
        assert answer.ok and answer.recalled, answer
        return answer.recalled[0].turn_id, answer.recalled[0].speaker

    assert first("Thanks, Caroline. Where does Ilse live now?") == ("1", "Melanie")
    assert first("Caroline, where does Ilse live now?") == ("1", "Melanie")
    # The look-alike: a question about Caroline recalls Caroline's lines first.
    assert first("Where does Caroline think the time goes?")[1] == "Caroline"


def test_a_commit_stores_the_vector_its_memory_query_embedded_and_embeds_nothing_more(
    service: DialogueService, scripted: ScriptedLLM
) -> None:
    """A turn's retrieval embeds the text its memory row embeds (core.recall.embedded_text:
    the words without the speakers' names and labels), so the commit makes no embedding call
    of its own and stores that vector."""
    from tests.support.scripted_llm import hashed_embedding

    conv = _conv("one-embedding")
    first = (("Caroline", "I went to a support group yesterday."), ("Melanie", "How did it go?"))

    def said(turn: int, speaker: str, text: str) -> TurnCommitRequest:
        # Plain chat: the scripted extractor finds no facts in these lines.
        request = _said(conv, turn, speaker, text, [])
        return request.model_copy(
            update={"config": request.config.model_copy(update={"require_actions": False})}
        )

    for turn, (speaker, text) in enumerate(first, start=1):
        assert service.commit(said(turn, speaker, text)).committed

    def embedded_during(turn: int, speaker: str, text: str) -> list[list[str]]:
        # As a chat front end does: a memory query for the message, then its commit.
        message = {"role": "user", "name": speaker, "content": text}
        assert service.memory_query({"conversation_id": conv, "messages": [message]}).ok
        before = len(scripted.requests)
        result = service.commit(said(turn, speaker, text))
        assert result.committed, result.reason
        return [
            r.body["input"] for r in scripted.requests[before:] if r.path.endswith("/embeddings")
        ]

    assert embedded_during(3, "Caroline", "Melanie, it was great, I felt accepted.") == [
        ["it was great, I felt accepted."]
    ]
    _, _, rows = DialogueRepository(service.store).memory_since(conv)
    stored = {r.turn_id: r for r in rows}["3"]
    assert stored.text == "Caroline: Melanie, it was great, I felt accepted."
    expected = hashed_embedding("it was great, I felt accepted.", len(stored.embedding))
    assert stored.embedding == [round(float(x), 7) for x in expected]
    # The look-alike: a speaker the conversation has not heard yet. The retrieval asks with
    # the name the index does not know as a speaker's; the row, whose speakers include its
    # own, embeds the words without it: a second call, for the row.
    assert embedded_during(4, "Dave", "Dave here, I paint lakes.") == [
        ["Dave: Dave here, I paint lakes."],
        ["here, I paint lakes."],
    ]


def test_a_question_about_yesterday_recalls_what_was_said_the_day_before_it_is_asked(
    service: DialogueService,
) -> None:
    """A chat imported with ISO times (its days its sessions), then asked "yesterday": the
    turn said the day before the pending message outranks the same words said weeks before."""
    conv = _conv("yesterday")
    said = {
        "1": "2023-04-10T19:00:00Z",
        "2": "2023-04-10T19:01:00Z",
        "3": "2023-05-07T20:00:00Z",
        "4": "2023-05-07T20:01:00Z",
    }
    texts = {
        "1": "We talked about the lighthouse on the hill.",
        "2": "Yes, the lighthouse keeper waved at us.",
        "3": "We talked about the lighthouse on the hill.",
        "4": "Yes, the lighthouse keeper waved at us.",
    }
    imported = service.import_turns(
        {
            "conversation_id": conv,
            "turns": [
                {
                    "turn_id": turn,
                    "messages": [
                        {"role": "user", "name": "Ann", "content": texts[turn], "time": said[turn]}
                    ],
                }
                for turn in said
            ],
        }
    )
    assert imported.ok and imported.added == ["1", "2", "3", "4"], imported

    def first_recalled(time: str) -> str:
        question = {"role": "user", "name": "Ann", "content": "What did we talk about yesterday?"}
        answer = service.memory_query(
            {"conversation_id": conv, "messages": [{**question, "time": time}]}
        )
        assert answer.ok, answer
        return answer.recalled[0].turn_id

    assert first_recalled("2023-05-08T09:00:00Z") == "3"
    # Look-alike: asked the day after the April turns, "yesterday" is theirs.
    assert first_recalled("2023-04-11T09:00:00Z") == "1"
