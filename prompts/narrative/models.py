"""Output models of the narrative agent (scene planning; drafting returns prose)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SceneDetail(BaseModel):
    model_config = ConfigDict(extra="ignore")

    title: str
    pov: str = Field(description="point-of-view character")
    setting: str = Field(description="where the scene happens")
    characters: list[str] = Field(
        default_factory=list, max_length=12, description="characters present"
    )
    beats: list[str] = Field(
        default_factory=list, max_length=10, description="what happens, in order"
    )


class ScenePlan(BaseModel):
    """scene_plan.j2"""

    model_config = ConfigDict(extra="ignore")

    scenes: list[SceneDetail] = Field(min_length=1, max_length=20)


class ChapterOutlineRefresh(BaseModel):
    """chapter_outline.j2: one chapter's outline, refreshed from what the book has become."""

    model_config = ConfigDict(extra="ignore")

    title: str = ""
    summary: str = ""
    pov: str = Field("", description="point-of-view character")
    setting: str = ""
    key_beats: list[str] = Field(default_factory=list, max_length=8)
