"""The retriever's graph read (kg.dialogue.snapshot): one statement for a reader one or two turns
behind, the rest of the rows paged in the same transaction for a reader further behind, and a
reset whenever the reader's cache is not this conversation's memory any more. And the one-round-trip
reads it is built on (GraphStore.read_in_one_round_trip, GraphStore.read): auto-commit, read again
in a managed transaction only on an error the driver would retry."""

from __future__ import annotations

import uuid
from typing import Any

import neo4j
import neo4j.exceptions as nx
import pytest

from kg.dialogue import (
    DialogueRepository,
    LostLockError,
    MemoryRow,
    RenameRefusedError,
    VectorWrite,
    anchor_token,
    turn_key,
)
from kg.dialogue import cypher as dq
from kg.dialogue.snapshot import SNAPSHOT_ROWS, snapshot_in_one_statement
from kg.errors import GraphQueryError
from kg.store import GraphStore

TURNS = SNAPSHOT_ROWS + 9  # more than the statement reads past position 0


def _remember(store: GraphStore, turns: int) -> tuple[DialogueRepository, str, list[MemoryRow]]:
    conversation = f"test-snapshot-{uuid.uuid4().hex[:8]}"
    rows = [
        MemoryRow(
            key=turn_key(conversation, str(i)),
            conversation_id=conversation,
            turn_id=str(i),
            speaker="Caroline",
            text=f"turn {i} of {conversation}",
        )
        for i in range(1, turns + 1)
    ]
    repo = DialogueRepository(store)
    assert repo.remember(conversation, rows) == turns
    return repo, conversation, rows


def test_a_reader_at_any_position_gets_exactly_the_rows_after_it(store: GraphStore) -> None:
    repo, conversation, rows = _remember(store, TURNS)
    cold = repo.snapshot(conversation)
    assert (cold.turn_count, cold.reset) == (TURNS, False)
    assert [r.seq for r in cold.new_turns] == list(range(1, TURNS + 1))
    assert [r.text for r in cold.new_turns] == [r.text for r in rows]
    for after in (1, 2, SNAPSHOT_ROWS, TURNS - 1, TURNS):
        held = cold.new_turns[after - 1]
        read = repo.snapshot(
            conversation, after_seq=after, anchor_key=anchor_token(held.key, held.text)
        )
        assert not read.reset, after
        assert [r.seq for r in read.new_turns] == list(range(after + 1, TURNS + 1)), after


def test_a_stale_cache_is_reset_and_gets_every_row(store: GraphStore) -> None:
    """The look-alikes of a current cache: the right key with other text (a replaced turn), a
    position past the head, a position nothing is at. Each resends every row."""
    repo, conversation, _ = _remember(store, TURNS)
    held = repo.snapshot(conversation).new_turns[4]
    for after, anchor in (
        (5, anchor_token(held.key, "an older text of turn 5")),
        (TURNS + 3, anchor_token(held.key, held.text)),
        (5, "some other conversation's key"),
    ):
        read = repo.snapshot(conversation, after_seq=after, anchor_key=anchor)
        assert read.reset, (after, anchor)
        assert [r.seq for r in read.new_turns] == list(range(1, TURNS + 1))


def test_a_re_embedded_rows_new_vector_is_written_only_over_the_text_embedded(
    store: GraphStore,
) -> None:
    repo, conversation, rows = _remember(store, 3)
    assert conversation in repo.conversation_ids()  # what `reembed` does without a conversation
    held = repo.snapshot(conversation).new_turns[-1]
    writes = [
        VectorWrite(key=rows[0].key, text="an edited text of turn 1", embedding=[0.0, 1.0]),
        VectorWrite(key=rows[1].key, text=rows[1].text, embedding=[0.6, 0.8]),
    ]
    assert repo.replace_vectors(conversation, writes, "model-b") == 1
    stored = repo.memory_rows(conversation, 1, 3)
    assert [(r.embedding, r.embedded_by) for r in stored] == [
        ([], ""),  # its text changed since it was read: the vector was not its text's
        ([0.6, 0.8], "model-b"),
        ([], ""),
    ]
    # Look-alike: a row already from the model is not written again.
    assert repo.replace_vectors(conversation, writes[1:], "model-b", new_epoch=True) == 0
    # The epoch started: a reader that cached the rows before is reset, one after is current.
    stale = repo.snapshot(conversation, after_seq=3, anchor_key=anchor_token(held.key, held.text))
    assert stale.reset and stale.vectors_epoch == 1 and len(stale.new_turns) == 3
    current = repo.snapshot(
        conversation, after_seq=3, anchor_key=anchor_token(held.key, held.text, 1)
    )
    assert not current.reset and current.new_turns == []


