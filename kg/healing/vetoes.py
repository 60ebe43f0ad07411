"""Vetoes: a pair is refused, whatever its scores, when the two appear together in one scene
(two people in a scene are two people), are related to each other directly, both come from
the user/outline (the author made two entities on purpose) or carry different numbers
("Deckhand 1" / "Deckhand 2")."""

from __future__ import annotations

from kg.healing.names import canonical_tokens
from kg.healing.snapshot import HealingSnapshot
from kg.models import Entity

CANONICAL_SOURCES = frozenset({"user", "outline"})


def _canonical(e: Entity) -> bool:
    return any(s.type in CANONICAL_SOURCES for s in e.sources)


_ROMAN = frozenset("ii iii iv vi vii viii ix xi xii xiii xiv xv".split())


def _numbers(tokens: tuple[str, ...]) -> set[str]:
    return {t for t in tokens if t.isdigit() or t in _ROMAN}


def veto_reason(snap: HealingSnapshot, a: str, b: str) -> str | None:
    """Why `a` and `b` can never be one entity, or None."""
    pair = frozenset((a, b))
    if pair in snap.co_scene:
        return f"appear together in {snap.co_scene[pair]}"
    if pair in snap.related:
        return "related to each other"
    ea, eb = snap.entities[a], snap.entities[b]
    if ea.label != eb.label:
        return "different labels"
    if _canonical(ea) and _canonical(eb):
        return "both given by the user/outline"
    # "Deckhand 1" / "Deckhand 2", "Henry VII" / "Henry VIII": numbered names are distinct.
    numbers_a, numbers_b = (
        _numbers(canonical_tokens(ea.name, ea.label)),
        _numbers(canonical_tokens(eb.name, eb.label)),
    )
    if numbers_a and numbers_b and numbers_a != numbers_b:
        return "different numbers in their names"
    return None
