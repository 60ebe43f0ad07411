"""The sidecar as a chat front end uses it (issue 15): memory before the reply, replace and
rewind (exact), read-back, bearer token and CORS, slot scheduling (judge and historian at
once, the deadline and per-slot timeouts cutting a running slot), refused overrides, and the
long-run bounds (call records, conversation locks, rolled-back traces).

Over 600 lines on purpose: the tests share one served app, scripted LLM and graph (module
fixtures), which a split would start again per file."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api import (
    COMMIT_PATH,
    CONVERSATIONS_PATH,
    COPY_PATH,
    FORGET_PATH,
    HEALTH_PATH,
    IMPORT_PATH,
    MEMORY_QUERY_PATH,
    RENAME_PATH,
    REPLACE_PATH,
    REWIND_PATH,
    SidecarSecurity,
    create_app,
    is_loopback,
    listening_socket,
)
from core.cli import run_main
from core.llm import LLMGateway
from core.priority import QUERIES
from core.settings import Settings, load_settings
from flows.dialogue import main
from kg.dialogue import DialogueRepository
from kg.transfer import dumps_export
from tasks.dialogue.ingest import memory_rows
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tasks.dialogue.remember import remember_rows
from tasks.dialogue.replay import load_dialogue
from tasks.dialogue.sillytavern import load_sillytavern_chat
from tests.support.cli import graph_vars
from tests.support.dialogue_script import DialogueScript
from tests.support.scripted_llm import ScriptedLLM

TOKEN = "t0ken-for-the-sidecar-tests"
ALLOWED = "http://127.0.0.1:8000"
SPEAKERS = ["Caroline", "Melanie"]


@pytest.fixture(scope="module")
def sidecar_speakers() -> list[str]:
    return SPEAKERS


def _conv() -> str:
    return f"test-api-{uuid.uuid4().hex[:8]}"


def _msg(speaker: str, content: str, n: int) -> dict[str, Any]:
    # A fixed time per message: the remembered `when` must not depend on the wall clock.
    return {
        "role": "user",
        "name": speaker,
        "content": content,
        "time": f"1:{n:02d} pm on 8 May, 2023",
    }


def _turn(conv: str, n: int, content: str, speaker: str | None = None) -> dict[str, Any]:
    speaker = speaker or SPEAKERS[n % 2]
    # The chat before the turn, as front ends send it: the other participant is in it, so a
    # relation between the two is grounded in the conversation.
    other = next(s for s in SPEAKERS if s != speaker)
    return {
        "conversation_id": conv,
        "turn_id": n,
        "messages": [_msg(speaker, content, n)],
        "window": [_msg(other, f"Hi {speaker}, how are you?", 0)],
    }


LINES = [
    "I went to the LGBTQ support group yesterday and it was so powerful!",
    "That sounds amazing. I painted a sunrise over the lake last week.",
    "I am thinking about a career in counseling now!",
    "My kids loved the pottery workshop we did together.",
    "The adoption agency called me back about the interview!",
    "We went camping in the mountains, the kids saw a bear.",
]


def _export(service: DialogueService) -> str:
    return dumps_export(service.store.export_data())


# --- 1. memory before the reply ---------------------------------------------------------------


def test_memory_query_before_a_reply_returns_facts_committed_earlier(
    client: TestClient, service: DialogueService, scripted: ScriptedLLM
) -> None:
    conv = _conv()
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    before = _export(service)
    chats = scripted.counts_by_path.get("/v1/chat/completions", 0)
    pending = {
        "conversation_id": conv,
        "messages": [
            {"role": "user", "name": "Melanie", "content": "How was the support group, Caroline?"}
        ],
    }
    response = client.post(MEMORY_QUERY_PATH, json=pending)
    assert response.status_code == 200, response.text
    data = response.json()
    packet = data["injection_packet"]
    # The facts of turn 1: Caroline's entity and bio, the relation, and the recalled turn itself.
    assert "support group" in packet["text"] and "Caroline" in packet["text"]
    assert "1" in [t["turn_id"] for t in data["recalled"]] and data["stored_turns"] == 2
    assert "Caroline -FRIEND_OF-> Melanie" in packet["text"]
    # No writes, no chat call: only the query embedding.
    assert _export(service) == before
    assert scripted.counts_by_path.get("/v1/chat/completions", 0) == chats
    # A message without a word (a front end's "continue") asks nothing: no turn is recalled,
    # where its embedding would have drawn some; a one-word message (the look-alike) asks.
    for wordless in ("", "...", "\U0001f44d"):
        silent = {**pending, "messages": [{**pending["messages"][0], "content": wordless}]}
        data = client.post(MEMORY_QUERY_PATH, json=silent).json()
        assert data["ok"] and data["recalled"] == [] and data["stored_turns"] == 2, wordless
    one_word = {**pending, "messages": [{**pending["messages"][0], "content": "Support?"}]}
    assert "1" in [
        t["turn_id"] for t in client.post(MEMORY_QUERY_PATH, json=one_word).json()["recalled"]
    ]
    # An unknown conversation is no error: an empty packet.
    empty = client.post(MEMORY_QUERY_PATH, json={**pending, "conversation_id": _conv()}).json()
    assert empty["ok"] and empty["recalled"] == [] and empty["stored_turns"] == 0


def _recalled_ids(client: TestClient, body: dict[str, Any]) -> list[str]:
    data = client.post(MEMORY_QUERY_PATH, json=body).json()
    assert data["ok"], data
    return [t["turn_id"] for t in data["recalled"]]


def test_memory_recalls_nothing_the_window_shows_and_a_topicless_reply_asks_about_its_topic(
    client: TestClient,
) -> None:
    conv = _conv()
    turns = [_turn(conv, n, LINES[n - 1]) for n in range(1, 7)]
    for turn in turns:
        assert client.post(COMMIT_PATH, json=turn).json()["committed"]
    ask = {"role": "user", "name": "Caroline", "content": "How was the support group?"}
    query = {"conversation_id": conv, "messages": [ask], "config": {"recall_k": 1}}
    first, second = _recalled_ids(client, {**query, "config": {"recall_k": 2}})
    assert _recalled_ids(client, query) == [first]
    # The front end shows the first (its window holds that turn as it was committed): the next
    # best takes its place, so the packet still carries k turns.
    shown = turns[int(first) - 1]["messages"]
    assert _recalled_ids(client, {**query, "window": shown}) == [second]
    # A window that shows every turn leaves nothing else to recall: the shown ones keep their
    # slots, in rank order (a short chat still gets memory pointing at what matters in it).
    everything = [m for turn in turns for m in turn["messages"]]
    two = {**query, "config": {"recall_k": 2}, "window": everything}
    assert _recalled_ids(client, two) == [first, second]
    # A window message that is not the turn's whole text hides nothing.
    cut = [{**shown[0], "content": shown[0]["content"][:30]}]
    assert _recalled_ids(client, {**query, "window": cut}) == [first]

    # A reply with no topic of its own is asked as the window's last message that has one.
    topic = {"role": "assistant", "name": "Melanie", "content": "Pottery was so much fun!"}
    base = {"conversation_id": conv, "config": {"recall_k": 2}}
    about_topic = _recalled_ids(client, {**base, "messages": [topic]})
    for reply in ("Haha, yesss!", "lol yeah", "Thanks!", "\U0001f44d", "*nods slowly*"):
        body = {**base, "messages": [{"role": "user", "name": "Caroline", "content": reply}]}
        window = [topic, {**body["messages"][0], "content": "ok"}]
        assert _recalled_ids(client, {**body, "window": window}) == about_topic, reply
        # With no window it asks nothing: no turn is recalled.
        assert _recalled_ids(client, body) == [], reply
    # The look-alike: a short reply that names something is asked by its own words.
    bear = {**base, "messages": [{"role": "user", "name": "Caroline", "content": "lol the bear!"}]}
    about_bear = _recalled_ids(client, bear)
    assert _recalled_ids(client, {**bear, "window": [topic]}) == about_bear != about_topic


def test_memory_query_bad_input_gets_one_line(client: TestClient) -> None:
    bad = client.post(
        MEMORY_QUERY_PATH,
        json={"conversation_id": "c", "turn_id": 1, "messages": [{"role": "user", "content": "x"}]},
    )
    assert (
        bad.status_code == 400
        and bad.json()["code"] == "INVALID_REQUEST"
        and "turn_id" in bad.json()["reason"]
    )
    assert (
        client.post(
            MEMORY_QUERY_PATH, content=b"{", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )


# --- 3. replace and rewind --------------------------------------------------------------------


def _kg_export_cli(graph_settings: Settings, out: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """`python -m kg export` (its main, in-process) against the session graph: the file's bytes."""
    from kg.__main__ import main as kg_main

    for name, value in graph_vars(graph_settings).items():
        monkeypatch.setenv(name, value)
    assert kg_main(["export", "--out", str(out), "--project-dir", str(out.parent)]) == 0
    return out.read_bytes()


