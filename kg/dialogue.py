"""Dialogue memory in the graph (spec 000 section 4): Cypher and the repository.

Per conversation the sidecar keeps:

- `KGEntity {conversation_id, entity_id, name, kind, aliases, bio_summary, bio_traits, ...}`
- `(:KGEntity)-[:KG_REL {rel_id, conversation_id, type, weight, status, ...}]->(:KGEntity)`;
  a relation is never deleted, only ended (`status: 'ended'`), so history stays queryable
- `KGRelEvent {event_id, conversation_id, turn_id, action, from_type, to_type,
  weight_before, weight_after, ...}`: one per applied relation action (the mutation log)
- `KGMilestone {milestone_id, conversation_id, turn_id, text, ...}`
- `KGTurn {key: "conversation_id:turn_id", payload_hash, status, result_json, seq, text, ...}`:
  the persisted idempotency record of a COMMITTED turn; its operational fields (`committed_at`,
  `committed_by`, `trace_json`: when, by which process, the slot timings) are left out of
  exports (kg.vocabulary.OPERATIONAL_PROPERTIES)
- `KGMemory {key, conversation_id, seq, position_key, speaker, text, extra, when, group,
  source_refs, embedding, committed}`: every turn's text, the recall document, written whether
  or not the turn's facts passed the commit gate (the gate governs graph facts only);
  `seq` is the turn's position in the conversation's memory, `position_key` =
  "conversation_id\\x1fseq" is unique and indexed so reads by position are index lookups
- `KGConversation {conversation_id, memory_seq, turn_seq}`: the position counters, so no
  write counts or scans a conversation's turns

The per-conversation lock is a lease node `KGTurn {key: "lock\\x1f<conversation_id>",
status: 'LOCK', owner, expires_at}` (the vocabulary has no lock label; the control
character cannot occur in a validated turn key, so the two key spaces never meet). It is
claimed with a compare-and-set in a write transaction, is stealable once expired (a crashed
process does not block a conversation forever), and is deleted on release, so a turn that
rolls back leaves the graph byte-identical. The commit transaction deletes the lease as its
first statement and aborts when it is no longer ours: a holder whose lease was stolen can
never commit (fencing).

Every value is a parameter; labels and the relationship type come from kg.vocabulary.
Every write runs in `GraphStore.execute_write` (managed, retried on transient errors such as
ArcadeDB's DeadlockDetected), so each transaction function below may run more than once
and keeps no side effects outside the transaction.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from neo4j import ManagedTransaction
from pydantic import BaseModel, ConfigDict, Field

from core.errors import GraphWriteError
from kg import vocabulary as vocab
from kg.store import GraphStore

_q = vocab.quote_label
_E = _q(vocab.KG_ENTITY)
_R = _q(vocab.KG_REL)
_EV = _q(vocab.KG_REL_EVENT)
_M = _q(vocab.KG_MILESTONE)
_T = _q(vocab.KG_TURN)
_MEM = _q(vocab.KG_MEMORY)
_CONV = _q(vocab.KG_CONVERSATION)

TURN_COMMITTED = "COMMITTED"
LOCK_STATUS = "LOCK"
REL_ACTIVE = "active"
REL_ENDED = "ended"
#: Strength a relation starts from when EVOLVE creates it.
EVOLVE_BASE_WEIGHT = 0.5
_LOCK_PREFIX = "lock\x1f"
# Errors that mean "someone else got there first" while claiming a lease: retry the claim.
_CLAIM_RACE_CODES = (
    "Neo.ClientError.Schema.ConstraintValidationFailed",
    "Neo.ClientError.Statement.EntityNotFound",
)

# --- Cypher ------------------------------------------------------------------------------

READ_TURN = f"MATCH (t:{_T} {{key: $key}}) RETURN properties(t) AS props"

LOCK_PROBE = (
    # SET + REMOVE takes the node's write lock before owner/expiry are read (a real
    # compare-and-set under Neo4j's pessimistic locking; ArcadeDB's optimistic MVCC retries
    # the loser instead) and leaves no trace: a refused claim changes nothing.
    f"MATCH (l:{_T} {{key: $key}}) SET l.lock_probe = true REMOVE l.lock_probe "
    "RETURN l.owner AS owner, l.expires_at AS expires_at, timestamp() AS now"
)
LOCK_CREATE = (
    # The uncontended path: one statement. The uniqueness constraint on KGTurn.key makes a
    # concurrent second CREATE fail cleanly, and the loser falls back to the compare-and-set.
    f"CREATE (l:{_T}) SET l = $props, l.acquired_at = timestamp(), l.expires_at = timestamp() + $lease_ms"
)
LOCK_TAKE = (
    f"MATCH (l:{_T} {{key: $key}}) SET l.owner = $owner, l.acquired_at = $now, l.expires_at = $expires_at"
)
LOCK_RELEASE = f"MATCH (l:{_T} {{key: $key}}) WHERE l.owner = $owner DELETE l RETURN count(*) AS released"

TURN_STATS = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id "
    "RETURN count(t) AS turns, max(t.seq) AS max_seq"
)
TURN_SEQ_NEXT = (
    f"MERGE (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "SET c.turn_seq = coalesce(c.turn_seq, $floor) + 1 RETURN c.turn_seq AS seq"
)
CONVERSATION_HEAD = (
    f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "RETURN c.memory_seq AS memory_seq, c.turn_seq AS turn_seq"
)
MEMORY_CLAIM = (
    f"MERGE (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "SET c.memory_seq = coalesce(c.memory_seq, 0) + $count RETURN c.memory_seq AS last"
)
MEMORY_KEYS_PRESENT = f"UNWIND $keys AS key MATCH (m:{_MEM} {{key: key}}) RETURN m.key AS key"
MEMORY_CREATE = f"UNWIND $rows AS row CREATE (m:{_MEM}) SET m = row"
MEMORY_MARK_COMMITTED = (
    f"MATCH (m:{_MEM} {{key: $key}}) SET m.committed = true, m.extra = $extra, m.facts = $facts"
)
MEMORY_AT = f"MATCH (m:{_MEM} {{position_key: $position_key}}) RETURN m.key AS key"
MEMORY_ROWS = (
    f"UNWIND $position_keys AS pk MATCH (m:{_MEM} {{position_key: pk}}) "
    "RETURN properties(m) AS props ORDER BY m.seq"
)
MEMORY_COUNT = f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id RETURN count(m) AS n, count(DISTINCT m.key) AS keys"
ENTITIES = (
    f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.last_seq DESC, e.entity_id LIMIT $limit"
)
ACTIVE_RELATIONS = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id AND r.status = $active "
    "RETURN a.entity_id AS source_id, a.name AS source_name, b.entity_id AS target_id, b.name AS target_name, "
    "properties(r) AS props ORDER BY r.weight DESC, r.rel_id LIMIT $limit"
)
ALL_RELATIONS = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id "
    "RETURN a.entity_id AS source_id, a.name AS source_name, b.entity_id AS target_id, b.name AS target_name, "
    "properties(r) AS props ORDER BY r.rel_id"
)
RECENT_MILESTONES = (
    f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id "
    "RETURN properties(m) AS props ORDER BY m.seq DESC, m.milestone_id DESC LIMIT $limit"
)
ALL_EVENTS = (
    f"MATCH (e:{_EV}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.seq, e.event_id"
)
ALL_TURNS = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id "
    "RETURN t.key AS key, t.turn_id AS turn_id, t.seq AS seq, t.payload_hash AS payload_hash ORDER BY t.seq"
)

UPSERT_ENTITIES = (
    f"UNWIND $rows AS row MERGE (e:{_E} {{conversation_id: row.conversation_id, entity_id: row.entity_id}}) "
    "ON CREATE SET e.name = row.name, e.name_key = row.name_key, e.kind = row.kind, e.aliases = [], "
    "e.first_turn = row.turn_id, e.first_seq = row.seq, e.mentions = 0, e.bio_summary = '', e.bio_traits = [] "
    "SET e.last_turn = row.turn_id, e.last_seq = row.seq, e.mentions = e.mentions + 1, "
    "e.aliases = e.aliases + [a IN row.aliases WHERE NOT a IN e.aliases]"
)
FIND_ACTIVE_RELATIONS = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}})-[r:{_R}]->"
    f"(b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) "
    "WHERE r.status = $active AND ($type IS NULL OR r.type = $type) "
    "RETURN r.rel_id AS rel_id, r.type AS type, r.weight AS weight ORDER BY r.rel_id"
)
SET_RELATION_WEIGHT = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}})-[r:{_R}]->"
    f"(b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) WHERE r.rel_id = $rel_id "
    "SET r.weight = $weight, r.updated_turn = $turn_id, r.updated_seq = $seq"
)
END_RELATION = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}})-[r:{_R}]->"
    f"(b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) WHERE r.rel_id = $rel_id "
    "SET r.status = $ended, r.ended_turn = $turn_id, r.ended_seq = $seq, r.updated_turn = $turn_id, "
    "r.updated_seq = $seq"
)
CREATE_RELATION = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}}) "
    f"MATCH (b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) "
    f"CREATE (a)-[r:{_R}]->(b) SET r = $props"
)
CREATE_EVENTS = f"UNWIND $rows AS row CREATE (e:{_EV}) SET e = row"
PATCH_BIO = (
    f"MATCH (e:{_E} {{conversation_id: $conversation_id, entity_id: $entity_id}}) "
    "SET e.bio_summary = CASE WHEN $summary IS NULL THEN e.bio_summary ELSE $summary END, "
    "e.bio_traits = [t IN coalesce(e.bio_traits, []) WHERE NOT t IN $remove] "
    "+ [t IN $add WHERE NOT t IN coalesce(e.bio_traits, [])], "
    "e.bio_updated_turn = $turn_id RETURN count(e) AS patched"
)
CREATE_MILESTONES = f"UNWIND $rows AS row CREATE (m:{_M}) SET m = row"
CREATE_TURN = f"CREATE (t:{_T}) SET t = $props"

DELETE_CONVERSATION_RELS = f"MATCH ()-[r:{_R}]->() WHERE r.conversation_id = $conversation_id DELETE r"
DELETE_CONVERSATION_NODES: tuple[str, ...] = tuple(
    f"MATCH (n:{label}) WHERE n.conversation_id = $conversation_id DETACH DELETE n"
    for label in (_EV, _M, _T, _MEM, _CONV, _E)
)
DELETE_CONVERSATION_LOCK = f"MATCH (l:{_T} {{key: $key}}) DELETE l"

# Rewind (edits, swipes): remove a turn and every later one exactly, by rebuilding the
# conversation's facts from the stored writes of the turns that stay.
LOCK_HELD = f"MATCH (l:{_T} {{key: $key}}) WHERE l.owner = $owner RETURN count(l) AS held"
MEMORY_SEQ_OF = f"MATCH (m:{_MEM} {{key: $key}}) RETURN m.seq AS seq, m.conversation_id AS conversation_id"
MEMORY_TEXT_OF = f"MATCH (m:{_MEM} {{key: $key}}) RETURN m.text AS text"
MEMORY_KEYS_FROM = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.seq >= $seq RETURN m.key AS key"
)
DELETE_MEMORY_FROM = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.seq >= $seq DELETE m"
)
COMMITTED_TURN_WRITES = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id AND t.status = $committed "
    "RETURN t.key AS key, t.turn_id AS turn_id, t.seq AS seq, t.write_json AS write_json ORDER BY t.seq"
)
DELETE_TURNS = f"UNWIND $keys AS key MATCH (t:{_T} {{key: key}}) DELETE t"
DELETE_CONVERSATION_FACTS: tuple[str, ...] = tuple(
    f"MATCH (n:{label}) WHERE n.conversation_id = $conversation_id DETACH DELETE n"
    for label in (_EV, _M, _E)
)
SET_HEADS = (
    f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) SET c.memory_seq = $memory_seq, c.turn_seq = $turn_seq"
)
SET_MEMORY_HEAD_ONLY = (
    f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) SET c.memory_seq = $memory_seq REMOVE c.turn_seq"
)
DELETE_CONVERSATION_HEAD = f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) DELETE c"

# Read-back (paged, stable order).
ENTITY_PAGE = (
    f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.first_seq, e.entity_id SKIP $offset LIMIT $limit"
)
ENTITY_TOTAL = f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id RETURN count(e) AS n"
RELATION_PAGE = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id "
    "RETURN a.entity_id AS source_id, a.name AS source_name, b.entity_id AS target_id, b.name AS target_name, "
    "properties(r) AS props ORDER BY r.since_seq, r.rel_id SKIP $offset LIMIT $limit"
)
RELATION_TOTAL = f"MATCH ()-[r:{_R}]->() WHERE r.conversation_id = $conversation_id RETURN count(r) AS n"
RELATION_EVENTS = (
    f"MATCH (e:{_EV}) WHERE e.conversation_id = $conversation_id AND e.rel_id IN $rel_ids "
    "RETURN properties(e) AS props ORDER BY e.seq, e.index"
)
MILESTONE_PAGE = (
    f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id "
    "RETURN properties(m) AS props ORDER BY m.seq, m.milestone_id SKIP $offset LIMIT $limit"
)
MILESTONE_TOTAL = f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id RETURN count(m) AS n"
MEMORY_PAGE_ROWS = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.seq > $offset AND m.seq <= $until "
    "RETURN m.key AS key, m.turn_id AS turn_id, m.seq AS seq, m.speaker AS speaker, m.text AS text, "
    "m.`when` AS said_when, m.committed AS committed, m.facts AS facts ORDER BY m.seq"
)


# --- Models ------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DialogueEntity(_Model):
    entity_id: str
    name: str
    kind: str = vocab.FALLBACK_LABEL
    aliases: list[str] = Field(default_factory=list)
    bio_summary: str = ""
    bio_traits: list[str] = Field(default_factory=list)
    first_turn: str | None = None
    last_turn: str | None = None
    mentions: int = 0


class DialogueRelation(_Model):
    rel_id: str
    source_id: str
    source_name: str
    target_id: str
    target_name: str
    type: str
    raw_type: str | None = None
    weight: float
    status: str
    since_turn: str | None = None
    ended_turn: str | None = None


class DialogueMilestone(_Model):
    milestone_id: str
    turn_id: str
    seq: int
    text: str
    importance: float = 0.5
    entity_ids: list[str] = Field(default_factory=list)


class MemoryRow(_Model):
    """One remembered turn (a KGMemory node)."""

    key: str
    conversation_id: str
    turn_id: str
    seq: int = 0
    speaker: str = ""
    text: str
    extra: str = ""
    when: str = ""
    group: str = ""
    source_refs: list[str] = Field(default_factory=list)
    facts: list[str] = Field(default_factory=list)
    embedding: list[float] = Field(default_factory=list)
    committed: bool = False


class ConversationSnapshot(_Model):
    """What the retriever reads for one turn, from one read transaction."""

    entities: list[DialogueEntity]
    relations: list[DialogueRelation]
    milestones: list[DialogueMilestone]
    new_turns: list[MemoryRow]
    turn_count: int = Field(description="turns remembered in this conversation")
    max_seq: int
    reset: bool = Field(False, description="the caller's anchor turn is gone: new_turns holds every turn")


class StoredTurn(_Model):
    key: str
    conversation_id: str
    turn_id: str
    seq: int
    payload_hash: str
    status: str
    result_json: str
    trace_json: str = Field("", description="the original commit's trace (operational: not exported)")


class LockClaim(_Model):
    acquired: bool
    owner: str
    holder: str | None = None
    expires_in_ms: int = 0
    stolen_from: str | None = None
    stored: StoredTurn | None = Field(None, description="the turn's committed record, read under the lock")


class EntityWrite(_Model):
    entity_id: str
    name: str
    kind: str
    aliases: list[str] = Field(default_factory=list)


class RelationActionWrite(_Model):
    action: Literal["EVOLVE", "REPLACE", "DELETE"]
    source_id: str
    target_id: str
    type: str = Field(description="EVOLVE/DELETE: the relation's type; REPLACE: the new type")
    raw_type: str | None = None
    from_type: str | None = Field(None, description="REPLACE: the type ended (None: every other type)")
    weight_delta: float = 0.0
    weight: float = EVOLVE_BASE_WEIGHT
    reason: str = ""


class BioPatchWrite(_Model):
    entity_id: str
    summary: str | None = None
    traits_add: list[str] = Field(default_factory=list)
    traits_remove: list[str] = Field(default_factory=list)


class MilestoneWrite(_Model):
    text: str
    importance: float = 0.5
    entity_ids: list[str] = Field(default_factory=list)


class TurnWrite(_Model):
    """Everything one committed turn writes, in one transaction."""

    key: str
    conversation_id: str
    turn_id: str
    payload_hash: str
    speaker: str = ""
    text: str
    source_refs: list[str] = Field(default_factory=list)
    facts: list[str] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list)
    embedding: list[float] = Field(default_factory=list)
    committed_at: str
    memory: MemoryRow | None = Field(None, description="the turn's memory row, written in the same transaction")
    entities: list[EntityWrite] = Field(default_factory=list)
    actions: list[RelationActionWrite] = Field(default_factory=list)
    bio_patches: list[BioPatchWrite] = Field(default_factory=list)
    milestones: list[MilestoneWrite] = Field(default_factory=list)


class AppliedAction(_Model):
    event_id: str | None = None
    action: Literal["EVOLVE", "REPLACE", "DELETE"]
    source_id: str
    target_id: str
    from_type: str | None = None
    to_type: str | None = None
    rel_id: str | None = None
    weight_before: float | None = None
    weight_after: float | None = None
    applied: bool = True
    note: str = ""


class CommitOutcome(_Model):
    status: Literal["committed", "duplicate", "conflict"]
    seq: int = 0
    applied: list[AppliedAction] = Field(default_factory=list)
    stored: StoredTurn | None = None


class RewindOutcome(_Model):
    status: Literal["rewound", "absent"]
    removed_turns: list[str] = Field(default_factory=list)
    removed_memory: int = 0
    replayed: int = 0


class RewindRefusedError(GraphWriteError):
    """A rewind would need a turn's stored write, which turns committed before rewinds existed lack."""


