"""Consolidation stage: per-scene extractions -> one normalized chapter delta.

Merges entities named in several scenes (keeping every scene as a provenance source),
normalizes relationship types into the graph vocabulary (kg.models does the mapping;
unknown types become RELATES_TO with the raw text kept), drops self-loops and repeats,
and attaches scene and chapter embeddings.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from core.content import ContentRef
from core.sentences import as_sentence
from kg import vocabulary as vocab
from kg.models import (
    ChapterDelta,
    Entity,
    EntitySource,
    Relationship,
    SceneDelta,
    StatusChange,
    user_location,
)
from prompts.initialization.models import CharacterSheets, GlobalOutline, OutlineRelationships
from prompts.knowledge.models import ExtractedEntity, SceneExtraction
from prompts.narrative.models import ScenePlan
from tasks.policy import plain_task
from tasks.services import Services

# Extraction kinds that are not graph labels by the same name.
KIND_TO_LABEL = {"Organization": "Faction"}
EXTRACTION_CONFIDENCE = 0.6


def merge_extractions(
    chapter: int, extractions: list[SceneExtraction]
) -> tuple[list[Entity], list[Relationship], list[StatusChange]]:
    """Pure merge of (grounded) scene extractions, scene numbers starting at 1. Every fact
    keeps its evidence: the entity's sources hold the quote that shows it in each scene and
    one per trait; relationships and status changes carry their scene and quote."""
    scenes = list(enumerate(extractions, start=1))
    return (
        _merge_entities(chapter, scenes),
        _merge_relationships(chapter, scenes),
        _merge_statuses(chapter, scenes),
    )


def _merge_entities(chapter: int, scenes: list[tuple[int, SceneExtraction]]) -> list[Entity]:
    """One entity a normalized name, in the order first seen: its traits in order, the longest
    description, and the sources of every scene it was found in."""
    entities: dict[str, Entity] = {}
    for scene_number, extraction in scenes:
        for found in extraction.entities:
            name = found.name.strip()
            if not name:
                continue
            found = found.model_copy(update={"description": as_sentence(found.description)})
            key = vocab.normalize_name(name)
            sources = _entity_sources(chapter, scene_number, found)
            if key in entities:
                known = entities[key]
                seen = {x.lower() for x in known.traits}
                traits = known.traits + [t for t in found.trait_names if t.lower() not in seen]
                description = (
                    known.description
                    if len(known.description) >= len(found.description)
                    else found.description
                )
                entities[key] = known.model_copy(
                    update={
                        "traits": traits,
                        "description": description,
                        "sources": [*known.sources, *sources],
                    }
                )
            else:
                entities[key] = Entity(
                    label=KIND_TO_LABEL.get(found.kind, found.kind),
                    name=name,
                    description=found.description,
                    traits=list(dict.fromkeys(found.trait_names)),
                    sources=sources,
                )
    return list(entities.values())


def _entity_sources(chapter: int, scene_number: int, found: ExtractedEntity) -> list[EntitySource]:
    """The evidence of one scene's entity: the quote that mentions it, then one per trait."""
    mention = EntitySource(
        type="extraction",
        chapter=chapter,
        scene=scene_number,
        original_name=found.name,
        confidence=EXTRACTION_CONFIDENCE,
        quote=found.quote or None,
    )
    return [mention] + [
        EntitySource(
            type="extraction",
            chapter=chapter,
            scene=scene_number,
            confidence=EXTRACTION_CONFIDENCE,
            quote=trait.quote or None,
            fact="trait",
            value=trait.trait,
        )
        for trait in found.traits
        if trait.quote
    ]


def _merge_relationships(
    chapter: int, scenes: list[tuple[int, SceneExtraction]]
) -> list[Relationship]:
    """The first of each (source, type, target), a relationship of an entity with itself
    dropped."""
    relationships: dict[tuple[str, str, str], Relationship] = {}
    for scene_number, extraction in scenes:
        for rel in extraction.relationships:
            source, target = rel.source.strip(), rel.target.strip()
            if (
                not source
                or not target
                or vocab.normalize_name(source) == vocab.normalize_name(target)
            ):
                continue
            normalized = Relationship(
                source=source,
                target=target,
                type=rel.type,
                chapter=chapter,
                scene=scene_number,
                description=rel.description,
                quote=rel.quote or None,
            )
            key = (vocab.normalize_name(source), normalized.type, vocab.normalize_name(target))
            relationships.setdefault(key, normalized)
    return list(relationships.values())


def _merge_statuses(chapter: int, scenes: list[tuple[int, SceneExtraction]]) -> list[StatusChange]:
    """The last status change of each entity."""
    statuses: dict[str, StatusChange] = {}
    for scene_number, extraction in scenes:
        for change in extraction.status_changes:
            if change.name.strip():
                statuses[vocab.normalize_name(change.name)] = StatusChange(
                    entity=change.name.strip(),
                    status=change.status,
                    chapter=chapter,
                    scene=scene_number,
                    quote=change.quote or None,
                )
    return list(statuses.values())