def test_rewind_leaves_the_export_byte_identical_to_never_having_the_turns(
    client: TestClient,
    service: DialogueService,
    scripted: ScriptedLLM,
    graph_settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conv = _conv()
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    never_had = _export(service)
    never_had_file = _kg_export_cli(graph_settings, tmp_path / "before.json", monkeypatch)
    assert client.post(COMMIT_PATH, json=_turn(conv, 3, LINES[2])).json()["committed"]
    # Turn 4 blocked by the commit gate (remembered, no facts); turn 5 committed after it.
    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
    )
    assert client.post(COMMIT_PATH, json=_turn(conv, 4, LINES[3])).json()["state"] == "ROLLED_BACK"
    assert client.post(COMMIT_PATH, json=_turn(conv, 5, LINES[4])).json()["committed"]
    assert _export(service) != never_had

    response = client.post(REWIND_PATH, json={"conversation_id": conv, "before_turn": 3})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["found"] and data["removed_turns"] == ["3", "5"] and data["removed_memory"] == 3
    assert data["replayed_turns"] == 2
    assert _export(service) == never_had
    assert _kg_export_cli(graph_settings, tmp_path / "after.json", monkeypatch) == never_had_file
    # The conversation goes on from there as if the turns never happened.
    again = client.post(COMMIT_PATH, json=_turn(conv, 3, LINES[2])).json()
    assert again["committed"] and again["seq"] == 3 and not again["idempotent_hit"]
    # Rewinding a turn that was never remembered changes nothing.
    after = _export(service)
    none = client.post(REWIND_PATH, json={"conversation_id": conv, "before_turn": 99}).json()
    assert none["ok"] and not none["found"] and _export(service) == after


def test_forget_removes_the_whole_conversation_and_nothing_of_another(
    client: TestClient, service: DialogueService, scripted: ScriptedLLM
) -> None:
    conv, other = _conv(), _conv()
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(other, n, LINES[n - 1])).json()["committed"]
    never_had = _export(service)
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n + 1])).json()["committed"]
    # Turn 3 blocked by the commit gate: remembered, no facts; forgotten all the same.
    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
    )
    assert client.post(COMMIT_PATH, json=_turn(conv, 3, LINES[4])).json()["state"] == "ROLLED_BACK"
    query = {"conversation_id": conv, "messages": [{"role": "user", "content": "counseling?"}]}
    assert client.post(MEMORY_QUERY_PATH, json=query).json()["stored_turns"] == 3

    def listed() -> dict[str, int]:
        page = client.get(CONVERSATIONS_PATH, params={"limit": 500}).json()
        assert page["page"]["total"] == len(page["items"]) < 500
        return {c["conversation_id"]: c["remembered_turns"] for c in page["items"]}

    assert (listed()[conv], listed()[other]) == (3, 2)

    response = client.post(FORGET_PATH, json={"conversation_id": conv})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["ok"] and data["found"]
    removed = data["removed"]
    assert (removed["turns"], removed["memory"], removed["entities"]) == (2, 3, 2)
    assert removed["relations"] >= 1
    # Byte-identical to never having had it; the other conversation is untouched.
    assert _export(service) == never_had
    assert client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()["page"]["total"] == 0
    assert client.get(f"{CONVERSATIONS_PATH}/{other}/turns").json()["page"]["total"] == 2
    assert conv not in listed() and listed()[other] == 2
    # The process's cached recall index is gone with it.
    recalled = client.post(MEMORY_QUERY_PATH, json=query).json()
    assert recalled["stored_turns"] == 0 and recalled["recalled"] == []
    # Again: nothing to forget, nothing changed.
    again = client.post(FORGET_PATH, json={"conversation_id": conv}).json()
    assert again["ok"] and not again["found"] and again["removed"]["memory"] == 0
    assert _export(service) == never_had
    # The same id starts afresh: turn 1 is a new commit, not an idempotent replay.
    fresh = client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[5])).json()
    assert fresh["committed"] and fresh["seq"] == 1 and not fresh["idempotent_hit"]


def test_forget_waits_for_no_one_and_removes_nothing_while_a_turn_holds_the_lease(
    client: TestClient, service: DialogueService
) -> None:
    conv = _conv()
    assert client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0])).json()["committed"]
    repo = DialogueRepository(service.store)
    assert repo.claim_lock(conv, "other-sidecar", lease_s=30).acquired
    before = _export(service)
    try:
        busy = client.post(FORGET_PATH, json={"conversation_id": conv})
        assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
        assert busy.json()["code"] == "IN_PROGRESS" and not busy.json()["found"]
        assert _export(service) == before
    finally:
        repo.release_lock(conv, "other-sidecar")
    malformed = client.post(FORGET_PATH, json={"conversation_id": conv, "turn_id": 1})
    assert malformed.status_code == 400 and "turn_id" in malformed.json()["reason"]
    assert client.post(FORGET_PATH, json={"conversation_id": conv}).json()["found"]


def _read_back(client: TestClient, conv: str) -> dict[str, Any]:
    """Everything the read-back API gives of a conversation (ids, facts, remembered turns)."""
    return {
        part: client.get(f"{CONVERSATIONS_PATH}/{conv}/{part}", params={"limit": 500}).json()
        for part in ("entities", "relations", "milestones", "turns")
    }


def _history(client: TestClient, scripted: ScriptedLLM, conv: str) -> dict[str, Any]:
    """Turns 1-2 committed, turn 3 blocked by the commit gate (remembered, no facts); returns
    turn 2's answer."""
    for n in (1, 2):
        answer = client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()
        assert answer["committed"]
    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
    )
    assert client.post(COMMIT_PATH, json=_turn(conv, 3, LINES[2])).json()["state"] == "ROLLED_BACK"
    return answer


def _facts_of(answer: dict[str, Any]) -> tuple[object, ...]:
    """A turn's answer's ids made from turns' keys (relations, events, milestones)."""
    packet = answer["injection_packet"] or {}
    return (answer["actions"], answer["events"], answer["milestones"], packet.get("relation_ids"))


