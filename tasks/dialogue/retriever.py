"""Retriever slot: graph recall + vector recall for one conversation.

Graph recall: the conversation's entities named in the latest messages (by normalised name
or alias), the active relations touching them, then the strongest relations overall, and
the latest milestones. Vector recall: cosine similarity (numpy) between the latest messages
and every committed turn's stored embedding (turn text + extracted facts).

Embeddings live on the KGTurn nodes (ArcadeDB has no vector index; Neo4j's is optional), and
each process keeps them in an in-memory matrix per conversation that is topped up from the
graph incrementally by turn sequence number, so a turn reads only what it has not seen,
including turns other processes committed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from core.llm import LLMGateway
from kg import vocabulary as vocab
from kg.dialogue import (
    ConversationSnapshot,
    DialogueEntity,
    DialogueMilestone,
    DialogueRelation,
    DialogueRepository,
    TurnVector,
)
from tasks.dialogue.models import ChatMessage


class RecalledTurn(BaseModel):
    key: str
    turn_id: str
    seq: int
    speaker: str
    text: str
    facts: list[str] = Field(default_factory=list)
    source_refs: list[str] = Field(default_factory=list)
    score: float


class Retrieval(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    known_entities: list[DialogueEntity] = Field(default_factory=list)
    mentioned: list[DialogueEntity] = Field(default_factory=list)
    relations: list[DialogueRelation] = Field(default_factory=list)
    milestones: list[DialogueMilestone] = Field(default_factory=list)
    recalled: list[RecalledTurn] = Field(default_factory=list)
    stored_turns: int = 0


@dataclass
class TurnVectorIndex:
    """The committed turns of one conversation with their embeddings (unit-normalised)."""

    turns: list[TurnVector] = field(default_factory=list)
    matrix: np.ndarray | None = None
    max_seq: int = 0
    anchor_key: str | None = None  # key of turn `max_seq`: proves the cache is still current
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cursor(self) -> tuple[int, str | None]:
        with self.lock:
            return self.max_seq, self.anchor_key

    def sync(self, snapshot: ConversationSnapshot) -> None:
        with self.lock:
            if snapshot.reset:
                self.turns, self.matrix, self.max_seq, self.anchor_key = [], None, 0, None
            fresh = [t for t in snapshot.new_turns if t.seq > self.max_seq]
            if not fresh:
                return
            last = max(fresh, key=lambda t: t.seq)
            self.max_seq, self.anchor_key = last.seq, last.key
            embedded = [t for t in fresh if t.embedding]
            if not embedded:
                return
            rows = np.asarray([t.embedding for t in embedded], dtype=np.float32)
            if self.matrix is not None and rows.shape[1] != self.matrix.shape[1]:
                # The embedding model changed: older vectors are not comparable any more.
                self.turns, self.matrix = [], None
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
            self.turns.extend(embedded)
            self.matrix = rows if self.matrix is None else np.vstack([self.matrix, rows])

    def search(self, query: np.ndarray, k: int) -> list[RecalledTurn]:
        with self.lock:
            if self.matrix is None or k <= 0 or query.shape[-1] != self.matrix.shape[1]:
                return []
            q = query.astype(np.float32).reshape(-1)
            q = q / max(float(np.linalg.norm(q)), 1e-12)
            scores = self.matrix @ q
            top = np.argsort(-scores, kind="stable")[:k]
            return [
                RecalledTurn(
                    key=self.turns[i].key,
                    turn_id=self.turns[i].turn_id,
                    seq=self.turns[i].seq,
                    speaker=self.turns[i].speaker,
                    text=self.turns[i].text,
                    facts=self.turns[i].facts,
                    source_refs=self.turns[i].source_refs,
                    score=round(float(scores[i]), 6),
                )
                for i in top
            ]


class VectorIndexRegistry:
    """One TurnVectorIndex per (graph, conversation) in this process."""

    def __init__(self) -> None:
        self._indexes: dict[tuple[str, str], TurnVectorIndex] = {}
        self._lock = threading.Lock()

    def get(self, graph: str, conversation_id: str) -> TurnVectorIndex:
        with self._lock:
            return self._indexes.setdefault((graph, conversation_id), TurnVectorIndex())


def mentioned_entities(entities: list[DialogueEntity], text: str) -> list[DialogueEntity]:
    """Entities whose name or an alias occurs as whole words in `text` (normalised)."""
    haystack = f" {vocab.normalize_name(text)} "
    found = []
    for entity in entities:
        keys = {vocab.normalize_name(entity.name), *(vocab.normalize_name(a) for a in entity.aliases)}
        if any(key and f" {key} " in haystack for key in keys):
            found.append(entity)
    return found


def select_relations(
    relations: list[DialogueRelation], focus: set[str], limit: int
) -> list[DialogueRelation]:
    """Relations touching the focus entities first (strongest first), then the strongest others."""
    touching = [r for r in relations if r.source_id in focus or r.target_id in focus]
    others = [r for r in relations if r not in touching]
    ranked = sorted(touching, key=lambda r: -r.weight) + sorted(others, key=lambda r: -r.weight)
    return ranked[:limit]


def turn_text(messages: list[ChatMessage]) -> str:
    return "\n".join(m.line() for m in messages)


def retrieve(
    repo: DialogueRepository,
    gateway: LLMGateway,
    index: TurnVectorIndex,
    conversation_id: str,
    messages: list[ChatMessage],
    *,
    recall_k: int,
    relation_limit: int = 12,
    purpose: str = "",
) -> Retrieval:
    after_seq, anchor = index.cursor()
    snapshot = repo.snapshot(conversation_id, after_seq=after_seq, anchor_key=anchor)
    index.sync(snapshot)
    query = turn_text(messages)
    mentioned = mentioned_entities(snapshot.entities, query)
    relations = select_relations(snapshot.relations, {e.entity_id for e in mentioned}, relation_limit)
    recalled: list[RecalledTurn] = []
    if recall_k > 0 and index.turns:
        # Nothing stored yet means nothing to search: the first turn makes no embedding call.
        vector = gateway.embed([query], purpose=purpose)[0]
        recalled = index.search(vector, recall_k)
    return Retrieval(
        known_entities=snapshot.entities,
        mentioned=mentioned,
        relations=relations,
        milestones=snapshot.milestones,
        recalled=recalled,
        stored_turns=snapshot.turn_count,
    )


def recall(
    repo: DialogueRepository,
    gateway: LLMGateway,
    index: TurnVectorIndex,
    conversation_id: str,
    query: str,
    k: int,
    *,
    purpose: str = "dialogue.recall",
) -> list[RecalledTurn]:
    """Vector recall for an arbitrary question (the regression batch's recall probe)."""
    after_seq, anchor = index.cursor()
    index.sync(
        repo.snapshot(
            conversation_id, after_seq=after_seq, anchor_key=anchor, entity_limit=1, relation_limit=1
        )
    )
    if not index.turns:
        return []
    return index.search(gateway.embed([query], purpose=purpose)[0], k)