class LostLockError(GraphWriteError):
    """The conversation's lease expired and was taken over before this turn could commit."""


# --- Pure helpers --------------------------------------------------------------------------


def turn_key(conversation_id: str, turn_id: str) -> str:
    return f"{conversation_id}:{turn_id}"


def lock_key(conversation_id: str) -> str:
    return f"{_LOCK_PREFIX}{conversation_id}"


def dialogue_entity_id(name: str) -> str:
    """One node per name within a conversation, whatever kind a model calls it."""
    return vocab.entity_id("entity", name)


def _clamp(value: float) -> float:
    return round(min(1.0, max(0.0, value)), 6)


def _no_nulls(props: dict[str, Any]) -> dict[str, Any]:
    # A null property is no property in Cypher: leave them out so SET n = $props is exact.
    return {k: v for k, v in props.items() if v is not None}


def _stored(props: dict[str, Any]) -> StoredTurn:
    return StoredTurn(
        key=props["key"],
        conversation_id=props.get("conversation_id", ""),
        turn_id=str(props.get("turn_id", "")),
        seq=int(props.get("seq") or 0),
        payload_hash=props.get("payload_hash", ""),
        status=props.get("status", ""),
        result_json=props.get("result_json", ""),
        trace_json=props.get("trace_json", ""),
    )