def test_rename_moves_the_conversation_as_if_committed_under_the_new_id(
    client: TestClient, service: DialogueService, scripted: ScriptedLLM
) -> None:
    old, new, other = _conv(), _conv(), _conv()
    assert client.post(COMMIT_PATH, json=_turn(other, 1, LINES[5])).json()["committed"]
    # What the read-back gives when the history was committed under the new id all along.
    direct_answer = _history(client, scripted, new)
    direct = _read_back(client, new)
    assert client.post(FORGET_PATH, json={"conversation_id": new}).json()["found"]
    old_answer = _history(client, scripted, old)
    assert any(a["rel_id"].startswith(f"{old}:") for a in old_answer["actions"])
    query = {"conversation_id": old, "messages": [{"role": "user", "content": "counseling?"}]}
    assert client.post(MEMORY_QUERY_PATH, json=query).json()["stored_turns"] == 3
    other_before = _read_back(client, other)

    response = client.post(RENAME_PATH, json={"conversation_id": old, "new_conversation_id": new})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["ok"] and data["found"] and data["new_conversation_id"] == new
    moved = data["moved"]
    assert (moved["turns"], moved["memory"], moved["entities"]) == (2, 3, 2)
    # Ids made from the turns' keys (relations, events, milestones) are the new id's.
    assert _read_back(client, new) == direct
    assert [part["page"]["total"] for part in _read_back(client, old).values()] == [0] * 4
    assert _read_back(client, other) == other_before
    # Each process's cached recall index follows: the old id recalls nothing, the new one all.
    assert client.post(MEMORY_QUERY_PATH, json=query).json()["stored_turns"] == 0
    renamed = client.post(MEMORY_QUERY_PATH, json={**query, "conversation_id": new}).json()
    assert renamed["stored_turns"] == 3 and renamed["recalled"]
    # A turn sent again under the new id is the same turn (its hash was made with the old id).
    again = client.post(COMMIT_PATH, json=_turn(new, 2, LINES[1])).json()
    assert again["idempotent_hit"] and again["conversation_id"] == new
    assert again["key"] == f"{new}:2" and again["seq"] == 2
    # ... and its answer names the relations, events and milestones as the graph now does.
    assert _facts_of(again) == _facts_of(direct_answer)
    changed = client.post(COMMIT_PATH, json=_turn(new, 2, LINES[4]))
    assert changed.status_code == 409 and changed.json()["error_kind"] == "conflict"
    # The conversation goes on under the new id; nothing is left to move under the old one.
    later = client.post(COMMIT_PATH, json=_turn(new, 4, LINES[3])).json()
    assert later["committed"] and later["seq"] == 3 and not later["idempotent_hit"]
    none = client.post(RENAME_PATH, json={"conversation_id": old, "new_conversation_id": _conv()})
    assert none.status_code == 200 and not none.json()["found"]


def test_copy_is_as_if_committed_under_the_new_id_and_leaves_the_original_as_it_was(
    client: TestClient, service: DialogueService, scripted: ScriptedLLM
) -> None:
    old, new = _conv(), _conv()
    direct_answer = _history(client, scripted, new)
    direct = _read_back(client, new)
    assert client.post(FORGET_PATH, json={"conversation_id": new}).json()["found"]
    _history(client, scripted, old)
    original = _read_back(client, old)

    response = client.post(COPY_PATH, json={"conversation_id": old, "new_conversation_id": new})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["ok"] and data["found"]
    assert (data["copied"]["turns"], data["copied"]["memory"], data["copied"]["entities"]) == (
        2,
        3,
        2,
    )
    assert _read_back(client, new) == direct
    assert _read_back(client, old) == original
    query = {"conversation_id": new, "messages": [{"role": "user", "content": "counseling?"}]}
    assert client.post(MEMORY_QUERY_PATH, json=query).json()["stored_turns"] == 3
    # The copy goes on apart: a turn sent again is the same turn; a new one changes only it.
    again = client.post(COMMIT_PATH, json=_turn(new, 2, LINES[1])).json()
    assert again["idempotent_hit"] and again["key"] == f"{new}:2"
    assert _facts_of(again) == _facts_of(direct_answer)
    assert client.post(COMMIT_PATH, json=_turn(new, 4, LINES[3])).json()["committed"]
    assert _read_back(client, old) == original
    # Copying into it again: it holds memory now, so the copy is refused (409, nothing changed).
    before = _export(service)
    twice = client.post(COPY_PATH, json={"conversation_id": old, "new_conversation_id": new})
    assert twice.status_code == 409 and twice.json()["error_kind"] == "conflict"
    assert _export(service) == before


#: A group's chat as SillyTavern saves it: Ilse speaks first, and later turns, said by others,
#: name her (each turn is embedded without the names of the speakers memory holds by then).
GROUP_CHAT = [
    {"name": "Ilse", "is_user": False, "mes": "Welcome to Bergen, I am Ilse.", "send_date": "1"},
    {"name": "User", "is_user": True, "mes": "Thanks! Rain again?", "send_date": "2"},
    {"name": "Seraphina", "is_user": False, "mes": "Ilse says it rains daily.", "send_date": "3"},
    {"name": "User", "is_user": True, "mes": "Where does Ilse live?", "send_date": "4"},
    {"name": "Seraphina", "is_user": False, "mes": "Ilse lives by the harbour.", "send_date": "5"},
]


def _rows_of(service: DialogueService, conv: str) -> list[tuple[object, ...]]:
    rows = DialogueRepository(service.store).memory_rows(conv, 1, 100)
    return [(r.turn_id, r.speaker, r.text, r.when, r.source_refs, r.embedding) for r in rows]


def test_import_remembers_a_chats_history_as_its_file_ingest_would_in_any_batches(
    client: TestClient, service: DialogueService, tmp_path: Path
) -> None:
    chat = tmp_path / "group-chat.jsonl"
    chat.write_text("".join(json.dumps(line) + "\n" for line in GROUP_CHAT))
    spec = load_sillytavern_chat(chat)
    turns = [
        {"turn_id": t.turn_id, "messages": [m.model_dump(exclude_none=True) for m in t.messages]}
        for t in spec.turns
    ]
    assert [t["turn_id"] for t in turns] == [0, 2, 4]
    # What `flows.dialogue ingest` of the file remembers, in one run.
    ingested = _conv()
    assert remember_rows(service, ingested, memory_rows(spec, ingested)) == (3, 0)

    conv = _conv()
    first = client.post(IMPORT_PATH, json={"conversation_id": conv, "turns": turns[:1]})
    assert first.status_code == 200, first.text
    assert (first.json()["added"], first.json()["already"]) == (["0"], [])
    # The next batch, the first turn again (held: left as it is) and a turn id given twice.
    rest = {"conversation_id": conv, "turns": [turns[0], *turns[1:], turns[2]]}
    second = client.post(IMPORT_PATH, json=rest).json()
    assert (second["added"], second["already"]) == (["2", "4"], ["0", "4"])
    # Every field the same as the file's ingest, the vectors too: turns 2 and 4 are embedded
    # without Ilse's name, as they would be had they come in the same batch as her turn.
    assert [r[:-1] for r in _rows_of(service, conv)] == [
        r[:-1] for r in _rows_of(service, ingested)
    ]
    assert _rows_of(service, conv) == _rows_of(service, ingested)
    assert client.post(IMPORT_PATH, json=rest).json()["added"] == []

    # Memory recalls the imported turns, and the chat goes on as committed turns after them.
    query = {"conversation_id": conv, "messages": [{"role": "user", "content": "harbour?"}]}
    packet = client.post(MEMORY_QUERY_PATH, json=query).json()
    assert packet["stored_turns"] == 3 and packet["recalled"][0]["turn_id"] == "4"
    committed = client.post(COMMIT_PATH, json=_turn(conv, 6, LINES[0])).json()
    assert committed["committed"] and not committed["idempotent_hit"]
    assert [r[0] for r in _rows_of(service, conv)] == ["0", "2", "4", "6"]


