"""Concurrent turns of one conversation: serialised across threads and processes, no lost
update, no duplicate.

The cross-process tests start two worker processes (`python -m
tests.tasks.dialogue.test_dialogue_concurrency worker ...`) that connect to the session's
graph through NEO4J_URI & co., as two sidecar instances would, each with its own scripted model (the
script is deterministic). They commit at the same moment (a start file releases both) and the graph
is then compared with a sequential run of the same turns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings, load_settings
from kg.dialogue import DialogueRepository
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support.cli import graph_vars
from tests.support.dialogue_script import (
    DialogueScript,
    dialogue_requests,
    participants,
)
from tests.support.scripted_llm import ScriptedLLM

DIALOGUE = "locomo-26"
TURNS = 10


def _requests(conversation_id: str, turns: int = TURNS) -> list[Any]:
    return dialogue_requests(DIALOGUE, conversation_id, turns)


def _state(repo: DialogueRepository, conv: str) -> dict[str, Any]:
    """What must not depend on who committed: relations, the event log, turn order."""
    relations = sorted(
        (r.source_id, r.target_id, r.type, r.status, r.weight, r.since_turn, r.ended_turn)
        for r in repo.relations(conv)
    )
    events = [
        (
            e["turn_id"],
            e["index"],
            e["action"],
            e.get("from_type"),
            e.get("to_type"),
            e.get("weight_before"),
            e.get("weight_after"),
        )
        for e in repo.events(conv)
    ]
    turns = [(t["turn_id"], t["seq"]) for t in repo.turns(conv)]
    return {
        "relations": relations,
        "events": sorted(events),
        "turns": turns,
        "event_ids": [e["event_id"] for e in repo.events(conv)],
    }


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


def _settings(graph_settings: Settings, llm: ScriptedLLM) -> Settings:
    return load_settings(
        graph_settings.project_dir, openai_base_url=llm.base_url, embedding_base_url=llm.base_url
    )


def _sequential(graph_settings: Settings, scripted: ScriptedLLM, mutations: str) -> dict[str, Any]:
    scripted.reset()
    DialogueScript(participants(DIALOGUE), mutations=mutations).install(scripted)  # type: ignore[arg-type]
    service = DialogueService(_settings(graph_settings, scripted))
    try:
        conv = f"test-sequential-{uuid.uuid4().hex[:8]}"
        assert all(service.commit(r).committed for r in _requests(conv))
        return _state(DialogueRepository(service.store), conv)
    finally:
        service.close()


def _run_workers(
    graph_settings: Settings, tmp_path: Path, conv: str, mutations: str, selections: list[str]
) -> list[list[dict[str, Any]]]:
    env = {
        **os.environ,
        **graph_vars(graph_settings),
        "PYTHONPATH": child_pythonpath(),
    }
    go = tmp_path / "go"
    procs, outputs = [], []
    for i, selection in enumerate(selections):
        out = tmp_path / f"worker-{i}.json"
        outputs.append(out)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.tasks.dialogue.test_dialogue_concurrency",
                    "worker",
                    "--conversation",
                    conv,
                    "--turns",
                    selection,
                    "--mutations",
                    mutations,
                    "--go",
                    str(go),
                    "--out",
                    str(out),
                    "--project-dir",
                    str(tmp_path / f"project-{i}"),
                ],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    ready = [tmp_path / f"worker-{i}.json.ready" for i in range(len(selections))]
    deadline = time.monotonic() + 600
    while not all(p.exists() for p in ready):
        assert time.monotonic() < deadline, "workers did not get ready"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.1)
    go.touch()  # both start committing now
    for proc in procs:
        _, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr[-3000:]
    return [json.loads(out.read_text()) for out in outputs]


def test_two_processes_committing_the_same_turns_serialise_them(
    graph_settings: Settings, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    expected = _sequential(graph_settings, scripted, "mixed")
    conv = f"test-2proc-same-{uuid.uuid4().hex[:8]}"
    results = _run_workers(graph_settings, tmp_path, conv, "mixed", ["all", "all"])

    for turn in range(TURNS):
        outcomes = [results[w][turn] for w in range(2)]
        assert all(o["committed"] for o in outcomes), outcomes
        assert sorted(o["idempotent_hit"] for o in outcomes) == [False, True], (
            outcomes
        )  # exactly once
        assert outcomes[0]["seq"] == outcomes[1]["seq"] == turn + 1
    service = DialogueService(_settings(graph_settings, scripted))
    try:
        state = _state(DialogueRepository(service.store), conv)
    finally:
        service.close()
    assert len(set(state.pop("event_ids"))) == len(expected.pop("event_ids"))
    assert state == expected


def test_two_processes_committing_alternate_turns_lose_no_update(
    graph_settings: Settings, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    # EVOLVE-only turns commute, so any serial order must give the sequential weights; an
    # unserialised read-modify-write would lose an increment.
    expected = _sequential(graph_settings, scripted, "evolve")
    conv = f"test-2proc-alt-{uuid.uuid4().hex[:8]}"
    results = _run_workers(graph_settings, tmp_path, conv, "evolve", ["odd", "even"])
    assert all(o["committed"] and not o["idempotent_hit"] for worker in results for o in worker)
    service = DialogueService(_settings(graph_settings, scripted))
    try:
        state = _state(DialogueRepository(service.store), conv)
    finally:
        service.close()
    assert sorted(seq for _, seq in state["turns"]) == list(
        range(1, TURNS + 1)
    )  # no duplicate, no gap
    assert sorted(t for t, _ in state["turns"]) == sorted(t for t, _ in expected["turns"])
    assert len(state["event_ids"]) == len(set(state["event_ids"])) == len(expected["event_ids"])
    final = {(s, t, typ): (status, w) for s, t, typ, status, w, *_ in state["relations"]}
    assert final == {(s, t, typ): (status, w) for s, t, typ, status, w, *_ in expected["relations"]}


def test_threads_and_two_service_instances_in_one_process_serialise_too(
    graph_settings: Settings, scripted: ScriptedLLM
) -> None:
    expected = _sequential(graph_settings, scripted, "evolve")
    settings = _settings(graph_settings, scripted)
    services = [DialogueService(settings, options=SidecarOptions(lock_wait_s=60)) for _ in range(2)]
    conv = f"test-threads-{uuid.uuid4().hex[:8]}"
    requests = _requests(conv)
    results: list[Any] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        service = services[index % 2]
        for request in requests[index::4]:
            result = service.commit(request)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(results) == TURNS and all(r.committed and not r.idempotent_hit for r in results)
        state = _state(DialogueRepository(services[0].store), conv)
    finally:
        for service in services:
            service.close()
    assert sorted(seq for _, seq in state["turns"]) == list(range(1, TURNS + 1))
    final = {(s, t, typ): w for s, t, typ, _, w, *_ in state["relations"]}
    assert final == {(s, t, typ): w for s, t, typ, _, w, *_ in expected["relations"]}


# --- the worker process ---------------------------------------------------------------------------


def _worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("worker")
    parser.add_argument("--conversation", required=True)
    parser.add_argument("--turns", choices=["all", "odd", "even"], required=True)
    parser.add_argument("--mutations", required=True)
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--project-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    with ScriptedLLM() as llm:
        DialogueScript(participants(DIALOGUE), mutations=args.mutations).install(llm)
        settings = load_settings(
            args.project_dir, openai_base_url=llm.base_url, embedding_base_url=llm.base_url
        )
        service = DialogueService(settings, options=SidecarOptions(lock_wait_s=60))
        try:
            requests = _requests(args.conversation)
            start = {"all": 0, "odd": 0, "even": 1}[args.turns]
            step = 1 if args.turns == "all" else 2
            mine = requests[start::step]
            service.store.migrate()  # connected before the start signal
            Path(f"{args.out}.ready").touch()
            while not args.go.exists():
                time.sleep(0.01)
            results = [service.commit(r) for r in mine]
        finally:
            service.close()
    args.out.write_text(
        json.dumps(
            [
                {
                    "turn": r.turn_id,
                    "committed": r.committed,
                    "idempotent_hit": r.idempotent_hit,
                    "seq": r.seq,
                    "code": r.code,
                    "reason": r.reason,
                }
                for r in results
            ]
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
