"""The sidecar codex built over a fake graph reader: rows in, a page out, no database.

The fake answers each of the codex's statements (kg/codex/cypher.py) with fixed rows, as the
driver's records would (`.data()`, `.single()`), so these tests drive the row models
(kg/codex/records.py) and the page builder (kg/codex/dialogue.py) alone. The same page over
the real graph is tests/kg/test_codex.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core.errors import InvalidInputError
from kg.codex import build_dialogue_codex, records
from kg.codex import cypher as cq

Row = dict[str, Any]


class _Record:
    def __init__(self, row: Row) -> None:
        self.row = row

    def data(self) -> Row:
        return dict(self.row)


class _Result:
    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def __iter__(self) -> Iterator[_Record]:
        return iter([_Record(r) for r in self.rows])

    def single(self) -> _Record | None:
        return _Record(self.rows[0]) if self.rows else None


class _Transaction:
    def __init__(self, rows: dict[str, list[Row]]) -> None:
        self.rows = rows
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def run(self, query: str, **params: Any) -> _Result:
        self.ran.append((query, params))
        return _Result(self.rows.get(query, []))


class FakeGraphReader:
    """A GraphReader (kg.ports) of only what the codex calls: its read transaction runs over
    fixed rows per statement."""

    def __init__(self, rows: dict[str, list[Row]]) -> None:
        self.tx = _Transaction(rows)

    def execute_read(self, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return work(self.tx, *args, **kwargs)


def _entity(eid: str, name: str | None, seq: int) -> Row:
    return {
        "entity_id": eid,
        "name": name,
        "kind": "Character",
        "aliases": None,
        "bio_summary": None,
        "bio_traits": ["kind"],
        "first_turn": seq,  # a turn id the graph holds as a number is still shown as text
        "first_seq": seq,
        "last_turn": 6,
        "last_seq": 6,
        "mentions": 2,
    }


def _relation(rel_id: str, rel_type: str, since: int, ended: int | None, target: str = "e1") -> Row:
    return {
        "source": "e0",
        "target": target,
        "rel_id": rel_id,
        "type": rel_type,
        "raw_type": None,
        "weight": 0.5,
        "status": "ended" if ended else "active",
        "since_turn": since,
        "since_seq": since,
        "ended_turn": ended,
        "ended_seq": ended,
    }


def _event(rel_id: str, seq: int, action: str, from_type: str | None, to_type: str | None) -> Row:
    return {
        "rel_id": rel_id,
        "turn_id": seq,
        "seq": seq,
        "action": action,
        "from_type": from_type,
        "to_type": to_type,
        "weight_before": 0.5 if from_type else None,
        "weight_after": 0.25 if to_type else None,
        "reason": "a lie found out" if action == "REPLACE" else None,
        "quote": f"words of turn {seq}",
        "source": "e0",
        "target": "e1",
    }


def _conversation(*, ender: str = "e1") -> dict[str, list[Row]]:
    replace = _event("r2", 4, "REPLACE", "FRIEND_OF", "ENEMY_OF")
    replace["target"] = ender
    return {
        cq.DIALOGUE_HEAD: [{"memory_seq": 9, "turn_seq": 7}],
        cq.DIALOGUE_ENTITIES: [_entity("e0", "Caroline", 1), _entity("e1", None, 2)],
        cq.DIALOGUE_RELATIONS: [
            _relation("r1", "FRIEND_OF", 1, 4),
            _relation("r2", "ENEMY_OF", 4, None),
            _relation("r9", "KNOWS", 3, None, target="gone"),  # its target is no entity here
        ],
        cq.DIALOGUE_EVENTS: [_event("r1", 1, "EVOLVE", None, "FRIEND_OF"), replace],
        cq.DIALOGUE_MILESTONES: [
            {
                "milestone_id": "m1",
                "turn_id": 3,
                "seq": 3,
                "text": "first trip",
                "importance": 1,
                "entity_ids": ["e0", "nobody"],
                "quote": "Paris!",
            }
        ],
    }


def test_the_rows_of_a_fake_reader_become_the_conversations_page() -> None:
    reader = FakeGraphReader(_conversation())
    page = build_dialogue_codex(reader, "c1")

    # Every statement ran once, on the conversation, the capped ones with their cap.
    ran = {query: params for query, params in reader.tx.ran}
    assert len(reader.tx.ran) == len(ran) == 5
    assert all(p["conversation_id"] == "c1" for p in ran.values())
    assert ran[cq.DIALOGUE_EVENTS]["limit"] == records.DIALOGUE_LIMITS["events"]

    assert page.subtitle == "9 turns remembered, 7 committed with their facts"
    # A nameless entity is named by its id; a relation to an entity not read is not drawn.
    assert [n.name for n in page.graph.nodes] == ["Caroline", "e1"]
    assert sorted(e.label for e in page.graph.edges) == ["ENEMY_OF", "FRIEND_OF"]
    friends = next(e for e in page.graph.edges if e.label == "FRIEND_OF")
    assert friends.spans == [(1, 4)]
    # The REPLACE logged on the new relation, between the same pair at the ending turn, ended it.
    assert (
        friends.ended_by
        == "REPLACE FRIEND_OF with ENEMY_OF 0.50\u21920.25 (a lie found out) at turn 4"
    )
    assert [ev.what for ev in friends.events] == ["EVOLVE FRIEND_OF at 0.25"]
    ended = [i for entry in page.timeline for i in entry.ended_relationships]
    assert [(i.text, i.quote) for i in ended] == [
        ("Caroline FRIEND_OF e1 ended", "words of turn 4")
    ]
    assert [entry.heading for entry in page.timeline] == [
        "Turn 1",
        "Turn 2",
        "Turn 3",
        "Turn 4",
    ]
    [milestone] = [m for entry in page.timeline for m in entry.milestones]
    assert milestone.text == "first trip" and milestone.anchor == page.sections[0].cards[0].anchor
    caroline = page.sections[0].cards[0]
    assert caroline.first == "turn 1" and caroline.aliases == [] and caroline.description == ""
    assert ("turns naming it", "2") in caroline.fields
    assert "milestone: first trip" in [f.statement for f in caroline.facts]
    assert page.notes == []


def test_a_replace_between_another_pair_does_not_end_the_relation() -> None:
    page = build_dialogue_codex(FakeGraphReader(_conversation(ender="e0")), "c1")
    friends = next(e for e in page.graph.edges if e.label == "FRIEND_OF")
    assert friends.spans == [(1, 4)] and friends.ended_by == "ended at turn 4"
    ended = [i for entry in page.timeline for i in entry.ended_relationships]
    assert [(i.text, i.quote) for i in ended] == [("Caroline FRIEND_OF e1 ended", None)]


def test_a_read_at_its_cap_says_what_the_page_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(records.DIALOGUE_LIMITS, "milestones", 1)
    page = build_dialogue_codex(FakeGraphReader(_conversation()), "c1")
    assert page.notes == ["only the first 1 milestones are shown"]
    monkeypatch.setitem(records.DIALOGUE_LIMITS, "milestones", 2)
    assert build_dialogue_codex(FakeGraphReader(_conversation()), "c1").notes == []


def test_a_conversation_the_graph_does_not_hold_is_refused_and_an_empty_one_is_a_page() -> None:
    with pytest.raises(InvalidInputError, match="has no memory in this graph"):
        build_dialogue_codex(FakeGraphReader({}), "nope")
    empty = build_dialogue_codex(
        FakeGraphReader({cq.DIALOGUE_HEAD: [{"memory_seq": 3, "turn_seq": None}]}), "quiet"
    )
    assert empty.subtitle == "3 turns remembered, 0 committed with their facts"
    assert empty.graph.nodes == [] and empty.sections == [] and empty.timeline == []
