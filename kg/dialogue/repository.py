"""DialogueRepository: the dialogue memory's one entry point over a connected GraphStore."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.forget import delete_conversation_tx, forget_tx
from kg.dialogue.keys import lock_key
from kg.dialogue.lease import ConversationLease
from kg.dialogue.lore import ConversationLore, lore_tx
from kg.dialogue.memory import memory_rows_tx, memory_since_tx, remember_tx, replace_vectors_tx
from kg.dialogue.models import (
    TURN_COMMITTED,
    CommitOutcome,
    ConversationContents,
    ConversationSnapshot,
    DialogueEntity,
    DialogueMilestone,
    DialogueRelation,
    MemoryRow,
    RewindOutcome,
    StoredTurn,
    TurnWrite,
    VectorWrite,
)
from kg.dialogue.records import dialogue_entity, dialogue_milestone, dialogue_relation, stored_turn
from kg.dialogue.rename import copy_tx, rename_tx
from kg.dialogue.rewind import rewind_tx
from kg.dialogue.snapshot import snapshot_in_one_statement, snapshot_tx
from kg.dialogue.turn_commit import ResultBuilder, commit_tx
from kg.store import GraphStore


class DialogueRepository(ConversationLease):
    """Dialogue-memory reads and writes over a connected GraphStore (the lease methods come
    from kg.dialogue.lease)."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store

    # -- idempotency record
    def get_turn(self, key: str) -> StoredTurn | None:
        rows = self.store.read(dq.READ_TURN, key=key)
        props = rows[0]["props"] if rows else None
        if props is None or props.get("status") != TURN_COMMITTED:
            return None
        return stored_turn(props)

    # -- reads for the retriever
    def snapshot(
        self,
        conversation_id: str,
        *,
        after_seq: int = 0,
        anchor_key: str | None = None,
        entity_limit: int = 500,
        relation_limit: int = 500,
        milestone_limit: int = 8,
    ) -> ConversationSnapshot:
        """Entities, active relations, recent milestones, and the turns after `after_seq`
        (`anchor_key` is the key the caller holds for turn `after_seq`, checked for staleness)."""
        args = (
            conversation_id,
            after_seq,
            anchor_key,
            entity_limit,
            relation_limit,
            milestone_limit,
        )
        quick = self.store.read_in_one_round_trip(snapshot_in_one_statement, *args)
        return quick if quick is not None else self.store.execute_read(snapshot_tx, *args)

    # -- turn memory (independent of the commit gate)
    def remember(self, conversation_id: str, rows: list[MemoryRow]) -> int:
        """Remember turns (new keys appended in order, known keys left alone): one transaction."""
        return self.store.execute_write(remember_tx, conversation_id, rows)

    def remembered_keys(self, keys: list[str]) -> set[str]:
        return {r["key"] for r in self.store.read(dq.MEMORY_KEYS_PRESENT, keys=keys)}

    def memory_since(
        self,
        conversation_id: str,
        after_seq: int = 0,
        anchor_key: str | None = None,
        limit: int | None = None,
    ) -> tuple[int, bool, list[MemoryRow]]:
        """(memory head, reset, the remembered turns after position `after_seq`)."""
        return self.store.execute_read(
            memory_since_tx, conversation_id, after_seq, anchor_key, limit
        )

    def memory_head(self, conversation_id: str) -> int:
        """The position of the conversation's last remembered row (0: none)."""
        rows = self.store.read(dq.CONVERSATION_HEAD, conversation_id=conversation_id)
        return int(rows[0]["memory_seq"] or 0) if rows else 0

    def memory_rows(self, conversation_id: str, first: int, last: int) -> list[MemoryRow]:
        """The remembered rows at positions `first`..`last`, in position order."""
        return self.store.execute_read(memory_rows_tx, conversation_id, first, last)

    def replace_vectors(
        self,
        conversation_id: str,
        rows: list[VectorWrite],
        embedded_by: str,
        *,
        new_epoch: bool = False,
    ) -> int:
        """New vectors for remembered rows, from model `embedded_by` (kg.dialogue.memory
        `replace_vectors_tx`): one transaction. Returns how many rows changed."""
        return self.store.execute_write(
            replace_vectors_tx, conversation_id, rows, embedded_by, new_epoch
        )

    def conversation_ids(self) -> list[str]:
        """Every conversation with a memory, in name order."""
        return [str(r["conversation_id"]) for r in self.store.read(dq.CONVERSATION_IDS)]

    def conversation_page(self, offset: int, limit: int) -> tuple[int, list[tuple[str, int]]]:
        """The conversations memory holds, in name order, each with its remembered turns (its
        memory head: positions 1..n), and how many there are in all (one read transaction)."""

        def read(tx: ManagedTransaction) -> tuple[int, list[tuple[str, int]]]:
            rows = [
                (str(r["conversation_id"]), int(r["memory_seq"] or 0))
                for r in tx.run(dq.CONVERSATION_PAGE, offset=offset, limit=limit)
            ]
            return int(tx.run(dq.CONVERSATION_TOTAL).single(strict=True)["n"]), rows

        return self.store.execute_read(read)

    def memory_count(self, conversation_id: str) -> tuple[int, int]:
        """(rows, distinct keys) of a conversation's memory: an audit, scans the conversation."""
        row = self.store.read(dq.MEMORY_COUNT, conversation_id=conversation_id)[0]
        return int(row["n"]), int(row["keys"])

    # -- the one commit transaction
    def commit_turn(
        self, write: TurnWrite, owner: str, build_result: ResultBuilder
    ) -> CommitOutcome:
        return self.store.execute_write(commit_tx, write, owner, build_result)

    # -- inspection (tests, reports, operators)
    def relations(self, conversation_id: str) -> list[DialogueRelation]:
        return [
            dialogue_relation(r)
            for r in self.store.read(dq.ALL_RELATIONS, conversation_id=conversation_id)
        ]

    def events(self, conversation_id: str) -> list[dict[str, Any]]:
        return [r["props"] for r in self.store.read(dq.ALL_EVENTS, conversation_id=conversation_id)]

    def turns(self, conversation_id: str) -> list[dict[str, Any]]:
        return self.store.read(dq.ALL_TURNS, conversation_id=conversation_id)

    def entities(self, conversation_id: str, limit: int = 10_000) -> list[DialogueEntity]:
        rows = self.store.read(dq.ENTITIES, conversation_id=conversation_id, limit=limit)
        return [dialogue_entity(r["props"]) for r in rows]

    def milestones(self, conversation_id: str, limit: int = 10_000) -> list[DialogueMilestone]:
        rows = self.store.read(dq.RECENT_MILESTONES, conversation_id=conversation_id, limit=limit)
        return sorted(
            (dialogue_milestone(r["props"]) for r in rows), key=lambda m: (m.seq, m.milestone_id)
        )

    # -- edits, swipes, rewinds
    def rewind(
        self,
        conversation_id: str,
        key: str,
        owner: str,
        *,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> RewindOutcome:
        """Remove remembered turn `key` and every later one (the caller holds the lease)."""
        with guard():
            return self.store.execute_write(rewind_tx, conversation_id, key, owner)

    def remembered_text(self, key: str) -> str | None:
        """The remembered text of turn `key` (None: not remembered)."""
        rows = self.store.read(dq.MEMORY_TEXT_OF, key=key)
        return str(rows[0]["text"]) if rows else None

    # -- read-back (paged)
    def _page(
        self, page_query: str, total_query: str, conversation_id: str, offset: int, limit: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """The total a page is counted in and the page's rows, read in one transaction: read
        apart, a turn committed between the two reads made the total disagree with the rows."""

        def read(tx: ManagedTransaction) -> tuple[int, list[dict[str, Any]]]:
            params = {"conversation_id": conversation_id}
            rows = [r.data() for r in tx.run(page_query, **params, offset=offset, limit=limit)]
            return int(tx.run(total_query, **params).single()["n"]), rows

        return self.store.execute_read(read)

    def entity_page(
        self, conversation_id: str, offset: int, limit: int
    ) -> tuple[int, list[DialogueEntity]]:
        total, rows = self._page(dq.ENTITY_PAGE, dq.ENTITY_TOTAL, conversation_id, offset, limit)
        return total, [dialogue_entity(r["props"]) for r in rows]

    def relation_page(
        self, conversation_id: str, offset: int, limit: int
    ) -> tuple[int, list[tuple[DialogueRelation, list[dict[str, Any]]]]]:
        """Relations (active and ended) with their event history, oldest first."""
        total, rows = self._page(
            dq.RELATION_PAGE, dq.RELATION_TOTAL, conversation_id, offset, limit
        )
        rels = [dialogue_relation(r) for r in rows]
        events: dict[str, list[dict[str, Any]]] = {r.rel_id: [] for r in rels}
        if rels:
            for row in self.store.read(
                dq.RELATION_EVENTS, conversation_id=conversation_id, rel_ids=list(events)
            ):
                events[row["props"]["rel_id"]].append(row["props"])
        # A relation's evidence is the quote of its latest change that has one.
        quoted = [
            r.model_copy(
                update={
                    "quote": next(
                        (str(e["quote"]) for e in reversed(events[r.rel_id]) if e.get("quote")), ""
                    )
                }
            )
            for r in rels
        ]
        return total, [(r, events[r.rel_id]) for r in quoted]

    def milestone_page(
        self, conversation_id: str, offset: int, limit: int
    ) -> tuple[int, list[DialogueMilestone]]:
        total, rows = self._page(
            dq.MILESTONE_PAGE, dq.MILESTONE_TOTAL, conversation_id, offset, limit
        )
        return total, [dialogue_milestone(r["props"]) for r in rows]

    def memory_page(
        self, conversation_id: str, offset: int, limit: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """Remembered turns by position (committed or blocked by the gate): index range reads."""
        head = self.store.read(dq.CONVERSATION_HEAD, conversation_id=conversation_id)
        total = int(head[0]["memory_seq"] or 0) if head else 0
        rows = self.store.read(
            dq.MEMORY_PAGE_ROWS,
            conversation_id=conversation_id,
            offset=offset,
            until=offset + limit,
        )
        return total, rows

    def lore(self, conversation_id: str) -> ConversationLore | None:
        """Everything the graph holds about a conversation now, for its lorebook (one read
        transaction); None: the graph has no such conversation."""
        return self.store.execute_read(lore_tx, conversation_id)

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation entirely (one transaction), whoever holds its lease, and the
        lease too: for setting up a graph, never while the conversation is served (`forget`)."""

        def work(tx: ManagedTransaction) -> None:
            delete_conversation_tx(tx, conversation_id)
            tx.run(dq.DELETE_CONVERSATION_LOCK, key=lock_key(conversation_id)).consume()

        self.store.execute_write(work)

    def forget(
        self,
        conversation_id: str,
        owner: str,
        *,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> ConversationContents | None:
        """Forget a conversation (the caller holds the lease): what it held, None if nothing."""
        with guard():
            return self.store.execute_write(forget_tx, conversation_id, owner)

    def carry(
        self,
        old_id: str,
        new_id: str,
        owner: str,
        *,
        move: bool,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> ConversationContents | None:
        """Move (`move`: a renamed chat) or copy (a branched one) a conversation to another id
        (the caller holds both leases): what was carried, None if the graph held nothing of
        `old_id`; RenameRefusedError when `new_id` holds memory."""
        with guard():
            return self.store.execute_write(rename_tx if move else copy_tx, old_id, new_id, owner)