def test_an_import_naming_its_sessions_groups_its_turns_as_a_recorded_dialogues_ingest(
    client: TestClient, service: DialogueService, tmp_path: Path
) -> None:
    """Recall takes the turns of one group as one exchange (neighbours, the session signal). A
    recorded dialogue's session is its group; an import that names its sessions gets the same
    rows as `flows.dialogue ingest` of that dialogue, and one that does not is grouped by day."""
    said = [
        (1, "1:56 pm on 8 May, 2023", "Ann", "I adopted a puppy today."),
        (1, "1:56 pm on 8 May, 2023", "Bob", "What is its name?"),
        (2, "11:40 pm on 25 May, 2023", "Ann", "Max turned one."),
        (2, "0:20 am on 26 May, 2023", "Bob", "Happy birthday to Max!"),  # past midnight
    ]
    recorded = tmp_path / "pets.turns.jsonl"
    recorded.write_text(
        "".join(
            json.dumps(
                {
                    "conversation_id": "pets",
                    "turn_id": n,
                    "session": session,
                    "session_time": when,
                    "dia_id": f"D{session}:{n}",
                    "speaker": speaker,
                    "text": text,
                }
            )
            + "\n"
            for n, (session, when, speaker, text) in enumerate(said, start=1)
        )
    )
    ingested = _conv()
    remember_rows(service, ingested, memory_rows(load_dialogue(recorded), ingested))
    turns = [
        {
            "turn_id": n,
            "messages": [
                {"role": "user", "name": speaker, "content": text, "message_id": f"D{session}:{n}"}
                | {"time": when}
            ],
            "session": str(session),
        }
        for n, (session, when, speaker, text) in enumerate(said, start=1)
    ]
    sessions = _conv()
    answer = client.post(IMPORT_PATH, json={"conversation_id": sessions, "turns": turns})
    assert answer.status_code == 200, answer.text

    def groups(conv: str) -> list[str]:
        return [r.group for r in DialogueRepository(service.store).memory_rows(conv, 1, 100)]

    assert groups(sessions) == groups(ingested) == ["session 1"] * 2 + ["session 2"] * 2
    assert _rows_of(service, sessions) == _rows_of(service, ingested)
    # Look-alike: the same turns with no session are grouped by the day each was said.
    days = _conv()
    bare = [{k: v for k, v in turn.items() if k != "session"} for turn in turns]
    assert (
        client.post(IMPORT_PATH, json={"conversation_id": days, "turns": bare}).status_code == 200
    )
    assert groups(days) == ["8 May, 2023"] * 2 + ["25 May, 2023", "26 May, 2023"]
    # A blank session is refused, as a blank name is.
    blank = [{**turns[0], "session": " "}]
    refused = client.post(IMPORT_PATH, json={"conversation_id": _conv(), "turns": blank})
    assert refused.status_code == 400 and "session" in refused.json()["reason"]


def test_import_writes_nothing_while_a_turn_holds_the_lease_and_refuses_bad_bodies(
    client: TestClient, service: DialogueService
) -> None:
    conv = _conv()
    body = {
        "conversation_id": conv,
        "turns": [{"turn_id": 1, "messages": [_msg("Caroline", LINES[0], 1)]}],
    }
    repo = DialogueRepository(service.store)
    assert repo.claim_lock(conv, "other-sidecar", lease_s=30).acquired
    before = _export(service)
    try:
        busy = client.post(IMPORT_PATH, json=body)
        assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
        assert busy.json()["code"] == "IN_PROGRESS" and busy.json()["added"] == []
        assert _export(service) == before
    finally:
        repo.release_lock(conv, "other-sidecar")
    before = _export(service)
    for bad, field in (
        ({**body, "turns": []}, "turns"),
        ({**body, "turns": [{"turn_id": 1, "messages": []}]}, "turns.0.messages"),
        ({**body, "window": []}, "window"),
    ):
        refused = client.post(IMPORT_PATH, json=bad)
        assert refused.status_code == 400 and field in refused.json()["reason"], refused.text
    assert _export(service) == before
    assert client.post(IMPORT_PATH, json=body).json()["added"] == ["1"]


def test_rename_refuses_to_merge_two_conversations_or_to_wait_for_a_lease(
    client: TestClient, service: DialogueService
) -> None:
    old, taken = _conv(), _conv()
    for conv in (old, taken):
        assert client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0])).json()["committed"]
    before = _export(service)
    merge = client.post(RENAME_PATH, json={"conversation_id": old, "new_conversation_id": taken})
    assert merge.status_code == 409 and merge.json()["error_kind"] == "conflict"
    assert "already holds memory" in merge.json()["reason"] and "retry-after" not in merge.headers
    assert _export(service) == before
    # Either id's lease held by another sidecar: 409 with Retry-After, nothing moved.
    repo = DialogueRepository(service.store)
    free = _conv()
    for leased in (old, free):
        assert repo.claim_lock(leased, "other-sidecar", lease_s=30).acquired
        leased_before = _export(service)
        try:
            busy = client.post(
                RENAME_PATH, json={"conversation_id": old, "new_conversation_id": free}
            )
            assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
            assert busy.json()["code"] == "IN_PROGRESS" and not busy.json()["found"]
            assert _export(service) == leased_before
        finally:
            repo.release_lock(leased, "other-sidecar")
    # The same id: nothing to move (200, found false); a malformed body: 400, one line.
    same = client.post(RENAME_PATH, json={"conversation_id": old, "new_conversation_id": old})
    assert same.status_code == 200 and same.json()["ok"] and not same.json()["found"]
    malformed = client.post(RENAME_PATH, json={"conversation_id": old})
    assert malformed.status_code == 400 and "new_conversation_id" in malformed.json()["reason"]
    assert _export(service) == before


