"""Conversions between domain models, graph property maps and JSON.

Node properties must be storable types (strings, numbers, booleans, homogeneous lists),
so nested data (sources, attributes) is kept as canonical JSON text and status intervals
as parallel lists that Cypher can still read. The value codec round-trips every property
value exactly (int vs float, temporal types), which the change-set and export rely on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol, TypeVar

import neo4j.time as ntime
from pydantic import BaseModel, ConfigDict

from kg import vocabulary as vocab
from kg.models import Entity, EntitySource, StatusInterval

_TEMPORAL: dict[str, type] = {
    "datetime": ntime.DateTime,
    "date": ntime.Date,
    "time": ntime.Time,
    "duration": ntime.Duration,
}
_TAG = "$kg"
T = TypeVar("T")


def encode_value(value: Any) -> Any:
    """A property value as plain JSON data; non-JSON types become tagged objects."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {_TAG: "float", "v": repr(value)}
    # Temporal types first: neo4j.time.Duration is a tuple subclass.
    for tag, cls in _TEMPORAL.items():
        if isinstance(value, cls):
            return {_TAG: tag, "v": value.iso_format()}  # type: ignore[attr-defined]
    if isinstance(value, list | tuple):
        return [encode_value(v) for v in value]
    raise TypeError(f"cannot encode a graph property of type {type(value).__name__}")


def decode_value(data: Any) -> Any:
    if isinstance(data, list):
        return [decode_value(v) for v in data]
    if isinstance(data, dict):
        tag, text = data.get(_TAG), data.get("v")
        if tag == "float" and isinstance(text, str):
            return float(text)
        if tag in _TEMPORAL and isinstance(text, str):
            return _TEMPORAL[tag].from_iso_format(text)  # type: ignore[attr-defined]
        raise ValueError(f"not a property value: {str(data)[:80]}")
    return data


def encode_props(props: dict[str, Any]) -> dict[str, Any]:
    return {k: encode_value(v) for k, v in sorted(props.items())}


def decode_props(data: dict[str, Any]) -> dict[str, Any]:
    return {k: decode_value(v) for k, v in data.items()}


def canonical_json(data: Any) -> str:
    """Deterministic JSON text: sorted keys, no ASCII escaping, no insignificant spaces."""
    return json.dumps(
        data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )


# --- Entity <-> node properties ----------------------------------------------------------

OPEN_END = -1  # status_to value of an interval that is still open
CORE_FIELDS = frozenset({"name", "description", "aliases", "traits", "is_provisional"})


def unique(items: Iterable[T]) -> list[T]:
    """The items in first-seen order, each once."""
    return list(dict.fromkeys(items))


def min_present(*values: int | None) -> int | None:
    """The smallest of the values that are set (first chapters), None when none is."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def max_present(*values: int | None) -> int | None:
    """The largest of the values that are set (last chapters), None when none is."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def entity_props(entity: Entity) -> dict[str, Any]:
    """The full property map of an entity node (the store writes it with `SET n = $props`)."""
    if entity.id is None:
        raise ValueError("entity has no id yet")
    key = vocab.name_key(entity.name)
    aliases = unique([a for a in entity.aliases if a != entity.name])
    props: dict[str, Any] = {
        "id": entity.id,
        "label": entity.label,
        "name": entity.name,
        "name_key": key,
        "aliases": aliases,
        "alias_keys": sorted({vocab.name_key(a) for a in aliases} - {key}),
        "description": entity.description,
        "traits": unique(entity.traits),
        "attributes_json": canonical_json(entity.attributes),
        "sources_json": canonical_json(
            [s.model_dump(mode="json", exclude_none=True) for s in entity.sources]
        ),
        "is_provisional": bool(entity.is_provisional),
        "status_values": [i.status for i in entity.status_intervals],
        "status_from": [i.from_chapter for i in entity.status_intervals],
        "status_to": [
            OPEN_END if i.to_chapter is None else i.to_chapter for i in entity.status_intervals
        ],
    }
    if entity.raw_label is not None:
        props["raw_label"] = entity.raw_label
    if entity.first_chapter is not None:
        props["first_chapter"] = entity.first_chapter
    if entity.last_chapter is not None:
        props["last_chapter"] = entity.last_chapter
    return props


