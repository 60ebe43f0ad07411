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

from api import COMMIT_PATH, CONVERSATION_PATH, REPLACE_PATH
from core.cli import run_main
from core.settings import Settings
from flows.dialogue import main
from kg.dialogue import ConversationLore, DialogueMilestone, LoreEntity, LoreRelation, StatedFacts
from tasks.dialogue.lorebook import build_lorebook
from tests.support.cli import graph_vars
from tests.support.dialogue_script import greeted_turn

SPEAKERS = ["Caroline", "Melanie"]
#: The fields of SillyTavern 1.12's entry template (world-info.js newWorldInfoEntryDefinition),
#: plus uid and displayIndex: the layout its World Info import and editor read.
ST_ENTRY_FIELDS = {
    "uid",
    "key",
    "keysecondary",
    "comment",
    "content",
    "constant",
    "vectorized",
    "selective",
    "selectiveLogic",
    "addMemo",
    "order",
    "position",
    "disable",
    "excludeRecursion",
    "preventRecursion",
    "delayUntilRecursion",
    "probability",
    "useProbability",
    "depth",
    "group",
    "groupOverride",
    "groupWeight",
    "scanDepth",
    "caseSensitive",
    "matchWholeWords",
    "useGroupScoring",
    "automationId",
    "role",
    "sticky",
    "cooldown",
    "delay",
    "displayIndex",
}


@pytest.fixture(scope="module")
def sidecar_speakers() -> list[str]:
    return SPEAKERS


def _conv() -> str:
    return f"test-lorebook-{uuid.uuid4().hex[:8]}"


def _turn(conv: str, n: int, speaker: str, content: str) -> dict[str, Any]:
    return greeted_turn(conv, n, speaker, content, next(s for s in SPEAKERS if s != speaker))


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


def test_lorebook_has_sillytaverns_layout_current_facts_and_latest_relation_states(
    client: TestClient,
) -> None:
    conv = _conv()
    _commit(
        client, conv, 1, "Caroline", "My garden is full of tomatoes this year."
    )  # TRUSTS starts
    _commit(client, conv, 2, "Melanie", "I painted the fence blue yesterday.")
    _commit(client, conv, 3, "Caroline", "I trust you with my spare key now.")  # TRUSTS ends
    _commit(client, conv, 4, "Caroline", "I finished reading a book about whales.")  # TRUSTS again
    book = _book(client, conv)

    # SillyTavern's layout: entries keyed by uid as a string, in order, every template field.
    assert list(book) == ["entries"]
    assert list(book["entries"]) == [str(uid) for uid in range(len(book["entries"]))]
    for uid, entry in book["entries"].items():
        assert (
            set(entry) == ST_ENTRY_FIELDS
            and str(entry["uid"]) == uid
            and entry["displayIndex"] == entry["uid"]
        )
    assert [e["comment"] for e in book["entries"].values()] == [
        "Caroline (Character)",
        "Melanie (Character)",
        "Caroline & Melanie",
    ]

    caroline = _entry(book, "Caroline (Character)")
    assert (
        caroline["key"] == ["Caroline"]
        and caroline["keysecondary"] == []
        and not caroline["constant"]
    )
    # Its current facts: the latest bio, and every fact its committed turns stated.
    assert "Caroline recently said: I finished reading a book about whales." in caroline["content"]
    for said in ("My garden is full of tomatoes this year.", "I trust you with my spare key now."):
        assert f"Caroline said: {said} (turn" in caroline["content"]
        # The look-alike: the superseded bio summaries are not in it (their facts still are).
        assert f"recently said: {said}" not in caroline["content"]
    assert "fence" not in caroline["content"]  # Melanie's fact, about Melanie only

    pair = _entry(book, "Caroline & Melanie")
    assert pair["key"] == ["Caroline"] and pair["keysecondary"] == ["Melanie"]
    assert pair["selective"] and pair["selectiveLogic"] == 0
    lines = pair["content"].splitlines()
    assert "- Caroline trusts Melanie: now, strength 0.60 (since turn 4)." in lines
    assert "- Caroline friend of Melanie: now, strength 0.65 (since turn 1)." in lines
    # The look-alike: TRUSTS ended at turn 3 and started again at turn 4; only its latest state shows.
    assert not [line for line in lines if "trusts" in line and "no longer" in line], lines

    # Ended for good: the latest state is the ending, and the uids of the entries stay.
    _commit(client, conv, 5, "Caroline", "Our bakery sells the best rye bread.")
    later = _book(client, conv)
    lines = _entry(later, "Caroline & Melanie")["content"].splitlines()
    assert "- Caroline trusts Melanie: no longer (ended at turn 5)." in lines
    assert not [line for line in lines if "trusts Melanie: now" in line], lines
    assert [e["comment"] for e in later["entries"].values()] == [
        e["comment"] for e in book["entries"].values()
    ]