def test_replace_removes_the_old_turns_facts_exactly_and_commits_the_new_text(
    client: TestClient,
    service: DialogueService,
    graph_settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conv = _conv()
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    # What the graph looks like when turn 3 was only ever the edited text: commit it, export, rewind.
    assert client.post(COMMIT_PATH, json=_turn(conv, 3, LINES[5])).json()["committed"]
    only_new = _kg_export_cli(graph_settings, tmp_path / "only-new.json", monkeypatch)
    assert client.post(REWIND_PATH, json={"conversation_id": conv, "before_turn": 3}).json()[
        "found"
    ]

    # The history with the old turn 3 (and a later turn 4), then the edit of turn 3.
    for n in (3, 4):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    assert _kg_export_cli(graph_settings, tmp_path / "old-history.json", monkeypatch) != only_new
    edited = _turn(conv, 3, LINES[5])
    # /turn/commit refuses a changed payload under a committed key (409, no Retry-After) ...
    conflict = client.post(COMMIT_PATH, json=edited)
    assert conflict.status_code == 409 and conflict.json()["error_kind"] == "conflict"
    assert "retry-after" not in conflict.headers
    # ... /turn/replace rewinds turn 3 (and 4) and commits the new text.
    response = client.post(REPLACE_PATH, json=edited)
    assert response.status_code == 200, response.text
    assert response.json()["committed"] and response.json()["seq"] == 3
    # The real `python -m kg export` files, byte for byte: the second commit of turn 3 has
    # its own commit time and timings, which the export leaves out (operational properties).
    assert _kg_export_cli(graph_settings, tmp_path / "replaced.json", monkeypatch) == only_new
    # The same replace again is an idempotent replay (a swipe sent twice), nothing rewound.
    exported = _export(service)
    replay = client.post(REPLACE_PATH, json=edited).json()
    assert replay["idempotent_hit"] and _export(service) == exported
    # The graph still holds the commit's trace for operators: the replay names it.
    assert replay["trace"]["replay_of"] == response.json()["trace"]["trace_id"]
    texts = [t["text"] for t in client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()["items"]]
    assert texts == [
        f"{SPEAKERS[1]}: {LINES[0]}",
        f"{SPEAKERS[0]}: {LINES[1]}",
        f"{SPEAKERS[1]}: {LINES[5]}",
    ]


# --- 5. read-back -----------------------------------------------------------------------------


def test_read_back_pages_and_search(client: TestClient) -> None:
    conv = _conv()
    for n in range(1, 6):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    base = f"{CONVERSATIONS_PATH}/{conv}"
    entities = client.get(f"{base}/entities").json()
    assert {e["name"] for e in entities["items"]} == set(SPEAKERS) and entities["page"][
        "total"
    ] == 2
    relations = client.get(f"{base}/relations").json()["items"]
    friend = next(
        r for r in relations if r["type"] == "FRIEND_OF" and r["source_name"] == "Melanie"
    )
    assert [e["turn_id"] for e in friend["events"]] == ["1", "3", "5"]
    assert (
        friend["events"][0]["action"] == "EVOLVE"
        and friend["weight"] == friend["events"][-1]["weight_after"]
    )
    # Each change carries its evidence, the words of its turn; the relation, its latest one's.
    assert [
        e["quote"] in " ".join(LINES[int(e["turn_id"]) - 1].split()) for e in friend["events"]
    ] == [True] * 3
    assert friend["quote"] == friend["events"][-1]["quote"] and len(friend["quote"].split()) >= 3
    first = client.get(f"{base}/turns", params={"offset": 0, "limit": 2}).json()
    rest = client.get(f"{base}/turns", params={"offset": 2, "limit": 10}).json()
    assert first["page"]["total"] == 5 and [t["turn_id"] for t in first["items"]] == ["1", "2"]
    assert [t["turn_id"] for t in rest["items"]] == ["3", "4", "5"] and all(
        t["committed"] for t in rest["items"]
    )
    milestones = client.get(f"{base}/milestones").json()
    assert milestones["page"]["total"] == len(milestones["items"])
    assert all(
        m["quote"] and m["quote"] in " ".join(LINES[int(m["turn_id"]) - 1].split())
        for m in milestones["items"]
    )
    found = client.get(f"{base}/search", params={"q": "adoption agency interview", "k": 3}).json()
    # Turn 5 holds these words (a turn's lexical document also holds its neighbour, so 4 may rank too).
    assert "5" in [t["turn_id"] for t in found["turns"][:2]]
    assert [
        e["name"] for e in client.get(f"{base}/search", params={"q": "Melanie"}).json()["entities"]
    ] == ["Melanie"]
    bad_limit = client.get(f"{base}/turns", params={"limit": 0})
    assert bad_limit.status_code == 400 and bad_limit.json()["code"] == "INVALID_REQUEST"
    assert "limit" in bad_limit.json()["reason"] and "\n" not in bad_limit.json()["reason"]
    spec = client.get("/openapi.json").json()
    assert CONVERSATIONS_PATH in spec["paths"]
    for suffix in ("entities", "relations", "milestones", "turns", "search"):
        assert f"{CONVERSATIONS_PATH}/{{conversation_id}}/{suffix}" in spec["paths"]
    for path in (MEMORY_QUERY_PATH, REPLACE_PATH, REWIND_PATH, FORGET_PATH):
        assert path in spec["paths"]
    assert {"MemoryQueryRequest", "RewindRequest", "RelationPage"} <= set(
        spec["components"]["schemas"]
    )


# --- 2/4. security ----------------------------------------------------------------------------


def test_cors_preflight_from_allowed_origin_passes_and_from_another_fails(
    service: DialogueService,
) -> None:
    app = create_app(service, SidecarSecurity(TOKEN, [ALLOWED]))
    with TestClient(app) as secured:
        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        ok = secured.options(MEMORY_QUERY_PATH, headers={"Origin": ALLOWED, **preflight})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ALLOWED
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        other = secured.options(
            MEMORY_QUERY_PATH, headers={"Origin": "http://evil.example", **preflight}
        )
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_bearer_token_required_when_configured(service: DialogueService) -> None:
    with TestClient(create_app(service, SidecarSecurity(TOKEN, [ALLOWED]))) as secured:
        assert secured.get(HEALTH_PATH).status_code == 401
        wrong = secured.get(HEALTH_PATH, headers={"Authorization": "Bearer not-the-token-at-all"})
        assert wrong.status_code == 401 and wrong.json()["code"] == "UNAUTHORIZED"
        body = {"conversation_id": _conv(), "messages": [{"role": "user", "content": "hi"}]}
        assert secured.post(MEMORY_QUERY_PATH, json=body).status_code == 401
        assert (
            secured.get(HEALTH_PATH, headers={"Authorization": f"Bearer {TOKEN}"}).status_code
            == 200
        )
        # A browser can read the 401 (CORS headers on it), so the extension can say why.
        denied = secured.get(HEALTH_PATH, headers={"Origin": ALLOWED})
        assert (
            denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ALLOWED
        )
    # Without a configured token (loopback), no header is needed.
    with TestClient(create_app(service)) as open_client:
        assert open_client.get(HEALTH_PATH).status_code == 200


def test_binding_all_interfaces_without_a_token_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("SKALD_SIDECAR_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exited:
        run_main(main, "dialogue", ["serve", "--host", "0.0.0.0", "--project-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and "0.0.0.0 without a bearer token" in err
    assert not (tmp_path / ".saga").exists()  # refused before anything started
    short = tmp_path / "token"
    short.write_text("short")
    with pytest.raises(SystemExit):
        run_main(
            main,
            "dialogue",
            [
                "serve",
                "--host",
                "0.0.0.0",
                "--token-file",
                str(short),
                "--project-dir",
                str(tmp_path),
            ],
        )
    assert "shorter than 16" in capsys.readouterr().err


def test_a_port_in_use_refuses_to_start_in_one_line_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exited:
            run_main(
                main, "dialogue", ["serve", "--port", str(port), "--project-dir", str(tmp_path)]
            )
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err, err
    assert "--port" in err and not (tmp_path / ".saga").exists()
    # The look-alike: a free port is bound (and IPv6 loopback as a URL writes it).
    for host in ("127.0.0.1", "[::1]"):
        listening_socket(host, 0).close()


def test_loopback_detection() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "sidecar.example"))


def test_request_db_credentials_are_refused_and_never_logged(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "hunter2-do-not-log"
    body = {**_turn(_conv(), 1, LINES[0]), "config": {"db": {"password": secret}}}
    with caplog.at_level("DEBUG"):
        response = client.post(COMMIT_PATH, json=body)
        query = client.post(
            MEMORY_QUERY_PATH,
            json={
                "conversation_id": "c",
                "messages": body["messages"],
                "config": {"db": {"password": secret}},
            },
        )
    # Valid requests this server's configuration refuses: 403, not 400.
    assert (
        response.status_code == 403 and "config.db.password is refused" in response.json()["reason"]
    )
    assert query.status_code == 403 and "config.db.password is refused" in query.json()["reason"]
    assert response.json()["error_kind"] == query.json()["error_kind"] == "forbidden"
    assert secret not in response.text + query.text + caplog.text


# --- 4. scheduling ----------------------------------------------------------------------------


def test_overrides_that_cannot_apply_are_refused(client: TestClient) -> None:
    for models, fragment in (
        ({"retriever": "m"}, "config.models.retriever"),
        ({"injector": "m"}, "config.models.injector"),
        ({"actor": "m"}, "config.models.actor"),
    ):
        body = {**_turn(_conv(), 1, LINES[0]), "config": {"models": models}}
        response = client.post(COMMIT_PATH, json=body)
        assert response.status_code == 400 and fragment in response.json()["reason"], models
        assert "cannot apply" in response.json()["reason"]
        query = client.post(
            MEMORY_QUERY_PATH,
            json={
                "conversation_id": "c",
                "messages": body["messages"],
                "config": {"models": models},
            },
        )
        assert query.status_code == 400
    # The look-alikes that do apply: an extractor override, an actor override when it generates.
    ok = client.post(
        COMMIT_PATH, json={**_turn(_conv(), 1, LINES[0]), "config": {"models": {"extractor": "m2"}}}
    )
    assert ok.status_code == 200 and ok.json()["committed"]
    generating = {
        **_turn(_conv(), 1, LINES[0]),
        "config": {"models": {"actor": "m3"}, "actor": {"mode": "generate", "speaker": "Melanie"}},
    }
    assert client.post(COMMIT_PATH, json=generating).status_code == 200


def test_judge_and_historian_run_at_the_same_time(
    client: TestClient, scripted: ScriptedLLM
) -> None:
    historian_started = threading.Event()
    seen: list[bool] = []
    script = DialogueScript(SPEAKERS)

    def judge(request: Any) -> Any:
        # Sequential slots would leave the historian unstarted: this wait would run out.
        seen.append(historian_started.wait(60))
        return script.judge(request)

    def historian(request: Any) -> Any:
        historian_started.set()
        return script.historian(request)

    scripted.on(schema="JudgeVerdict", times=1, respond=judge)
    scripted.on(schema="HistorianReport", times=1, respond=historian)
    result = client.post(COMMIT_PATH, json=_turn(_conv(), 1, LINES[0])).json()
    assert result["committed"] and seen == [True]


@pytest.mark.parametrize("limit", ["deadline", "slot"])
def test_a_running_slot_is_cut_by_the_deadline_or_its_timeout(
    settings: Settings, scripted: ScriptedLLM, limit: str
) -> None:
    release = threading.Event()
    script = DialogueScript(SPEAKERS)

    def stuck(request: Any) -> Any:
        release.wait(120)
        return script.historian(request)

    if limit == "deadline":
        # Room for the slots before the stuck one on a loaded machine (a 1 s deadline sometimes
        # ran out in the extractor there); the historian is held for 120 s.
        svc = DialogueService(settings, options=SidecarOptions(turn_timeout_s=10.0))
        fragment = "deadline while the historian slot was running"
    else:
        svc = DialogueService(settings.model_copy(update={"slot_timeouts_s": {"historian": 1.0}}))
        fragment = "the historian slot's 1s timeout"
    conv = _conv()
    # The rule matches this variant's turn only: a call the other variant abandoned may still
    # reach the server late (a busy machine), and must not take this rule's one answer.
    marker = f"(variant {limit})"
    scripted.on(schema="HistorianReport", times=1, contains=marker, respond=stuck)
    try:
        result = svc.commit(_turn(conv, 1, f"{LINES[0]} {marker}"))
        still_running = not release.is_set()
    finally:
        release.set()
    try:
        assert still_running  # the turn answered while the slot's call was still held
        assert result.state == "ROLLED_BACK" and result.timed_out and result.retryable
        assert fragment in (result.reason or "")
        assert DialogueRepository(svc.store).get_turn(f"{conv}:1") is None
        assert svc.rolled_back_count == 1
    finally:
        svc.close()


def test_slot_timeouts_setting_is_checked() -> None:
    from core.errors import SkaldError

    with pytest.raises((ValueError, SkaldError)):
        load_settings(None, slot_timeouts_s={"narrator": 3})
    with pytest.raises((ValueError, SkaldError)):
        load_settings(None, slot_timeouts_s={"judge": 0})
    assert load_settings(None, slot_timeouts_s={"judge": 2.5}).slot_timeouts_s == {"judge": 2.5}


# --- 6. long-run bounds -----------------------------------------------------------------------


def test_call_records_are_bounded_and_flushed_to_parquet(
    settings: Settings, tmp_path: Path
) -> None:
    import polars as pl

    with LLMGateway(settings, max_records=100, flush_dir=tmp_path) as gateway:
        for i in range(250):
            gateway.embed([f"text {i}"], purpose=f"dialogue.commit|tag{i}")
        kept = gateway.records
        assert len(kept) <= 100 and gateway.flushed_records == 250 - len(kept)
        # The newest are kept, and a turn still finds its own records by tag.
        assert kept[-1].purpose.endswith("|tag249")
        assert len(gateway.take_records("tag249")) == 1 and gateway.take_records("tag249") == []
        flushed = pl.concat(
            [pl.read_parquet(p) for p in sorted(tmp_path.glob("llm-calls-*.parquet"))]
        )
        assert flushed.height == 250 - len(kept)
        assert flushed["purpose"].to_list()[0] == "dialogue.commit|tag0"
    # Closed (a server that stops), the gateway writes the ones it kept as well: every call of
    # the run is on disk, once, in order.
    files = sorted(tmp_path.glob("llm-calls-*.parquet"))
    everything = pl.concat([pl.read_parquet(p) for p in files])
    assert everything["purpose"].to_list() == [f"dialogue.commit|tag{i}" for i in range(250)]
    # The look-alike: without a bound (batch runs) every record stays.
    with LLMGateway(settings) as unbounded:
        for i in range(150):
            unbounded.embed([f"text {i}"], purpose="x")
        assert len(unbounded.records) == 150


def test_call_records_reach_disk_soon_after_their_calls_without_waiting_for_close(
    settings: Settings, tmp_path: Path
) -> None:
    import polars as pl

    soon, late = tmp_path / "soon", tmp_path / "late"

    def flushed(folder: Path) -> list[str]:
        files = sorted(folder.glob("llm-calls-*.parquet"))
        return pl.concat([pl.read_parquet(p) for p in files])["purpose"].to_list() if files else []

    # A sidecar killed with kill -9 never closes its gateway: its records must be on disk by
    # then. With a flush delay they are, a moment after the calls, with nobody closing anything.
    with (
        LLMGateway(settings, max_records=20_000, flush_dir=soon, flush_after_s=0.05) as timely,
        LLMGateway(settings, max_records=20_000, flush_dir=late) as closing,
    ):
        for i in range(3):
            timely.embed([f"text {i}"], purpose=f"dialogue.commit|tag{i}")
            closing.embed([f"text {i}"], purpose=f"dialogue.commit|tag{i}")
        deadline = time.monotonic() + 60  # a bound on a loaded machine, not a margin
        while len(flushed(soon)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flushed(soon) == [f"dialogue.commit|tag{i}" for i in range(3)]
        assert timely.records == [] and len(timely.take_records("tag2")) == 1
        # The look-alike: without the delay, the records wait in memory for the bound or close.
        assert flushed(late) == [] and len(closing.records) == 3
        timely.embed(["text 3"], purpose="dialogue.commit|tag3")
    # Closed: what was left goes too, and nothing is written twice.
    assert flushed(soon) == [f"dialogue.commit|tag{i}" for i in range(4)]
    assert flushed(late) == [f"dialogue.commit|tag{i}" for i in range(3)]


def test_conversation_locks_are_evicted_and_rolled_back_traces_persisted(
    settings: Settings, scripted: ScriptedLLM
) -> None:
    svc = DialogueService(settings, options=SidecarOptions(max_conversation_locks=16))
    try:
        for _ in range(40):
            assert svc.rewind(_conv(), "1").ok
        assert svc.conversation_lock_count() == 16
        scripted.on(
            schema="TurnExtraction",
            times=1,
            respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
        )
        conv = _conv()
        blocked = svc.commit(_turn(conv, 1, LINES[0]))
        assert blocked.state == "ROLLED_BACK" and svc.rolled_back_count == 1
        files = list((settings.saga_dir / "runs" / "sidecar").glob("rolled-back-*.jsonl"))
        rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
        mine = [r for r in rows if r["key"] == f"{conv}:1"]
        assert len(mine) == 1 and mine[0]["error_kind"] == "gate" and mine[0]["trace"]["states"]
    finally:
        svc.close()


def test_deep_health_asks_the_llm(client: TestClient, settings: Settings) -> None:
    from core.graph_server import free_port

    healthy = client.get(HEALTH_PATH, params={"deep": "true"})
    assert healthy.status_code == 200 and healthy.json()["llm"] and healthy.json()["status"] == "ok"
    # The look-alike: the graph answers but nothing listens at the LLM URL.
    dead = settings.model_copy(update={"openai_base_url": f"http://127.0.0.1:{free_port()}/v1"})
    svc = DialogueService(dead)
    try:
        with TestClient(create_app(svc)) as broken:
            assert broken.get(HEALTH_PATH).status_code == 200  # liveness alone does not ask the LLM
            degraded = broken.get(HEALTH_PATH, params={"deep": "true"})
            assert degraded.status_code == 503 and degraded.json()["status"] == "degraded"
            assert "unreachable" in degraded.json()["llm_error"]
    finally:
        svc.close()


def test_cli_rewind_forget_rename_and_copy(
    client: TestClient,
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conv = _conv()
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    for name, value in {
        **graph_vars(graph_settings),
        "OPENAI_BASE_URL": scripted.base_url,
    }.items():
        monkeypatch.setenv(name, value)

    def run(*args: str) -> int:
        with pytest.raises(SystemExit) as exited:
            run_main(main, "dialogue", list(args))
        return int(exited.value.code or 0)

    assert (
        run(
            "rewind",
            "--conversation-id",
            conv,
            "--before-turn",
            "2",
            "--project-dir",
            str(tmp_path),
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["found"] and out["removed_turns"] == ["2"]
    assert [
        t["turn_id"] for t in client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()["items"]
    ] == ["1"]
    assert (
        run(
            "rewind", "--conversation-id", " ", "--before-turn", "2", "--project-dir", str(tmp_path)
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "conversation_id" in err
    assert run("rewind", "--help") == 0 and "--before-turn" in capsys.readouterr().out
    # conversations: one JSON line each; forget: the whole conversation, then nothing left to
    # forget (both exit 0).
    assert run("conversations", "--project-dir", str(tmp_path)) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"conversation_id": conv, "remembered_turns": 1} in lines
    # rename: the conversation moves; the old id then has nothing to move (both exit 0), and a
    # rename into a conversation that holds memory is a conflict (exit 2, one line).
    renamed = _conv()
    args = ("--project-dir", str(tmp_path))
    assert run("rename", "--conversation-id", conv, "--new-conversation-id", renamed, *args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["found"] and out["moved"]["memory"] == 1
    assert client.get(f"{CONVERSATIONS_PATH}/{renamed}/turns").json()["page"]["total"] == 1
    assert run("rename", "--conversation-id", conv, "--new-conversation-id", renamed, *args) == 0
    again = capsys.readouterr()
    assert not json.loads(again.out)["found"]
    assert again.err == (
        f"dialogue: note: memory holds nothing of conversation {conv!r}; nothing changed "
        "(`python -m flows.dialogue conversations` lists what it holds)\n"
    )
    taken = _conv()
    assert client.post(COMMIT_PATH, json=_turn(taken, 1, LINES[2])).json()["committed"]
    assert run("rename", "--conversation-id", renamed, "--new-conversation-id", taken, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds memory" in err
    assert run("rename", "--conversation-id", taken, "--new-conversation-id", conv, *args) == 0
    capsys.readouterr()
    # copy: the conversation is copied and stays (exit 0, found).
    copied = _conv()
    assert run("copy", "--conversation-id", conv, "--new-conversation-id", copied, *args) == 0
    done = capsys.readouterr()
    out = json.loads(done.out)
    assert out["found"] and out["copied"]["memory"] == 1 and "note" not in done.err
    assert run("copy", "--conversation-id", conv, "--new-conversation-id", conv, *args) == 0
    assert "is the conversation's id already" in capsys.readouterr().err
    for cid in (conv, copied):
        assert client.get(f"{CONVERSATIONS_PATH}/{cid}/turns").json()["page"]["total"] == 1
    assert run("forget", "--conversation-id", conv, "--project-dir", str(tmp_path)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["found"] and out["removed"]["turns"] == 1 and out["removed"]["memory"] == 1
    assert client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()["page"]["total"] == 0
    assert run("forget", "--conversation-id", conv, "--project-dir", str(tmp_path)) == 0
    assert not json.loads(capsys.readouterr().out)["found"]
    assert run("conversations", "--project-dir", str(tmp_path)) == 0
    assert conv not in capsys.readouterr().out


def test_replace_with_the_same_text_of_a_blocked_turn_keeps_later_turns(
    client: TestClient, scripted: ScriptedLLM
) -> None:
    conv = _conv()
    assert client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0])).json()["committed"]
    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
    )
    assert client.post(COMMIT_PATH, json=_turn(conv, 2, LINES[1])).json()["state"] == "ROLLED_BACK"
    assert client.post(COMMIT_PATH, json=_turn(conv, 3, LINES[2])).json()["committed"]
    # Sent again unchanged through /turn/replace: retried in place (and committed this time).
    again = client.post(REPLACE_PATH, json=_turn(conv, 2, LINES[1])).json()
    assert again["committed"]
    turns = client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()["items"]
    assert [(t["turn_id"], t["committed"]) for t in turns] == [
        ("1", True),
        ("2", True),
        ("3", True),
    ]
    # The look-alike: changed text does rewind turn 2 and the later turn 3.
    changed = client.post(REPLACE_PATH, json=_turn(conv, 2, LINES[4])).json()
    assert changed["committed"]
    assert [
        t["turn_id"] for t in client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()["items"]
    ] == ["1", "2"]


def test_allowed_request_db_password_is_used_but_never_logged(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from core.graph_server import free_port

    secret = "s3cret-request-password"
    svc = DialogueService(
        settings.model_copy(update={"graph_connect_attempts": 1}),
        options=SidecarOptions(allow_request_db=True),
    )
    body = {
        **_turn(_conv(), 1, LINES[0]),
        "config": {
            "db": {
                "uri": f"bolt://127.0.0.1:{free_port()}",
                "username": "neo4j",
                "password": secret,
            }
        },
    }
    try:
        with caplog.at_level("DEBUG"):
            result = svc.commit(body)
        # Honoured (it tried that graph, which is down): retryable, and the secret nowhere.
        assert result.state == "ROLLED_BACK" and result.retryable and result.error_kind == "graph"
        assert secret not in result.model_dump_json() and secret not in caplog.text
        from core.graph_server import GraphEndpoint

        assert secret not in repr(
            GraphEndpoint("bolt://127.0.0.1:1", "neo4j", secret, "neo4j", embedded=False)
        )
    finally:
        svc.close()


# --- every answer documented: ids with "/", bugs, an unreachable graph (issue 24) ----------------


def test_a_conversation_id_holding_a_slash_is_read_back_whole(client: TestClient) -> None:
    conv = f"regression-{uuid.uuid4().hex[:6]}/locomo-26"
    assert client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0])).json()["committed"]
    turns = client.get(f"{CONVERSATIONS_PATH}/{conv.replace('/', '%2F')}/turns")
    assert turns.status_code == 200 and turns.json()["conversation_id"] == conv
    assert [t["turn_id"] for t in turns.json()["items"]] == ["1"]
    # The look-alike: the part after the slash alone is another (empty) conversation.
    other = client.get(f"{CONVERSATIONS_PATH}/locomo-26/turns").json()
    assert other["items"] == [] and other["conversation_id"] == "locomo-26"
    bad = client.get(f"{CONVERSATIONS_PATH}/%01/turns")
    assert bad.status_code == 400 and "conversation_id" in bad.json()["reason"]
    # A line break in the id is refused the same way on every read-back route (it matched no
    # route once, and answered an undocumented 404).
    for part in ("entities", "relations", "milestones", "turns"):
        broken = client.get(f"{CONVERSATIONS_PATH}/a%0Ab/{part}")
        assert broken.status_code == 400 and "conversation_id" in broken.json()["reason"], (
            part,
            broken.text,
        )
    # A query parameter given twice is refused, not read as its last value; look-alike: once each.
    twice = client.get(f"{CONVERSATIONS_PATH}/locomo-26/relations?offset=M&offset=0&limit=1")
    assert (
        twice.status_code == 400
        and twice.json()["reason"] == "invalid query parameter offset: given more than once"
    )
    assert (
        client.get(f"{CONVERSATIONS_PATH}/locomo-26/relations?offset=0&limit=1").status_code == 200
    )


def test_a_bug_is_a_documented_500_and_nothing_is_written(
    client: TestClient, service: DialogueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.dialogue.turn

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a planted bug")

    conv = _conv()
    monkeypatch.setattr(tasks.dialogue.turn, "commit_gate", broken)
    response = client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0]))
    assert response.status_code == 500
    data = response.json()
    assert (data["state"], data["error_kind"], data["retryable"]) == (
        "ROLLED_BACK",
        "internal",
        False,
    )
    assert "a planted bug" in data["reason"] and "\n" not in data["reason"]
    assert DialogueRepository(service.store).get_turn(f"{conv}:1") is None
    monkeypatch.undo()
    # The conversation's lock was released: the same turn commits now.
    assert client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0])).json()["committed"]
    # A read that raises answers 500 with an ApiError body.
    monkeypatch.setattr(DialogueRepository, "memory_page", broken)
    with TestClient(create_app(service), raise_server_exceptions=False) as tolerant:
        failed = tolerant.get(f"{CONVERSATIONS_PATH}/{conv}/turns")
    assert failed.status_code == 500 and failed.json()["code"] == "INTERNAL"
    assert "a planted bug" in failed.json()["reason"]