def _entity(props: dict[str, Any]) -> DialogueEntity:
    return DialogueEntity(
        entity_id=props["entity_id"],
        name=props.get("name") or props["entity_id"],
        kind=props.get("kind") or vocab.FALLBACK_LABEL,
        aliases=list(props.get("aliases") or []),
        bio_summary=props.get("bio_summary") or "",
        bio_traits=list(props.get("bio_traits") or []),
        first_turn=props.get("first_turn"),
        last_turn=props.get("last_turn"),
        mentions=int(props.get("mentions") or 0),
    )


def _relation(row: dict[str, Any]) -> DialogueRelation:
    props = row["props"]
    return DialogueRelation(
        rel_id=props["rel_id"],
        source_id=row["source_id"],
        source_name=row["source_name"] or row["source_id"],
        target_id=row["target_id"],
        target_name=row["target_name"] or row["target_id"],
        type=props.get("type", vocab.RELATES_TO),
        raw_type=props.get("raw_type"),
        weight=float(props.get("weight") or 0.0),
        status=props.get("status", REL_ACTIVE),
        since_turn=props.get("since_turn"),
        ended_turn=props.get("ended_turn"),
    )


def _milestone(props: dict[str, Any]) -> DialogueMilestone:
    return DialogueMilestone(
        milestone_id=props["milestone_id"],
        turn_id=str(props.get("turn_id", "")),
        seq=int(props.get("seq") or 0),
        text=props.get("text", ""),
        importance=float(props.get("importance") or 0.0),
        entity_ids=list(props.get("entity_ids") or []),
    )


