"""Context retrieval stage: graph + hybrid (lexical + vector) context for drafting one scene.

Reads the world "as of the previous chapter" (profiles, relationships, statuses, the
location, recent summaries, similar earlier scenes) and fits it into the context
envelope's per-section token budgets. The stage is cached under the chapter's history
(tasks.policy.graph_read_task: every change-set committed before the chapter, healing's
amendments included), so a replayed chapter gets the context it was drafted with, whatever
was committed or healed since, and its draft replays from the cache. The query embedding is
a cached task too, so a resumed run asks the embedding endpoint nothing.
"""

from __future__ import annotations

import hashlib

from prefect import get_run_logger

from core.content import ContentRef
from core.errors import LLMError
from kg.models import EntityProfile, SceneContext
from kg.retrieval import scene_context
from prompts.narrative.models import SceneDetail
from tasks.context import ContextEnvelope, build_envelope
from tasks.embedding import embed_texts
from tasks.policy import graph_read_task
from tasks.services import Services

# Room kept free for the fixed prompt text around the context.
PROMPT_OVERHEAD_TOKENS = 400
# A character attribute (backstory, motivation) longer than this keeps its first sentences.
BACKSTORY_CHARS = 240


def scene_query(scene: SceneDetail) -> str:
    return f"{scene.title}. {scene.setting}. " + " ".join(scene.beats)


def _profile_line(profile: EntityProfile) -> str:
    """Who a character is for the novelist: description, traits, and what drives them
    (motivation, backstory essentials, voice) from the character sheet's attributes."""
    entity = profile.entity
    line = (
        f"{entity.name} ({entity.label.lower()}{', ' + profile.status if profile.status else ''})"
    )
    if entity.description:
        line += f": {entity.description}"
    details = []
    if entity.traits:
        details.append("traits: " + ", ".join(entity.traits))
    for key in ("motivation", "backstory", "voice"):
        value = str(entity.attributes.get(key) or "").strip()
        if value:
            details.append(f"{key}: {_essentials(value)}")
    return line + ("; " + "; ".join(details) if details else "")


