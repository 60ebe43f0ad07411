"""Enrichment: entities whose story-relationship count crossed the threshold (spec 003) get
an LLM summary (tasks/healing.py asks for it); this module finds them and stores the result."""

from __future__ import annotations

from neo4j import ManagedTransaction

from core.settings import HealingSettings
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.commit.amendments import Amendment, amend_newest
from kg.healing.models import EnrichmentResult, EnrichmentTarget
from kg.healing.node_writes import HEALER, node_props
from kg.healing.snapshot import HealingSnapshot
from kg.models import EntitySource
from kg.records import entity_from_props
from kg.retrieval import recent_relationships
from kg.store import GraphStore

#: An entity is enriched again once its relationships have grown by this factor since the
#: last enrichment (and by the threshold): a protagonist who gains a few relationships every
#: chapter is summarised at 5, 10, 20, 40, ... relationships, a handful of times in a book,
#: not after every healing run.
REENRICH_GROWTH = 2.0


def due_for_enrichment(count: int, done: object, threshold: int) -> bool:
    """Whether an entity with `count` story relationships, enriched at `done` (None: never),
    is due for an enrichment."""
    if count < threshold:
        return False
    if not isinstance(done, int | float):
        return True
    return count >= done + threshold and count >= done * REENRICH_GROWTH


def enrichment_busy_ids(snap: HealingSnapshot, settings: HealingSettings) -> list[str]:
    """Entities with enough story relationships to be enriched at all (the snapshot's counts)."""
    return sorted(
        eid for eid, count in snap.rel_counts.items() if count >= settings.enrichment_edge_threshold
    )


def enrichment_targets(
    store: GraphStore,
    snap: HealingSnapshot,
    settings: HealingSettings,
    *,
    max_relationships: int = 40,
) -> list[EnrichmentTarget]:
    """Entities whose story-relationship count reached the threshold and were not enriched
    at this size (`due_for_enrichment`), each with its most recent relationships (at most
    `max_relationships`, the latest of each kind with each other entity) for the prompt."""
    threshold = settings.enrichment_edge_threshold
    targets = []
    due = [
        eid
        for eid, count in sorted(snap.rel_counts.items())
        if (e := snap.entities.get(eid)) is not None
        and due_for_enrichment(count, e.attributes.get("enriched_edge_count"), threshold)
    ]
    if not due:
        return []
    latest = recent_relationships(store, due, max_relationships)
    for eid in due:
        e = snap.entities[eid]
        lines = []
        for r in latest.get(eid, []):
            where = f" (chapter {r.chapter})" if r.chapter is not None else ""
            what = f": {r.description}" if r.description else ""
            if r.direction == "out":
                lines.append(f"{e.name} {r.type} {r.other_name}{where}{what}")
            else:
                lines.append(f"{r.other_name} {r.type} {e.name}{where}{what}")
        targets.append(
            EnrichmentTarget(
                id=eid,
                name=e.name,
                label=e.label,
                description=e.description,
                relationship_count=snap.rel_counts[eid],
                relationships=lines,
                last_chapter=e.last_chapter,
            )
        )
    return targets


def enrich_tx(
    tx: ManagedTransaction, result: EnrichmentResult, created_at: str, chapter: int = 0
) -> bool:
    """Store an enrichment: attributes + an `enrichment` source; only adds, never removes."""
    rows = tx.run(mq.LOCK_ENTITIES, ids=[result.id]).data()
    if not rows:
        return False
    before = rows[0]["props"]
    entity = entity_from_props(before)
    attributes = {
        **entity.attributes,
        "enrichment_summary": result.summary,
        "enrichment_facets": list(result.facets),
        "enrichment_confidence": round(result.confidence, 4),
        "enriched_edge_count": result.relationship_count,
    }
    source = EntitySource(
        type="enrichment",
        chapter=chapter,
        created_at=created_at,
        created_by=HEALER,
        confidence=result.confidence,
    )
    entity = entity.model_copy(
        update={
            "attributes": attributes,
            "sources": [*entity.sources, source],
            "description": entity.description or result.summary,
        }
    )
    after = node_props(before, entity, chapter)
    tx.run(mq.REPLACE_ENTITIES, rows=[{"id": result.id, "props": after}]).consume()
    undo = Amendment()
    undo.updated(vocab.ENTITY, result.id, before, after)
    amend_newest(tx, undo)
    return True