def test_a_replaced_turns_facts_leave_the_lorebook(client: TestClient) -> None:
    conv = _conv()
    _commit(client, conv, 1, "Melanie", "The neighbours threw a loud party.")
    before = _entry(_book(client, conv), "Melanie (Character)")["content"]
    assert "Melanie said: The neighbours threw a loud party. (turn 1)" in before
    edited = _turn(conv, 1, "Melanie", "The neighbours threw a quiet party.")
    assert client.post(REPLACE_PATH, json=edited).json()["committed"]
    after = _entry(_book(client, conv), "Melanie (Character)")["content"]
    assert "Melanie said: The neighbours threw a quiet party. (turn 1)" in after
    assert "loud" not in after


def test_lorebook_of_an_unknown_conversation_is_404(client: TestClient) -> None:
    missing = client.get(f"{CONVERSATION_PATH}/{_conv()}/lorebook")
    assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"
    # The look-alike: a known conversation's book is there.
    conv = _conv()
    _commit(client, conv, 1, "Caroline", "I painted the fence blue yesterday.")
    assert client.get(f"{CONVERSATION_PATH}/{conv}/lorebook").status_code == 200
    operation = client.get("/openapi.json").json()["paths"][
        f"{CONVERSATION_PATH}/{{conversation_id}}/lorebook"
    ]["get"]
    assert {"200", "404"} <= set(operation["responses"]) and "422" not in operation["responses"]