# --- Transaction functions -----------------------------------------------------------------


def _read_stored(tx: ManagedTransaction, key: str | None) -> StoredTurn | None:
    if key is None:
        return None
    row = tx.run(READ_TURN, key=key).single()
    if row is None or row["props"].get("status") != TURN_COMMITTED:
        return None
    return _stored(row["props"])


def _create_lock_tx(
    tx: ManagedTransaction, key: str, conversation_id: str, owner: str, lease_ms: int, turn: str | None
) -> LockClaim:
    props = {"key": key, "status": LOCK_STATUS, "lock_of": conversation_id, "owner": owner}
    tx.run(LOCK_CREATE, props=props, lease_ms=lease_ms).consume()
    return LockClaim(acquired=True, owner=owner, stored=_read_stored(tx, turn))


def _take_lock_tx(
    tx: ManagedTransaction, key: str, owner: str, lease_ms: int, turn: str | None
) -> LockClaim:
    row = tx.run(LOCK_PROBE, key=key).single()
    if row is None:
        # Released between our failed CREATE and this probe: the caller simply tries again.
        return LockClaim(acquired=False, owner=owner, holder="(just released)")
    holder, expires_at, now = row["owner"], row["expires_at"], int(row["now"])
    if holder == owner or expires_at is None or int(expires_at) <= now:
        tx.run(LOCK_TAKE, key=key, owner=owner, now=now, expires_at=now + lease_ms).consume()
        stolen = holder if holder not in (None, owner) else None
        return LockClaim(acquired=True, owner=owner, stolen_from=stolen, stored=_read_stored(tx, turn))
    return LockClaim(acquired=False, owner=owner, holder=holder, expires_in_ms=int(expires_at) - now)


def position_key(conversation_id: str, seq: int) -> str:
    return f"{conversation_id}\x1f{seq}"


#: Memory rows read per statement when a reader catches up (one index lookup each).
MEMORY_PAGE = 2000


def _memory_row(props: dict[str, Any]) -> MemoryRow:
    return MemoryRow(
        key=props["key"],
        conversation_id=props.get("conversation_id", ""),
        turn_id=str(props.get("turn_id", "")),
        seq=int(props.get("seq") or 0),
        speaker=props.get("speaker") or "",
        text=props.get("text") or "",
        extra=props.get("extra") or "",
        when=props.get("when") or "",
        group=props.get("group") or "",
        source_refs=list(props.get("source_refs") or []),
        facts=list(props.get("facts") or []),
        embedding=[float(x) for x in (props.get("embedding") or [])],
        committed=bool(props.get("committed")),
    )


