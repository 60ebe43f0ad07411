"""Output models of the validation agent (quality scores, revision guidance)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class QualityScores(BaseModel):
    """quality.j2: each score from 0 (poor) to 1 (excellent)."""

    model_config = ConfigDict(extra="ignore")

    coherence: float = Field(ge=0.0, le=1.0)
    prose_quality: float = Field(ge=0.0, le=1.0)
    plot_advancement: float = Field(ge=0.0, le=1.0)
    pacing: float = Field(ge=0.0, le=1.0)
    tone_consistency: float = Field(ge=0.0, le=1.0)
    feedback: str = ""

    @property
    def mean(self) -> float:
        return (self.coherence + self.prose_quality + self.plot_advancement + self.pacing + self.tone_consistency) / 5


class RevisionGuidance(BaseModel):
    """revision_guidance.j2"""

    model_config = ConfigDict(extra="ignore")

    problems: list[str] = Field(default_factory=list, max_length=12)
    guidance: str = Field(min_length=1)
