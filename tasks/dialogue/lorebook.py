"""A conversation's memory as a SillyTavern World Info book (lorebook), in the layout
SillyTavern's own World Info import accepts (public/scripts/world-info.js `importWorldInfo`,
POST /api/worldinfo/import: a JSON object with `entries`, keyed by each entry's uid as a
string; the fields and defaults of `newWorldInfoEntryDefinition`, SillyTavern 1.12).

The contract:

- one entry per entity: its name and aliases are the entry's keys (SillyTavern injects the
  entry when a scanned message names it); the content is what the graph holds about it now:
  kind, bio summary, traits, the facts the committed turns stated about it, its milestones.
  A fact goes to every entity it names (name or alias, whole words, case- and
  punctuation-insensitive), and to the turn's speaker when it names none. A superseded bio or
  trait, and the facts of a replaced or rewound turn, are not in it: the graph no longer
  holds them.
- one entry per pair of entities with a relation: the first's names are the keys, the
  second's the secondary keys (selective, AND ANY: injected when both are named); each
  relation type between them appears once, in its latest state (active with its strength, or
  ended, and when).
- entries are ordered by first appearance in the conversation (an entity before the pair
  that appears in the same turn), and the uid is the position in that order, so a book read
  again after more turns keeps the earlier entries' uids (a rewind can change them).

The book is built from pydantic models rather than a hand-written dict: the same model is
the HTTP response's documented schema (api.readback) and what the CLI writes.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from kg import vocabulary as vocab
from kg.dialogue import REL_ACTIVE, ConversationLore, DialogueRepository, LoreEntity, LoreRelation

#: SillyTavern's defaults (world-info.js: DEFAULT_DEPTH, DEFAULT_WEIGHT, world_info_position.before,
#: world_info_logic.AND_ANY).
ST_DEFAULT_DEPTH = 4
ST_DEFAULT_WEIGHT = 100
ST_POSITION_BEFORE_CHARACTER = 0
ST_LOGIC_AND_ANY = 0
ENTITY_ORDER = 100
RELATION_ORDER = 90


class WorldInfoEntry(BaseModel):
    """One World Info entry, every field of SillyTavern's entry template (names as SillyTavern
    spells them). Where its editor rewrites a field when it shows an entry (selective always on,
    role null unless the position is at depth, sticky/cooldown/delay 0 for none), the value is
    the one it writes, so a book shown in SillyTavern is saved back unchanged."""

    uid: int = Field(description="the entry's id; also its key in `entries`")
    key: list[str] = Field(description="primary keywords: an entity's name and aliases")
    keysecondary: list[str] = Field(
        default_factory=list,
        description="secondary keywords (relation entries: the other side's names)",
    )
    comment: str = Field("", description="the entry's title in SillyTavern's editor")
    content: str = Field(description="the text SillyTavern injects")
    constant: bool = False
    vectorized: bool = False
    selective: bool = Field(
        True,
        description="the secondary keywords must match too (ignored when there are "
        "none; SillyTavern's editor sets it on for every entry)",
    )
    selectiveLogic: int = Field(
        ST_LOGIC_AND_ANY, description="0 AND ANY, 1 NOT ALL, 2 NOT ANY, 3 AND ALL"
    )
    addMemo: bool = True
    order: int = Field(
        ENTITY_ORDER, description="insertion priority (higher goes later, nearer the chat)"
    )
    position: int = Field(
        ST_POSITION_BEFORE_CHARACTER, description="0: before the character definitions"
    )
    disable: bool = False
    excludeRecursion: bool = False
    preventRecursion: bool = False
    delayUntilRecursion: int = 0
    probability: int = 100
    useProbability: bool = True
    depth: int = ST_DEFAULT_DEPTH
    group: str = ""
    groupOverride: bool = False
    groupWeight: int = ST_DEFAULT_WEIGHT
    scanDepth: int | None = None
    caseSensitive: bool | None = None
    matchWholeWords: bool | None = None
    useGroupScoring: bool | None = None
    automationId: str = ""
    role: int | None = Field(None, description="the message role at depth (position 4 only)")
    sticky: int = 0
    cooldown: int = 0
    delay: int = 0
    displayIndex: int = Field(description="the entry's place in SillyTavern's editor (= uid)")


class WorldInfoBook(BaseModel):
    """A World Info book as SillyTavern imports it: `entries` keyed by uid (a string)."""

    entries: dict[str, WorldInfoEntry] = Field(
        default_factory=dict,
        description="the entries by uid, in order: entities and relation pairs by first "
        "appearance in the conversation",
    )


def _names(entity: LoreEntity) -> list[str]:
    """The entity's name and aliases, each once (case-insensitively), name first."""
    out: dict[str, str] = {}
    for name in (entity.name, *entity.aliases):
        if name.strip():
            out.setdefault(name.strip().casefold(), name.strip())
    return list(out.values())


def _padded(text: str) -> str:
    return f" {vocab.normalize_name(text)} "