def _essentials(text: str, limit: int = BACKSTORY_CHARS) -> str:
    """The first sentences of a long attribute, up to `limit` characters."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
    return cut[: end + 1] if end > limit // 3 else cut.rsplit(" ", 1)[0] + " …"


def sections_from(context: SceneContext) -> dict[str, list[str]]:
    """Context sections in priority order within each section."""
    characters = [_profile_line(p) for p in context.characters]
    relationships = []
    for profile in context.characters:
        for rel in profile.relationships:
            if rel.direction == "out":
                label = (rel.raw_type or rel.type).replace("_", " ").lower()
                relationships.append(
                    f"{profile.entity.name} {label} {rel.other_name}"
                    + (f" (since chapter {rel.chapter})" if rel.chapter else "")
                )
    lore = []
    if context.location is not None:
        place = context.location
        lore.append(f"{place.location.name}: {place.location.description}".rstrip(": "))
        lore += [f"{e.name} is here" for e in place.occupants]
        lore += [f"event here: {e.name}: {e.description}".rstrip(": ") for e in place.events]
        lore += [f"part of {e.name}" for e in place.parents]
    summaries = [
        f"Chapter {s.chapter}{': ' + s.title if s.title else ''}: {s.summary}"
        for s in reversed(context.recent_summaries)
        if s.summary
    ]
    history = [
        f"Chapter {hit.chapter} scene {hit.scene}: {hit.title}: {hit.summary}".rstrip(": ")
        for hit in context.similar_scenes
    ]
    return {
        "characters": characters,
        "relationships": list(dict.fromkeys(relationships)),
        "lore": lore,
        "summaries": summaries,
        "history": history,
    }


@graph_read_task("retrieve_context", chapter="chapter_number")
def retrieve_context(
    services: Services,
    chapter_number: int,
    scene: SceneDetail,
    guidance: tuple[str, ...] = (),
    fixed_tokens: int = PROMPT_OVERHEAD_TOKENS,
) -> ContentRef:
    """The scene's context text, stored as content (drafting takes the reference).

    `guidance` (revision guidance) fills the envelope's guidance share, so it is counted in
    the budget; `fixed_tokens` is the rest of the prompt, measured by the caller."""
    text = scene_query(scene)
    # A stable name (Python's hash() is salted per process) keeps the cache key stable.
    name = hashlib.sha256("\n".join((text, *guidance)).encode("utf-8")).hexdigest()[:16]
    vector = _query_vector(services, chapter_number, text)
    names = [scene.pov, *scene.characters] if scene.pov else list(scene.characters)
    # Earlier scenes through the hybrid retrieval shared with the dialogue memory (core.recall).
    context = scene_context(
        services.graph_reader,
        chapter=chapter_number,
        characters=names,
        location=scene.setting or None,
        embedding=vector,
        query=text,
        embedded_by=services.llm.embedding_fingerprint(),
    )
    tier = services.settings.tier("narrative")
    sections = sections_from(context) | {"guidance": list(guidance)}
    envelope = build_envelope(
        sections,
        services.settings.limits.context_budget,
        tier.context_window,
        reserved_tokens=fixed_tokens + tier.max_tokens,
    )
    _report(services, chapter_number, scene, context, envelope, fixed_tokens, name)
    return services.content.put_text(
        "context", f"chapter_{chapter_number:03d}/{name}", envelope.text
    )


def _query_vector(services: Services, chapter_number: int, text: str) -> list[float] | None:
    """The scene query's embedding (a cached task), or None when there is none: embeddings
    are optional (spec 001 section 7), graph context works without them."""
    # A stable name (Python's hash() is salted per process) keeps the cache key stable.
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    try:
        query = embed_texts(services, f"queries/chapter_{chapter_number:03d}/{digest}", (text,))
        return services.content.get_array(query)[0].tolist()
    except LLMError as exc:
        get_run_logger().warning(
            "chapter %d: no query embedding, retrieving without vector search: %s",
            chapter_number,
            exc,
        )
        return None


def _report(
    services: Services,
    chapter_number: int,
    scene: SceneDetail,
    context: SceneContext,
    envelope: ContextEnvelope,
    fixed_tokens: int,
    name: str,
) -> None:
    """Log what went into a scene's context and store it, section by section, with what was
    cut: nothing is left out silently."""
    log = get_run_logger()
    log.info(
        "chapter %d: context for %r: %d/%d tokens (%s)",
        chapter_number,
        scene.title,
        envelope.used_tokens,
        envelope.total_budget,
        ", ".join(f"{s.name} {s.items_kept}/{s.items_in}" for s in envelope.sections) or "empty",
    )
    # What the budget cut, and what was not even read.
    for section in envelope.sections:
        if section.cut:
            log.info("chapter %d: context for %r: %s", chapter_number, scene.title, section.cut)
    for profile in context.characters:
        if profile.relationships_left_out:
            log.info(
                "chapter %d: context for %r: %s's %d older relationships were not read (the %d most recent "
                "are, more than the prompt's budget holds)",
                chapter_number,
                scene.title,
                profile.entity.name,
                profile.relationships_left_out,
                len(profile.relationships),
            )
    # What went into the prompt, section by section, and what was cut (for audits and bench/long_book.py).
    services.content.put_json(
        "context_budget",
        f"chapter_{chapter_number:03d}/{name}",
        {
            "chapter": chapter_number,
            "scene": scene.title,
            "fixed_tokens": fixed_tokens,
            **envelope.model_dump(exclude={"text"}),
            "cuts": [s.cut for s in envelope.sections if s.cut],
            "not_read": {
                p.entity.name: p.relationships_left_out
                for p in context.characters
                if p.relationships_left_out
            },
        },
    )
