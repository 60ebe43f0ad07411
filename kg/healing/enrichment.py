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
from kg.store import GraphStore


def enrichment_targets(store: GraphStore, snap: HealingSnapshot, settings: HealingSettings,
                       *, max_relationships: int = 40) -> list[EnrichmentTarget]:
    """Entities whose story-relationship count reached the threshold and were not enriched
    at this size: never enriched, or grown by another threshold's worth of relationships
    since (so an active entity is re-enriched in steps, not on every run)."""
    threshold = settings.enrichment_edge_threshold
    targets = []
    for eid, count in sorted(snap.rel_counts.items()):
        e = snap.entities.get(eid)
        if e is None or count < threshold:
            continue
        done = e.attributes.get("enriched_edge_count")
        if isinstance(done, int | float) and count < done + threshold:
            continue
        lines = []
        for r in store.read(mq.STORY_RELS_OF, id=eid, limit=max_relationships):
            where = f" (chapter {r['chapter']})" if r["chapter"] is not None else ""
            what = f": {r['description']}" if r["description"] else ""
            if r["outgoing"]:
                lines.append(f"{e.name} {r['type']} {r['other']}{where}{what}")
            else:
                lines.append(f"{r['other']} {r['type']} {e.name}{where}{what}")
        targets.append(
            EnrichmentTarget(id=eid, name=e.name, label=e.label, description=e.description, relationship_count=count,
                             relationships=lines, last_chapter=e.last_chapter)
        )
    return targets


def enrich_tx(tx: ManagedTransaction, result: EnrichmentResult, created_at: str, chapter: int = 0) -> bool:
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
    source = EntitySource(type="enrichment", chapter=chapter, created_at=created_at, created_by=HEALER,
                          confidence=result.confidence)
    entity = entity.model_copy(
        update={
            "attributes": attributes,
            "sources": [*entity.sources, source],
            "description": entity.description or result.summary,
        }
    )
    tx.run(mq.REPLACE_ENTITIES, rows=[{"id": result.id, "props": node_props(before, entity, chapter)}]).consume()
    undo = Amendment()
    undo.updated(vocab.ENTITY, result.id, before)
    amend_newest(tx, undo)
    return True
