"""`python -m flows.dialogue query`: what memory recalls for a message, from the terminal, the
same answer POST .../memory/query gives (over the real graph and the scripted LLM: the sidecar
fixtures of tests/conftest.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api import COMMIT_PATH, CONVERSATIONS_PATH, MEMORY_QUERY_PATH
from core.cli import run_main
from core.settings import Settings
from flows.dialogue import main
from tests.support.cli import graph_vars
from tests.support.dialogue_script import greeted_turn
from tests.support.scripted_llm import ScriptedLLM

TIME = "10:00 am on 9 May, 2023"
QUESTION = "What colour did Melanie paint the fence?"


def _conv() -> str:
    return f"test-query-cli-{uuid.uuid4().hex[:8]}"


def _commit(client: TestClient, conv: str, n: int, speaker: str, content: str) -> None:
    other = "Melanie" if speaker == "Caroline" else "Caroline"
    turn = greeted_turn(conv, n, speaker, content, other)
    answer = client.post(COMMIT_PATH, json=turn).json()
    assert answer["committed"], answer


def _api_answer(client: TestClient, conv: str) -> dict[str, Any]:
    request = {
        "conversation_id": conv,
        "messages": [{"role": "user", "name": "Caroline", "content": QUESTION, "time": TIME}],
        "config": {"recall_k": 2},
    }
    answer: dict[str, Any] = client.post(MEMORY_QUERY_PATH, json=request).json()
    assert answer["ok"], answer
    return answer


def test_cli_query_prints_the_packet_the_api_injects_and_refuses_an_unknown_conversation(
    client: TestClient,
    settings: Settings,
    graph_settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conv = _conv()
    _commit(client, conv, 1, "Caroline", "My garden is full of tomatoes this year.")
    _commit(client, conv, 2, "Melanie", "I painted the fence blue yesterday.")
    _commit(client, conv, 3, "Caroline", "The bakery on the corner closed last month.")
    # The service's graph and endpoints: its turns' vectors are the scripted server's.
    for name, value in graph_vars(graph_settings).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OPENAI_BASE_URL", settings.openai_base_url or "")
    monkeypatch.setenv("SKALD_EMBEDDING_BASE_URL", settings.embedding_base_url or "")

    def run(*args: str) -> int:
        with pytest.raises(SystemExit) as exited:
            run_main(main, "dialogue", ["query", *args, "--project-dir", str(tmp_path)])
        return int(exited.value.code or 0)

    asked = ("--conversation-id", conv, "--speaker", "Caroline", "--time", TIME, "--recall-k", "2")
    expected = _api_answer(client, conv)
    turns_before = client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json()
    assert turns_before["page"]["total"] == 3
    capsys.readouterr()
    assert run(*asked, QUESTION) == 0
    printed = capsys.readouterr().out
    assert printed == expected["injection_packet"]["text"] + "\n"
    assert "I painted the fence blue yesterday." in printed
    assert "yesterday = Sunday 7 May 2023" in printed  # resolved against when it was said
    assert "In the message answered now" not in printed  # the question names no day
    # A question that does name one through its own day has that day spelled out first.
    assert run(*asked, "What did Melanie paint the day before yesterday?") == 0
    lines = capsys.readouterr().out.splitlines()
    passages = lines.index("## Related earlier passages")
    assert lines[passages + 1] == (
        "- In the message answered now: the day before yesterday = Sunday 7 May 2023"
    )

    assert run(*asked, "--json", QUESTION) == 0
    whole = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in whole.items() if k != "elapsed_ms"} == {
        k: v for k, v in expected.items() if k != "elapsed_ms"
    }
    assert [t["turn_id"] for t in whole["recalled"]] == expected["injection_packet"][
        "recalled_turns"
    ]

    # Nothing written: the conversation's turns are as they were.
    assert client.get(f"{CONVERSATIONS_PATH}/{conv}/turns").json() == turns_before

    # The look-alike: an id memory does not hold gets one line and a non-zero exit, not an
    # empty packet that would read as a memory recalling nothing.
    assert run("--conversation-id", _conv(), QUESTION) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no remembered turns" in err

    # A bad option value is the request's error, said in one line.
    assert run("--conversation-id", conv, "--recall-k", "99", QUESTION) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "recall_k" in err
    # So is a --time that names no date ("yesterday" would be left unresolved without a word).
    assert run("--conversation-id", conv, "--time", "next Tuesday", QUESTION) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--time 'next Tuesday' names no date" in err

    # --window N: asked as a front end showing the last N remembered messages. "Thanks!" names
    # no topic: it asks about the last message shown (the bakery's), as the API does given that
    # window, and the bakery turn itself goes last; with no window it asks nothing.
    bakery = {
        "role": "user",
        "name": "Caroline",
        "content": "The bakery on the corner closed last month.",
    }
    thanks = {"role": "user", "name": "Melanie", "content": "Thanks!"}
    api = client.post(
        MEMORY_QUERY_PATH,
        json={
            "conversation_id": conv,
            "messages": [thanks],
            "window": [bakery],
            "config": {"recall_k": 2},
        },
    ).json()
    assert api["ok"] and api["recalled"], api
    windowed = ("--conversation-id", conv, "--speaker", "Melanie", "--recall-k", "2")
    assert run(*windowed, "--window", "1", "--json", "Thanks!") == 0
    cli = json.loads(capsys.readouterr().out)
    assert [t["turn_id"] for t in cli["recalled"]] == [t["turn_id"] for t in api["recalled"]]
    assert "3" not in [t["turn_id"] for t in cli["recalled"]]  # two others fill k
    assert run(*windowed, "--json", "Thanks!") == 0
    assert json.loads(capsys.readouterr().out)["recalled"] == []

    # A project directory that does not exist is a mistyped path: one line, and no graph is
    # made there (the same for every command that reads what a project holds).
    missing = tmp_path / "no-such-project"
    for command in (["query", "--conversation-id", conv, QUESTION], ["conversations"]):
        with pytest.raises(SystemExit) as exited:
            run_main(main, "dialogue", [*command, "--project-dir", str(missing)])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.count("\n") == 1, err
        assert f"--project-dir {missing} is not a directory" in err and not missing.exists()


def test_a_chat_message_is_asked_by_its_topic_and_its_typos_as_the_words_they_mean(
    client: TestClient, scripted: ScriptedLLM
) -> None:
    """What memory embeds and searches for "Hey Caroline, hope you're well! Which bakrey
    closed?" is the question, spelled as the memory spells it: its pleasantries
    (core.recall.topical_text) and its typo (core.recall.HybridIndex.spelled) matched other
    turns by their words, and pulled its vector toward them."""
    conv = _conv()
    _commit(client, conv, 1, "Caroline", "Hope you're well! I'm well, thanks for asking.")
    _commit(client, conv, 2, "Caroline", "The bakery on the corner closed last month.")

    def embedded(content: str) -> list[str]:
        scripted.requests.clear()
        request = {
            "conversation_id": conv,
            "messages": [{"role": "user", "name": "Melanie", "content": content, "time": TIME}],
            "config": {"recall_k": 2},
        }
        answer = client.post(MEMORY_QUERY_PATH, json=request).json()
        assert answer["ok"] and answer["recalled"], answer
        return [
            text
            for r in scripted.requests
            if r.path.endswith("/embeddings")
            for text in ([r.body["input"]] if isinstance(r.body["input"], str) else r.body["input"])
        ]

    assert embedded("Hey Caroline, hope you're well! Which bakrey closed?") == [
        "Which bakery closed?"
    ]
    # The look-alikes: a message that is only pleasantries is asked by them; a word the memory
    # does not hold but English does is asked as it is.
    assert embedded("Hey Caroline, hope you're well!") == ["Hey, hope you're well!"]
    assert embedded("Which pastry shop closed?") == ["Which pastry shop closed?"]