def test_an_unreachable_graph_gets_each_operations_documented_503(settings: Settings) -> None:
    from core.graph_server import free_port

    dead = settings.model_copy(
        update={"neo4j_uri": f"bolt://127.0.0.1:{free_port()}", "graph_connect_attempts": 1}
    )
    svc = DialogueService(dead)
    try:
        with TestClient(create_app(svc)) as down:
            spec = down.get("/openapi.json").json()
            calls = [
                ("post", COMMIT_PATH, {"json": _turn(_conv(), 1, LINES[0])}),
                ("post", REWIND_PATH, {"json": {"conversation_id": _conv(), "before_turn": 1}}),
                (
                    "post",
                    MEMORY_QUERY_PATH,
                    {"json": {"conversation_id": _conv(), "messages": [_msg("A", "hi", 1)]}},
                ),
                ("get", f"{CONVERSATIONS_PATH}/{_conv()}/turns", {}),
                ("get", HEALTH_PATH, {}),
            ]
            for method, path, kwargs in calls:
                response = getattr(down, method)(path, **kwargs)
                assert response.status_code == 503, (path, response.text)
                assert response.headers["retry-after"] == "1", path
                assert "unreachable" in response.json()["reason"], path
                template = (
                    path
                    if path in spec["paths"]
                    else f"{CONVERSATIONS_PATH}/{{conversation_id}}/turns"
                )
                assert "503" in spec["paths"][template][method]["responses"], path
    finally:
        svc.close()


