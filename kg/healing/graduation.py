"""Graduation: a provisional entity becomes confirmed once it is connected, described and
has been around for a few chapters (confidence formula: see the constants)."""

from __future__ import annotations

from neo4j import ManagedTransaction

from core.settings import HealingSettings
from kg import maintenance_cypher as mq
from kg import vocabulary as vocab
from kg.commit.amendments import Amendment, amend_newest
from kg.healing.models import Graduation
from kg.healing.node_writes import node_props
from kg.healing.snapshot import HealingSnapshot
from kg.records import entity_from_props

#: Graduation: confidence = W_CONNECTIVITY * min(1, neighbours / CONNECTIVITY_FULL)
#:   + W_COMPLETENESS * completeness + W_AGE * min(1, chapters since first seen / AGE_FULL),
#: completeness = 0.6 [has description] + 0.2 [has traits] + 0.2 [has attributes or aliases].
W_CONNECTIVITY, W_COMPLETENESS, W_AGE = 0.4, 0.3, 0.3
CONNECTIVITY_FULL = 3
AGE_FULL = 3


def graduation_score(snap: HealingSnapshot, eid: str) -> Graduation:
    """Confidence that a provisional entity is real (formula: see the constants above)."""
    e = snap.entities[eid]
    connectivity = min(1.0, len(snap.neighbours.get(eid, ())) / CONNECTIVITY_FULL)
    completeness = (
        0.6 * bool(e.description.strip())
        + 0.2 * bool(e.traits)
        + 0.2 * bool(e.attributes or e.aliases)
    )
    latest = snap.latest_chapter
    if e.first_chapter is None or latest is None:
        age = 0.0
    else:
        age = min(1.0, max(0, latest - e.first_chapter + 1) / AGE_FULL)
    confidence = W_CONNECTIVITY * connectivity + W_COMPLETENESS * completeness + W_AGE * age
    return Graduation(
        id=eid,
        name=e.name,
        confidence=round(confidence, 4),
        connectivity=round(connectivity, 4),
        completeness=round(completeness, 4),
        age=round(age, 4),
    )


def graduation_candidates(snap: HealingSnapshot, settings: HealingSettings) -> list[Graduation]:
    scores = [
        graduation_score(snap, eid) for eid, e in sorted(snap.entities.items()) if e.is_provisional
    ]
    return [g for g in scores if g.confidence >= settings.graduation_confidence]


def graduate_tx(
    tx: ManagedTransaction, graduations: list[Graduation], chapter: int = 0
) -> list[Graduation]:
    """Confirm the entities (still provisional ones only); returns those changed."""
    by_id = {g.id: g for g in graduations}
    rows, done = [], []
    undo = Amendment()
    for row in tx.run(mq.LOCK_ENTITIES, ids=sorted(by_id)):
        before = row["props"]
        if not before.get("is_provisional"):
            continue
        entity = entity_from_props(before)
        grad = by_id[row["id"]]
        entity = entity.model_copy(
            update={
                "is_provisional": False,
                "attributes": {**entity.attributes, "graduation_confidence": grad.confidence},
            }
        )
        after = node_props(before, entity, chapter)
        rows.append({"id": row["id"], "props": after})
        undo.updated(vocab.ENTITY, row["id"], before, after)
        done.append(grad)
    if rows:
        tx.run(mq.REPLACE_ENTITIES, rows=rows).consume()
        amend_newest(tx, undo)
    return done
