"""Output models of the knowledge agent (extraction, summaries, enrichment)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EntityKind = Literal["Character", "Location", "Item", "Event", "Organization", "Concept"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExtractedEntity(_Out):
    name: str = Field(min_length=1)
    kind: EntityKind
    description: str = ""
    traits: list[str] = Field(default_factory=list, max_length=8)
    presence: Literal["present", "mentioned"] = Field(
        "present",
        description="present: on the scene and acting; mentioned: only remembered, mourned, talked or thought about",
    )


class ExtractedRelationship(_Out):
    source: str
    target: str
    type: str = Field(description="UPPER_SNAKE_CASE, e.g. FRIEND_OF, LOCATED_IN, OWNS")
    description: str = ""


class StatusChange(_Out):
    name: str
    status: Literal["alive", "dead", "missing", "injured", "imprisoned"]


class SceneExtraction(_Out):
    """extraction.j2"""

    entities: list[ExtractedEntity] = Field(default_factory=list, max_length=40)
    relationships: list[ExtractedRelationship] = Field(default_factory=list, max_length=40)
    status_changes: list[StatusChange] = Field(default_factory=list, max_length=12)


class ChapterSummary(_Out):
    """summary.j2"""

    summary: str = Field(min_length=1)
    key_events: list[str] = Field(default_factory=list, max_length=12)


class EntityEnrichment(_Out):
    """enrichment.j2"""

    summary: str = Field(min_length=1)
    facets: list[str] = Field(default_factory=list, max_length=10, description="short descriptive tags")
    confidence: float = Field(0.5, ge=0.0, le=1.0)