def _memory_since_tx(
    tx: ManagedTransaction, conversation_id: str, after_seq: int, anchor_key: str | None, limit: int | None
) -> tuple[int, bool, list[MemoryRow]]:
    """(memory head, reset, rows after `after_seq`): index lookups by position only."""
    head_row = tx.run(CONVERSATION_HEAD, conversation_id=conversation_id).single()
    head = int(head_row["memory_seq"] or 0) if head_row else 0
    reset = False
    if after_seq > 0:
        at = tx.run(MEMORY_AT, position_key=position_key(conversation_id, after_seq)).single()
        if at is None or at["key"] != anchor_key or after_seq > head:
            # The caller's cache is from another life of this conversation: resend everything.
            after_seq, reset = 0, True
    last = head if limit is None else min(head, after_seq + limit)
    rows: list[MemoryRow] = []
    for start in range(after_seq + 1, last + 1, MEMORY_PAGE):
        keys = [position_key(conversation_id, s) for s in range(start, min(last, start + MEMORY_PAGE - 1) + 1)]
        rows += [_memory_row(r["props"]) for r in tx.run(MEMORY_ROWS, position_keys=keys)]
    return head, reset, rows


def _snapshot_tx(
    tx: ManagedTransaction,
    conversation_id: str,
    after_seq: int,
    anchor_key: str | None,
    entity_limit: int,
    relation_limit: int,
    milestone_limit: int,
) -> ConversationSnapshot:
    head, reset, new_turns = _memory_since_tx(tx, conversation_id, after_seq, anchor_key, None)
    entities = [
        _entity(r["props"])
        for r in tx.run(ENTITIES, conversation_id=conversation_id, limit=entity_limit)
    ]
    relations = [
        _relation(r.data())
        for r in tx.run(
            ACTIVE_RELATIONS, conversation_id=conversation_id, active=REL_ACTIVE, limit=relation_limit
        )
    ]
    milestones = [
        _milestone(r["props"])
        for r in tx.run(RECENT_MILESTONES, conversation_id=conversation_id, limit=milestone_limit)
    ]
    return ConversationSnapshot(
        entities=entities,
        relations=relations,
        milestones=milestones,
        new_turns=new_turns,
        turn_count=head,
        max_seq=head,
        reset=reset,
    )


def _memory_props(row: MemoryRow, seq: int) -> dict[str, Any]:
    return _no_nulls(
        {
            "key": row.key,
            "conversation_id": row.conversation_id,
            "turn_id": row.turn_id,
            "seq": seq,
            "position_key": position_key(row.conversation_id, seq),
            "speaker": row.speaker,
            "text": row.text,
            "extra": row.extra,
            "when": row.when,
            "group": row.group,
            "source_refs": row.source_refs,
            "facts": row.facts,
            "embedding": row.embedding,
            "committed": row.committed,
        }
    )


def _remember_tx(tx: ManagedTransaction, conversation_id: str, rows: list[MemoryRow]) -> int:
    """Append the rows whose key is not remembered yet (exactly once: a key is unique, and a
    row and its position are written in one transaction); a committed row already
    remembered is marked committed. Returns how many rows were appended."""
    if not rows:
        return 0
    present = {r["key"] for r in tx.run(MEMORY_KEYS_PRESENT, keys=[row.key for row in rows])}
    for row in rows:
        if row.key in present and row.committed:
            tx.run(MEMORY_MARK_COMMITTED, key=row.key, extra=row.extra, facts=row.facts).consume()
    fresh = list({row.key: row for row in rows if row.key not in present}.values())
    if not fresh:
        return 0
    claimed = tx.run(MEMORY_CLAIM, conversation_id=conversation_id, count=len(fresh)).single()
    first = int(claimed["last"]) - len(fresh) + 1  # type: ignore[index]
    tx.run(MEMORY_CREATE, rows=[_memory_props(row, first + i) for i, row in enumerate(fresh)]).consume()
    return len(fresh)


def _apply_action(
    tx: ManagedTransaction,
    write: TurnWrite,
    seq: int,
    index: int,
    action: RelationActionWrite,
) -> AppliedAction:
    conv = write.conversation_id
    pair = {"conversation_id": conv, "source_id": action.source_id, "target_id": action.target_id}
    stamp = {"turn_id": write.turn_id, "seq": seq}

    def active(rel_type: str | None) -> list[dict[str, Any]]:
        return [
            r.data()
            for r in tx.run(FIND_ACTIVE_RELATIONS, **pair, type=rel_type, active=REL_ACTIVE)
        ]

    def create(rel_type: str, weight: float, suffix: str) -> str:
        rel_id = f"{write.key}#r{index}{suffix}"
        props = _no_nulls(
            {
                "rel_id": rel_id,
                "conversation_id": conv,
                "type": rel_type,
                "raw_type": action.raw_type,
                "weight": weight,
                "status": REL_ACTIVE,
                "since_turn": write.turn_id,
                "since_seq": seq,
                "updated_turn": write.turn_id,
                "updated_seq": seq,
            }
        )
        tx.run(CREATE_RELATION, **pair, props=props).consume()
        return rel_id

    if action.action == "EVOLVE":
        found = active(action.type)
        if found:
            before = float(found[0]["weight"] or 0.0)
            after = _clamp(before + action.weight_delta)
            tx.run(SET_RELATION_WEIGHT, **pair, **stamp, rel_id=found[0]["rel_id"], weight=after).consume()
            return AppliedAction(
                action="EVOLVE", source_id=action.source_id, target_id=action.target_id,
                from_type=action.type, to_type=action.type, rel_id=found[0]["rel_id"],
                weight_before=before, weight_after=after,
            )
        after = _clamp(EVOLVE_BASE_WEIGHT + action.weight_delta)
        rel_id = create(action.type, after, "")
        return AppliedAction(
            action="EVOLVE", source_id=action.source_id, target_id=action.target_id,
            to_type=action.type, rel_id=rel_id, weight_after=after, note="created",
        )

    if action.action == "REPLACE":
        ended = [
            r for r in active(action.from_type) if r["type"] != action.type
        ]
        for rel in ended:
            tx.run(END_RELATION, **pair, **stamp, rel_id=rel["rel_id"], ended=REL_ENDED).consume()
        already = active(action.type)
        weight = _clamp(action.weight)
        if already:
            rel_id = already[0]["rel_id"]
            tx.run(SET_RELATION_WEIGHT, **pair, **stamp, rel_id=rel_id, weight=weight).consume()
        else:
            rel_id = create(action.type, weight, "")
        return AppliedAction(
            action="REPLACE", source_id=action.source_id, target_id=action.target_id,
            from_type=ended[0]["type"] if ended else action.from_type, to_type=action.type,
            rel_id=rel_id,
            weight_before=float(ended[0]["weight"] or 0.0) if ended else None,
            weight_after=weight,
            note="" if ended else "nothing to replace; new relation started",
        )

    found = active(action.type)
    if not found:
        return AppliedAction(
            action="DELETE", source_id=action.source_id, target_id=action.target_id,
            from_type=action.type, applied=False, note="no active relation of this type",
        )
    for rel in found:
        tx.run(END_RELATION, **pair, **stamp, rel_id=rel["rel_id"], ended=REL_ENDED).consume()
    return AppliedAction(
        action="DELETE", source_id=action.source_id, target_id=action.target_id,
        from_type=action.type, rel_id=found[0]["rel_id"],
        weight_before=float(found[0]["weight"] or 0.0), weight_after=0.0,
    )