def test_the_service_answers_bad_rewind_ids_without_raising(settings: Settings) -> None:
    svc = DialogueService(settings)
    try:
        for before in ("\x01", "  ", "x" * 101, -1):
            outcome = svc.rewind(_conv(), before)  # type: ignore[arg-type]
            assert (
                not outcome.ok
                and outcome.code == "INVALID_REQUEST"
                and "before_turn" in (outcome.reason or "")
            )
        assert svc.rewind(" ", "1").code == "INVALID_REQUEST"
    finally:
        svc.close()


def test_a_turn_waits_for_a_memory_query_in_flight_and_a_query_never_waits_for_another(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A query a person waits for is in flight (held open here): a commit's first step waits for
    # it, and goes on once it is answered. Another memory query meanwhile does not wait: its
    # embedding's HTTP answer (the scripted endpoint here) is its own work. Bounds of 60 s that
    # no passing run comes near: no timing margin.
    monkeypatch.setattr(QUERIES, "max_wait_s", 60.0)
    conv = _conv()
    assert client.post(COMMIT_PATH, json=_turn(conv, 1, LINES[0])).json()["committed"]
    before = client.get(HEALTH_PATH).json()["yielded_to_queries"]
    events: list[str] = []
    done: list[dict[str, Any]] = []

    def commit() -> None:
        done.append(client.post(COMMIT_PATH, json=_turn(conv, 2, LINES[1])).json())
        events.append("committed")

    with QUERIES.serving():
        query = {"conversation_id": conv, "messages": [_msg("Caroline", "Any news?", 3)]}
        answer = client.post(MEMORY_QUERY_PATH, json=query)
        assert answer.status_code == 200 and answer.json()["stored_turns"] == 1
        assert client.get(HEALTH_PATH).json()["yielded_to_queries"] == before
        writer = threading.Thread(target=commit, daemon=True)
        writer.start()
        deadline = time.monotonic() + 60
        while QUERIES.waiting == 0 and time.monotonic() < deadline and writer.is_alive():
            time.sleep(0.005)
        assert QUERIES.waiting >= 1 and not done, "the turn did not wait for the query"
        events.append("query answered")
    writer.join(60)
    assert events == ["query answered", "committed"] and done[0]["committed"]
    after = client.get(HEALTH_PATH).json()["yielded_to_queries"]
    assert after["yields"] >= before["yields"] + 1 and after["timed_out"] == before["timed_out"]


def test_a_turns_write_and_slots_run_below_the_memory_querys_priority_and_health_counts_serialised_writes(
    client: TestClient, service: DialogueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both the memory query and the turn's retrieval slot embed the message: note each
    # caller thread's nice value (the request threads are the server's; slots are niced),
    # and the thread each commit runs on (the turn-write pool, niced less than its slots).
    seen: list[tuple[str, int]] = []
    turn_threads: list[tuple[str, int]] = []
    embed, commit = service.gateway.embed, service.commit

    def priority() -> tuple[str, int]:
        return (
            threading.current_thread().name,
            os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
        )

    def embed_noting_priority(*args: Any, **kwargs: Any) -> Any:
        seen.append(priority())
        return embed(*args, **kwargs)

    def commit_noting_priority(*args: Any, **kwargs: Any) -> Any:
        turn_threads.append(priority())
        return commit(*args, **kwargs)

    monkeypatch.setattr(service.gateway, "embed", embed_noting_priority)
    monkeypatch.setattr(service, "commit", commit_noting_priority)
    before = client.get(HEALTH_PATH).json()["graph_write_lock"]
    conv = _conv()
    for n in (1, 2):
        assert client.post(COMMIT_PATH, json=_turn(conv, n, LINES[n - 1])).json()["committed"]
    committed, seen[:] = list(seen), []
    query = {
        "conversation_id": conv,
        "messages": [_msg("Caroline", "How was the support group?", 3)],
    }
    assert client.post(MEMORY_QUERY_PATH, json=query).status_code == 200
    assert seen and not any(name.startswith("dialogue-slot") for name, _ in seen)
    query_nice = seen[0][1]
    slots = [nice for name, nice in committed if name.startswith("dialogue-slot")]
    assert service.options.background_nice > 0
    assert slots and set(slots) == {min(19, query_nice + service.options.background_nice)}
    assert 0 < service.options.turn_nice < service.options.background_nice
    assert len(turn_threads) == 2 and {name.split("_")[0] for name, _ in turn_threads} == {
        "dialogue-turn"
    }
    assert {nice for _, nice in turn_threads} == {min(19, query_nice + service.options.turn_nice)}
    after = client.get(HEALTH_PATH).json()["graph_write_lock"]
    if service.store.server.is_arcadedb:  # serialised there only (SidecarOptions.serialize_writes)
        # At least the lease claim and the commit transaction, each held for some time.
        assert after["acquired"] >= before["acquired"] + 2 and after["held_s"] > before["held_s"]
    else:
        assert after == before
