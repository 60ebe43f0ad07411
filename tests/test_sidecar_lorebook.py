"""A conversation's memory as a SillyTavern World Info book (issue 32): GET
.../conversation/{id}/lorebook and `python -m flows.dialogue lorebook`, over the real graph
and the scripted LLM (the sidecar fixtures of tests/conftest.py), plus the book's rules on
hand-made lore (aliases, which entity a fact goes to, a relation's latest state)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api import COMMIT_PATH, CONVERSATIONS_PATH, REPLACE_PATH
from api.paths import CONVERSATION_PATH
from core.cli import run_main
from core.settings import Settings
from flows.dialogue import main
from kg.dialogue import ConversationLore, DialogueMilestone, LoreEntity, LoreRelation, StatedFacts
from tasks.dialogue.lorebook import WorldInfoEntry, build_lorebook

SPEAKERS = ["Caroline", "Melanie"]
#: The fields of SillyTavern 1.12's entry template (world-info.js newWorldInfoEntryDefinition),
#: plus uid and displayIndex: the layout its World Info import and editor read.
ST_ENTRY_FIELDS = {
    "uid", "key", "keysecondary", "comment", "content", "constant", "vectorized", "selective", "selectiveLogic",
    "addMemo", "order", "position", "disable", "excludeRecursion", "preventRecursion", "delayUntilRecursion",
    "probability", "useProbability", "depth", "group", "groupOverride", "groupWeight", "scanDepth",
    "caseSensitive", "matchWholeWords", "useGroupScoring", "automationId", "role", "sticky", "cooldown", "delay",
    "displayIndex",
}


@pytest.fixture(scope="module")
def sidecar_speakers() -> list[str]:
    return SPEAKERS


def _conv() -> str:
    return f"test-lorebook-{uuid.uuid4().hex[:8]}"


def _turn(conv: str, n: int, speaker: str, content: str) -> dict[str, Any]:
    other = next(s for s in SPEAKERS if s != speaker)
    return {"conversation_id": conv, "turn_id": n,
            "messages": [{"role": "user", "name": speaker, "content": content, "time": f"1:{n:02d} pm on 8 May, 2023"}],
            "window": [{"role": "user", "name": other, "content": f"Hi {speaker}, how are you?"}]}


def _commit(client: TestClient, conv: str, n: int, speaker: str, content: str) -> None:
    answer = client.post(COMMIT_PATH, json=_turn(conv, n, speaker, content)).json()
    assert answer["committed"], answer


def _book(client: TestClient, conv: str) -> dict[str, Any]:
    response = client.get(f"{CONVERSATION_PATH}/{conv}/lorebook")
    assert response.status_code == 200, response.text
    return response.json()


def _entry(book: dict[str, Any], comment: str) -> dict[str, Any]:
    found = [e for e in book["entries"].values() if e["comment"] == comment]
    assert len(found) == 1, [e["comment"] for e in book["entries"].values()]
    return found[0]


def test_lorebook_has_sillytaverns_layout_current_facts_and_latest_relation_states(client: TestClient) -> None:
    conv = _conv()
    _commit(client, conv, 1, "Caroline", "My garden is full of tomatoes this year.")
    _commit(client, conv, 2, "Melanie", "I painted the fence blue yesterday.")
    _commit(client, conv, 3, "Caroline", "I trust you with my spare key now.")
    _commit(client, conv, 4, "Caroline", "I finished reading a book about whales.")
    relations = client.get(f"{CONVERSATIONS_PATH}/{conv}/relations").json()["items"]
    print([(r["source_name"], r["type"], r["target_name"], r["status"], r["since_turn"], r["ended_turn"]) for r in relations])
    book = _book(client, conv)
    print(json.dumps(book, indent=1)[:4000])