#: (seq, applied actions) -> (the result a replay returns, the commit's trace), both JSON.
ResultBuilder = Callable[[int, list[AppliedAction]], tuple[str, str]]


def _commit_tx(
    tx: ManagedTransaction, write: TurnWrite, owner: str, build_result: ResultBuilder
) -> CommitOutcome:
    # 1. Fence: our lease must still exist; deleting it here also releases it atomically.
    released = tx.run(LOCK_RELEASE, key=lock_key(write.conversation_id), owner=owner).single()
    if not released or not int(released["released"]):
        raise LostLockError(
            f"conversation {write.conversation_id!r}: the lock lease expired and was taken over "
            "before the turn could commit",
            hint="retry the turn; raise the lease if turns take this long",
        )
    # 2. Idempotency: the key may have been committed by an earlier holder.
    existing = tx.run(READ_TURN, key=write.key).single()
    if existing is not None:
        stored = _stored(existing["props"])
        status: Literal["duplicate", "conflict"] = (
            "duplicate" if stored.payload_hash == write.payload_hash else "conflict"
        )
        return CommitOutcome(status=status, seq=stored.seq, stored=stored)
    seq = _next_turn_seq(tx, write.conversation_id)
    applied = _apply_facts(tx, write, seq)
    result_json, trace_json = build_result(seq, applied)
    # 7. The turn record last: it carries the result the caller gets on a replay.
    props = _no_nulls(
        {
            "key": write.key,
            "conversation_id": write.conversation_id,
            "turn_id": write.turn_id,
            "seq": seq,
            "status": TURN_COMMITTED,
            "payload_hash": write.payload_hash,
            "speaker": write.speaker,
            "text": write.text,
            "source_refs": write.source_refs,
            "facts": write.facts,
            "events": write.events,
            "embedding": write.embedding,
            "committed_at": write.committed_at,
            "committed_by": owner,
            "result_json": result_json,
            "trace_json": trace_json,
            # What a rewind re-applies (the memory row and vectors stay on KGMemory).
            "write_json": write.model_dump_json(exclude={"memory", "embedding", "committed_at"}),
        }
    )
    tx.run(CREATE_TURN, props=props).consume()
    if write.memory is not None:
        _remember_tx(tx, write.conversation_id, [write.memory])
    return CommitOutcome(status="committed", seq=seq, applied=applied)


def _apply_facts(tx: ManagedTransaction, write: TurnWrite, seq: int) -> list[AppliedAction]:
    """Steps 3-6 of a commit: entities, relation actions with their events, bio patches,
    milestones. Deterministic given the graph state, so a rewind can re-apply kept turns."""
    # 3. Entities first: every action, patch and milestone refers to them.
    if write.entities:
        rows = [
            {
                "conversation_id": write.conversation_id,
                "entity_id": e.entity_id,
                "name": e.name,
                "name_key": vocab.name_key(e.name),
                "kind": e.kind,
                "aliases": e.aliases,
                "turn_id": write.turn_id,
                "seq": seq,
            }
            for e in write.entities
        ]
        tx.run(UPSERT_ENTITIES, rows=rows).consume()
    # 4. Relation actions in order (a later action may build on an earlier one), each logged.
    applied: list[AppliedAction] = []
    events: list[dict[str, Any]] = []
    for index, action in enumerate(write.actions):
        result = _apply_action(tx, write, seq, index, action)
        if result.applied:
            result.event_id = f"{write.key}#e{index}"
            events.append(
                _no_nulls(
                    {
                        "event_id": result.event_id,
                        "conversation_id": write.conversation_id,
                        "turn_id": write.turn_id,
                        "turn_key": write.key,
                        "seq": seq,
                        "index": index,
                        "rel_id": result.rel_id,
                        "action": result.action,
                        "source_id": result.source_id,
                        "target_id": result.target_id,
                        "from_type": result.from_type,
                        "to_type": result.to_type,
                        "weight_before": result.weight_before,
                        "weight_after": result.weight_after,
                        "reason": action.reason,
                    }
                )
            )
        applied.append(result)
    if events:
        tx.run(CREATE_EVENTS, rows=events).consume()
    # 5. Bio patches.
    for patch in write.bio_patches:
        tx.run(
            PATCH_BIO,
            conversation_id=write.conversation_id,
            entity_id=patch.entity_id,
            summary=patch.summary,
            add=patch.traits_add,
            remove=patch.traits_remove,
            turn_id=write.turn_id,
        ).consume()
    # 6. Milestones.
    if write.milestones:
        rows = [
            {
                "milestone_id": f"{write.key}#m{i}",
                "conversation_id": write.conversation_id,
                "turn_id": write.turn_id,
                "turn_key": write.key,
                "seq": seq,
                "text": m.text,
                "importance": m.importance,
                "entity_ids": m.entity_ids,
            }
            for i, m in enumerate(write.milestones)
        ]
        tx.run(CREATE_MILESTONES, rows=rows).consume()
    return applied


