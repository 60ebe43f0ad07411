"""Output models of the initialization agent (character sheets, outlines, relationships)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CharacterSheet(_Out):
    name: str = Field(min_length=1, max_length=200)
    role: str = Field(description="protagonist, antagonist, supporting, ...")
    description: str
    traits: list[str] = Field(
        default_factory=list, max_length=8, description="single-word personality traits"
    )
    motivation: str = ""
    backstory: str = ""
    voice: str = Field("", description="how they speak: diction, rhythm, verbal habits")


class CharacterSheets(_Out):
    """character_sheets.j2"""

    characters: list[CharacterSheet] = Field(min_length=1, max_length=12)


class ActSummary(_Out):
    number: int = Field(ge=1)
    summary: str


class GlobalOutline(_Out):
    """global_outline.j2"""

    title: str = Field(min_length=1)
    logline: str
    setting: str
    themes: list[str] = Field(default_factory=list, max_length=8)
    acts: list[ActSummary] = Field(min_length=1, max_length=10)


class ActOutline(_Out):
    """act_outline.j2"""

    summary: str
    key_events: list[str] = Field(default_factory=list, max_length=12)


class ChapterOutline(_Out):
    number: int = Field(ge=1)
    title: str
    summary: str
    pov: str = ""
    setting: str = ""
    key_beats: list[str] = Field(default_factory=list, max_length=8)


class ChapterOutlines(_Out):
    """chapter_outlines.j2"""

    chapters: list[ChapterOutline] = Field(min_length=1, max_length=60)


class OutlineRelationship(_Out):
    source: str
    target: str
    type: str = Field(description="e.g. FRIEND_OF, ENEMY_OF, FAMILY_OF, LOVES, MENTORS, WORKS_FOR")
    description: str = ""


class OutlineLocation(_Out):
    name: str
    description: str = ""


class OutlineRelationships(_Out):
    """relationships.j2"""

    relationships: list[OutlineRelationship] = Field(default_factory=list, max_length=8)
    locations: list[OutlineLocation] = Field(default_factory=list, max_length=6)
