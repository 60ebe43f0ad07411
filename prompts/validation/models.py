"""Output models of the validation agent (quality scores, revision guidance)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class QualityScores(BaseModel):
    """quality.j2: each score from 0 (poor) to 1 (excellent)."""

    model_config = ConfigDict(extra="ignore")

    coherence: float = Field(ge=0.0, le=1.0)
    prose_quality: float = Field(ge=0.0, le=1.0)
    plot_advancement: float = Field(ge=0.0, le=1.0)
    pacing: float = Field(ge=0.0, le=1.0)
    tone_consistency: float = Field(ge=0.0, le=1.0)
    feedback: str = ""

    @field_validator("coherence", "prose_quality", "plot_advancement", "pacing", "tone_consistency", mode="before")
    @classmethod
    def _rescale(cls, value: Any) -> Any:
        # Models often answer on a 0-10 or 0-100 scale ("8" meaning 8/10) despite the prompt;
        # that is a unit slip, not a bad review. Anything outside 0-100 still fails.
        if isinstance(value, int | float) and not isinstance(value, bool):
            if 1.0 < value <= 10.0:
                return value / 10.0
            if 10.0 < value <= 100.0:
                return value / 100.0
        return value

    @property
    def mean(self) -> float:
        return (self.coherence + self.prose_quality + self.plot_advancement + self.pacing + self.tone_consistency) / 5


class RevisionGuidance(BaseModel):
    """revision_guidance.j2"""

    model_config = ConfigDict(extra="ignore")

    problems: list[str] = Field(default_factory=list, max_length=12)
    guidance: str = Field(min_length=1)
