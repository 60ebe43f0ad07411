"""The dialogue memory's models at the boundary: what is read (entities, relations,
milestones, memory rows, the retriever's snapshot), what a turn writes, and the outcomes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import GraphWriteError
from kg import vocabulary as vocab

TURN_COMMITTED = "COMMITTED"
LOCK_STATUS = "LOCK"
REL_ACTIVE = "active"
REL_ENDED = "ended"
#: Strength a relation starts from when EVOLVE creates it.
EVOLVE_BASE_WEIGHT = 0.5


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
    quote: str = Field("", description="the words of the turn behind the relation's latest change")


class DialogueMilestone(_Model):
    milestone_id: str
    turn_id: str
    seq: int
    text: str
    importance: float = 0.5
    entity_ids: list[str] = Field(default_factory=list)
    quote: str = Field("", description="the words of the turn that state it")


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
    embedded_by: str = Field(
        "",
        description="the embedding model that made `embedding` (its fingerprint, "
        "LLMGateway.embedding_fingerprint); empty on rows remembered before it was recorded",
    )
    committed: bool = False


class VectorWrite(_Model):
    """A remembered turn's new vector (re-embedding): written only while its text is `text`."""

    key: str
    text: str
    embedding: list[float]


class ConversationSnapshot(_Model):
    """What the retriever reads for one turn, from one read transaction."""

    entities: list[DialogueEntity]
    relations: list[DialogueRelation]
    milestones: list[DialogueMilestone]
    new_turns: list[MemoryRow]
    turn_count: int = Field(description="turns remembered in this conversation")
    max_seq: int
    reset: bool = Field(
        False, description="the caller's anchor turn is gone: new_turns holds every turn"
    )
    vectors_epoch: int = Field(
        0,
        description="how many times the conversation's rows were re-embedded (a reader's "
        "cache of an older epoch is reset)",
    )


class StoredTurn(_Model):
    key: str
    conversation_id: str
    turn_id: str
    seq: int
    payload_hash: str
    status: str
    result_json: str
    trace_json: str = Field(
        "", description="the original commit's trace (operational: not exported)"
    )
    payload_conversation_id: str | None = Field(
        None,
        description="the conversation id the payload hash was computed with, when the "
        "conversation was renamed since (kg.dialogue.rename)",
    )


class LockClaim(_Model):
    acquired: bool
    owner: str
    holder: str | None = None
    expires_in_ms: int = 0
    stolen_from: str | None = None
    stored: StoredTurn | None = Field(
        None, description="the turn's committed record, read under the lock"
    )


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
    from_type: str | None = Field(
        None, description="REPLACE: the type ended (None: every other type)"
    )
    weight_delta: float = 0.0
    weight: float = EVOLVE_BASE_WEIGHT
    reason: str = ""
    quote: str = Field("", description="the evidence: words of the turn that state it")


class BioPatchWrite(_Model):
    entity_id: str
    summary: str | None = None
    traits_add: list[str] = Field(default_factory=list)
    traits_remove: list[str] = Field(default_factory=list)
    quote: str = Field("", description="the evidence: words of the turn that state it")


class MilestoneWrite(_Model):
    text: str
    importance: float = 0.5
    entity_ids: list[str] = Field(default_factory=list)
    quote: str = Field("", description="the evidence: words of the turn that state it")


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
    memory: MemoryRow | None = Field(
        None, description="the turn's memory row, written in the same transaction"
    )
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


class ConversationContents(_Model):
    """What the graph holds of one conversation (what forgetting it removes)."""

    turns: int = Field(0, description="committed turn records")
    memory: int = Field(0, description="remembered turns (committed, gate-blocked or ingested)")
    entities: int = 0
    relations: int = 0
    milestones: int = 0


class RewindRefusedError(GraphWriteError):
    """A rewind would need a turn's stored write, which turns committed before rewinds existed lack."""


class RenameRefusedError(GraphWriteError):
    """A rename would merge two conversations' memory, or needs a stored write a turn lacks."""


class LostLockError(GraphWriteError):
    """The conversation's lease expired and was taken over before this turn could commit."""
