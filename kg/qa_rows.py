"""The rows graph QA (kg.qa) reads, as frozen models made where they leave Cypher.

Each row of a QA statement (kg/maintenance_cypher.py, and the reads of kg/cypher.py the
chapter scope uses) is validated once, in `read`, into one of the models here; the rows the
chapter scope builds from the story mirror (kg.mirror) go through the same models (`parse`).
So the checks work on typed fields, never on a row's keys, and a row the graph should not
hold (a chapter that is no whole number, a missing column) stops QA with one line that says
which row and why (kg.errors.GraphQueryError) instead of a KeyError or TypeError inside a check.

The parsers keep what the checks did with the raw values: an id, a name key or a lookup key
is its text (`str(value)`, None as "None"); a name that may be missing stays None (a number
as its text); a chapter is a whole number (3.0 included) or None, nothing else. Pydantic, as the other rows
of kg/ (kg.records, kg.codex.records): the graph is an outside input, and its validation
errors read as one line. Each row is validated once; the checks then only read attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from neo4j import ManagedTransaction
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    field_validator,
)

from core.errors import first_problem
from kg.errors import GraphQueryError

#: An id or a key the checks index by: always text (`str(value)`).
Key = Annotated[str, BeforeValidator(str)]
#: Text that may be missing: None stays None, a number is its text (`coerce_numbers_to_str`,
#: in pydantic's core: no Python call per field on the rows there are most of).
Text = str | None
#: A list that may be missing: None is empty; its items as text.
Texts = Annotated[tuple[str, ...], BeforeValidator(lambda v: tuple(str(x) for x in v or ()))]
#: A chapter as the graph writes it: a whole number, or missing. Lax on purpose: 3.0 (a graph
#: written by another tool, a Neo4j float) is chapter 3, as the checks always read it; 'five',
#: 3.5 or a list is no chapter and stops QA.
Chapter = int | None

Row = TypeVar("Row", bound="QaRow")


class QaRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", coerce_numbers_to_str=True)

    #: What one row is, for the error that names a malformed one.
    what: ClassVar[str] = "row"


def parse(model: type[Row], data: Mapping[str, Any], at: str) -> Row:
    """`data` as a `model`; a row that is not one is a GraphQueryError naming it (`at`)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problem = first_problem(exc, "row")
        raise GraphQueryError(
            f"graph QA read a malformed {model.what} ({at}): {problem.place}: "
            f"{problem.message}{problem.got()}{problem.and_more()}"
        ) from exc


def read(tx: ManagedTransaction, model: type[Row], query: str, **params: Any) -> list[Row]:
    """The rows of `query`, each validated once as a `model`."""
    return [
        parse(model, record.data(), f"row {n}") for n, record in enumerate(tx.run(query, **params))
    ]


class EntityNode(QaRow):
    """An entity node's whole property map."""

    what: ClassVar[str] = "entity node"

    # Open on purpose: an entity holds whatever properties its label and its updates gave it
    # (traits, status intervals, revisions, ...); the checks read a few, kg.records the rest.
    props: dict[str, Any]

    @field_validator("props")
    @classmethod
    def _has_id(cls, props: dict[str, Any]) -> dict[str, Any]:
        if "id" not in props:
            raise ValueError("an entity node without an id")
        return props


class ChangesetNode(QaRow):
    """A change-set node's property map: what the chapter scope reads is `created_rels_json`."""

    what: ClassVar[str] = "change-set node"

    props: Mapping[str, Any]  # a change-set's properties, as kg.commit wrote them


class IndexEntry(QaRow):
    """What scene references resolve through: an entity's id, name keys and first chapter
    (a first chapter that is no whole number counts as unknown)."""

    what: ClassVar[str] = "entity index entry"

    id: Key
    name: Text = None
    name_key: Text = None
    alias_keys: Texts = ()
    first_chapter: Annotated[
        int | None, BeforeValidator(lambda v: v if isinstance(v, int) else None)
    ] = None


class StoryRel(QaRow):
    """A story relationship: its type, chapter and key, and the id, name and first chapter
    of either end (`src_*`, `tgt_*`)."""

    what: ClassVar[str] = "story relationship"

    type: str
    chapter: Chapter
    key: Text
    src_id: Text
    src_name: Text
    src_first: Chapter = None
    tgt_id: Text
    tgt_name: Text
    tgt_first: Chapter = None


class BrokenRel(StoryRel):
    """A story relationship whose end is not a complete entity, or that lacks key or chapter:
    with the labels of either end."""

    what: ClassVar[str] = "broken relationship"

    src_labels: Texts
    tgt_labels: Texts


class TraitEdge(QaRow):
    """A HAS_TRAIT relationship: the entity (`id`, `name`), the trait's name, its chapter."""

    what: ClassVar[str] = "trait relationship"

    id: Key
    name: Text
    trait: Text
    chapter: Chapter


class SceneCast(QaRow):
    """Who and where a scene names: its chapter and index, its characters and location."""

    what: ClassVar[str] = "scene"

    id: Text
    chapter: Chapter
    scene: int | None
    characters: Texts
    location: Text


class NameLookup(QaRow):
    """An EntityName lookup: its key and the entity id it points to."""

    what: ClassVar[str] = "name lookup"

    entity_id: Key
    key: Key


class EntityId(QaRow):
    """An entity's id (the entities a set of chapters touched)."""

    what: ClassVar[str] = "entity id"

    id: Key


class ChapterNumber(QaRow):
    """A Chapter node's number (as a whole number; None when it has none)."""

    what: ClassVar[str] = "chapter number"

    number: Annotated[int | None, BeforeValidator(lambda v: None if v is None else int(v))]


class ProvisionalCount(QaRow):
    """How many entities there are, and how many are still provisional."""

    what: ClassVar[str] = "provisional count"

    total: Annotated[int, BeforeValidator(lambda v: int(v or 0))]
    provisional: Annotated[int, BeforeValidator(lambda v: int(v or 0))]


class ProvisionalEntity(QaRow):
    """A provisional entity as its finding lists it."""

    what: ClassVar[str] = "provisional entity"

    id: Key
    name: Key
    first_chapter: Chapter
