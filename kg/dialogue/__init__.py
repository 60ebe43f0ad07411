"""Dialogue memory in the graph (spec 000 section 4): Cypher, transactions and the repository.

Per conversation the sidecar keeps:

- `KGEntity {conversation_id, entity_id, name, kind, aliases, bio_summary, bio_traits, ...}`
- `(:KGEntity)-[:KG_REL {rel_id, conversation_id, type, weight, status, ...}]->(:KGEntity)`;
  a relation is never deleted, only ended (`status: 'ended'`), so history stays queryable
- `KGRelEvent {event_id, conversation_id, turn_id, action, from_type, to_type,
  weight_before, weight_after, ...}`: one per applied relation action (the mutation log)
- `KGMilestone {milestone_id, conversation_id, turn_id, text, ...}`
- `KGTurn {key: "conversation_id:turn_id", payload_hash, status, result_json, seq, text, ...}`:
  the persisted idempotency record of a COMMITTED turn (`payload_conversation_id`: the id its
  payload hash was computed with, on a turn of a renamed or copied conversation); its
  operational fields (`committed_at`, `committed_by`, `trace_json`: when, by which process, the
  slot timings) are left out of exports (kg.vocabulary.OPERATIONAL_PROPERTIES)
- `KGMemory {key, conversation_id, seq, position_key, speaker, text, extra, when, group,
  source_refs, embedding, embedded_by, committed}`: every turn's text, the recall document,
  written whether or not the turn's facts passed the commit gate (the gate governs graph facts
  only); `embedded_by` names the model that made `embedding` (re-embedding replaces both);
  `seq` is the turn's position in the conversation's memory, `position_key` =
  "conversation_id\\x1fseq" is unique and indexed so reads by position are index lookups
- `KGConversation {conversation_id, memory_seq, turn_seq, vectors_epoch}`: the position
  counters, so no write counts or scans a conversation's turns, and how often its rows were
  re-embedded

The per-conversation lock is a lease node `KGTurn {key: "lock\\x1f<conversation_id>",
status: 'LOCK', owner, expires_at}` (the vocabulary has no lock label; the control
character cannot occur in a validated turn key, so the two key spaces never meet). It is
claimed with a compare-and-set in a write transaction, is short and renewed by a heartbeat
while its turn runs, is stealable once expired (a crashed process blocks a conversation for
one short lease, a slow live one is never robbed), and is deleted on release, so a turn that
rolls back leaves the graph byte-identical. The commit transaction deletes the lease as its
first statement and aborts when it is no longer ours: a holder whose lease was stolen can
never commit (fencing).

Every value is a parameter; labels and the relationship type come from kg.vocabulary.
Every write runs in `GraphStore.execute_write` (managed, retried on transient errors such as
ArcadeDB's DeadlockDetected), so each transaction function may run more than once
and keeps no side effects outside the transaction.

One concern per module:

- `cypher`: every statement above (values are parameters, labels from kg.vocabulary);
- `models`: what is read, what a turn writes, the outcomes and errors;
- `keys`: turn, lease, entity, memory-position keys and the payload digest;
- `records`: property maps -> models;
- `lease`: the per-conversation lock (claim, compare-and-set take-over, polling);
- `memory`: episodic memory rows, appended once, read by position;
- `snapshot`: the retriever's read of one turn;
- `turn_commit`: the one commit transaction of a turn;
- `rewind`: exact rewinds for edits and swipes;
- `forget`: a whole conversation removed (its chat was deleted);
- `rename`: a whole conversation moved (its chat was renamed) or copied (branched) to another id;
- `lore`: the read behind a conversation's lorebook (all it holds now, one transaction);
- `repository`: `DialogueRepository`, the entry point the sidecar uses.
"""

from kg.dialogue.keys import dialogue_entity_id, lock_key, payload_digest, position_key, turn_key
from kg.dialogue.lore import ConversationLore, LoreEntity, LoreRelation, StatedFacts
from kg.dialogue.memory import anchor_token
from kg.dialogue.models import (
    EVOLVE_BASE_WEIGHT,
    LOCK_STATUS,
    REL_ACTIVE,
    REL_ENDED,
    TURN_COMMITTED,
    AppliedAction,
    BioPatchWrite,
    CommitOutcome,
    ConversationContents,
    ConversationSnapshot,
    DialogueEntity,
    DialogueMilestone,
    DialogueRelation,
    EntityWrite,
    LockClaim,
    LostLockError,
    MemoryRow,
    MilestoneWrite,
    RelationActionWrite,
    RenameRefusedError,
    RewindOutcome,
    RewindRefusedError,
    StoredTurn,
    TurnWrite,
    VectorWrite,
)
from kg.dialogue.repository import DialogueRepository
from kg.dialogue.turn_commit import ResultBuilder

__all__ = [
    "EVOLVE_BASE_WEIGHT",
    "LOCK_STATUS",
    "REL_ACTIVE",
    "REL_ENDED",
    "TURN_COMMITTED",
    "AppliedAction",
    "BioPatchWrite",
    "CommitOutcome",
    "ConversationContents",
    "ConversationLore",
    "ConversationSnapshot",
    "DialogueEntity",
    "DialogueMilestone",
    "DialogueRelation",
    "DialogueRepository",
    "EntityWrite",
    "LockClaim",
    "LoreEntity",
    "LoreRelation",
    "LostLockError",
    "MemoryRow",
    "MilestoneWrite",
    "RelationActionWrite",
    "ResultBuilder",
    "RewindOutcome",
    "RenameRefusedError",
    "RewindRefusedError",
    "StatedFacts",
    "StoredTurn",
    "TurnWrite",
    "VectorWrite",
    "anchor_token",
    "dialogue_entity_id",
    "lock_key",
    "payload_digest",
    "position_key",
    "turn_key",
]
