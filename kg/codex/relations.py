"""A book's story relationships with their history: one relation per (source, type, target),
its statements in story order, and the spans in which it holds.

A relationship is stated in the chapters that wrote it, and it ends when the pair is later
stated the opposite way (kg.vocabulary.OPPOSITE_REL_TYPES: friends become enemies) or, for
LOCATED_IN, when its source is placed somewhere else: the same "latest holds" reading the
consistency checks and the drafting context use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from kg import vocabulary as vocab
from kg.codex.models import relationship_caption, relationship_label
from kg.codex.records import StatementRow


@dataclass(eq=False)
class Relation:
    source: str
    target: str
    type: str
    raw_type: str | None
    statements: list[StatementRow] = field(default_factory=list)
    spans: list[tuple[int, int | None]] = field(default_factory=list)
    ended_by: str | None = None

    @property
    def chapters(self) -> list[int]:
        return sorted({int(s.chapter or 0) for s in self.statements})

    @property
    def label(self) -> str:
        return relationship_label(self.type, self.raw_type)

    @property
    def caption(self) -> str:
        return relationship_caption(self.type, self.raw_type)

    def key(self) -> str:
        return "\x1f".join((self.source, self.label, self.target))


def _walk(
    group: list[Relation], rivals: Callable[[Relation, Relation], bool], names: dict[str, str]
) -> None:
    """Spans of rels that replace each other: in each chapter, a rel stated there starts (if it
    was not active) and ends every active rival not stated there."""
    chapters: dict[int, list[Relation]] = defaultdict(list)
    for rel in group:
        for chapter in rel.chapters:
            chapters[chapter].append(rel)
    active: dict[int, int] = {}  # id(rel) -> start
    by_id = {id(rel): rel for rel in group}
    for chapter in sorted(chapters):
        stated = chapters[chapter]
        for rel in stated:
            active.setdefault(id(rel), chapter)
        for rid, start in list(active.items()):
            rel = by_id[rid]
            if any(other is rel for other in stated):
                continue
            winner = next((other for other in stated if rivals(rel, other)), None)
            if winner is not None:
                rel.spans.append((start, chapter))
                rel.ended_by = (
                    f"{names.get(winner.source, winner.source)} {winner.label} "
                    f"{names.get(winner.target, winner.target)} in chapter {chapter}"
                )
                del active[rid]
    for rid, start in active.items():
        by_id[rid].spans.append((start, None))


def relationships(rows: list[StatementRow], names: dict[str, str]) -> list[Relation]:
    """Rows (one per relationship and chapter) -> one rel per (source, type, target) with its
    statements in order and its active spans."""
    rels: dict[tuple[str, str, str | None, str], Relation] = {}
    for row in rows:
        raw = row.raw_type if row.type == vocab.RELATES_TO else None
        key = (row.source, row.type, raw, row.target)
        rel = rels.get(key)
        if rel is None:
            rel = rels[key] = Relation(row.source, row.target, row.type, raw)
        rel.statements.append(row)
    for rel in rels.values():
        rel.statements.sort(key=lambda s: (s.chapter or 0, s.scene or 0))
    opposite = vocab.OPPOSITES
    pairs: dict[frozenset[str], list[Relation]] = defaultdict(list)
    places: dict[str, list[Relation]] = defaultdict(list)
    alone: list[Relation] = []
    for rel in rels.values():
        if rel.type in opposite:
            pairs[frozenset((rel.source, rel.target))].append(rel)
        elif rel.type == "LOCATED_IN":
            places[rel.source].append(rel)
        else:
            alone.append(rel)
    for group in pairs.values():
        _walk(group, lambda a, b: b.type in opposite[a.type], names)
    for group in places.values():
        _walk(group, lambda a, b: b.target != a.target, names)
    for rel in alone:
        rel.spans.append((rel.chapters[0], None))
    return sorted(
        rels.values(),
        key=lambda r: (
            r.chapters[0],
            names.get(r.source, r.source),
            r.label,
            names.get(r.target, r.target),
        ),
    )


def span_text(spans: list[tuple[int, int | None]]) -> str:
    parts = []
    for start, end in spans:
        since = "story bible" if start == 0 else f"ch {start}"
        parts.append(f"since {since}" if end is None else f"{since}, ended ch {end}")
    return "; ".join(parts)
