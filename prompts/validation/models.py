"""Output models of the validation agent (quality scores, revision guidance)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

_SCORE = "a decimal from 0.0 (poor) to 1.0 (excellent); 0.7 means 7 out of 10"


class QualityScores(BaseModel):
    """quality.j2: each score a decimal from 0.0 (poor) to 1.0 (excellent).

    One scale, stated in the schema. An answer on another scale is rejected (the gateway
    asks again with the error), never rescaled: "1" is perfect on 0-1 and poor on 0-10, and
    no rule can tell which the model meant. So a bare integer other than 0 is rejected as
    ambiguous, and so is anything above 1.
    """

    model_config = ConfigDict(extra="ignore")

    coherence: float = Field(ge=0.0, le=1.0, description=_SCORE)
    prose_quality: float = Field(ge=0.0, le=1.0, description=_SCORE)
    plot_advancement: float = Field(ge=0.0, le=1.0, description=_SCORE)
    pacing: float = Field(ge=0.0, le=1.0, description=_SCORE)
    tone_consistency: float = Field(ge=0.0, le=1.0, description=_SCORE)
    feedback: str = ""

    @field_validator(
        "coherence",
        "prose_quality",
        "plot_advancement",
        "pacing",
        "tone_consistency",
        mode="before",
    )
    @classmethod
    def _one_scale(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a score is a decimal from 0.0 to 1.0, not true/false")
        if isinstance(value, int) and value != 0:
            raise ValueError(
                f"the integer {value} is ambiguous (a 0-10 or 0-100 scale?); "
                "write every score as a decimal from 0.0 to 1.0, e.g. 0.7"
            )
        if isinstance(value, float) and value > 1.0:
            raise ValueError(
                f"{value} is above 1.0: scores are decimals from 0.0 to 1.0, not a 0-10 or 0-100 scale"
            )
        return value

    @property
    def mean(self) -> float:
        return (
            self.coherence
            + self.prose_quality
            + self.plot_advancement
            + self.pacing
            + self.tone_consistency
        ) / 5


class RevisionGuidance(BaseModel):
    """revision_guidance.j2"""

    model_config = ConfigDict(extra="ignore")

    problems: list[str] = Field(default_factory=list, max_length=12)
    guidance: str = Field(min_length=1)