def entity_from_props(props: dict[str, Any]) -> Entity:
    intervals = [
        StatusInterval(status=s, from_chapter=f, to_chapter=None if t == OPEN_END else t)
        for s, f, t in zip(
            props.get("status_values") or [],
            props.get("status_from") or [],
            props.get("status_to") or [],
            strict=False,
        )
    ]
    label = props.get("label")
    if label not in vocab.ENTITY_LABELS:
        label = vocab.FALLBACK_LABEL
    return Entity(
        id=props["id"],
        label=label,
        raw_label=props.get("raw_label"),
        name=props.get("name") or props["id"],
        aliases=list(props.get("aliases") or []),
        description=props.get("description") or "",
        traits=list(props.get("traits") or []),
        attributes=json.loads(props.get("attributes_json") or "{}"),
        sources=[
            EntitySource.model_validate(s) for s in json.loads(props.get("sources_json") or "[]")
        ],
        is_provisional=bool(props.get("is_provisional", False)),
        first_chapter=props.get("first_chapter"),
        last_chapter=props.get("last_chapter"),
        status_intervals=intervals,
    )


def name_rows(props: dict[str, Any]) -> list[dict[str, Any]]:
    """The EntityName lookup nodes an entity node implies (one per name/alias key)."""
    label, entity_id = props.get("label", vocab.FALLBACK_LABEL), props["id"]
    key = props.get("name_key") or vocab.name_key(str(props.get("name") or entity_id))
    rows = [{"entity_id": entity_id, "key": key, "kind": "name", "label": label}]
    rows += [
        {"entity_id": entity_id, "key": k, "kind": "alias", "label": label}
        for k in props.get("alias_keys") or []
        if k != key
    ]
    return rows


# --- Per-entity revision history ("as of chapter N") ----------------------------------------

#: Node property holding the history: a JSON list of [chapter, {property: previous value}]
#: appended by each commit that changed the entity (absent properties are tagged). Reading
#: "as of chapter N" undoes the entries of later chapters, newest first.
REVISIONS = "revisions_json"
_ABSENT = {_TAG: "absent"}
# Not versioned: identity, the history itself, and provenance (filtered by its chapter instead).
_UNVERSIONED = frozenset({"id", REVISIONS, "sources_json"})


def add_revision(before: dict[str, Any], after: dict[str, Any], chapter: int) -> dict[str, Any]:
    """`after` plus the history carried over from `before`, extended by what this chapter changed."""
    history = json.loads(before.get(REVISIONS) or "[]")
    changed = {
        key: encode_value(before[key]) if key in before else _ABSENT
        for key in sorted((before.keys() | after.keys()) - _UNVERSIONED)
        if key not in before or key not in after or not same_value(before[key], after[key])
    }
    result = dict(after)
    if changed:
        history.append([chapter, changed])
    if history:
        result[REVISIONS] = canonical_json(history)
    return result


def same_value(a: Any, b: Any) -> bool:
    """Equality that also tells 1 from 1.0 and True from 1 (graph values keep their type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(v, b[k]) for k, v in a.items())
    return bool(a == b)


#: Properties only ever appended to (JSON lists): an undo record keeps how long they were, not
#: what they held, so a change-set stays the size of what changed, not of the entity's history.
APPEND_ONLY = ("sources_json", REVISIONS)
_PREFIX = "prefix"
#: Shorter values are kept as they are (a marker would save nothing).
_PREFIX_MIN_CHARS = 64


def encode_undo(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`encode_props(before)`, with each append-only property whose previous value is the start
    of its new one stored as its length: exact, because an undo runs on the node as the write
    left it (later writes are undone first) and `decode_undo` cuts the current value back."""
    out = encode_props(before)
    for key in APPEND_ONLY:
        old, new = before.get(key), after.get(key)
        if not (isinstance(old, str) and isinstance(new, str) and len(old) >= _PREFIX_MIN_CHARS):
            continue
        old_items, new_items = json.loads(old), json.loads(new)
        if (
            isinstance(old_items, list)
            and isinstance(new_items, list)
            and len(new_items) >= len(old_items)
            and canonical_json(new_items[: len(old_items)]) == old
        ):
            out[key] = {_TAG: _PREFIX, "n": len(old_items)}
    return out