def _rewind_tx(tx: ManagedTransaction, conversation_id: str, key: str, owner: str) -> RewindOutcome:
    """Remove remembered turn `key` and every later turn of the conversation, exactly.

    Later turns may have changed what earlier ones wrote (weights, ended relations, bios,
    mention counts), and those changes are not all invertible from the event log; so the
    conversation's facts are deleted and the kept committed turns' stored writes re-applied
    in order, which reproduces the state they left (`_apply_facts` is deterministic). The
    position counters go back to where the kept turns left them. Cost: one pass over the
    kept turns' facts."""
    held = tx.run(LOCK_HELD, key=lock_key(conversation_id), owner=owner).single()
    if not held or not int(held["held"]):
        raise LostLockError(
            f"conversation {conversation_id!r}: the lock lease expired and was taken over before the rewind",
            hint="retry the rewind",
        )
    at = tx.run(MEMORY_SEQ_OF, key=key).single()
    mseq = int(at["seq"]) if at is not None and at["conversation_id"] == conversation_id else None
    turns = [r.data() for r in tx.run(COMMITTED_TURN_WRITES, conversation_id=conversation_id, committed=TURN_COMMITTED)]
    memory_keys: set[str] = set()
    if mseq is not None:
        memory_keys = {r["key"] for r in tx.run(MEMORY_KEYS_FROM, conversation_id=conversation_id, seq=mseq)}
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
        for statement in (DELETE_CONVERSATION_RELS, *DELETE_CONVERSATION_FACTS):
            tx.run(statement, conversation_id=conversation_id).consume()
        tx.run(DELETE_TURNS, keys=[t["key"] for t in removed]).consume()
        for turn in kept:
            stored_write = {"committed_at": "", **json.loads(turn["write_json"])}
            _apply_facts(tx, TurnWrite.model_validate(stored_write), int(turn["seq"]))
    if mseq is not None:
        tx.run(DELETE_MEMORY_FROM, conversation_id=conversation_id, seq=mseq).consume()
    head = tx.run(CONVERSATION_HEAD, conversation_id=conversation_id).single()
    memory_seq = mseq - 1 if mseq is not None else int(head["memory_seq"] or 0) if head else 0
    turn_seq = max((int(t["seq"]) for t in kept), default=None)
    if memory_seq == 0 and turn_seq is None:
        tx.run(DELETE_CONVERSATION_HEAD, conversation_id=conversation_id).consume()
    elif turn_seq is None:
        tx.run(SET_MEMORY_HEAD_ONLY, conversation_id=conversation_id, memory_seq=memory_seq).consume()
    else:
        tx.run(SET_HEADS, conversation_id=conversation_id, memory_seq=memory_seq, turn_seq=turn_seq).consume()
    return RewindOutcome(
        status="rewound", removed_turns=[str(t["turn_id"]) for t in removed],
        removed_memory=len(memory_keys), replayed=len(kept) if removed else 0,
    )


def _next_turn_seq(tx: ManagedTransaction, conversation_id: str) -> int:
    head = tx.run(CONVERSATION_HEAD, conversation_id=conversation_id).single()
    floor = 0
    if head is None or head["turn_seq"] is None:
        # First commit since the counter exists: a graph from before it may hold turns
        # already (one scan in the conversation's life, never again).
        stats = tx.run(TURN_STATS, conversation_id=conversation_id).single()
        floor = int(stats["max_seq"]) if stats and stats["max_seq"] is not None else 0
    row = tx.run(TURN_SEQ_NEXT, conversation_id=conversation_id, floor=floor).single()
    return int(row["seq"])  # type: ignore[index]


# --- Repository ----------------------------------------------------------------------------


