"""The fixed vocabulary of labels and relationship types, and normalisation into it.

Labels and relationship types are the only parts of a Cypher statement that cannot be
parameters, so every one of them that reaches a query comes from the constants here;
anything a model invents is normalised into this vocabulary first (unknown relationship
types become RELATES_TO with the raw text kept as a property, unknown entity categories
become Concept with the raw text kept). `name_key` and `entity_id` give the stable,
bounded keys used for resolution lookups and uniqueness.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from functools import lru_cache

from kg.rel_synonyms import REL_SYNONYMS

# --- Node labels -------------------------------------------------------------------------

#: Umbrella label carried by every story entity (uniqueness of `id` is enforced on it).
ENTITY = "Entity"

#: Story-entity labels a chapter delta may use (spec 001 section 16, plus Faction/Lore/
#: Concept for world-building and the catch-all).
ENTITY_LABELS: tuple[str, ...] = (
    "Character",
    "Location",
    "Event",
    "Item",
    "Trait",
    "Faction",
    "Lore",
    "Concept",
)
FALLBACK_LABEL = "Concept"

# Infrastructure labels of the novel graph.
CHAPTER = "Chapter"
SCENE = "Scene"
NOVEL_INFO = "NovelInfo"
WORLD_CONTAINER = "WorldContainer"
VALUE_NODE = "ValueNode"
CHANGE_SET = "ChangeSet"
SCHEMA_META = "SchemaMeta"
#: Lookup node per (entity, normalised name or alias): list properties cannot be indexed
#: portably, so alias resolution goes through these indexed nodes instead of a scan.
ENTITY_NAME = "EntityName"
#: Audit record of one healing merge (kg/healing/merge.py).
MERGE_AUDIT = "MergeAudit"

# Dialogue memory (spec 000 section 4).
KG_ENTITY = "KGEntity"
KG_REL_EVENT = "KGRelEvent"
KG_MILESTONE = "KGMilestone"
KG_TURN = "KGTurn"
#: Every turn's text, remembered whether or not its facts passed the commit gate.
KG_MEMORY = "KGMemory"
#: One per conversation: position counters, so no write counts or scans the turns.
KG_CONVERSATION = "KGConversation"

INFRA_LABELS: tuple[str, ...] = (
    CHAPTER,
    SCENE,
    NOVEL_INFO,
    WORLD_CONTAINER,
    VALUE_NODE,
    CHANGE_SET,
    SCHEMA_META,
    ENTITY_NAME,
    MERGE_AUDIT,
)
DIALOGUE_LABELS: tuple[str, ...] = (
    KG_ENTITY,
    KG_REL_EVENT,
    KG_MILESTONE,
    KG_TURN,
    KG_MEMORY,
    KG_CONVERSATION,
)
ALL_LABELS: frozenset[str] = frozenset((ENTITY, *ENTITY_LABELS, *INFRA_LABELS, *DIALOGUE_LABELS))

#: Operational properties: when, by which process and how long an operation ran. The graph
#: keeps them for operators (a replayed turn names its original trace), but they are not the
#: world's content, so exports leave them out (kg.transfer). One rule for chapters and
#: dialogue: the chapter side's ChangeSet records what changed, never when, so it has none;
#: a dialogue turn's commit time, committing process and slot timings are listed here. An
#: export is then byte-identical for the same story however and whenever it was written.
OPERATIONAL_PROPERTIES: dict[str, frozenset[str]] = {
    KG_TURN: frozenset({"committed_at", "committed_by", "trace_json"}),
}

# --- Relationship types ------------------------------------------------------------------

RELATES_TO = "RELATES_TO"
#: Types a chapter delta may carry between two entities.
ENTITY_REL_TYPES: tuple[str, ...] = (
    # social
    "FRIEND_OF",
    "ENEMY_OF",
    "ALLY_OF",
    "RIVAL_OF",
    "LOVES",
    "HATES",
    "FAMILY_OF",
    "PARENT_OF",
    "CHILD_OF",
    "SIBLING_OF",
    "SPOUSE_OF",
    "MENTOR_OF",
    "SERVES",
    "LEADS",
    "MEMBER_OF",
    "KNOWS",
    "TRUSTS",
    "DISTRUSTS",
    "BETRAYED",
    "KILLED",
    "PROTECTS",
    # places
    "LOCATED_IN",
    "PART_OF",
    "NEAR",
    "TRAVELS_TO",
    # things and events
    "OWNS",
    "USES",
    "CREATED",
    "SEEKS",
    "PARTICIPATES_IN",
    "HAPPENS_IN",
    "CAUSES",
    "HAS_TRAIT",
    RELATES_TO,
)
#: Types that replace each other between one pair: the latest stated holds (the consistency
#: check warns on a flip with no transition; the codex draws the earlier one as ended).
OPPOSITE_REL_TYPES: tuple[tuple[str, str], ...] = (
    ("FRIEND_OF", "ENEMY_OF"),
    ("ALLY_OF", "ENEMY_OF"),
    ("LOVES", "HATES"),
)
#: Each relationship type with its opposites, both ways round (from OPPOSITE_REL_TYPES).
OPPOSITES: dict[str, frozenset[str]] = {
    rel: frozenset(
        {b for a, b in OPPOSITE_REL_TYPES if a == rel}
        | {a for a, b in OPPOSITE_REL_TYPES if b == rel}
    )
    for pair in OPPOSITE_REL_TYPES
    for rel in pair
}
# Structural edges written by the store itself.
APPEARS_IN = "APPEARS_IN"  # Character -> Chapter
MENTIONS = "MENTIONS"  # Chapter -> non-character Entity
HAS_SCENE = "HAS_SCENE"  # Chapter -> Scene
STRUCTURAL_REL_TYPES: tuple[str, ...] = (APPEARS_IN, MENTIONS, HAS_SCENE)
KG_REL = "KG_REL"  # dialogue memory: KGEntity -> KGEntity
ALL_REL_TYPES: frozenset[str] = frozenset((*ENTITY_REL_TYPES, *STRUCTURAL_REL_TYPES, KG_REL))

# Endpoint labels implied by a type, used when an unresolved endpoint must be created
# provisionally and the caller did not say what it is.
_ENDPOINT_HINTS: dict[str, tuple[str, str]] = {
    "LOCATED_IN": ("Character", "Location"),
    "PART_OF": ("Location", "Location"),
    "NEAR": ("Location", "Location"),
    "TRAVELS_TO": ("Character", "Location"),
    "OWNS": ("Character", "Item"),
    "USES": ("Character", "Item"),
    "CREATED": ("Character", "Item"),
    "SEEKS": ("Character", "Item"),
    "PARTICIPATES_IN": ("Character", "Event"),
    "HAPPENS_IN": ("Event", "Location"),
    "CAUSES": ("Event", "Event"),
    "HAS_TRAIT": ("Character", "Trait"),
    "MEMBER_OF": ("Character", "Faction"),
}


def endpoint_hint(rel_type: str) -> tuple[str, str]:
    """(source label, target label) to assume for unresolved endpoints of `rel_type`."""
    return _ENDPOINT_HINTS.get(rel_type, ("Character", "Character"))


# Leading auxiliaries that carry no relation meaning ("is friends with", "was betrayed").
_AUX = re.compile(r"^(?:is|was|are|were|has been|had been|have been|becomes|became|is now|now)\s+")
_NON_WORD = re.compile(r"[^\w]+", re.UNICODE)
_REL_CANON = {t: t for t in ENTITY_REL_TYPES}


def _phrase(raw: str) -> str:
    text = unicodedata.normalize("NFKC", raw).casefold().replace("_", " ").replace("-", " ")
    return " ".join(_NON_WORD.sub(" ", text).split())


def normalize_rel_type(raw: str) -> tuple[str, str | None]:
    """Map a model-supplied relationship type into the vocabulary.

    Returns (canonical type, raw type or None). The raw text is kept whenever it was not
    already the canonical spelling, so nothing the model said is lost.
    """
    if raw in _REL_CANON:
        return raw, None
    phrase = _phrase(raw)
    upper = phrase.upper().replace(" ", "_")
    if upper in _REL_CANON:
        return upper, raw
    stripped = _AUX.sub("", phrase)
    for candidate in (phrase, stripped):
        if candidate in REL_SYNONYMS:
            return REL_SYNONYMS[candidate], raw
        upper = candidate.upper().replace(" ", "_")
        if upper in _REL_CANON:
            return upper, raw
    return RELATES_TO, raw


_LABEL_SYNONYMS: dict[str, str] = {}
for _label, _words in {
    "Character": "character characters person people human npc protagonist antagonist creature being animal god deity spirit individual figure",
    "Location": "location locations place places setting settings city town village region country kingdom realm building room area planet world land site landmark",
    "Event": "event events plot point plotpoint incident battle war meeting ceremony scene happening occurrence",
    "Item": "item items object objects artifact artefact weapon tool thing possession relic device vehicle",
    "Trait": "trait traits quality personality characteristic attribute virtue flaw",
    "Faction": "faction factions organization organisation group guild house clan order army company party family dynasty institution",
    "Lore": "lore history legend myth magic rule law religion prophecy tradition culture",
    "Concept": "concept idea theme other",
}.items():
    for _word in _words.split():
        _LABEL_SYNONYMS[_word] = _label
_LABEL_SYNONYMS["plot point"] = "Event"
_LABEL_SYNONYMS["magic system"] = "Lore"


def normalize_label(raw: str) -> tuple[str, str | None]:
    """Map a model-supplied entity category to an entity label: (label, raw or None)."""
    if raw in ENTITY_LABELS:
        return raw, None
    phrase = _phrase(raw)
    for label in ENTITY_LABELS:
        if phrase == label.casefold():
            return label, raw
    if phrase in _LABEL_SYNONYMS:
        return _LABEL_SYNONYMS[phrase], raw
    last = phrase.rsplit(" ", 1)[-1] if phrase else ""
    if last in _LABEL_SYNONYMS:
        return _LABEL_SYNONYMS[last], raw
    return FALLBACK_LABEL, raw


# --- Names, keys and ids -----------------------------------------------------------------

_APOSTROPHES = re.compile(r"['\u2019\u2018`\u00b4]")
_LEADING_ARTICLE = re.compile(r"^the\s+")
#: Longest normalised name stored as-is in an indexed key; longer ones are truncated and
#: suffixed with a hash so index entries stay far below every server's key size limit.
MAX_KEY_CHARS = 200


@lru_cache(maxsize=65536)
def normalize_name(name: str) -> str:
    """Case-, accent-width- and punctuation-insensitive form of a name, for matching."""
    text = unicodedata.normalize("NFKC", name).casefold().strip()
    text = _APOSTROPHES.sub("", text)
    words = " ".join(_NON_WORD.sub(" ", text).replace("_", " ").split())
    words = _LEADING_ARTICLE.sub("", words) or words
    # A name made only of symbols/emoji still needs a usable key: keep it casefolded.
    return words or " ".join(text.split())


def _digest(text: str, chars: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:chars]


def name_key(name: str) -> str:
    """The bounded, indexed lookup key of a name."""
    norm = normalize_name(name)
    if len(norm) <= MAX_KEY_CHARS:
        return norm
    return f"{norm[:150]}#{_digest(norm, 16)}"


_SLUG_OK = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def entity_id(label: str, name: str) -> str:
    """Deterministic id from label + normalised name, so re-commits merge onto one node.

    Plain ASCII names give readable ids (`character:aragorn-son-of-arathorn`); anything
    else gets a slug plus a hash after `~`, a character clean slugs never contain.
    """
    norm = normalize_name(name)
    slug = norm.replace(" ", "-")
    prefix = label.lower()
    if len(slug) <= 64 and _SLUG_OK.match(slug):
        return f"{prefix}:{slug}"
    ascii_slug = "-".join(re.findall(r"[a-z0-9]+", slug))[:40]
    return f"{prefix}:{ascii_slug}~{_digest(f'{label}|{norm}', 12)}"


def rel_key(
    source_id: str, rel_type: str, target_id: str, chapter: int, raw_type: str | None = None
) -> str:
    """Stable key of a relationship written for a chapter (found again by rollback).

    The raw type only distinguishes RELATES_TO edges: two spellings of FRIEND_OF in one
    chapter are the same fact, two unknown relations are not.
    """
    qualifier = normalize_name(raw_type) if rel_type == RELATES_TO and raw_type else ""
    material = "\x1f".join((source_id, rel_type, qualifier, target_id, str(chapter)))
    return f"{rel_type.lower()}:{chapter}:{_digest(material, 24)}"


def quote_label(label: str) -> str:
    """Backtick a label/type for Cypher after checking it is in the vocabulary."""
    if label not in ALL_LABELS and label not in ALL_REL_TYPES:
        raise ValueError(f"{label!r} is not in the graph vocabulary")
    return f"`{label}`"
