"""Where a fact came from: every fact the graph holds about an entity, with its evidence.

`python -m kg facts --entity NAME` prints them. A fact the chapters taught the graph keeps
its chapter, scene and the quote of the scene that states it (grounding refused the rest
before the commit: tasks/grounding.py); a fact of the story bible says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from neo4j import ManagedTransaction
from pydantic import BaseModel, Field

from kg.models import Entity, EntitySource
from kg.retrieval import relationship_rows

if TYPE_CHECKING:
    from kg.store import GraphStore

#: Sorts after every chapter: "as of the end of the book".
_EVERY_CHAPTER = 10**9
#: Provenance types of the story bible (the outline at initialization, the writer's edits).
BIBLE_SOURCES = frozenset({"outline", "user"})

FactKind = Literal["mention", "trait", "status", "relationship", "bible", "merge", "enrichment"]


class Fact(BaseModel):
    kind: FactKind
    statement: str = Field(
        description="what is stated: 'appears', 'trait: brave', 'FRIEND_OF -> Tobias Venn'"
    )
    chapter: int | None = None
    scene: int | None = None
    quote: str | None = None
    source: str = Field("extraction", description="extraction, outline, user, merge, enrichment")


class EntityFacts(BaseModel):
    entity: Entity
    facts: list[Fact]


def source_fact(source: EntitySource) -> Fact:
    """The fact one provenance entry of an entity is evidence of (the codex uses it too)."""
    if source.type in BIBLE_SOURCES:
        kind: FactKind = "bible"
        statement = (
            "in the story bible" if source.type == "outline" else "in the story bible (your edit)"
        )
    elif source.type in ("merge", "enrichment"):
        kind = source.type
        statement = f"merged from {source.original_name!r}" if source.original_name else source.type
    elif source.fact == "trait":
        kind, statement = "trait", f"trait: {source.value}"
    elif source.fact == "status":
        kind, statement = "status", f"status: {source.value}"
    else:
        kind = "mention"
        named = source.original_name
        statement = "appears" + (f" as {named!r}" if named and source.quote is None else "")
    return Fact(
        kind=kind,
        statement=statement,
        chapter=source.chapter,
        scene=source.scene,
        quote=source.quote,
        source=source.type,
    )


def _facts_tx(tx: ManagedTransaction, entity: Entity) -> list[Fact]:
    assert entity.id is not None
    facts = [source_fact(s) for s in entity.sources]
    rows, names = relationship_rows(tx, [entity.id], _EVERY_CHAPTER)
    for row in rows:
        other = names.get(row.other)
        props = row.props
        arrow = (
            f"{row.type} -> {other[0] if other else row.other}"
            if row.outgoing
            else f"{row.type} <- {other[0] if other else row.other}"
        )
        chapter = props.get("chapter")
        facts.append(
            Fact(
                kind="relationship",
                statement=arrow,
                chapter=chapter,
                scene=props.get("scene"),
                quote=props.get("quote"),
                source="extraction" if chapter else "outline",
            )
        )
    return sorted(
        facts,
        key=lambda f: (
            f.chapter if f.chapter is not None else -1,
            f.scene or 0,
            f.kind != "mention",
            f.statement,
        ),
    )


def entity_facts(store: GraphStore, name: str) -> list[EntityFacts]:
    """Every entity named (or aliased) `name`, each with every fact the graph holds about it."""
    entities = store.find_entities(name)
    if not entities:
        return []

    def work(tx: ManagedTransaction) -> list[EntityFacts]:
        return [EntityFacts(entity=e, facts=_facts_tx(tx, e)) for e in entities]

    return store.execute_read(work)


def format_facts(found: list[EntityFacts]) -> str:
    """The facts as aligned text lines, one entity after another."""
    lines: list[str] = []
    for item in found:
        e = item.entity
        aliases = f" (also {', '.join(e.aliases)})" if e.aliases else ""
        lines.append(f"{e.name} [{e.label}, {e.id}]{aliases}: {len(item.facts)} facts")
        for fact in item.facts:
            if fact.source in BIBLE_SOURCES or not fact.chapter:
                where = "bible"
            else:
                where = f"ch {fact.chapter}" + (f" sc {fact.scene}" if fact.scene else "")
            quote = (
                f'  "{fact.quote}"'
                if fact.quote
                else ("" if fact.kind in ("bible", "merge") else "  (no quote)")
            )
            lines.append(f"  {where:<12} {fact.statement:<40}{quote}")
    return "\n".join(lines)
