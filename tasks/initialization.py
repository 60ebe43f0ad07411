"""Initialization stage: character sheets, global outline, act outlines, chapter outlines,
outline relationships. Each LLM step is a cached task returning a ContentRef."""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from core.errors import LLMBadOutputError
from core.grounding import distinct_texts, name_problem, normalise, usable_title
from core.sentences import as_sentence
from kg import vocabulary as vocab
from prompts import render_messages
from prompts.initialization.models import (
    ActOutline,
    ChapterOutline,
    ChapterOutlines,
    CharacterSheet,
    CharacterSheets,
    GlobalOutline,
    OutlineRelationships,
)
from tasks.planning import tidy_outline
from tasks.policy import llm_task
from tasks.services import Services

#: The tiers these stages ask (their models' fingerprint is in each stage's cache key).
INIT_TIER = "large"
RELATIONSHIPS_TIER = "small"
MAX_OUTLINE_CALLS_PER_ACT = 4
#: Answers asked for character sheets before a run gives up for want of one usable name.
MAX_SHEET_CALLS = 3
SHEET_PROSE_FIELDS = ("description", "motivation", "backstory", "voice")
#: The book's title when the model's is a loop or a paragraph (the writer renames it in the bible).
UNTITLED = "Untitled"


def act_ranges(chapters: int, acts: int) -> list[tuple[int, int, int]]:
    """Split chapters 1..N into `acts` contiguous ranges: (act, first, last)."""
    acts = max(1, min(acts, chapters))
    base, extra = divmod(chapters, acts)
    ranges, first = [], 1
    for act in range(1, acts + 1):
        size = base + (1 if act <= extra else 0)
        ranges.append((act, first, first + size - 1))
        first += size
    return ranges


@llm_task("generate_character_sheets", tier=INIT_TIER)
def generate_character_sheets(
    services: Services, premise: str, genre: str, count: int
) -> ContentRef:
    """Character sheets with usable names, asking again (with the refused names and why) when
    the model wrote none: a small model's first answer is sometimes all identifiers
    ('Lighthouse_Lady_Amara') or loops, and a run must not die on its first call for that."""
    log = get_run_logger()
    refused: list[tuple[str, str]] = []
    unique: list[CharacterSheet] = []
    written = 0
    for _ in range(MAX_SHEET_CALLS):
        sheets = services.llm.structured(
            INIT_TIER,
            render_messages(
                "initialization/character_sheets",
                premise=premise,
                genre=genre,
                count=count,
                refused=refused,
            ),
            CharacterSheets,
            purpose="character_sheets",
        )
        written += len(sheets.characters)
        unique, refused_now, left_out = usable_sheets(sheets)
        for name, problem in refused_now:
            log.warning("init: character sheet %r refused: %s", name, problem)
        for note in left_out:
            log.warning("init: %s not used", note)
        if unique:
            break
        refused.extend(refused_now)
    if not unique:
        raise LLMBadOutputError(
            f"the model wrote {written} character sheets in {MAX_SHEET_CALLS} answers and none "
            "has a usable name",
            hint="use a stronger model for the large tier (OPENAI_BASE_URL)",
        )
    result = CharacterSheets(characters=unique)
    log.info("init: %d character sheets: %s", len(unique), ", ".join(c.name for c in unique))
    return services.content.put_json("character_sheets", "characters", result)


def usable_sheets(
    sheets: CharacterSheets,
) -> tuple[list[CharacterSheet], list[tuple[str, str]], list[str]]:
    """The sheets whose names can be identities in the graph, each name once, tidied
    (`tidy_sheet`); each refused name (cut to 80 characters) with why
    (core.grounding.name_problem); and what tidying left out, said for the log."""
    seen: set[str] = set()
    unique: list[CharacterSheet] = []
    refused: list[tuple[str, str]] = []
    left_out: list[str] = []
    for sheet in sheets.characters:
        key, problem = vocab.normalize_name(sheet.name), name_problem(sheet.name)
        if problem is not None:
            refused.append((sheet.name[:80], problem))
        elif key not in seen:
            seen.add(key)
            tidy, dropped = tidy_sheet(sheet)
            unique.append(tidy)
            if dropped:
                left_out.append(f"{sheet.name}'s sheet: {'; '.join(dropped)}")
    return unique, refused, left_out


