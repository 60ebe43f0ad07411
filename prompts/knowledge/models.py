"""Output models of the knowledge agent (extraction, summaries, enrichment)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

EntityKind = Literal["Character", "Location", "Item", "Event", "Organization", "Concept"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


QUOTE_DESCRIPTION = "the words of the scene that state this, copied exactly (one sentence or less)"


class ExtractedTrait(_Out):
    trait: str = Field(min_length=1, description="one word or a short phrase")
    quote: str = Field("", max_length=300, description=QUOTE_DESCRIPTION)


class ExtractedEntity(_Out):
    name: str = Field(min_length=1, description="the name exactly as the scene writes it")
    kind: EntityKind
    description: str = ""
    quote: str = Field("", max_length=300, description=QUOTE_DESCRIPTION)
    traits: list[ExtractedTrait] = Field(default_factory=list, max_length=8)
    presence: Literal["present", "mentioned"] = Field(
        "present",
        description="present: on the scene and acting; mentioned: only remembered, mourned, talked or thought about",
    )

    @field_validator("traits", mode="before")
    @classmethod
    def _plain_traits(cls, value: Any) -> Any:
        # A trait given as a bare word (extractions stored before quotes existed) has no evidence.
        if isinstance(value, list):
            return [{"trait": item} if isinstance(item, str) else item for item in value]
        return value

    @property
    def trait_names(self) -> list[str]:
        return [t.trait for t in self.traits]


class ExtractedRelationship(_Out):
    source: str
    target: str
    type: str = Field(description="UPPER_SNAKE_CASE, e.g. FRIEND_OF, LOCATED_IN, OWNS")
    description: str = ""
    quote: str = Field("", max_length=300, description=QUOTE_DESCRIPTION)


class StatusChange(_Out):
    name: str
    status: Literal["alive", "dead", "missing", "injured", "imprisoned"]
    quote: str = Field("", max_length=300, description=QUOTE_DESCRIPTION)


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
    facets: list[str] = Field(
        default_factory=list, max_length=10, description="short descriptive tags"
    )
    confidence: float = Field(0.5, ge=0.0, le=1.0)
