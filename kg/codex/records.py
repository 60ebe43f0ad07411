"""The codex's reads, turned into frozen models where they are read.

Each row of a statement in kg/codex/cypher.py (and each story relationship and scene the
story mirror, kg.mirror, holds) becomes one frozen pydantic model here, so the page
builders (kg.codex.novel, kg.codex.dialogue) work on typed fields, never on a row's keys.
The parsers normalise a value as the page states it (an id or a turn as text, a position as
an int), and nothing more: what the page shows is the same as when it read the rows itself.

`read_novel_tx` and `read_dialogue_tx` are the two read transactions (one statement per
label or type, each capped; a capped read says so in `truncated`). A graph reader
(kg.ports.GraphReader) runs them: `reader.execute_read(read_dialogue_tx, conversation_id)`.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from neo4j import ManagedTransaction
from pydantic import BaseModel, BeforeValidator, ConfigDict

from core.errors import InvalidInputError
from kg import cypher as kq
from kg.codex import cypher as cq
from kg.commit import NOVEL_INFO_ID
from kg.mirror import StoryMirror

#: A key the builders index by: always text (`str(value)`, as a dict key of the page).
Key = Annotated[str, BeforeValidator(str)]
#: Text that may be missing: None stays None, anything else is its text.
Text = Annotated[str | None, BeforeValidator(lambda v: None if v is None else str(v))]
#: A position (a turn's seq, a chapter) that may be missing.
Position = Annotated[int | None, BeforeValidator(lambda v: None if v is None else int(v))]
#: Text that may be missing, as the empty text.
OrEmpty = Annotated[str, BeforeValidator(lambda v: v or "")]
#: A list that may be missing: None is empty; its items as text.
Texts = Annotated[tuple[str, ...], BeforeValidator(lambda v: tuple(str(x) for x in v or ()))]

Row = TypeVar("Row", bound="_Row")

#: Caps of the book's reads: far above any book (a 100-chapter book has a few hundred
#: entities); a graph beyond them gets a page that says what it leaves out instead of a huge one.
NOVEL_LIMITS = {
    "chapters": 5_000,
    "scenes": 50_000,
    "entities": 20_000,
    "relationships": 100_000,
    "appearances": 200_000,
}
#: Caps of a conversation's reads.
DIALOGUE_LIMITS = {"entities": 20_000, "relations": 50_000, "events": 200_000, "milestones": 50_000}


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# --- a book -------------------------------------------------------------------------------------


class ChapterRow(_Row):
    """A chapter node: `number` is None where the graph holds no whole number."""

    number: Annotated[int | None, BeforeValidator(lambda v: v if isinstance(v, int) else None)]
    title: OrEmpty = ""
    summary: OrEmpty = ""
    key_events: Texts = ()


class EntityRow(_Row):
    """An entity node's whole property map (kg.records.props_as_of reads it as of a chapter)."""

    props: dict[str, Any]


class AppearanceRow(_Row):
    """An entity appears in (or is mentioned by) a chapter (the statement's filter on the
    chapter leaves no row without one)."""

    id: str
    chapter: int


class StatementRow(_Row):
    """One chapter's statement of a story relationship (from the story mirror's edges)."""

    source: str
    target: str
    type: str
    raw_type: str | None = None
    chapter: int
    scene: int | None = None
    quote: str | None = None
    description: str | None = None
    weight: float | None = None


class TimelineSceneRow(_Row):
    """A scene as the timeline lists it (from the story mirror)."""

    chapter: int
    scene: int | None
    title: str | None
    location: str | None
    characters: Texts = ()
    summary: str | None


class NovelInfoRow(_Row):
    """What the page's heading shows of the book's info node."""

    title: Text = None
    logline: Text = None
    genre: Text = None


class NovelRead(_Row):
    """Everything a book's codex reads, in one transaction."""

    as_of: int
    latest: int
    info: NovelInfoRow
    chapters: tuple[ChapterRow, ...]
    scenes: tuple[TimelineSceneRow, ...]
    entities: tuple[EntityRow, ...]
    relationships: tuple[StatementRow, ...]
    appearances: tuple[AppearanceRow, ...]
    mentions: tuple[AppearanceRow, ...]
    truncated: tuple[str, ...] = ()