def tidy_sheet(sheet: CharacterSheet) -> tuple[CharacterSheet, list[str]]:
    """A sheet as the bible keeps it, and what was left out: prose fields as sentences, never
    fragments cut at a comma; each trait once (a small model wrote "loyal, protective, and
    protective of the town." three times); no role that only repeats the name (role "Lysander"
    for Lysander says nothing)."""
    dropped: list[str] = []
    role = sheet.role.strip()
    if role and normalise(role) == normalise(sheet.name):
        dropped.append(f"role {role[:40]!r} (the name)")
        role = ""
    traits = distinct_texts(sheet.traits, unwanted=[sheet.name])
    if len(traits) < len(sheet.traits):
        dropped.append(f"{len(sheet.traits) - len(traits)} trait(s) said twice or blank")
    tidy = sheet.model_copy(
        update={
            **{f: as_sentence(getattr(sheet, f)) for f in SHEET_PROSE_FIELDS},
            "role": role,
            "traits": traits,
        }
    )
    return tidy, dropped


@llm_task("generate_global_outline", tier=INIT_TIER)
def generate_global_outline(
    services: Services, premise: str, genre: str, chapters: int, acts: int, characters: ContentRef
) -> ContentRef:
    sheets = services.content.get_model(characters, CharacterSheets)
    outline = services.llm.structured(
        INIT_TIER,
        render_messages(
            "initialization/global_outline",
            premise=premise,
            genre=genre,
            chapters=chapters,
            acts=acts,
            characters=sheets.characters,
        ),
        GlobalOutline,
        purpose="global_outline",
    )
    # Keep exactly `acts` acts numbered 1..acts so later stages can rely on it.
    summaries = [a.summary for a in outline.acts][:acts]
    while len(summaries) < acts:
        summaries.append(outline.logline)
    title, problem = usable_title(outline.title, UNTITLED)
    if problem:
        get_run_logger().warning(
            "init: the book's title %r is not used (%s)", outline.title[:80], problem
        )
    # A theme is not the book's title said again, nor said twice.
    themes = distinct_texts(outline.themes, unwanted=[outline.title, title])
    if len(themes) < len(outline.themes):
        get_run_logger().warning(
            "init: %d of the outline's themes not used (the title, said twice or blank)",
            len(outline.themes) - len(themes),
        )
    outline = GlobalOutline.model_validate(
        {
            **outline.model_dump(),
            "title": title,
            "themes": themes,
            "acts": [{"number": i + 1, "summary": s} for i, s in enumerate(summaries)],
        }
    )
    get_run_logger().info("init: global outline %r with %d acts", outline.title, len(outline.acts))
    return services.content.put_json("global_outline", "outline", outline)


@llm_task("generate_act_outline", tier=INIT_TIER)
def generate_act_outline(
    services: Services, global_outline: ContentRef, act: int, first: int, last: int
) -> ContentRef:
    outline = services.content.get_model(global_outline, GlobalOutline)
    act_outline = services.llm.structured(
        INIT_TIER,
        render_messages(
            "initialization/act_outline",
            outline=outline,
            act=outline.acts[act - 1],
            first_chapter=first,
            last_chapter=last,
        ),
        ActOutline,
        purpose="act_outline",
    )
    events = distinct_texts(act_outline.key_events, unwanted=[outline.title])
    if len(events) < len(act_outline.key_events):
        get_run_logger().warning(
            "init: act %d's outline: %d key event(s) said twice, blank or the title not used",
            act,
            len(act_outline.key_events) - len(events),
        )
    act_outline = act_outline.model_copy(update={"key_events": events})
    return services.content.put_json("act_outlines", f"act_{act:02d}", act_outline)


