"""Rewinding a conversation to before a turn (edits, swipes): exact, by re-applying the kept turns."""

from __future__ import annotations

import json

from neo4j import ManagedTransaction

from kg.dialogue import cypher as dq
from kg.dialogue.lease import require_lease
from kg.dialogue.models import (
    TURN_COMMITTED,
    RewindOutcome,
    RewindRefusedError,
    TurnWrite,
)
from kg.dialogue.turn_commit import apply_facts


def rewind_tx(tx: ManagedTransaction, conversation_id: str, key: str, owner: str) -> RewindOutcome:
    """Remove remembered turn `key` and every later turn of the conversation, exactly.

    Later turns may have changed what earlier ones wrote (weights, ended relations, bios,
    mention counts), and those changes are not all invertible from the event log; so the
    conversation's facts are deleted and the kept committed turns' stored writes re-applied
    in order, which reproduces the state they left (`apply_facts` is deterministic). The
    position counters go back to where the kept turns left them. Cost: one pass over the
    kept turns' facts."""
    require_lease(tx, conversation_id, owner, doing="the rewind", hint="retry the rewind")
    at = tx.run(dq.MEMORY_SEQ_OF, key=key).single()
    mseq = int(at["seq"]) if at is not None and at["conversation_id"] == conversation_id else None
    turns = [
        r.data()
        for r in tx.run(
            dq.COMMITTED_TURN_WRITES, conversation_id=conversation_id, committed=TURN_COMMITTED
        )
    ]
    memory_keys: set[str] = set()
    if mseq is not None:
        memory_keys = {
            r["key"] for r in tx.run(dq.MEMORY_KEYS_FROM, conversation_id=conversation_id, seq=mseq)
        }
    removed_keys = {key, *memory_keys}
    first_removed = min((int(t["seq"]) for t in turns if t["key"] in removed_keys), default=None)
    if mseq is None and first_removed is None:
        return RewindOutcome(status="absent")
    removed = [t for t in turns if first_removed is not None and int(t["seq"]) >= first_removed]
    kept = [t for t in turns if t not in removed]
    if removed:
        missing = [t["turn_id"] for t in kept if not t["write_json"]]
        if missing:
            raise RewindRefusedError(
                f"conversation {conversation_id!r}: turn {missing[0]} was committed before rewinds were "
                "possible (no stored write); this conversation cannot be rewound",
                hint="start a new conversation, or delete this one",
            )
        for statement in (dq.DELETE_CONVERSATION_RELS, *dq.DELETE_CONVERSATION_FACTS):
            tx.run(statement, conversation_id=conversation_id).consume()
        tx.run(dq.DELETE_TURNS, keys=[t["key"] for t in removed]).consume()
        for turn in kept:
            stored_write = {"committed_at": "", **json.loads(turn["write_json"])}
            apply_facts(tx, TurnWrite.model_validate(stored_write), int(turn["seq"]))
    if mseq is not None:
        tx.run(dq.DELETE_MEMORY_FROM, conversation_id=conversation_id, seq=mseq).consume()
    head = tx.run(dq.CONVERSATION_HEAD, conversation_id=conversation_id).single()
    memory_seq = mseq - 1 if mseq is not None else int(head["memory_seq"] or 0) if head else 0
    turn_seq = max((int(t["seq"]) for t in kept), default=None)
    if memory_seq == 0 and turn_seq is None:
        tx.run(dq.DELETE_CONVERSATION_HEAD, conversation_id=conversation_id).consume()
    elif turn_seq is None:
        tx.run(
            dq.SET_MEMORY_HEAD_ONLY, conversation_id=conversation_id, memory_seq=memory_seq
        ).consume()
    else:
        tx.run(
            dq.SET_HEADS, conversation_id=conversation_id, memory_seq=memory_seq, turn_seq=turn_seq
        ).consume()
    return RewindOutcome(
        status="rewound",
        removed_turns=[str(t["turn_id"]) for t in removed],
        removed_memory=len(memory_keys),
        replayed=len(kept) if removed else 0,
    )