def test_cli_lorebook_writes_the_apis_book_byte_identical_and_refuses_an_unknown_conversation(
    client: TestClient,
    graph_settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conv = _conv()
    _commit(client, conv, 1, "Caroline", "My garden is full of tomatoes this year.")
    _commit(client, conv, 2, "Melanie", "I painted the fence blue yesterday.")
    for name, value in graph_vars(graph_settings).items():
        monkeypatch.setenv(name, value)

    def run(*args: str) -> int:
        with pytest.raises(SystemExit) as exited:
            run_main(main, "dialogue", [*args, "--project-dir", str(tmp_path)])
        return int(exited.value.code or 0)

    digests = []
    for n in (1, 2):
        out = tmp_path / f"book-{n}.json"
        assert run("lorebook", "--conversation", conv, "--out", str(out)) == 0
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    assert json.loads((tmp_path / "book-1.json").read_text(encoding="utf-8")) == _book(client, conv)
    capsys.readouterr()

    assert run("lorebook", "--conversation", _conv()) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no conversation" in err


# --- the book's rules, on hand-made lore ---------------------------------------------------------


def _entity(eid: str, name: str, seq: int, aliases: tuple[str, ...] = (), **bio: Any) -> LoreEntity:
    return LoreEntity(
        entity_id=eid, name=name, kind="Character", aliases=list(aliases), first_seq=seq, **bio
    )


def _relation(
    rid: str,
    source: LoreEntity,
    target: LoreEntity,
    rel_type: str,
    status: str,
    since: int,
    updated: int,
    ended: str | None = None,
    weight: float = 0.5,
) -> LoreRelation:
    return LoreRelation(
        rel_id=rid,
        source_id=source.entity_id,
        source_name=source.name,
        target_id=target.entity_id,
        target_name=target.name,
        type=rel_type,
        weight=weight,
        status=status,
        since_turn=str(since),
        ended_turn=ended,
        since_seq=since,
        updated_seq=updated,
    )


def test_keys_are_names_and_aliases_and_each_fact_goes_to_the_entities_it_names() -> None:
    ilse = _entity(
        "e-ilse",
        "Ilse",
        2,
        ("Ilse Berg", "my sister", "ilse"),
        bio_summary="Studies marine biology.",
        bio_traits=["curious"],
    )
    tester = _entity("e-tester", "Tester", 1)
    bergen = _entity("e-bergen", "Bergen", 2)
    lore = ConversationLore(
        conversation_id="c",
        entities=[tester, ilse, bergen],
        stated=[
            StatedFacts(
                seq=1,
                turn_id="1",
                speaker="Tester",
                facts=["My sister moved to Bergen.", "I baked bread."],
            ),
            StatedFacts(seq=2, turn_id="2", speaker="Stranger", facts=["Nobody named here."]),
            StatedFacts(
                seq=3, turn_id="3", speaker="Tester", facts=["Ilsebill is another person."]
            ),
        ],
        milestones=[
            DialogueMilestone(
                milestone_id="m1",
                turn_id="2",
                seq=2,
                text="Ilse passed her exam",
                entity_ids=["e-ilse"],
            )
        ],
    )
    entries = {e.comment: e for e in build_lorebook(lore).entries.values()}
    ilse_entry = entries["Ilse (Character)"]
    # The name first, each alias once (case-insensitively).
    assert ilse_entry.key == ["Ilse", "Ilse Berg", "my sister"]
    assert ilse_entry.content.splitlines() == [
        "Ilse (Character), also called Ilse Berg, my sister.",
        "Studies marine biology.",
        "Traits: curious.",
        "Stated:",
        "- My sister moved to Bergen. (turn 1)",
        "Milestones:",
        "- Ilse passed her exam (turn 2)",
    ]
    # A fact naming two entities goes to both; one naming none goes to its speaker; a word that
    # merely starts with a name (Ilsebill) does not name it; a speaker who is no entity gets none.
    assert "- My sister moved to Bergen. (turn 1)" in entries["Bergen (Character)"].content
    tester_lines = entries["Tester (Character)"].content.splitlines()
    assert (
        "- I baked bread. (turn 1)" in tester_lines
        and "- Ilsebill is another person. (turn 3)" in tester_lines
    )
    assert "My sister moved" not in entries["Tester (Character)"].content
    assert not any("Nobody named here" in e.content for e in entries.values())
    assert "Ilsebill" not in ilse_entry.content
    # Ordered by first appearance, uids in that order.
    assert [(e.uid, e.comment) for e in build_lorebook(lore).entries.values()] == [
        (0, "Tester (Character)"),
        (1, "Bergen (Character)"),
        (2, "Ilse (Character)"),
    ]


def test_each_relation_type_shows_once_in_its_latest_state() -> None:
    a, b = _entity("e-a", "Anna", 1), _entity("e-b", "Boris", 2)
    lore = ConversationLore(
        conversation_id="c",
        entities=[a, b],
        relations=[
            _relation("r1", a, b, "RIVAL_OF", "ended", 2, 5, ended="5"),
            _relation("r2", a, b, "FRIEND_OF", "active", 5, 7, weight=0.8),
            _relation("r3", a, b, "TRUSTS", "ended", 3, 4, ended="4"),
            _relation("r4", a, b, "TRUSTS", "ended", 6, 9, ended="9"),
            _relation("r5", b, a, "ADMIRES", "active", 8, 8),
        ],
    )
    entries = list(build_lorebook(lore).entries.values())
    assert [e.comment for e in entries] == ["Anna (Character)", "Boris (Character)", "Anna & Boris"]
    pair = entries[2]
    assert pair.key == ["Anna"] and pair.keysecondary == ["Boris"] and pair.selective
    assert pair.content.splitlines() == [
        "Anna and Boris:",
        "- Anna friend of Boris: now, strength 0.80 (since turn 5).",
        "- Boris admires Anna: now, strength 0.50 (since turn 8).",
        "- Anna rival of Boris: no longer (ended at turn 5).",
        "- Anna trusts Boris: no longer (ended at turn 9).",
    ]