@llm_task("generate_chapter_outlines", tier=INIT_TIER)
def generate_chapter_outlines(
    services: Services,
    global_outline: ContentRef,
    act_outline: ContentRef,
    act: int,
    first: int,
    last: int,
    character_names: tuple[str, ...],
) -> ContentRef:
    """Outline chapters first..last of one act; re-ask for any chapters the model skipped."""
    outline = services.content.get_model(global_outline, GlobalOutline)
    act_model = services.content.get_model(act_outline, ActOutline)
    got: dict[int, ChapterOutline] = {}
    for _ in range(MAX_OUTLINE_CALLS_PER_ACT):
        missing = [n for n in range(first, last + 1) if n not in got]
        if not missing:
            break
        answer = services.llm.structured(
            INIT_TIER,
            render_messages(
                "initialization/chapter_outlines",
                outline=outline,
                act=act_model,
                act_number=act,
                first_chapter=missing[0],
                last_chapter=missing[-1],
                character_names=character_names,
            ),
            ChapterOutlines,
            purpose="chapter_outlines",
        )
        # Models number chapters unreliably: take them in order for the missing slots.
        for slot, chapter in zip(missing, answer.chapters, strict=False):
            taken = (outline.title, *(c.title for c in got.values()))
            title, problem = usable_title(chapter.title, f"Chapter {slot}", taken=taken)
            if problem:
                get_run_logger().warning(
                    "init: chapter %d's title %r is not used (%s)",
                    slot,
                    chapter.title[:80],
                    problem,
                )
            tidy, dropped = tidy_outline(
                chapter.model_copy(update={"number": slot, "title": title}),
                character_names,
                taken,
            )
            if dropped:
                get_run_logger().warning(
                    "init: chapter %d's outline: %s not used", slot, "; ".join(dropped)
                )
            got[slot] = tidy
    if len(got) < last - first + 1:
        raise LLMBadOutputError(
            f"the model outlined {len(got)} of chapters {first}-{last} after {MAX_OUTLINE_CALLS_PER_ACT} requests",
            hint="use a stronger model for the large tier",
        )
    result = ChapterOutlines(chapters=[got[n] for n in range(first, last + 1)])
    return services.content.put_json("chapter_outlines", f"act_{act:02d}", result)


@llm_task("extract_outline_relationships", tier=RELATIONSHIPS_TIER)
def extract_outline_relationships(
    services: Services,
    global_outline: ContentRef,
    chapter_outlines: tuple[ContentRef, ...],
    character_names: tuple[str, ...],
) -> ContentRef:
    outline = services.content.get_model(global_outline, GlobalOutline)
    chapters = [
        c
        for ref in chapter_outlines
        for c in services.content.get_model(ref, ChapterOutlines).chapters
    ]
    rels = services.llm.structured(
        RELATIONSHIPS_TIER,
        render_messages(
            "initialization/relationships",
            outline=outline,
            chapters=chapters,
            character_names=character_names,
        ),
        OutlineRelationships,
        purpose="outline_relationships",
    )
    titles = (outline.title, *(c.title for c in chapters))
    rels, refusals = world_with_names(rels, character_names, titles)
    for refusal in refusals:
        get_run_logger().warning("init: %s", refusal)
    return services.content.put_json("outline_relationships", "relationships", rels)


def world_with_names(
    world: OutlineRelationships, character_names: tuple[str, ...], titles: tuple[str, ...]
) -> tuple[OutlineRelationships, list[str]]:
    """The outline's places whose names can be names, and the relationships between the
    cast and those places only: both ends of each must be someone or somewhere of the bible;
    and what was refused and why, each refusal once (a small model repeats itself)."""
    refusals: list[str] = []
    places = []
    cast = {vocab.normalize_name(n) for n in character_names}
    known = set(cast)
    for place in world.locations:
        key = vocab.normalize_name(place.name)
        if key in cast:
            problem: str | None = "already a character's name"
        elif key in known:
            problem = "already a place of the outline"
        else:
            problem = name_problem(place.name, titles)
        if problem is None and key:
            known.add(key)
            places.append(place)
        else:
            refusals.append(f"place {place.name[:80]!r} refused: {problem or 'blank name'}")
    relationships = []
    for rel in world.relationships:
        ends = (vocab.normalize_name(rel.source), vocab.normalize_name(rel.target))
        if ends[0] in known and ends[1] in known and ends[0] != ends[1]:
            relationships.append(rel)
        else:
            refusals.append(
                f"relationship {rel.source[:60]!r} -{rel.type[:40]}-> {rel.target[:60]!r} "
                "refused: an end is not a character or place of the bible"
            )
    world = OutlineRelationships(relationships=relationships, locations=places)
    return world, list(dict.fromkeys(refusals))