def needs_current(data: dict[str, Any]) -> bool:
    """Whether an undo record cuts a current value back (`decode_undo` needs the node's properties)."""
    return any(isinstance(v, dict) and v.get(_TAG) == _PREFIX for v in data.values())


def decode_undo(data: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The properties an `encode_undo` record restores, given the node's current properties."""
    props: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value.get(_TAG) == _PREFIX:
            if current is None or not isinstance(current.get(key), str):
                raise ValueError(f"undo of {key!r} needs the node's current value")
            props[key] = canonical_json(json.loads(current[key])[: value["n"]])
        else:
            props[key] = decode_value(value)
    return props


def props_as_of(
    props: dict[str, Any], chapter: int, *, sources: bool = True
) -> dict[str, Any] | None:
    """The entity's properties as they were after `chapter` (None: it did not exist yet);
    `sources=False` leaves the provenance out (the longest property, and the only one a read
    for a prompt or a check does not need)."""
    first = props.get("first_chapter")
    if first is not None and first > chapter:
        return None
    state = dict(props)
    for rev_chapter, previous in reversed(json.loads(props.get(REVISIONS) or "[]")):
        if rev_chapter <= chapter:
            break
        for key, value in previous.items():
            if value == _ABSENT:
                state.pop(key, None)
            else:
                state[key] = decode_value(value)
    if not sources:
        state.pop("sources_json", None)
        return state
    kept = [
        s
        for s in json.loads(state.get("sources_json") or "[]")
        if s.get("chapter") is None or s["chapter"] <= chapter
    ]
    state["sources_json"] = canonical_json(kept)
    return state


def entity_as_of(
    props: dict[str, Any], chapter: int | None, *, sources: bool = True
) -> Entity | None:
    """Entity view as of a chapter (None = current state); `sources=False`: without provenance."""
    if chapter is None:
        return entity_from_props(
            props if sources else {k: v for k, v in props.items() if k != "sources_json"}
        )
    state = props_as_of(props, chapter, sources=sources)
    return None if state is None else entity_from_props(state)


class RelationshipRow(BaseModel):
    """A story relationship seen from one of its entities `id`: its type, whether it leaves
    `id`, its properties and the entity at its `other` end. The row of
    cypher.ENTITY_RELS_AS_OF, and of the story mirror (kg.mirror.StoryMirror.rows_of), which
    builds it from its own edges without validating them again (`model_construct`)."""

    model_config = ConfigDict(frozen=True)

    id: str
    type: str
    outgoing: bool
    props: dict[str, Any]
    other: str

    @property
    def chapter(self) -> Any:
        return self.props.get("chapter")


class _Dated(Protocol):
    @property
    def chapter(self) -> int | None: ...


_D = TypeVar("_D", bound=_Dated)


def latest_per_slot(
    owned: Iterable[tuple[str, _D]], slot: Callable[[_D], Hashable]
) -> dict[str, list[_D]]:
    """Per owning entity, the latest item per slot (a later or the same chapter replaces what
    the slot held), in the order the slots were first seen: the one rule for which version of
    a relationship an entity shows, over rows and over views."""
    latest: dict[str, dict[Hashable, _D]] = {}
    for owner, item in owned:
        mine = latest.setdefault(owner, {})
        key = slot(item)
        if key not in mine or (item.chapter or 0) >= (mine[key].chapter or 0):
            mine[key] = item
    return {owner: list(found.values()) for owner, found in latest.items()}