def test_forgetting_needs_the_lease_and_resets_a_reader_that_held_the_conversation(
    store: GraphStore,
) -> None:
    repo, conversation, _ = _remember(store, 3)
    _, other, _ = _remember(store, 2)
    held = repo.snapshot(conversation).new_turns[-1]
    anchor = anchor_token(held.key, held.text)
    # Without the lease (nobody's, or another owner's): refused, nothing removed.
    with pytest.raises(LostLockError):
        repo.forget(conversation, "sidecar-a")
    assert repo.claim_lock(conversation, "sidecar-b", lease_s=30).acquired
    with pytest.raises(LostLockError):
        repo.forget(conversation, "sidecar-a")
    assert repo.snapshot(conversation).turn_count == 3
    removed = repo.forget(conversation, "sidecar-b")
    assert removed is not None and (removed.memory, removed.turns) == (3, 0)
    repo.release_lock(conversation, "sidecar-b")
    # A reader whose cache holds the conversation up to its last row is reset, to nothing.
    after = repo.snapshot(conversation, after_seq=held.seq, anchor_key=anchor)
    assert (after.reset, after.turn_count, after.new_turns) == (True, 0, [])
    assert repo.snapshot(other).turn_count == 2
    # Nothing left: forgetting it again finds nothing.
    assert repo.claim_lock(conversation, "sidecar-b", lease_s=30).acquired
    assert repo.forget(conversation, "sidecar-b") is None
    repo.release_lock(conversation, "sidecar-b")


def test_renaming_needs_both_leases_and_moves_every_row_by_position(store: GraphStore) -> None:
    repo, conversation, rows = _remember(store, 3)
    _, taken, _ = _remember(store, 2)
    new = f"test-snapshot-renamed-{uuid.uuid4().hex[:8]}"
    held = repo.snapshot(conversation).new_turns[-1]
    anchor = anchor_token(held.key, held.text)
    # Without both leases: refused, nothing moved.
    assert repo.claim_lock(conversation, "sidecar-a", lease_s=30).acquired
    with pytest.raises(LostLockError):
        repo.carry(conversation, new, "sidecar-a", move=True)
    assert repo.claim_lock(taken, "sidecar-a", lease_s=30).acquired
    # Into a conversation that holds memory: refused, nothing moved.
    with pytest.raises(RenameRefusedError):
        repo.carry(conversation, taken, "sidecar-a", move=True)
    assert repo.snapshot(conversation).turn_count == 3 and repo.snapshot(taken).turn_count == 2
    assert repo.claim_lock(new, "sidecar-a", lease_s=30).acquired
    moved = repo.carry(conversation, new, "sidecar-a", move=True)
    assert moved is not None and (moved.memory, moved.turns) == (3, 0)
    for cid in (conversation, taken, new):
        repo.release_lock(cid, "sidecar-a")
    # The new id reads every row, each at its position under the new key; the old one nothing.
    read = repo.snapshot(new)
    assert [(r.key, r.seq, r.text) for r in read.new_turns] == [
        (turn_key(new, r.turn_id), i, r.text) for i, r in enumerate(rows, start=1)
    ]
    behind = repo.snapshot(
        new, after_seq=1, anchor_key=anchor_token(read.new_turns[0].key, rows[0].text)
    )
    assert not behind.reset and [r.seq for r in behind.new_turns] == [2, 3]
    # A reader whose cache held the old id is reset, to nothing.
    after = repo.snapshot(conversation, after_seq=held.seq, anchor_key=anchor)
    assert (after.reset, after.turn_count, after.new_turns) == (True, 0, [])
    assert repo.snapshot(taken).turn_count == 2


