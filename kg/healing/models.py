"""Healing's models at the boundary: pair evidence, merge plans and results, graduation and
enrichment records (tasks/healing.py reports them; nothing here touches the graph)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

#: Embedder: texts -> float array of shape (len(texts), dim).
Embedder = Callable[[Sequence[str]], np.ndarray]
NameMatch = Literal["same", "nickname", "contained", "similar"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PairEvidence(_Model):
    """Why two entities are (or are not) the same, as scored by `detect_duplicates`."""

    a_id: str
    b_id: str
    a_name: str
    b_name: str
    name_score: float
    name_match: NameMatch = "similar"
    shared_neighbours: int = 0
    overlap: float = Field(0.0, description="Jaccard overlap of the story neighbours")
    embedding_score: float | None = None
    veto: str | None = None
    accepted: bool = False
    score: float = Field(0.0, description="combined evidence, orders cluster joins")


class MergePlan(_Model):
    label: str
    survivor_id: str
    survivor_name: str
    merged_ids: list[str]
    merged_names: list[str]
    evidence: list[PairEvidence]

    @property
    def score(self) -> float:
        return max((e.score for e in self.evidence), default=0.0)


class DetectionStats(_Model):
    entities: int
    blocks: int
    candidate_pairs: int
    name_matches: int
    accepted_pairs: int
    vetoed_pairs: int
    embedded_entities: int
    seconds: float


class DetectionResult(_Model):
    plans: list[MergePlan]
    stats: DetectionStats
    vetoed: list[PairEvidence] = Field(default_factory=list)
    latest_chapter: int | None = Field(None, description="newest Chapter node when detection ran")


class MergeResult(_Model):
    survivor_id: str
    name: str
    merged_ids: list[str]
    merged_names: list[str]
    audit_id: str | None = None
    aliases: list[str] = Field(default_factory=list)
    sources: int = 0
    relationships_moved: int = 0
    relationships_deduplicated: int = 0
    relationships_dropped: int = Field(
        0, description="between merged entities (would be self-loops)"
    )
    skipped: str | None = Field(None, description="why nothing was written")


class Graduation(_Model):
    id: str
    name: str
    confidence: float
    connectivity: float
    completeness: float
    age: float


class EnrichmentTarget(_Model):
    id: str
    name: str
    label: str
    description: str
    relationship_count: int
    relationships: list[str]
    last_chapter: int | None = None


class EnrichmentResult(_Model):
    id: str
    name: str
    relationship_count: int
    summary: str
    facets: list[str] = Field(default_factory=list)
    confidence: float


class AttachedRel(BaseModel):
    """A relationship of an entity a merge touches (maintenance_cypher.RELS_OF), seen from the
    entity `id`; its `other` end may be any node (no id, or no entity label)."""

    model_config = ConfigDict(frozen=True)

    id: str
    type: str
    outgoing: bool
    props: dict[str, Any]
    other: str | None
    other_labels: tuple[str, ...] = ()

    @property
    def fact(self) -> tuple[str, bool, str | None, Any]:
        """What the survivor keeps one copy of: (type, direction, other end, chapter)."""
        return (self.type, self.outgoing, self.other, self.props.get("chapter"))
