"""The phrases a model uses for a relationship, and the vocabulary's type each one means
(kg.vocabulary.normalize_rel_type reads them after its own normalisation of the phrase:
case-folded, words only, leading auxiliaries dropped).

A table of data, kept apart from the vocabulary's rules; a phrase named twice means the type
of its last naming.
"""

from __future__ import annotations

REL_SYNONYMS: dict[str, str] = {}


def _syn(target: str, *phrases: str) -> None:
    for phrase in phrases:
        REL_SYNONYMS[phrase] = target


_syn(
    "FRIEND_OF",
    "friend",
    "friends",
    "friend of",
    "friends with",
    "befriends",
    "befriended",
    "best friend of",
    "companion of",
    "companions with",
)
_syn(
    "ENEMY_OF",
    "enemy",
    "enemy of",
    "enemies with",
    "foe of",
    "nemesis of",
    "opposes",
    "opposed to",
    "fights",
    "fought",
)
_syn(
    "ALLY_OF",
    "ally",
    "ally of",
    "allied with",
    "allies with",
    "allies",
    "sides with",
    "works with",
    "cooperates with",
)
_syn("RIVAL_OF", "rival", "rival of", "rivals", "rivals with", "competes with", "competitor of")
_syn(
    "LOVES",
    "love",
    "loves",
    "loved",
    "in love with",
    "adores",
    "romantically involved with",
    "lover of",
    "attracted to",
)
_syn("HATES", "hate", "hates", "hated", "despises", "loathes", "resents")
_syn(
    "FAMILY_OF",
    "family",
    "family of",
    "related to",
    "relative of",
    "cousin of",
    "uncle of",
    "aunt of",
    "niece of",
    "nephew of",
    "grandparent of",
    "grandchild of",
)
_syn("PARENT_OF", "parent of", "father of", "mother of", "raised")
_syn("CHILD_OF", "child of", "son of", "daughter of", "heir of")
_syn("SIBLING_OF", "sibling of", "brother of", "sister of", "twin of", "siblings with")
_syn(
    "SPOUSE_OF",
    "spouse of",
    "married to",
    "wife of",
    "husband of",
    "wed to",
    "betrothed to",
    "engaged to",
)
_syn(
    "MENTOR_OF",
    "mentor of",
    "mentors",
    "mentored",
    "teaches",
    "taught",
    "trains",
    "trained",
    "teacher of",
    "master of",
)
_syn(
    "SERVES",
    "serves",
    "served",
    "servant of",
    "works for",
    "worked for",
    "employed by",
    "obeys",
    "loyal to",
    "sworn to",
)
_syn(
    "LEADS",
    "leads",
    "led",
    "leader of",
    "rules",
    "ruled",
    "ruler of",
    "commands",
    "commanded",
    "commander of",
    "king of",
    "queen of",
    "captain of",
    "head of",
)
_syn(
    "MEMBER_OF",
    "member of",
    "belongs to",
    "part of group",
    "joins",
    "joined",
    "serves in",
    "soldier of",
    "citizen of",
)
_syn(
    "KNOWS",
    "knows",
    "knew",
    "met",
    "meets",
    "acquainted with",
    "acquaintance of",
    "aware of",
    "recognizes",
)
_syn("TRUSTS", "trusts", "trusted", "relies on", "confides in", "believes")
_syn(
    "DISTRUSTS",
    "distrusts",
    "distrusted",
    "suspects",
    "suspicious of",
    "wary of",
    "doubts",
    "mistrusts",
    "fears",
    "afraid of",
)
_syn(
    "BETRAYED",
    "betrayed",
    "betrays",
    "double crossed",
    "deceived",
    "deceives",
    "lied to",
    "lies to",
)
_syn(
    "KILLED",
    "killed",
    "kills",
    "murdered",
    "murders",
    "slew",
    "slays",
    "slain by",
    "assassinated",
    "executed",
)
_syn(
    "PROTECTS",
    "protects",
    "protected",
    "guards",
    "guarded",
    "defends",
    "defended",
    "shields",
    "saved",
    "saves",
    "rescued",
    "rescues",
    "guardian of",
    "bodyguard of",
)
_syn(
    "LOCATED_IN",
    "located in",
    "located at",
    "lives in",
    "lived in",
    "living in",
    "resides in",
    "resided in",
    "resides at",
    "is in",
    "in",
    "at",
    "stays in",
    "stays at",
    "found in",
    "kept in",
    "stored in",
    "imprisoned in",
    "based in",
    "inside",
    "dwells in",
    "home is",
)
_syn(
    "PART_OF",
    "part of",
    "within",
    "contained in",
    "region of",
    "district of",
    "room of",
    "belongs to region",
)
_syn(
    "NEAR",
    "near",
    "next to",
    "adjacent to",
    "close to",
    "borders",
    "bordering",
    "beside",
    "neighbors",
)
_syn(
    "TRAVELS_TO",
    "travels to",
    "traveled to",
    "travelled to",
    "goes to",
    "went to",
    "visits",
    "visited",
    "journeys to",
    "journeyed to",
    "heads to",
    "headed to",
    "arrives at",
    "arrived at",
    "flees to",
    "fled to",
    "moves to",
    "moved to",
)
_syn(
    "OWNS",
    "owns",
    "owned",
    "possesses",
    "possessed",
    "has",
    "had",
    "holds",
    "held",
    "carries",
    "carried",
    "owner of",
    "keeps",
    "inherited",
)
_syn("USES", "uses", "used", "wields", "wielded", "wears", "wore", "operates", "drives", "rides")
_syn(
    "CREATED",
    "created",
    "creates",
    "made",
    "makes",
    "forged",
    "forges",
    "built",
    "builds",
    "wrote",
    "writes",
    "invented",
    "invents",
    "crafted",
    "founded",
    "creator of",
    "author of",
)
_syn(
    "SEEKS",
    "seeks",
    "sought",
    "searches for",
    "searching for",
    "looks for",
    "looking for",
    "hunts",
    "hunting",
    "wants",
    "desires",
    "pursues",
    "quests for",
)
_syn(
    "PARTICIPATES_IN",
    "participates in",
    "participated in",
    "takes part in",
    "took part in",
    "involved in",
    "attends",
    "attended",
    "witnessed",
    "witnesses",
    "fought in",
    "present at",
)
_syn(
    "HAPPENS_IN",
    "happens in",
    "happened in",
    "happens at",
    "happened at",
    "takes place in",
    "took place in",
    "takes place at",
    "took place at",
    "occurs in",
    "occurred in",
    "occurs at",
    "occurred at",
    "set in",
)
_syn(
    "CAUSES",
    "causes",
    "caused",
    "leads to",
    "led to",
    "results in",
    "resulted in",
    "triggers",
    "triggered",
    "provokes",
    "provoked",
    "causes of",
)
_syn(
    "HAS_TRAIT",
    "has trait",
    "trait",
    "is trait",
    "characterized by",
    "exhibits",
    "displays",
    "shows",
)
_syn(
    "RELATES_TO",
    "relates to",
    "related",
    "relates",
    "associated with",
    "connected to",
    "linked to",
    "relationship",
)