class ChapterParts(BaseModel):
    """What a chapter's graph delta is built from: the stage's parameter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int = Field(ge=1)
    title: str
    iteration: int = Field(ge=1)
    plan: ContentRef
    scenes: tuple[ContentRef, ...]
    extractions: tuple[ContentRef, ...] = Field(description="the grounded extractions, one a scene")
    embeddings: ContentRef | None = Field(description="the scenes' vectors; None: none (optional)")
    chapter_text: ContentRef


@plain_task("consolidate_extraction")
def build_chapter_delta(services: Services, parts: ChapterParts) -> ContentRef:
    """Consolidate, normalize and embed: the chapter's graph delta, stored as content."""
    number, title, iteration, plan = parts.number, parts.title, parts.iteration, parts.plan
    scenes, extractions, embeddings = parts.scenes, parts.extractions, parts.embeddings
    chapter_text = parts.chapter_text
    store = services.content
    scene_plan = store.get_model(plan, ScenePlan)
    entities, relationships, statuses = merge_extractions(
        number, [store.get_model(ref, SceneExtraction) for ref in extractions]
    )
    # Without embeddings (they are optional) the chapter is committed without vectors.
    vectors: list[list[float] | None] = [None] * len(scenes)
    chapter_vector: list[float] | None = None
    # What made the vectors: similarity compares a query only with its own model's (kg.similarity).
    embedded_by = services.llm.embedding_fingerprint() if embeddings is not None else None
    if embeddings is not None:
        matrix = store.get_array(embeddings).astype(np.float32)
        mean = matrix.mean(axis=0)
        mean /= max(float(np.linalg.norm(mean)), 1e-12)
        chapter_vector = [round(float(x), 6) for x in mean]
        vectors = [[round(float(x), 6) for x in row] for row in matrix]
    scene_deltas = [
        SceneDelta(
            index=index,
            title=detail.title,
            summary="; ".join(detail.beats),
            text_ref=ref.path,
            text_sha=ref.sha256,
            location=detail.setting or None,
            characters=list(detail.characters),
            embedding=vector,
            embedded_by=embedded_by if vector is not None else None,
        )
        for index, (detail, ref, vector) in enumerate(
            zip(scene_plan.scenes, scenes, vectors, strict=True), start=1
        )
    ]
    delta = ChapterDelta(
        chapter=number,
        title=title,
        text_ref=chapter_text.path,
        text_sha=chapter_text.sha256,
        embedding=chapter_vector,
        embedded_by=embedded_by,
        entities=entities,
        relationships=relationships,
        status_changes=statuses,
        scenes=scene_deltas,
        novel_info=None,
    )
    return store.put_json("deltas", f"chapter_{number:03d}/iter_{iteration}", delta)


def initialization_delta(
    characters: CharacterSheets, outline: GlobalOutline, world: OutlineRelationships, genre: str
) -> ChapterDelta:
    """The initialization phase as chapter 0: canonical (non-provisional) outline entities."""
    source = EntitySource(type="outline", chapter=0, confidence=1.0)
    entities = [
        Entity(
            label="Character",
            name=c.name,
            description=c.description,
            traits=list(dict.fromkeys(c.traits)),
            attributes={
                "role": c.role,
                "motivation": c.motivation,
                "backstory": c.backstory,
                "voice": c.voice,
            },
            sources=[source.model_copy(update={"original_name": c.name})],
            is_provisional=False,
            first_chapter=0,
            status_intervals=[{"status": "alive", "from_chapter": 0}],
        )
        for c in characters.characters
    ]
    known = {vocab.normalize_name(e.name) for e in entities}
    for location in world.locations:
        if location.name.strip() and vocab.normalize_name(location.name) not in known:
            known.add(vocab.normalize_name(location.name))
            entities.append(
                user_location(location.name, location.description, source, first_chapter=0)
            )
    relationships = []
    seen: set[tuple[str, str, str]] = set()
    for rel in world.relationships:
        ends = (vocab.normalize_name(rel.source), vocab.normalize_name(rel.target))
        if ends[0] == ends[1] or not all(ends):
            continue
        normalized = Relationship(
            source=rel.source,
            target=rel.target,
            type=rel.type,
            chapter=0,
            description=rel.description,
        )
        key = (ends[0], normalized.type, ends[1])
        if key not in seen:
            seen.add(key)
            relationships.append(normalized)
    return ChapterDelta(
        chapter=0,
        title=outline.title,
        summary=outline.logline,
        source_type="outline",
        entities=entities,
        relationships=relationships,
        novel_info={
            "title": outline.title,
            "logline": outline.logline,
            "setting": outline.setting,
            "genre": genre,
            "themes": list(outline.themes),
        },
    )