class _Capped:
    """Rows of one transaction's capped reads, noting each cap reached."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.truncated: list[str] = []

    def cap(self, name: str, found: list[Row]) -> list[Row]:
        if len(found) >= self.limits[name]:
            self.truncated.append(f"only the first {self.limits[name]} {name} are shown")
        return found[: self.limits[name]]

    def rows(
        self, tx: ManagedTransaction, model: type[Row], name: str, query: str, **params: Any
    ) -> list[Row]:
        found = tx.run(query, **params, limit=self.limits[name])
        return self.cap(name, [model.model_validate(r.data()) for r in found])


def read_novel_tx(tx: ManagedTransaction, as_of: int | None, mirror: StoryMirror) -> NovelRead:
    """The book as of chapter `as_of` (None: the latest); a chapter past the book is bad input."""
    row = tx.run(cq.LATEST_CHAPTER).single()
    latest = int(row["latest"]) if row and row["latest"] is not None else 0
    if as_of is not None and as_of > latest:
        written = f"chapters 1-{latest}" if latest else "no chapter yet"
        raise InvalidInputError(
            f"--as-of-chapter {as_of} is past the book: the graph holds {written}"
        )
    upto = latest if as_of is None else as_of
    capped = _Capped(NOVEL_LIMITS)
    # The story relationships and the scenes are the bulk of a long book's page: they come from
    # the story mirror (kg.mirror), brought up to the newest change-set inside this read, so a
    # codex written after every chapter does not read the whole book's edges again each time.
    mirror.refresh(tx)
    relationships = [
        StatementRow(
            source=e.src,
            target=e.tgt,
            type=e.type,
            raw_type=e.props.get("raw_type"),
            chapter=e.chapter,
            scene=e.props.get("scene"),
            quote=e.props.get("quote"),
            description=e.props.get("description"),
            weight=e.props.get("weight"),
        )
        for e in mirror.edges_as_of(upto)
    ]
    scenes = [
        TimelineSceneRow(
            chapter=s.chapter,
            scene=s.scene if s.scene >= 0 else None,
            title=s.title or None,
            location=s.location,
            characters=s.characters,
            summary=s.summary,
        )
        for s in mirror.scenes_as_of(upto)
    ]
    info_row = tx.run(kq.READ_NOVEL_INFO, id=NOVEL_INFO_ID).single()
    chapters = capped.rows(tx, ChapterRow, "chapters", cq.CHAPTERS, as_of=upto)
    return NovelRead(
        as_of=upto,
        latest=latest,
        info=NovelInfoRow.model_validate(dict(info_row["props"]) if info_row else {}),
        chapters=tuple(c for c in chapters if c.number is not None and c.number <= upto),
        scenes=tuple(capped.cap("scenes", scenes)),
        entities=tuple(capped.rows(tx, EntityRow, "entities", cq.ENTITIES, as_of=upto)),
        relationships=tuple(capped.cap("relationships", relationships)),
        appearances=tuple(
            capped.rows(tx, AppearanceRow, "appearances", cq.APPEARANCES, as_of=upto)
        ),
        mentions=tuple(capped.rows(tx, AppearanceRow, "appearances", cq.MENTIONS, as_of=upto)),
        truncated=tuple(capped.truncated),
    )


# --- a conversation -----------------------------------------------------------------------------


class DialogueHead(_Row):
    """The conversation node: how many turns it remembers, and committed with their facts."""

    memory_seq: int = 0
    turn_seq: int = 0

    @classmethod
    def parse(cls, row: dict[str, Any]) -> DialogueHead:
        return cls(memory_seq=int(row["memory_seq"] or 0), turn_seq=int(row["turn_seq"] or 0))


class DialogueEntityRow(_Row):
    entity_id: Key
    name: Text
    kind: Text
    aliases: Texts = ()
    bio_summary: Text = None
    bio_traits: Texts = ()
    first_turn: Text
    first_seq: Position
    last_turn: Text
    last_seq: Position
    mentions: Position = None


class DialogueRelationRow(_Row):
    """A relation between two entities; ended ones keep their ending turn."""

    source: Key
    target: Key
    rel_id: Key
    type: Key
    raw_type: str | None = None
    weight: float | None = None
    since_turn: Text
    since_seq: Position
    ended_turn: Text
    ended_seq: Position


class DialogueEventRow(_Row):
    """One logged change of a relation (EVOLVE, REPLACE, DELETE) at a turn."""

    rel_id: Key
    turn_id: Text
    seq: Position
    action: Text
    from_type: Text
    to_type: Text
    weight_before: float | None = None
    weight_after: float | None = None
    reason: Text
    quote: Text
    source: Key
    target: Key


class MilestoneRow(_Row):
    turn_id: Text
    seq: Position
    text: Text
    entity_ids: Texts = ()
    quote: Text


class DialogueRead(_Row):
    """Everything a conversation's codex reads, in one transaction (head None: no such node)."""

    head: DialogueHead | None
    entities: tuple[DialogueEntityRow, ...]
    relations: tuple[DialogueRelationRow, ...]
    events: tuple[DialogueEventRow, ...]
    milestones: tuple[MilestoneRow, ...]
    truncated: tuple[str, ...] = ()


def read_dialogue_tx(tx: ManagedTransaction, conversation_id: str) -> DialogueRead:
    capped = _Capped(DIALOGUE_LIMITS)
    cid = {"conversation_id": conversation_id}
    head = tx.run(cq.DIALOGUE_HEAD, **cid).single()
    return DialogueRead(
        head=DialogueHead.parse(head.data()) if head else None,
        entities=tuple(capped.rows(tx, DialogueEntityRow, "entities", cq.DIALOGUE_ENTITIES, **cid)),
        relations=tuple(
            capped.rows(tx, DialogueRelationRow, "relations", cq.DIALOGUE_RELATIONS, **cid)
        ),
        events=tuple(capped.rows(tx, DialogueEventRow, "events", cq.DIALOGUE_EVENTS, **cid)),
        milestones=tuple(
            capped.rows(tx, MilestoneRow, "milestones", cq.DIALOGUE_MILESTONES, **cid)
        ),
        truncated=tuple(capped.truncated),
    )