def test_a_conversation_nothing_was_remembered_in_reads_empty(store: GraphStore) -> None:
    read = DialogueRepository(store).snapshot(f"test-snapshot-none-{uuid.uuid4().hex[:8]}")
    assert (read.turn_count, read.reset, read.new_turns) == (0, False, [])
    assert (read.entities, read.relations, read.milestones) == ([], [], [])


def test_a_reader_one_turn_behind_is_answered_by_one_auto_commit_statement(
    store: GraphStore,
) -> None:
    """The quick path answers a current reader within the statement's rows; a reader further
    behind or a stale one gets None (and `snapshot` then reads in one transaction)."""
    repo, conversation, _ = _remember(store, TURNS)
    cold = repo.snapshot(conversation)
    held = cold.new_turns[TURNS - 2]
    anchor = anchor_token(held.key, held.text)
    quick = store.read_in_one_round_trip(
        snapshot_in_one_statement, conversation, TURNS - 1, anchor, 500, 500, 8
    )
    assert quick is not None and not quick.reset
    assert [r.seq for r in quick.new_turns] == [TURNS]
    assert quick == repo.snapshot(conversation, after_seq=TURNS - 1, anchor_key=anchor)
    far = cold.new_turns[TURNS - SNAPSHOT_ROWS - 2]
    for after, anchor_key in (
        (0, None),  # the statement reads SNAPSHOT_ROWS rows, the reader needs TURNS
        (TURNS - SNAPSHOT_ROWS - 1, anchor_token(far.key, far.text)),
        (TURNS - 1, anchor_token(held.key, "an older text")),  # stale: a reset
    ):
        assert (
            store.read_in_one_round_trip(
                snapshot_in_one_statement, conversation, after, anchor_key, 500, 500, 8
            )
            is None
        ), after


@pytest.mark.parametrize(
    "error",
    [
        nx.TransientError("a concurrent change"),
        nx.ServiceUnavailable("the connection was lost"),
        nx.SessionExpired("the session expired"),
    ],
    ids=["transient", "service-unavailable", "session-expired"],
)
def test_an_error_the_driver_would_retry_in_one_round_trip_asks_for_the_managed_read(
    store: GraphStore, error: Exception
) -> None:
    def failing(session: object) -> str:
        raise error

    def refused(session: object) -> str:
        raise nx.ClientError("a statement the server refuses")

    assert store.read_in_one_round_trip(failing) is None
    with pytest.raises(GraphQueryError):  # the look-alike: not retried by the driver, so not here
        store.read_in_one_round_trip(refused)


def test_a_one_statement_read_runs_without_a_managed_transaction(
    store: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GraphStore.read` is one auto-commit statement (one round trip, no BEGIN or COMMIT);
    only when that meets an error the driver would retry does it read in a managed transaction."""
    _, conversation, _ = _remember(store, 3)
    managed: list[str] = []
    real_execute_read = GraphStore.execute_read

    def counted_execute_read(self: GraphStore, work: Any, *args: Any, **kwargs: Any) -> Any:
        managed.append("read")
        return real_execute_read(self, work, *args, **kwargs)

    def run_failing_with(error: Exception) -> Any:
        def failing_run(self: neo4j.Session, *args: Any, **kwargs: Any) -> Any:
            raise error

        return failing_run

    monkeypatch.setattr(GraphStore, "execute_read", counted_execute_read)
    assert store.read(dq.MEMORY_COUNT, conversation_id=conversation) == [{"n": 3, "keys": 3}]
    assert managed == []
    monkeypatch.setattr(neo4j.Session, "run", run_failing_with(nx.TransientError("a conflict")))
    assert store.read(dq.MEMORY_COUNT, conversation_id=conversation) == [{"n": 3, "keys": 3}]
    assert managed == ["read"]  # read again, in a managed transaction
    monkeypatch.setattr(neo4j.Session, "run", run_failing_with(nx.ClientError("refused")))
    with pytest.raises(GraphQueryError):  # the look-alike: the driver would not retry it
        store.read(dq.MEMORY_COUNT, conversation_id=conversation)
    assert managed == ["read"]
