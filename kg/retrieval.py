"""Read queries for drafting and validation, all "as of chapter N".

"As of chapter N" means: entities first seen in chapters <= N, with the properties they had
after chapter N (each commit records the previous values in the entity's revision history,
see kg.records.props_as_of), the names and aliases they had then, sources up to N,
relationships written for chapters <= N (the latest one per pair and type wins), the status
interval covering N, summaries and scenes of chapters <= N. So the context for a chapter
does not change when later chapters are committed: a re-run builds the same prompts.
To draft chapter N, ask as of N - 1.

Each public function runs in one read transaction with a handful of indexed queries.
Similarity reads (`similar_scenes`, `similar_chapters`, the earlier scenes of a scene's
context) live in kg.similarity and are re-exported here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from neo4j import ManagedTransaction

from kg import cypher
from kg import vocabulary as vocab
from kg.commit import NOVEL_INFO_ID
from kg.mirror import MirroredReader, StoryMirror, mirror_of, same_model
from kg.models import (
    ChapterSummary,
    ConsistencyFacts,
    Entity,
    EntityProfile,
    LocationContext,
    RelationshipView,
    SceneContext,
)
from kg.ports import GraphReader
from kg.records import RelationshipRow, entity_as_of, latest_per_slot, props_as_of
from kg.similarity import hybrid_scenes_tx, similar_scenes_tx, vector_index_ready
from kg.similarity import similar_chapters as similar_chapters  # re-exported: part of this API
from kg.similarity import similar_scenes as similar_scenes  # re-exported: part of this API

if TYPE_CHECKING:
    from kg.store import GraphStore

log = logging.getLogger("skald.kg")
#: A drafting prompt shows at most this many relationships per character (the most recent
#: ones) and this many parts, events, neighbours and occupants of the place: more than its
#: budget holds (tasks.context), so nothing the prompt could show is left out, and what the
#: scene reads stays bounded however many relationships a protagonist gathers.
MAX_RELATIONSHIPS = 40
MAX_PLACE_ITEMS = 20
_LABEL_ORDER = {label: i for i, label in enumerate(vocab.ENTITY_LABELS)}


# --- building blocks (transaction functions) ------------------------------------------------


def _resolve_names(
    tx: ManagedTransaction,
    names: Iterable[str],
    label: str | None,
    as_of: int | None = None,
    read: dict[str, dict[str, Any]] | None = None,
) -> dict[str, str | None]:
    """Name or alias -> best entity id (exact name before alias, then label order).

    With `as_of`, only names and aliases the entity had after that chapter count, so a name
    learned later does not change what an earlier chapter's context resolves to. `read`
    receives the properties of the entities seen (the caller need not read them again).
    """
    wanted = {name: vocab.name_key(name) for name in names}
    best: dict[str, tuple[Any, ...]] = {}
    for row in tx.run(cypher.RESOLVE_NAMES, keys=sorted(set(wanted.values()))):
        key, kind, found_label = row["key"], row["kind"], row["label"]
        if read is not None:
            read[row["props"]["id"]] = row["props"]
        if as_of is not None:
            state = props_as_of(row["props"], as_of, sources=False)
            if state is None:
                continue
            found_label = state.get("label", found_label)
            if key == state.get("name_key"):
                kind = "name"
            elif key in (state.get("alias_keys") or []):
                kind = "alias"
            else:
                continue
        if label is not None and found_label != label:
            continue
        rank = (0 if kind == "name" else 1, _LABEL_ORDER.get(found_label, 99), row["props"]["id"])
        if key not in best or rank < best[key]:
            best[key] = rank
    return {name: (str(best[key][-1]) if key in best else None) for name, key in wanted.items()}


def _entities(
    tx: ManagedTransaction,
    ids: Iterable[str],
    as_of: int | None,
    *,
    sources: bool = True,
    read: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Entity]:
    """Entities by id as they were after chapter `as_of` (current state when None); entities
    first seen later are left out. `sources=False` leaves their provenance out (a prompt does
    not show it, and it is the longest property); `read`: properties already read."""
    wanted = sorted(set(ids))
    props = {eid: read[eid] for eid in wanted if read and eid in read}
    missing = [eid for eid in wanted if eid not in props]
    if missing:
        props.update(
            {r["id"]: r["props"] for r in tx.run(cypher.read_nodes(vocab.ENTITY), ids=missing)}
        )
    found = {eid: entity_as_of(p, as_of, sources=sources) for eid, p in props.items()}
    return {eid: e for eid, e in found.items() if e is not None}


def relationship_rows(
    tx: ManagedTransaction, ids: Iterable[str], as_of: int
) -> tuple[list[RelationshipRow], dict[str, tuple[str, str] | None]]:
    """Story relationships of the entities up to the chapter, and the name and label of each
    other end as of the chapter (None: it did not exist yet). Reads the graph itself (the
    `kg facts` command); the drafting and validation reads go through the story mirror."""
    found = tx.run(cypher.ENTITY_RELS_AS_OF, ids=sorted(set(ids)), as_of=as_of)
    rows = [RelationshipRow.model_validate(r.data()) for r in found]
    return rows, _names_as_of(tx, {row.other for row in rows}, as_of)


def _names_as_of(
    tx: ManagedTransaction, ids: Iterable[str], as_of: int
) -> dict[str, tuple[str, str] | None]:
    """Name and label of each entity as of the chapter (None: it did not exist yet)."""
    names: dict[str, tuple[str, str] | None] = {}
    wanted = sorted(set(ids))
    if not wanted:
        return names
    renamed: list[str] = []
    for r in tx.run(cypher.READ_NAME_LABELS, ids=wanted):
        first = r["first_chapter"]
        if first is not None and first > as_of:
            names[r["id"]] = None
        elif r["renamed"]:
            renamed.append(r["id"])
        else:
            names[r["id"]] = (r["name"] or r["id"], r["label"] or vocab.FALLBACK_LABEL)
    for eid, entity in _entities(tx, renamed, as_of).items():
        names[eid] = (entity.name, entity.label)
    return names


def _latest_rows(rows: list[RelationshipRow]) -> dict[str, list[RelationshipRow]]:
    """Per entity, the latest row per (direction, type, raw type, other entity), newest first."""
    latest = latest_per_slot(
        ((row.id, row) for row in rows),
        lambda r: (r.outgoing, r.type, r.props.get("raw_type") or "", r.other),
    )
    return {
        eid: sorted(found, key=lambda r: (-(r.chapter or 0), r.type, r.other))
        for eid, found in latest.items()
    }


def _recent_views(
    tx: ManagedTransaction,
    rows: list[RelationshipRow],
    as_of: int,
    limit: int | None,
    left_out: dict[str, int] | None = None,
) -> dict[str, list[RelationshipView]]:
    """`_latest_views` of the rows, keeping the `limit` most recent per entity (names are read
    for those only): a protagonist's hundred relationships cost what the prompt can show.
    `left_out` receives, per entity, how many older ones were not kept."""
    latest = _latest_rows(rows)
    if left_out is not None and limit:
        left_out.update(
            {eid: len(found) - limit for eid, found in latest.items() if len(found) > limit}
        )
    kept = [r for found in latest.values() for r in (found[:limit] if limit else found)]
    return _latest_views(kept, _names_as_of(tx, {r.other for r in kept}, as_of))


def _latest_views(
    rows: list[RelationshipRow], names: dict[str, tuple[str, str] | None]
) -> dict[str, list[RelationshipView]]:
    """Per entity, the latest relationship per (direction, type, raw type, other entity)."""
    owned: list[tuple[str, RelationshipView]] = []
    for row in rows:
        props = row.props
        name_label = names.get(row.other)
        if name_label is None:
            continue  # the other end was first seen after the chapter
        view = RelationshipView(
            type=row.type,
            raw_type=props.get("raw_type"),
            direction="out" if row.outgoing else "in",
            other_id=row.other,
            other_name=name_label[0],
            other_label=name_label[1],
            chapter=props.get("chapter"),
            scene=props.get("scene"),
            weight=props.get("weight"),
            description=props.get("description", ""),
            quote=props.get("quote"),
        )
        owned.append((row.id, view))
    latest = latest_per_slot(owned, lambda v: (v.direction, v.type, v.raw_type or "", v.other_id))
    return {
        eid: sorted(views, key=lambda v: (-(v.chapter or 0), v.type, v.other_name))
        for eid, views in latest.items()
    }


def _profiles_tx(
    tx: ManagedTransaction,
    ids: list[str],
    as_of: int,
    mirror: StoryMirror | None = None,
    limit: int | None = None,
    read: dict[str, dict[str, Any]] | None = None,
) -> list[EntityProfile]:
    """Profiles of the entities as of the chapter; with `mirror` (the drafting read), their
    relationships come from it (kept current first by the caller), at most `limit` (the most
    recent) per entity, and their provenance is left out; `read`: properties already read."""
    entities = _entities(tx, ids, as_of, sources=mirror is None, read=read)
    left_out: dict[str, int] = {}
    if not entities:
        views: dict[str, list[RelationshipView]] = {}
    elif mirror is not None:
        views = _recent_views(tx, mirror.rows_of(set(entities), as_of), as_of, limit, left_out)
    else:
        views = _latest_views(*relationship_rows(tx, entities, as_of))
    return [
        EntityProfile(
            entity=entities[eid],
            as_of_chapter=as_of,
            status=entities[eid].status_as_of(as_of),
            relationships=views.get(eid, []),
            relationships_left_out=left_out.get(eid, 0),
        )
        for eid in ids
        if eid in entities
    ]


def _location_tx(
    tx: ManagedTransaction,
    location: str,
    as_of: int,
    mirror: StoryMirror | None = None,
    limit: int | None = None,
) -> LocationContext | None:
    entities = _entities(tx, [location], as_of, sources=mirror is None)
    if location not in entities:
        resolved = _resolve_names(tx, [location], "Location", as_of)[location]
        if resolved is None:
            return None
        location = resolved
        entities = _entities(tx, [location], as_of, sources=mirror is None)
    place = entities.get(location)
    if place is None:
        return None
    if mirror is None:
        rows, names = relationship_rows(tx, [location], as_of)
    else:
        rows = mirror.rows_of({location}, as_of)
        names = {}
    context = LocationContext(location=place, as_of_chapter=as_of)
    groups: dict[str, list[str]] = {"parents": [], "children": [], "events": [], "nearby": []}
    candidates: set[str] = set()
    for row in _latest_rows(rows).get(location, []):
        other, kind, out = row.other, row.type, row.outgoing
        if kind == "PART_OF":
            groups["parents" if out else "children"].append(other)
        elif kind == "LOCATED_IN" and not out:
            candidates.add(other)
        elif kind == "HAPPENS_IN" and not out:
            groups["events"].append(other)
        elif kind == "NEAR":
            groups["nearby"].append(other)
    occupants = _occupants(tx, location, candidates, as_of, mirror)
    if limit:  # the most recent first (rows come newest first)
        groups = {name: found[:limit] for name, found in groups.items()}
        occupants = occupants[:limit]
    wanted = [*occupants, *(eid for found in groups.values() for eid in found)]
    if mirror is not None:
        names = _names_as_of(tx, wanted, as_of)
    others = _entities(
        tx, [eid for eid in wanted if names.get(eid) is not None], as_of, sources=mirror is None
    )
    for name, found in groups.items():
        getattr(context, name).extend(others[eid] for eid in dict.fromkeys(found) if eid in others)
    context.occupants = [others[eid] for eid in occupants if eid in others]
    for group in (context.parents, context.children, context.events, context.nearby):
        group.sort(key=lambda e: e.name)
    context.occupants.sort(key=lambda e: e.name)
    return context


def _occupants(
    tx: ManagedTransaction,
    location: str,
    candidates: set[str],
    as_of: int,
    mirror: StoryMirror | None,
) -> list[str]:
    """Who is here as of the chapter: the candidates whose latest LOCATED_IN points here
    (in a chapter, the later scene wins), in id order."""
    if not candidates:
        return []
    if mirror is not None:
        rows = [
            {
                "id": r.id,
                "location": r.other,
                "chapter": r.chapter,
                "scene": r.props.get("scene"),
            }
            for r in mirror.rows_of(candidates, as_of)
            if r.type == "LOCATED_IN" and r.outgoing
        ]
    else:
        rows = [
            r.data()
            for r in tx.run(cypher.LATEST_LOCATIONS_AS_OF, ids=sorted(candidates), as_of=as_of)
        ]
    latest: dict[str, tuple[int, int, str]] = {}
    for row in rows:
        when = (
            row["chapter"] if row["chapter"] is not None else -1,
            row.get("scene") or 0,
            row["location"],
        )
        if row["id"] not in latest or when[:2] >= latest[row["id"]][:2]:
            latest[row["id"]] = when
    return [eid for eid in sorted(candidates) if latest.get(eid, (0, 0, ""))[2] == location]


def _summaries_tx(
    tx: ManagedTransaction, as_of: int, k: int, min_chapter: int
) -> list[ChapterSummary]:
    # The last k chapter numbers by index; only a book with gaps in its numbering needs the range query.
    numbers = list(range(max(min_chapter, as_of - k + 1), as_of + 1))
    rows = (
        [r.data() for r in tx.run(cypher.SUMMARIES_OF, numbers=numbers)]
        if numbers and k > 0
        else []
    )
    if len(rows) < len(numbers) or (len(numbers) < k and numbers and numbers[0] > min_chapter):
        rows = [
            r.data()
            for r in tx.run(cypher.RECENT_SUMMARIES, as_of=as_of, k=k, min_chapter=min_chapter)
        ]
    found = [
        ChapterSummary(chapter=r["chapter"], title=r["title"] or "", summary=r["summary"] or "")
        for r in rows
    ]
    return sorted(found, key=lambda s: s.chapter)


# --- public retrieval API ------------------------------------------------------------------


def resolve_names(
    store: GraphReader,
    names: Iterable[str],
    *,
    label: str | None = None,
    as_of_chapter: int | None = None,
) -> dict[str, str | None]:
    """Map each name (or alias) to the id of the entity it names, or None."""
    names = list(names)
    return store.execute_read(_resolve_names, names, label, as_of_chapter)


def entities_by_name(
    store: GraphReader,
    names: Iterable[str],
    *,
    as_of_chapter: int | None = None,
    label: str | None = None,
) -> dict[str, Entity | None]:
    """The entities named in a scene plan (by name or alias); None for unknown names."""
    names = list(names)

    def work(tx: ManagedTransaction) -> dict[str, Entity | None]:
        ids = _resolve_names(tx, names, label, as_of_chapter)
        found = _entities(tx, [i for i in ids.values() if i], as_of_chapter)
        return {name: found.get(eid) if eid else None for name, eid in ids.items()}

    return store.execute_read(work)


def character_profiles(
    store: GraphReader, *, as_of_chapter: int, names: Iterable[str] = (), ids: Iterable[str] = ()
) -> list[EntityProfile]:
    """Profiles (status and latest relationships as of the chapter) of named or given entities."""
    names, wanted = list(names), list(ids)

    def work(tx: ManagedTransaction) -> list[EntityProfile]:
        resolved = _resolve_names(tx, names, None, as_of_chapter) if names else {}
        all_ids = list(dict.fromkeys([*wanted, *(i for i in resolved.values() if i)]))
        return _profiles_tx(tx, all_ids, as_of_chapter)

    return store.execute_read(work)


def relationships_as_of(
    store: GraphReader, entity_id: str, *, as_of_chapter: int
) -> list[RelationshipView]:
    def work(tx: ManagedTransaction) -> list[RelationshipView]:
        return _latest_views(*relationship_rows(tx, [entity_id], as_of_chapter)).get(entity_id, [])

    return store.execute_read(work)


#: "As of" the newest chapter, whatever its number.
NOW = 10**9


def recent_relationships(
    store: MirroredReader, ids: Iterable[str], limit: int = 40
) -> dict[str, list[RelationshipView]]:
    """Each entity's relationships now (the latest of each kind with each other entity), the
    `limit` most recent, oldest first (from the story mirror)."""
    wanted = set(ids)
    mirror = mirror_of(store)

    def work(tx: ManagedTransaction) -> dict[str, list[RelationshipView]]:
        mirror.refresh(tx)
        views = _recent_views(tx, mirror.rows_of(wanted, NOW), NOW, limit)
        return {
            eid: sorted(found, key=lambda v: (v.chapter or 0, v.type, v.other_name))
            for eid, found in views.items()
        }

    return store.execute_read(work)


def novel_info(store: GraphReader) -> dict[str, Any]:
    """The NovelInfo properties (title, genre, themes, ... from the initialization phase)."""
    rows = store.read(cypher.READ_NOVEL_INFO, id=NOVEL_INFO_ID)
    return {k: v for k, v in rows[0]["props"].items() if k != "id"} if rows else {}


def recent_summaries(
    store: GraphReader, *, as_of_chapter: int, k: int = 3, min_chapter: int = 1
) -> list[ChapterSummary]:
    """The last k chapter summaries up to and including `as_of_chapter`, oldest first."""
    return store.execute_read(_summaries_tx, as_of_chapter, k, min_chapter)


def location_context(
    store: GraphReader, location: str, *, as_of_chapter: int
) -> LocationContext | None:
    """A location (by id, name or alias) with its parents, children, occupants, events and neighbours."""
    return store.execute_read(_location_tx, location, as_of_chapter)


def scene_context(
    store: GraphStore,
    *,
    chapter: int,
    characters: Iterable[str] = (),
    location: str | None = None,
    k_summaries: int = 3,
    embedding: list[float] | None = None,
    k_similar: int = 3,
    query: str | None = None,
    embedded_by: str | None = None,
) -> SceneContext:
    """Everything drafting a scene of `chapter` needs, as of chapter - 1, in one read transaction.

    With `query` (the scene's text), earlier scenes come from the hybrid retrieval shared
    with the dialogue memory (core.recall); without it, from vector similarity alone. Either
    way `embedding` is compared only with scene vectors its own model made (`embedded_by`;
    None: any): a scene another model embedded is found by its words, or not at all."""
    names = list(dict.fromkeys(characters))
    as_of = chapter - 1
    use_numpy = (
        query is None and embedding is not None and not vector_index_ready(store, len(embedding))
    )
    mirror = mirror_of(store)

    def work(tx: ManagedTransaction) -> SceneContext:
        mirror.refresh(tx)
        read: dict[str, dict[str, Any]] = {}
        resolved = _resolve_names(tx, names, None, as_of, read) if names else {}
        ids = list(dict.fromkeys(i for i in resolved.values() if i))
        context = SceneContext(
            chapter=chapter,
            as_of_chapter=as_of,
            characters=_profiles_tx(tx, ids, as_of, mirror, MAX_RELATIONSHIPS, read) if ids else [],
            unresolved_names=[n for n, i in resolved.items() if i is None],
            location=_location_tx(tx, location, as_of, mirror, MAX_PLACE_ITEMS)
            if location
            else None,
            recent_summaries=_summaries_tx(tx, as_of, k_summaries, 1),
        )
        if query is not None:
            context.similar_scenes = hybrid_scenes_tx(
                tx, query, embedding, k_similar, as_of, mirror, embedded_by
            )
        elif use_numpy and embedding is not None:
            context.similar_scenes = similar_scenes_tx(tx, embedding, k_similar, as_of, embedded_by)
        return context

    context = store.execute_read(work)
    if query is None and embedding is not None and not use_numpy:
        context.similar_scenes = similar_scenes(
            store, embedding, k=k_similar, as_of_chapter=as_of, embedded_by=embedded_by
        )
    return context


# --- validation support ------------------------------------------------------------------


def _earlier_scenes(
    mirror: StoryMirror, as_of_chapter: int, embedded_by: str | None
) -> tuple[
    list[tuple[int, int, list[float] | np.ndarray]], dict[tuple[int, int], tuple[str, str | None]]
]:
    """The scenes as of the chapter: their vectors that model `embedded_by` made, and their
    texts (references and hashes), by (chapter, scene)."""
    earlier = mirror.scenes_as_of(as_of_chapter)
    vectors: list[tuple[int, int, list[float] | np.ndarray]] = [
        (s.chapter, s.scene, s.vector)
        for s in earlier
        if s.vector is not None and same_model(s.embedded_by, embedded_by)
    ]
    texts = {
        (s.chapter, s.scene): (s.text_ref, s.text_sha) for s in earlier if s.text_ref is not None
    }
    return vectors, texts


def consistency_facts(
    store: MirroredReader,
    names: Iterable[str],
    *,
    as_of_chapter: int,
    embedded_by: str | None = None,
) -> ConsistencyFacts:
    """What the checks need of the named entities and of every earlier scene, as of the chapter;
    the relationships and scenes come from the story mirror (kg.mirror), kept current first.
    The scene vectors are those model `embedded_by` made (None: any): the new chapter's are
    compared with them."""
    names = list(dict.fromkeys(names))
    mirror = mirror_of(store)

    def work(tx: ManagedTransaction) -> ConsistencyFacts:
        mirror.refresh(tx)
        read: dict[str, dict[str, Any]] = {}
        resolved = _resolve_names(tx, names, None, as_of_chapter, read)
        ids = {i for i in resolved.values() if i}
        entities = _entities(tx, ids, as_of_chapter, sources=False, read=read)
        statuses: dict[str, tuple[str, int]] = {}
        traits: dict[str, list[str]] = {}
        keys_of: dict[str, list[str]] = {}
        for name, eid in resolved.items():
            if not eid or eid not in entities:
                continue
            key = vocab.normalize_name(name)
            keys_of.setdefault(eid, []).append(key)
            entity = entities[eid]
            covering = [i for i in entity.status_intervals if i.covers(as_of_chapter)]
            if covering:
                statuses[key] = (covering[-1].status, covering[-1].from_chapter)
            if entity.traits:
                traits[key] = list(entity.traits)
        relationships: dict[tuple[str, str], tuple[str, int]] = {}
        types: dict[tuple[str, str], dict[str, int]] = {}
        containers: dict[str, set[str]] = {}
        rows = [
            r
            for r in mirror.rows_of(ids, as_of_chapter)
            if r.outgoing and (r.other in ids or r.type == "PART_OF")
        ]
        other_names = _names_as_of(
            tx, {r.other for r in rows if r.type == "PART_OF"}, as_of_chapter
        )
        for row in rows:
            other = row.other
            if not row.outgoing:
                continue
            if row.type == "PART_OF" and other_names.get(other) is not None:
                for a in keys_of.get(row.id, []):
                    containers.setdefault(a, set()).add(vocab.normalize_name(other_names[other][0]))
            if other not in ids:
                continue
            chapter = row.props.get("chapter", 0)
            for a in keys_of.get(row.id, []):
                for b in keys_of.get(other, []):
                    if (a, b) not in relationships or chapter >= relationships[(a, b)][1]:
                        relationships[(a, b)] = (row.type, chapter)
                    seen = types.setdefault((a, b), {})
                    seen[row.type] = max(chapter, seen.get(row.type, chapter))
        scenes, texts = _earlier_scenes(mirror, as_of_chapter, embedded_by)
        return ConsistencyFacts(
            statuses=statuses,
            scene_embeddings=scenes,
            relationships=relationships,
            relationship_types=types,
            traits=traits,
            containers=containers,
            scene_texts=texts,
        )

    return store.execute_read(work)