def _facts_by_entity(lore: ConversationLore) -> dict[str, list[str]]:
    """entity_id -> the stated facts about it, in turn order, each once."""
    names = {e.entity_id: [_padded(n) for n in _names(e)] for e in lore.entities}
    by_name = {vocab.normalize_name(n): e.entity_id for e in lore.entities for n in _names(e)}
    out: dict[str, dict[str, None]] = {e.entity_id: {} for e in lore.entities}
    for turn in lore.stated:
        speaker = by_name.get(vocab.normalize_name(turn.speaker)) if turn.speaker.strip() else None
        for fact in turn.facts:
            text = _padded(fact)
            named = [
                eid for eid, padded in names.items() if any(p in text for p in padded if p.strip())
            ]
            for eid in named or ([speaker] if speaker else []):
                out[eid].setdefault(f"{fact} (turn {turn.turn_id})", None)
    return {eid: list(facts) for eid, facts in out.items()}


def _bullets(title: str, lines: Iterable[str]) -> list[str]:
    items = [f"- {line}" for line in lines]
    return [f"{title}:", *items] if items else []


def _entity_content(entity: LoreEntity, facts: list[str], moments: list[str]) -> str:
    head = f"{entity.name} ({entity.kind})"
    others = _names(entity)[1:]
    if others:
        head += ", also called " + ", ".join(others)
    lines = [head + "."]
    if entity.bio_summary:
        lines.append(entity.bio_summary)
    if entity.bio_traits:
        lines.append("Traits: " + ", ".join(entity.bio_traits) + ".")
    lines += _bullets("Stated", facts) + _bullets("Milestones", moments)
    return "\n".join(lines)


def _verb(relation_type: str) -> str:
    return relation_type.lower().replace("_", " ")


def _latest_per_type(relations: list[LoreRelation]) -> list[LoreRelation]:
    """Each (source, target, type) once: the active relation if there is one, else the one
    ended last."""
    latest: dict[tuple[str, str, str], LoreRelation] = {}
    for rel in relations:
        known = latest.get((rel.source_id, rel.target_id, rel.type))
        rank = (rel.status == REL_ACTIVE, rel.updated_seq, rel.since_seq, rel.rel_id)
        if known is None or rank > (
            known.status == REL_ACTIVE,
            known.updated_seq,
            known.since_seq,
            known.rel_id,
        ):
            latest[(rel.source_id, rel.target_id, rel.type)] = rel
    return list(latest.values())


def _relation_line(rel: LoreRelation) -> str:
    said = f"{rel.source_name} {_verb(rel.type)} {rel.target_name}"
    if rel.status == REL_ACTIVE:
        return f"{said}: now, strength {rel.weight:.2f} (since turn {rel.since_turn})."
    return f"{said}: no longer (ended at turn {rel.ended_turn})."


def _relation_content(first: LoreEntity, second: LoreEntity, relations: list[LoreRelation]) -> str:
    ordered = sorted(
        _latest_per_type(relations),
        key=lambda r: (r.status != REL_ACTIVE, r.since_seq, r.source_id, r.type, r.rel_id),
    )
    return "\n".join(
        [f"{first.name} and {second.name}:", *(f"- {_relation_line(r)}" for r in ordered)]
    )


def build_lorebook(lore: ConversationLore) -> WorldInfoBook:
    """The conversation's lorebook (see the module docstring for what goes where)."""
    by_id = {e.entity_id: e for e in lore.entities}
    facts = _facts_by_entity(lore)
    moments: dict[str, list[str]] = {e.entity_id: [] for e in lore.entities}
    for milestone in lore.milestones:
        for eid in dict.fromkeys(milestone.entity_ids):
            if eid in moments:
                moments[eid].append(f"{milestone.text} (turn {milestone.turn_id})")
    pairs: dict[tuple[str, str], list[LoreRelation]] = {}
    for rel in lore.relations:
        if rel.source_id in by_id and rel.target_id in by_id and rel.source_id != rel.target_id:
            ends = sorted(
                (rel.source_id, rel.target_id), key=lambda eid: (by_id[eid].first_seq, eid)
            )
            pairs.setdefault((ends[0], ends[1]), []).append(rel)

    # (first appearance, entity before pair, id) -> the entry without its uid.
    drafts: list[tuple[tuple[int, int, str], dict[str, object]]] = []
    for entity in lore.entities:
        drafts.append(
            (
                (entity.first_seq, 0, entity.entity_id),
                {
                    "key": _names(entity),
                    "comment": f"{entity.name} ({entity.kind})",
                    "order": ENTITY_ORDER,
                    "content": _entity_content(
                        entity, facts[entity.entity_id], moments[entity.entity_id]
                    ),
                },
            )
        )
    for (a, b), relations in pairs.items():
        first, second = by_id[a], by_id[b]
        drafts.append(
            (
                (min(r.since_seq for r in relations), 1, f"{a}\x1f{b}"),
                {
                    "key": _names(first),
                    "keysecondary": _names(second),
                    "selectiveLogic": ST_LOGIC_AND_ANY,
                    "comment": f"{first.name} & {second.name}",
                    "order": RELATION_ORDER,
                    "content": _relation_content(first, second, relations),
                },
            )
        )
    drafts.sort(key=lambda draft: draft[0])
    entries = {
        str(uid): WorldInfoEntry.model_validate({"uid": uid, "displayIndex": uid, **fields})
        for uid, (_, fields) in enumerate(drafts)
    }
    return WorldInfoBook(entries=entries)


def conversation_lorebook(repo: DialogueRepository, conversation_id: str) -> WorldInfoBook | None:
    """The lorebook of a conversation as the graph holds it now; None: no such conversation."""
    lore = repo.lore(conversation_id)
    return None if lore is None else build_lorebook(lore)