class DialogueRepository:
    """Dialogue-memory reads and writes over a connected GraphStore."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store

    # -- idempotency record
    def get_turn(self, key: str) -> StoredTurn | None:
        rows = self.store.read(READ_TURN, key=key)
        props = rows[0]["props"] if rows else None
        if props is None or props.get("status") != TURN_COMMITTED:
            return None
        return _stored(props)

    # -- the per-conversation lease
    def claim_lock(
        self, conversation_id: str, owner: str, lease_s: float, *, turn_key: str | None = None
    ) -> LockClaim:
        """One attempt to take the lease; `acquired=False` names the current holder.

        With `turn_key`, the turn's committed record is read in the same transaction, under
        the lock (`LockClaim.stored`), so a turn committed while we waited is not redone."""
        key, lease_ms = lock_key(conversation_id), int(lease_s * 1000)
        try:
            return self.store.execute_write(_create_lock_tx, key, conversation_id, owner, lease_ms, turn_key)
        except GraphWriteError as exc:
            if getattr(exc.__cause__, "code", None) not in _CLAIM_RACE_CODES:
                raise
        try:
            return self.store.execute_write(_take_lock_tx, key, owner, lease_ms, turn_key)
        except GraphWriteError as exc:
            if getattr(exc.__cause__, "code", None) in _CLAIM_RACE_CODES:
                return LockClaim(acquired=False, owner=owner, holder="(racing claimant)")
            raise

    def acquire_lock(
        self,
        conversation_id: str,
        owner: str,
        *,
        lease_s: float,
        wait_s: float,
        turn_key: str | None = None,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> LockClaim:
        """Claim the lease, polling with capped backoff for up to `wait_s` seconds
        (`guard` wraps each claim transaction, e.g. the caller's write serialisation)."""
        deadline = time.monotonic() + max(0.0, wait_s)
        delay = 0.02
        while True:
            with guard():
                claim = self.claim_lock(conversation_id, owner, lease_s, turn_key=turn_key)
            left = deadline - time.monotonic()
            if claim.acquired or left <= 0:
                return claim
            time.sleep(min(delay, left))  # the last attempt falls on the deadline
            delay = min(delay * 1.6, 0.25)

    def release_lock(self, conversation_id: str, owner: str) -> bool:
        rows = self.store.write(LOCK_RELEASE, key=lock_key(conversation_id), owner=owner)
        return bool(rows and int(rows[0]["released"]))

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
        return self.store.execute_read(
            _snapshot_tx,
            conversation_id,
            after_seq,
            anchor_key,
            entity_limit,
            relation_limit,
            milestone_limit,
        )

    # -- turn memory (independent of the commit gate)
    def remember(self, conversation_id: str, rows: list[MemoryRow]) -> int:
        """Remember turns (new keys appended in order, known keys left alone): one transaction."""
        return self.store.execute_write(_remember_tx, conversation_id, rows)

    def remembered_keys(self, keys: list[str]) -> set[str]:
        return {r["key"] for r in self.store.read(MEMORY_KEYS_PRESENT, keys=keys)}

    def memory_since(
        self, conversation_id: str, after_seq: int = 0, anchor_key: str | None = None, limit: int | None = None
    ) -> tuple[int, bool, list[MemoryRow]]:
        """(memory head, reset, the remembered turns after position `after_seq`)."""
        return self.store.execute_read(_memory_since_tx, conversation_id, after_seq, anchor_key, limit)

    def memory_count(self, conversation_id: str) -> tuple[int, int]:
        """(rows, distinct keys) of a conversation's memory: an audit, scans the conversation."""
        row = self.store.read(MEMORY_COUNT, conversation_id=conversation_id)[0]
        return int(row["n"]), int(row["keys"])

    # -- the one commit transaction
    def commit_turn(self, write: TurnWrite, owner: str, build_result: ResultBuilder) -> CommitOutcome:
        return self.store.execute_write(_commit_tx, write, owner, build_result)

    # -- inspection (tests, reports, operators)
    def relations(self, conversation_id: str) -> list[DialogueRelation]:
        return [_relation(r) for r in self.store.read(ALL_RELATIONS, conversation_id=conversation_id)]

    def events(self, conversation_id: str) -> list[dict[str, Any]]:
        return [r["props"] for r in self.store.read(ALL_EVENTS, conversation_id=conversation_id)]

    def turns(self, conversation_id: str) -> list[dict[str, Any]]:
        return self.store.read(ALL_TURNS, conversation_id=conversation_id)

    def entities(self, conversation_id: str, limit: int = 10_000) -> list[DialogueEntity]:
        rows = self.store.read(ENTITIES, conversation_id=conversation_id, limit=limit)
        return [_entity(r["props"]) for r in rows]

    def milestones(self, conversation_id: str, limit: int = 10_000) -> list[DialogueMilestone]:
        rows = self.store.read(RECENT_MILESTONES, conversation_id=conversation_id, limit=limit)
        return sorted((_milestone(r["props"]) for r in rows), key=lambda m: (m.seq, m.milestone_id))

    # -- edits, swipes, rewinds
    def rewind(
        self, conversation_id: str, key: str, owner: str,
        *, guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> RewindOutcome:
        """Remove remembered turn `key` and every later one (the caller holds the lease)."""
        with guard():
            return self.store.execute_write(_rewind_tx, conversation_id, key, owner)

    def remembered_text(self, key: str) -> str | None:
        """The remembered text of turn `key` (None: not remembered)."""
        rows = self.store.read(MEMORY_TEXT_OF, key=key)
        return str(rows[0]["text"]) if rows else None

    # -- read-back (paged)
    def entity_page(self, conversation_id: str, offset: int, limit: int) -> tuple[int, list[DialogueEntity]]:
        rows = self.store.read(ENTITY_PAGE, conversation_id=conversation_id, offset=offset, limit=limit)
        total = self.store.read(ENTITY_TOTAL, conversation_id=conversation_id)[0]["n"]
        return int(total), [_entity(r["props"]) for r in rows]

    def relation_page(
        self, conversation_id: str, offset: int, limit: int
    ) -> tuple[int, list[tuple[DialogueRelation, list[dict[str, Any]]]]]:
        """Relations (active and ended) with their event history, oldest first."""
        rels = [_relation(r) for r in self.store.read(RELATION_PAGE, conversation_id=conversation_id,
                                                      offset=offset, limit=limit)]
        total = self.store.read(RELATION_TOTAL, conversation_id=conversation_id)[0]["n"]
        events: dict[str, list[dict[str, Any]]] = {r.rel_id: [] for r in rels}
        if rels:
            for row in self.store.read(RELATION_EVENTS, conversation_id=conversation_id, rel_ids=list(events)):
                events[row["props"]["rel_id"]].append(row["props"])
        return int(total), [(r, events[r.rel_id]) for r in rels]

    def milestone_page(self, conversation_id: str, offset: int, limit: int) -> tuple[int, list[DialogueMilestone]]:
        rows = self.store.read(MILESTONE_PAGE, conversation_id=conversation_id, offset=offset, limit=limit)
        total = self.store.read(MILESTONE_TOTAL, conversation_id=conversation_id)[0]["n"]
        return int(total), [_milestone(r["props"]) for r in rows]

    def memory_page(self, conversation_id: str, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
        """Remembered turns by position (committed or blocked by the gate): index range reads."""
        head = self.store.read(CONVERSATION_HEAD, conversation_id=conversation_id)
        total = int(head[0]["memory_seq"] or 0) if head else 0
        rows = self.store.read(MEMORY_PAGE_ROWS, conversation_id=conversation_id, offset=offset,
                               until=offset + limit)
        return total, rows

    def delete_conversation(self, conversation_id: str) -> None:
        """Forget a conversation entirely (one transaction), including a stale lease."""

        def work(tx: ManagedTransaction) -> None:
            tx.run(DELETE_CONVERSATION_RELS, conversation_id=conversation_id).consume()
            for statement in DELETE_CONVERSATION_NODES:
                tx.run(statement, conversation_id=conversation_id).consume()
            tx.run(DELETE_CONVERSATION_LOCK, key=lock_key(conversation_id)).consume()

        self.store.execute_write(work)


def payload_digest(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
