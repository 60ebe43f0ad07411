"""Pydantic domain models at the boundary of the graph layer.

`ChapterDelta` is what the chapter flow hands to `GraphStore.commit_chapter`; `Entity` is
both an input (inside a delta) and what the store returns. Labels and relationship types
are normalised into the fixed vocabulary on validation, so a model's free-form "is
friends with" arrives as FRIEND_OF with `raw_type` keeping the original text.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kg import vocabulary as vocab

if TYPE_CHECKING:
    import numpy as np

Scalar = str | bool | int | float
#: Values an entity attribute or property update may carry (stored as JSON on the node).
AttrValue = Scalar | list[Scalar]
SourceType = Literal["user", "outline", "extraction", "enrichment", "merge"]

_PROP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _non_blank(value: str) -> str:
    # Names are stored verbatim (whitespace included); they only have to say something.
    if not value.strip():
        raise ValueError("must not be blank")
    return value


class EntitySource(_Model):
    """Provenance of an entity (spec 003): who or what produced it, from where."""

    type: SourceType
    chapter: int | None = Field(None, ge=0)
    scene: int | None = Field(None, ge=0)
    original_name: str | None = None
    confidence: float | None = Field(None, ge=0.0, le=1.0)
    created_by: str | None = None
    #: The evidence: words of the source text (a scene, a turn) that state the fact.
    quote: str | None = None
    #: What the quote is evidence of: the entity itself (None or "mention"), one of its
    #: traits, or a status change; `value` is then the trait or the status.
    fact: Literal["mention", "trait", "status"] | None = None
    value: str | None = None
    # ISO-8601 text chosen by the caller: the store adds no clock values of its own, so a
    # delta committed twice (or on two machines) produces byte-identical graphs.
    created_at: str | None = None


class StatusInterval(_Model):
    """`status` holds from `from_chapter` through `to_chapter` (inclusive; None = open)."""

    status: str = Field(min_length=1, max_length=64)
    from_chapter: int = Field(ge=0)
    to_chapter: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> StatusInterval:
        if self.to_chapter is not None and self.to_chapter < self.from_chapter:
            raise ValueError("to_chapter must not be before from_chapter")
        return self

    def covers(self, chapter: int) -> bool:
        return self.from_chapter <= chapter and (
            self.to_chapter is None or chapter <= self.to_chapter
        )


def _label_before(data: Any, field: str, raw_field: str) -> Any:
    if isinstance(data, dict) and isinstance(data.get(field), str):
        label, raw = vocab.normalize_label(data[field])
        data = {**data, field: label}
        if raw is not None and raw_field and not data.get(raw_field):
            data[raw_field] = raw
    return data


class Entity(_Model):
    """A story entity. `id` is optional on input: the store resolves or derives it."""

    id: str | None = Field(None, min_length=1, max_length=512)
    label: str
    raw_label: str | None = None
    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    description: str = ""
    traits: list[str] = Field(default_factory=list)
    attributes: dict[str, AttrValue] = Field(default_factory=dict)
    sources: list[EntitySource] = Field(default_factory=list)
    # None on input means "decide from the sources": user/outline entities are confirmed.
    is_provisional: bool | None = None
    first_chapter: int | None = Field(None, ge=0)
    last_chapter: int | None = Field(None, ge=0)
    status_intervals: list[StatusInterval] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _normalise_label(cls, data: Any) -> Any:
        return _label_before(data, "label", "raw_label")

    @field_validator("label")
    @classmethod
    def _known_label(cls, value: str) -> str:
        if value not in vocab.ENTITY_LABELS:
            raise ValueError(f"unknown entity label {value!r}")
        return value

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, value: str) -> str:
        return _non_blank(value)

    def status_as_of(self, chapter: int) -> str | None:
        """The status holding at `chapter` (the latest matching interval wins), or None."""
        found = None
        for interval in self.status_intervals:
            if interval.covers(chapter):
                found = interval.status
        return found

    def exists_as_of(self, chapter: int) -> bool:
        return self.first_chapter is None or self.first_chapter <= chapter


def user_location(
    name: str, description: str, source: EntitySource, *, first_chapter: int | None = None
) -> Entity:
    """A Location the user wrote (the outline, the story bible): canonical, its source keeping
    the name as written."""
    return Entity(
        label="Location",
        name=name.strip(),
        description=description,
        sources=[source.model_copy(update={"original_name": name})],
        is_provisional=False,
        first_chapter=first_chapter,
    )


class Relationship(_Model):
    """A relationship between two entities, each given by id or by name/alias."""

    source: str = Field(min_length=1)
    target: str = Field(min_length=1)
    type: str
    raw_type: str | None = None
    source_label: str | None = None
    target_label: str | None = None
    chapter: int | None = Field(None, ge=0, description="defaults to the delta's chapter")
    scene: int | None = Field(None, ge=0)
    weight: float = 1.0
    description: str = ""
    confidence: float | None = Field(None, ge=0.0, le=1.0)
    quote: str | None = Field(None, description="the words of the source text that state it")

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _label_before(_label_before(data, "source_label", ""), "target_label", "")
        if isinstance(data.get("type"), str):
            canonical, raw = vocab.normalize_rel_type(data["type"])
            data = {**data, "type": canonical}
            if raw is not None and not data.get("raw_type"):
                data["raw_type"] = raw
        return data

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in vocab.ENTITY_REL_TYPES:
            raise ValueError(f"unknown relationship type {value!r}")
        return value


class PropertyUpdate(_Model):
    """Changes to an entity's properties; None removes an attribute.

    Keys `name`, `description`, `aliases`, `traits` and `is_provisional` change those
    fields; any other key is an attribute (kept in the entity's attribute map, so names a
    model invents never become property keys in the graph).
    """

    entity: str = Field(min_length=1, description="id or name/alias of the entity")
    label: str | None = None
    changes: dict[str, AttrValue | None] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _normalise_label(cls, data: Any) -> Any:
        return _label_before(data, "label", "")

    @field_validator("changes")
    @classmethod
    def _core_field_types(cls, changes: dict[str, Any]) -> dict[str, Any]:
        for key, value in changes.items():
            if key == "name" and not (isinstance(value, str) and value.strip()):
                raise ValueError("'name' must be a non-blank string")
            if key == "description" and not isinstance(value, str | None):
                raise ValueError("'description' must be a string or null")
            if key in ("aliases", "traits") and not (
                value is None
                or (isinstance(value, list) and all(isinstance(v, str) for v in value))
            ):
                raise ValueError(f"{key!r} must be a list of strings or null")
            if key == "is_provisional" and not isinstance(value, bool | None):
                raise ValueError("'is_provisional' must be a boolean")
        return changes


class StatusChange(_Model):
    """From `chapter` on the entity has `status` (e.g. alive -> dead)."""

    entity: str = Field(min_length=1)
    label: str | None = None
    status: str = Field(min_length=1, max_length=64)
    chapter: int | None = Field(None, ge=0, description="defaults to the delta's chapter")
    scene: int | None = Field(None, ge=0)
    quote: str | None = Field(None, description="the words of the source text that state it")

    @model_validator(mode="before")
    @classmethod
    def _normalise_label(cls, data: Any) -> Any:
        return _label_before(data, "label", "")


class SceneDelta(_Model):
    index: int = Field(ge=0)
    title: str = ""
    summary: str = ""
    text_ref: str | None = None
    text_sha: str | None = None
    location: str | None = None
    characters: list[str] = Field(default_factory=list)
    embedding: list[float] | None = None
    embedded_by: str | None = Field(
        None,
        description="the embedding model that made `embedding` (LanguageModel."
        "embedding_fingerprint); None: not recorded (taken as the model in use)",
    )


class ChapterDelta(_Model):
    """Everything one chapter adds to or changes in the graph; committed atomically."""

    # 0 is the initialization phase (outline entities): it writes no Chapter node; its title
    # and summary go to the NovelInfo node unless novel_info sets them.
    chapter: int = Field(ge=0, description="0 is the initialization phase")
    title: str = ""
    summary: str = ""
    text_ref: str | None = None
    text_sha: str | None = None
    embedding: list[float] | None = None
    embedded_by: str | None = Field(None, description="the model that made `embedding`")
    source_type: SourceType = Field(
        "extraction", description="provenance for entities without sources"
    )
    entities: list[Entity] = Field(default_factory=list)
    relationships: list[Relationship] = Field(default_factory=list)
    property_updates: list[PropertyUpdate] = Field(default_factory=list)
    status_changes: list[StatusChange] = Field(default_factory=list)
    scenes: list[SceneDelta] = Field(default_factory=list)
    novel_info: dict[str, Scalar | list[str]] | None = None
    # A story-bible sync is its own change-set, keyed by a negative number (-1, -2, ...) so
    # it never collides with a chapter; `chapter` is then the chapter its facts hold from.
    changeset: int | None = Field(
        None, lt=0, description="change-set key of a story-bible sync (negative)"
    )

    @property
    def changeset_key(self) -> int:
        """The key its change-set is stored, found and rolled back by."""
        return self.chapter if self.changeset is None else self.changeset

    @field_validator("scenes")
    @classmethod
    def _unique_scenes(cls, scenes: list[SceneDelta]) -> list[SceneDelta]:
        indexes = [s.index for s in scenes]
        if len(set(indexes)) != len(indexes):
            raise ValueError("scene indexes must be unique")
        return scenes

    @model_validator(mode="after")
    def _initialization_has_no_chapter_content(self) -> ChapterDelta:
        if self.chapter == 0 and (
            self.scenes or self.embedding is not None or self.text_ref or self.text_sha
        ):
            raise ValueError(
                "chapter 0 is the initialization phase: it has no Chapter node, scenes, text or embedding"
            )
        if self.changeset is not None and (
            self.scenes or self.embedding is not None or self.text_ref or self.text_sha
        ):
            raise ValueError("a story-bible sync has no scenes, text or embedding")
        return self

    @field_validator("novel_info")
    @classmethod
    def _plain_keys(cls, info: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in info or {}:
            if not _PROP_NAME.match(key) or key == "id":
                raise ValueError(
                    f"novel_info key {key[:40]!r} must be an identifier other than 'id'"
                )
        return info

    def delta_hash(self) -> str:
        """Content hash: the same delta (whatever its dict ordering) hashes the same."""
        # A chapter's hash leaves out the (unset) bible key, so hashes stored before it existed still match.
        dumped = self.model_dump(
            mode="json", exclude={"changeset"} if self.changeset is None else None
        )
        canonical = json.dumps(dumped, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


# --- Results -----------------------------------------------------------------------------


class CommitResult(_Model):
    chapter: int
    seq: int
    delta_hash: str
    noop: bool = Field(False, description="the same delta was already committed")
    replaced: bool = Field(
        False, description="a different delta for the chapter was rolled back first"
    )
    created_nodes: int = 0
    updated_nodes: int = 0
    created_relationships: int = 0
    updated_relationships: int = 0
    #: every reference in the delta (entity name, id, relationship endpoint) -> entity id
    resolved: dict[str, str] = Field(default_factory=dict)
    provisional_ids: list[str] = Field(default_factory=list)
    seconds: float = 0.0


class RollbackResult(_Model):
    chapters: list[int] = Field(description="chapters rolled back, newest commit first")
    deleted_nodes: int = 0
    deleted_relationships: int = 0
    restored_nodes: int = 0
    restored_relationships: int = 0
    seconds: float = 0.0


class ChangeSetInfo(_Model):
    chapter: int
    seq: int
    delta_hash: str
    created_nodes: int
    created_relationships: int
    updated_nodes: int
    updated_relationships: int


class GraphStats(_Model):
    labels: dict[str, int]
    relationship_types: dict[str, int]
    nodes: int
    relationships: int
    schema_version: int
    committed_chapters: list[int]


# --- Retrieval views ---------------------------------------------------------------------


class RelationshipView(_Model):
    """One relationship seen from an entity, as of a chapter (the latest version wins)."""

    type: str
    raw_type: str | None = None
    direction: Literal["out", "in"]
    other_id: str
    other_name: str
    other_label: str
    chapter: int | None = None
    scene: int | None = None
    weight: float | None = None
    description: str = ""
    quote: str | None = None


class EntityProfile(_Model):
    entity: Entity
    as_of_chapter: int
    status: str | None = None
    relationships: list[RelationshipView] = Field(default_factory=list)
    relationships_left_out: int = Field(
        0, description="older relationships not read (a read capped to the most recent)"
    )


class ChapterSummary(_Model):
    chapter: int
    title: str = ""
    summary: str = ""


class LocationContext(_Model):
    location: Entity
    as_of_chapter: int
    parents: list[Entity] = Field(default_factory=list, description="locations it is PART_OF")
    children: list[Entity] = Field(default_factory=list)
    occupants: list[Entity] = Field(
        default_factory=list, description="whose latest LOCATED_IN is here"
    )
    events: list[Entity] = Field(default_factory=list, description="events that HAPPENS_IN here")
    nearby: list[Entity] = Field(default_factory=list)


class SimilarityHit(_Model):
    id: str
    chapter: int
    scene: int | None = None
    score: float
    title: str = ""
    summary: str = ""


class SceneContext(_Model):
    """Everything drafting one scene needs from the graph (see retrieval.scene_context)."""

    chapter: int
    as_of_chapter: int
    characters: list[EntityProfile] = Field(default_factory=list)
    unresolved_names: list[str] = Field(default_factory=list)
    location: LocationContext | None = None
    recent_summaries: list[ChapterSummary] = Field(default_factory=list)
    similar_scenes: list[SimilarityHit] = Field(default_factory=list)


@dataclass(frozen=True)
class ConsistencyFacts:
    """What the consistency checks need, keyed by `vocabulary.normalize_name` of the names asked.

    statuses: name -> (status as of the chapter, chapter since which it holds)
    scene_embeddings: (chapter, scene index, embedding) of every scene up to the chapter
    relationships: (source name, target name) -> (type, chapter) of the latest relationship
    relationship_types: (source name, target name) -> {type: latest chapter} of every type
    traits: name -> the traits the entity has accumulated as of the chapter
    containers: name -> normalized names of the places it is PART_OF (one hop)
    scene_texts: (chapter, scene index) -> (content-store path, sha256) of each scene's text
    """

    statuses: dict[str, tuple[str, int]]
    scene_embeddings: list[tuple[int, int, list[float] | np.ndarray]]
    relationships: dict[tuple[str, str], tuple[str, int]]
    relationship_types: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    traits: dict[str, list[str]] = field(default_factory=dict)
    containers: dict[str, set[str]] = field(default_factory=dict)
    scene_texts: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)
