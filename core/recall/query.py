"""What a query is made of before any index is asked: its words for BM25 (`STOP_WORDS`), the
query without the speakers' names for the dense model (`plain_query`; `embedded_text`, the
text embedded for a query and for a stored turn alike), the parts of a question
about two entities or two events (`query_parts`, `part_text`), and what the rankers hand the
fusion for it (`Prepared`), the texts embedded for it (`query_texts`, `embedded_query`), and
a chat message worded as a query about the speaker it is about (`asked_about`).

Contract: pure functions of the query text and the speakers' names, no LLM and no index;
the same text gives the same parts on every run. Why the names are taken out and what the
parts measured: docs/decisions/recall-fusion.md.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from core.recall.params import DEFAULT_PARAMS, RecallParams
from core.timex import QueryDate, TimeSpan, order_choice, query_dates, resolve

#: The spaces before a punctuation mark, taken only from a run's first space: tried from every
#: space of a long run (a pasted text), the pattern cost the square of the run's length.
_SPACE_BEFORE_MARK = re.compile(r"(?<!\s)\s+([?,.!])")
#: English function words (NLTK's list, plus question words): tantivy's own English list is
#: Lucene's 33 words and keeps "what", "did", "when" in every query.
STOP_WORDS = sorted(
    set(
        """
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself yourselves
""".split()
    )
)
_STOP_SET = frozenset(STOP_WORDS)


def plain_query(query: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """The query without the conversation's speakers' names (and their possessive 's), for the
    dense model. Speakers call each other by name, so a name in the question drew the greetings
    that name the speaker, not what was said; who said it is the speaker feature's business
    (measured: docs/decisions/recall-fusion.md). `embedded_text` applies it to every line of a
    query and of a stored turn."""
    for name in sorted(speakers, key=len, reverse=True):
        if name:
            query = re.sub(rf"\b{re.escape(name)}(?:'s|\u2019s)?\b", "", query, flags=re.IGNORECASE)
    query = re.sub(_SPACE_BEFORE_MARK, r"\1", query)
    return re.sub(r"\s+", " ", query).strip()


#: Words a message may open with before it calls someone by name ("Thanks, Seraphina").
_OPENERS = (
    r"(?:hi|hey|hello|hiya|thanks|thank\s+you|ok|okay|oh|ah|well|yes|yeah|no|so|dear|sorry|bye"
    r"|goodbye|good\s+(?:morning|afternoon|evening|night)|morning|congrats|congratulations"
    r"|welcome\s+back|listen|look)"
)


@functools.lru_cache(maxsize=1024)
def _address_pattern(name: str) -> re.Pattern[str]:
    """Where `name` is only the one a message speaks to (English vocatives): opening a sentence
    (or what follows a "Speaker:" label) before a comma or "!" ("Seraphina, where ...", not a
    list: "Caroline, Melanie and I ..."),
    after a greeting or thanks ("Hi Seraphina!", "Thanks, Seraphina."), or after a comma at a
    sentence's end ("How are you, Seraphina?")."""
    n = re.escape(name)
    return re.compile(
        rf"(?:(?:^|(?<=[.!?:\n]))\s*(?:{_OPENERS}\s*[,!]?\s+)?{n}\s*[,!]"
        r"(?!\s*(?:[A-Z][\w'\u2019-]*\s*(?:,|\band\b|&)|and\b|&))"
        rf"|\b{_OPENERS}\s*,?\s+{n}\b(?=\s*(?:[,.!?;:]|$))"
        rf"|,\s*{n}\s*(?=[.!?]|$))",
        re.IGNORECASE,
    )


def unaddressed(query: str, names: list[str] | set[str] | frozenset[str]) -> str:
    """The query without the names it only calls its listener by (a chat message's "Thanks,
    Seraphina. Where does Ilse live now?" is "Thanks. Where does Ilse live now?"): what it
    asks about, for the lexical ranking and `named_in`."""
    # Only the names the query holds are tried, each pattern compiled once: a long chat knows
    # hundreds of names (its entities and their aliases), and a pattern per name and query
    # outgrew the re module's cache: recall p50 257 ms with 400 against 9 ms with the speakers
    # alone (`python -m bench.memory_retrieval`, its `entities` way).
    lowered = query.lower()
    for name in sorted(
        (n for n in set(names) if n and n.lower() in lowered), key=len, reverse=True
    ):
        query = _address_pattern(name).sub(" ", query)
    query = re.sub(_SPACE_BEFORE_MARK, r"\1", query)
    query = re.sub(r"(^|\n)[ \t]*[,.!]+", r"\1", query)  # what an address opened with
    return re.sub(r"[ \t]+", " ", query).strip()


def without_phrases(query: str, phrases: list[str]) -> str:
    """`query` without each of `phrases` (its first occurrence, any case): a question's
    "yesterday", once resolved to the day it means, is not a word to match: a turn that says
    "yesterday" speaks of the day before its own."""
    for phrase in phrases:
        query = re.sub(re.escape(phrase), " ", query, count=1, flags=re.IGNORECASE)
    return re.sub(r"[ \t]+", " ", query).strip()


def named_in(query: str, names: list[str] | set[str] | frozenset[str]) -> list[str]:
    """The names a query speaks of, in `names`' order: a name it only addresses (a chat
    message's "Thanks, Seraphina. Where does Ilse live now?") is not one. Recall favours the
    turns a named speaker said and holds back the others' (the fusion's strongest signal), so
    a message that calls its listener by name recalled only the listener's lines."""
    spoken_of = unaddressed(query, names)
    lowered = spoken_of.lower()
    return [
        name
        for name in dict.fromkeys(names)
        if name
        and name.lower() in lowered
        and re.search(rf"\b{re.escape(name)}\b", spoken_of, re.IGNORECASE)
    ]


#: A message's words that point at its own speaker, and at whom it speaks to (English).
_FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|myself)\b", re.IGNORECASE)
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself)\b", re.IGNORECASE)


def asked_about(sender: str, content: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """A chat message as a memory query: its content under the name of the speaker it is
    about, not of the one who sends it. Stored turns read "Speaker: text" and recall favours
    the speaker a query names, so the sender's label alone pulled the sender's own lines:
    Melanie asking "How is the adoption going?" recalled Melanie's remarks about adoption, not
    Caroline's news. A message about its sender ("I", "my") is asked under the sender's name;
    one addressed to the other speaker ("you") of a two-person chat under that speaker's;
    anything else (both, neither, a group) under no name. A role-play action's stage business
    is not what the message is about (`spoken_topic`)."""
    spoken = spoken_topic(content)  # "*tilts my head* What did you do?" is about "you"
    about_self = bool(_FIRST_PERSON.search(spoken))
    about_other = bool(_SECOND_PERSON.search(spoken))
    others = sorted(s for s in speakers if s.lower() != sender.lower())
    if about_self and not about_other:
        return f"{sender}: {content}"
    if about_other and not about_self and len(others) == 1:
        return f"{others[0]}: {content}"
    return content


#: Words of acknowledgement, reaction and greeting: a chat message made of these and stop words
#: ("lol yeah", "Thanks!", "Wow, amazing!", "Tell me more") carries no topic of its own.
FILLER_WORDS = frozenset(
    """
absolutely agree agreed ah aha alright amazing anytime ask asking aw aww awesome bet bye care catch
catching cheers chat chatting congrats congratulations cool continue curious cya definitely easy
enjoy evening exactly fantastic fine go good goodbye goodnight got gotcha great guess haha hehe
hello hey hi hm hmm hmmm hope huh indeed interesting k kk know later lmao lol love lovely mean mhm
morning nah nice night np nope ok okay oh omg please pls problem question questions quick really
right rofl same see seriously something soon sounds sure sweet take talk tell thank thanks think
thx true totally ttyl ty uh um understand welcome well wonder wondered wondering wonderful worries
wow ya yay yea yeah yep yes yup
""".split()
)
#: Laughter however long ("hahaha", "lolol", "hehehe").
_LAUGHTER = re.compile(r"(?:ha|he|hi|ah)+h?|lo(?:lo)*l|lmf?a+o+|x+d+")
#: A word (letters or digits, any script), with an apostrophe's contraction.
_TOKEN = re.compile(r"[^\W_][\w'\u2019-]*")
_CONTRACTION = re.compile(r"['\u2019](?:m|s|re|ll|ve|d|t)$|n['\u2019]t$")
#: Three or more of one letter ("yesss", "sooo"): a typed drawl, read as one.
_DRAWL = re.compile(r"(\w)\1{2,}")


def _filler(token: str) -> bool:
    word = _CONTRACTION.sub("", _DRAWL.sub(r"\1", token.lower()))
    return word in FILLER_WORDS or word in _STOP_SET or bool(_LAUGHTER.fullmatch(word))


#: The words of a role-play action that is only stage business ("*leans back in the chair and
#: smiles*", "*tilts her head, curious*"): gestures, looks, postures and ways of speaking, the
#: body's parts, the room's furniture, directions and manners. Between asterisks (SillyTavern's
#: convention for an action) such words name no topic; anything else there ("*shows you the
#: photo of the turtles*": photo, turtles) does.
GESTURE_WORDS = frozenset(
    """
absently across along arch arm around away awkwardly back beam behind bench beneath beside bite
blink blush bow breath breathe brightly broadly brow brush calmly chair cheek chin chuckle clear deep
close closer cock couch cough cross curious curiously desk down eagerly ear elbow excitedly exhale
eye eyebrow face faintly fidget finger floor fold fondly forward frown gasp gaze gentle gently
giggle glance grimace grin hair hand happily head hesitantly hesitate hold hug hum idly inhale
kindly knee kneel knowingly lap laugh lazily lean lie lift lip look lower mischievously mouth murmur
mutter narrow near neck nervous nervously next nod nose nudge onto pace pat pause peer perk playful
playfully pout quiet quietly raise relax rest rise rub sadly scoot scratch seat settle shake
sheepishly shift shoulder shrug shy shyly sigh sit sleepily slight slightly slow slowly smile smirk
snicker sofa soft softly stand stare step strand stretch sweetly table tap tease teasing teasingly
thoughtful thoughtfully throat tilt tiredly toward towards tuck turn twirl warm warmly wave whisper
wide widen wince wink wryly yawn
""".split()
)
#: What may be an action: words between single asterisks (not "**bold**", not a "5*3"
#: product) that open a line or follow a sentence's end or another action ("*smiles* Hi!",
#: "Thanks! *hugs you*"), not an emphasis inside a sentence ("I *love* pottery", "Did you see
#: *Inception*?").
_OPENS = r"(?:^[ \t]*|(?<=[.!?\u2026\"\u201d)*])[ \t]+)"
_ACTION = re.compile(_OPENS + r"\*(?![*\s])([^*\n]+?)(?<![*\s])\*(?![*\w])", re.MULTILINE)
#: A word a title in Title Case may hold in lower case ("The Lord of the Rings").
_TITLE_SMALL_WORDS = frozenset("a an and at by for in of on or the to with".split())


def _looks_like_a_title(words: list[str]) -> bool:
    """Whether an italic's words are a title in Title Case ("*Dune*", "*The Lord of the
    Rings*"), not an action ("*glances up*", "*Seraphina smiles*")."""
    return bool(words) and all(
        w[0].isupper() or (i > 0 and w.lower() in _TITLE_SMALL_WORDS) for i, w in enumerate(words)
    )


def _actions(text: str) -> list[re.Match[str]]:
    """The role-play actions of `text` (`_ACTION`, not a title)."""
    if "*" not in text:
        return []
    return [m for m in _ACTION.finditer(text) if not _looks_like_a_title(_TOKEN.findall(m[1]))]


def _without(text: str, actions: list[re.Match[str]]) -> str:
    """`text` with each of `actions` (its asterisks and words) replaced by a space."""
    pieces, end = [], 0
    for action in actions:
        pieces += [text[end : action.start(1) - 1], " "]
        end = action.end(1) + 1
    pieces.append(text[end:])
    return re.sub(r"[ \t]+", " ", "".join(pieces)).strip()


_STAGE_WORDS = GESTURE_WORDS | FILLER_WORDS
#: The irregular past forms of `GESTURE_WORDS` and `FILLER_WORDS` verbs, which no ending rule
#: reaches ("*sat down beside you*", "*shook her head*", "*took a deep breath*").
_IRREGULAR_PASTS: dict[str, str] = {
    "bit": "bite",
    "bitten": "bite",
    "held": "hold",
    "knelt": "kneel",
    "lay": "lie",
    "lain": "lie",
    "leant": "lean",
    "rose": "rise",
    "risen": "rise",
    "sat": "sit",
    "shook": "shake",
    "shaken": "shake",
    "stood": "stand",
    "took": "take",
    "taken": "take",
}
#: English inflections and the endings of their stems: "glances" glance, "hugged" hug,
#: "smiling" smile, "nodding" nod, "shies" shy.
_INFLECTION = re.compile(r"(?:(?P<double>(?P<letter>[a-z])(?P=letter))(?:ed|ing)|e?s|ed|ing)$")


def _gesture(token: str) -> bool:
    """Whether `token` is a `GESTURE_WORDS` or `FILLER_WORDS` word, or one of its inflections
    ("leans", "smiled", "glancing", "nodding", "eyes", "brushes", "taking it in", "sat", "took");
    not a longer word that starts with one ("laptop", "bowl")."""
    word = token.lower()
    if word in _STAGE_WORDS or _IRREGULAR_PASTS.get(word) in _STAGE_WORDS:
        return True
    ending = _INFLECTION.search(word)
    if ending is None:
        return False
    stem = word[: ending.start()]
    stems = {stem, stem + "e"}
    if ending["double"]:
        stems.add(stem + ending["letter"])
    if word.endswith("ies"):
        stems.add(word[:-3] + "y")
    if word.endswith("es"):
        stems.add(word[:-1])
    return bool(stems & _STAGE_WORDS)


def _stage_business(action: str) -> bool:
    """Whether a role-play action's words are all stop words, filler or `GESTURE_WORDS`."""
    return all(_filler(t) or _gesture(t) for t in _TOKEN.findall(action))


def without_stage_business(text: str) -> str:
    """`text` without its role-play actions that are only stage business (`GESTURE_WORDS`):
    "*leans back in the chair and smiles* Did you ever finish the screenplay?" asks about the
    screenplay, and its chairs and smiles matched the memory's other chairs and smiles (held
    out, such an action before each question cost recall@10 0.032: docs/decisions/
    recall-fusion.md). An action that names something stays ("*shows you the photo of the
    turtles* Remember these guys?")."""
    business = [a for a in _actions(text) if _stage_business(a[1])]
    return _without(text, business) if business else text


#: Words of a message's speech that point at something outside it: at what an action shows
#: ("*shows you the photo of the turtles* Remember these guys?", "*points at the castle* Who
#: lives there?").
_POINTING = re.compile(
    r"\b(?:this|that|these|those|it|its|they|them|their|he|him|his|she|her|there|here)\b",
    re.IGNORECASE,
)


#: Quoted speech in a role play's narrated prose: words in double quotes that end with a
#: sentence's mark inside them and stand as sentences of their own (She smiles. "Did you
#: finish it?"), not a quoted title ("Have you read "The Road"?") nor reported speech inside a
#: sentence (I said "no way!" to her).
_QUOTED_SPEECH = re.compile(
    _OPENS + r"[\"\u201c]([^\"\u201c\u201d\n]*?[.!?,\u2026])[\"\u201d]", re.MULTILINE
)


def _speech(text: str) -> str | None:
    """What `text`'s speakers say, without its narration: the text outside its actions
    (`_actions`), or, in narrated prose, its quoted speech (`_QUOTED_SPEECH`); None when it has
    neither actions nor narration around its quotes."""
    actions = _actions(text)
    if actions:
        return _without(text, actions)
    if '"' not in text and "\u201c" not in text:
        return None
    quoted = _QUOTED_SPEECH.findall(text)
    if not quoted:
        return None
    speech = " ".join(q.strip() for q in quoted)
    return speech if speech != text.strip().strip('"\u201c\u201d') else None


def spoken_topic(text: str, names: list[str] | set[str] | frozenset[str] = ()) -> str:
    """What a role-play message asks: `text` without its stage business
    (`without_stage_business`), and without its narration altogether (its actions, or in
    narrated prose what is outside its quoted speech) when its speech names a topic of its own
    and points at nothing outside it: in "*glances up from the book* Did you ever finish the
    screenplay?" and in 'She glances up from the book. "Did you ever finish the screenplay?"'
    the book is the scene and the screenplay the question (held out, an action with such a
    prop before each question cost recall@10 0.03). The narration stays when the speech points
    at it ("*hands you the letter* Where did you find this?") or says nothing without it, or
    only what an action would ("*shows you the photo of the turtles* Look!")."""
    text = without_stage_business(text)
    speech = _speech(text)
    if speech is None:
        return text
    if (
        says_something(speech, names)
        and not _stage_business(speech)  # "Look!"
        and not _POINTING.search(speech)
    ):
        return speech
    return text


def says_something(text: str, names: list[str] | set[str] | frozenset[str] = ()) -> bool:
    """Whether a chat message names a topic: a word (in any script, or a number) that is
    neither a stop word nor a word of acknowledgement, reaction, greeting or farewell
    (`FILLER_WORDS`), nor one of `names` the message only addresses (`unaddressed`: "Bye
    Joanna!"), nor in a role-play action that is only stage business ("*nods slowly*",
    `without_stage_business`). "Support?" and "lol the bear was huge" say something; "", "...",
    an emoji, "lol yeah", "Haha, yesss!", "Thanks!", "Me too", "*smiles warmly*" and "Bye
    Joanna! Take care!" do not: recalled for by their own words, they would draw turns that say
    the same nothing (every "Yeah!" or goodbye of the conversation)."""
    text = without_stage_business(text)
    if names:
        text = unaddressed(text, names)
    return any(not _filler(token) for token in _TOKEN.findall(text))


#: Where a message's sentences end: after ".", "!", "?" or ":" (however many) and a space
#: ("Quick question: where ...").
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+")
#: What may be a "Name:" label at the start of a line (a name is checked against the chat's).
_LABEL = re.compile(r"^([^:\n]{1,80}):\s*")


def _labelled_lines(
    query: str, names: list[str] | set[str] | frozenset[str]
) -> list[tuple[str, str]]:
    """Each line of `query` as its "Name:" label (`asked_about`'s, one of `names`; "" when it
    has none) and the text after it."""
    named = {n.lower() for n in names if n}
    lines = []
    for line in query.splitlines():
        label = _LABEL.match(line)
        head = label.group(0) if label and label.group(1).lower() in named else ""
        lines.append((head, line[len(head) :]))
    return lines


#: A sentence that is all one quotation (a role play's speech: "Did you finish it?"): its
#: marks are not what it asks, and they moved its vector (held out, a question in quotes
#: recalled 0.011 less).
_WHOLE_QUOTE = re.compile(r"^[\"\u201c]([^\"\u201c\u201d]+)[\"\u201d]$")


def topical_text(query: str, names: list[str] | set[str] | frozenset[str] = ()) -> str:
    """`query` without its sentences that name no topic (`says_something`): a chat message's
    pleasantries ("Hey Caroline, hope you're doing well! Quick question: what did you
    research?") matched the memory's own pleasantries by their words and pulled its vector
    toward them. Held out, such an opening cost recall@10 0.044 (docs/decisions/recall-fusion.md).
    A sentence of stage business alone ("She leans back and smiles.") names none either, and a
    role play's narration goes as `spoken_topic` says; a sentence that is all one quotation is
    kept without its marks. A line's "Name:" label (`asked_about`'s, one of `names`) stays;
    the query as it is when no sentence names a topic."""
    kept = []
    for head, text in _labelled_lines(query, names):
        text = spoken_topic(text, names)
        sentences = [
            _WHOLE_QUOTE.sub(r"\1", s)
            for s in _SENTENCE_END.split(text)
            # names a topic: a word that is not filler nor stage business (`spoken_topic` has
            # already taken out the actions that are only stage business)
            if not _stage_business(unaddressed(s, names))
        ]
        if sentences:
            kept.append(head + " ".join(sentences))
    return "\n".join(kept) if kept else query


#: Only a question this short is split into parts (a chat turn's long text is not a question
#: about two events, and each part costs a ranking).
MAX_PART_QUERY = 240
#: The top documents a two-event question's parts are guaranteed slots in (`part_budget`).
PART_WINDOW = 10
#: Words that mark a question about two events or two entities.
_PAIR_CUE = re.compile(r"\b(?:between|before|after|since|both|and|or)\b", re.IGNORECASE)
#: Capitalised words that are not names an entity part could be split on.
_NOT_NAMES = frozenset(
    """
i january february march april may june july august september october november december monday tuesday
wednesday thursday friday saturday sunday what when where which who whom whose why how did do does was were
is are has have had can could would should will
""".split()
)
#: What joins two names: "and", "or" (a choice between two: "Coco or Shadow?"), a comma, "&".
_JOIN = r"\s*(?:,\s*(?:and|or)\b|,|\b(?:and|or)\b|&)\s*"


def _content_words(text: str) -> list[str]:
    return [
        w for w in re.findall(r"[A-Za-z][A-Za-z'\u2019-]*", text) if w.lower() not in STOP_WORDS
    ]


def _without_name(query: str, name: str) -> str:
    """`query` without `name` and the "and" (or comma, "&") that joins it to the next or the
    last name; without "both" and "together": "What have Ann and Bob both painted?" without
    Bob is "What have Ann painted?", without Ann "What have Bob painted?"."""
    name_re = rf"\b{re.escape(name)}(?:'s|\u2019s)?\b"
    joined, count = re.subn(rf"{name_re}{_JOIN}", "", query, count=1, flags=re.IGNORECASE)
    if not count:
        joined = re.sub(rf"{_JOIN}{name_re}", "", query, count=1, flags=re.IGNORECASE)
    joined = re.sub(r"\b(?:both|together)\b", "", joined, flags=re.IGNORECASE)
    joined = re.sub(_SPACE_BEFORE_MARK, r"\1", joined)
    return re.sub(r"\s+", " ", joined).strip()


def _entity_names(query: str, speakers: list[str] | set[str] | frozenset[str]) -> list[str]:
    """Two names joined by "and" (or "or", a comma, "&") in the question: two of the speakers, or
    else two capitalised words that are not question words, months or days ("Which city have
    both Jean and John visited?"). Two speakers named apart ("What did Nate give Joanna?")
    are one event, not two."""
    named = [s for s in sorted(speakers, key=len, reverse=True) if s]
    if named:
        alternatives = "|".join(re.escape(s) for s in named)
        pair = re.search(
            rf"\b({alternatives})(?:'s|\u2019s)?{_JOIN}({alternatives})\b", query, re.IGNORECASE
        )
        if pair and pair[1].lower() != pair[2].lower():
            return [pair[1], pair[2]]
    pair = re.search(rf"\b([A-Z][a-z]+){_JOIN}([A-Z][a-z]+)\b", query)
    if pair and pair.start() > 0 and not {pair[1].lower(), pair[2].lower()} & _NOT_NAMES:
        return [pair[1], pair[2]]
    return []


def _event_parts(query: str) -> list[str]:
    """The two events of a question that needs both: "between A and B" (A, B), "both A and
    B" (A, B), "X before or after E" (X, E), their order ("Which came first, A or B?": A, B;
    `core.timex.order_choice`), and a length of time from one to the other ("How
    long after E did X?": X, E). E is never a date (a date the question names is the time
    feature's business, not a second event). A second event said as an ordinal alone
    ("between adopting the first dog and the second") is the first one with that ordinal; two
    ordinals before one noun ("between Sam's first and second appointment") are each that noun.

    "X before / after E" with E a name ("Which city was she in before Lisbon?") is two (X, E).
    "X after E" asking about X alone ("How did Melanie feel after the accident?") is one event:
    E is its context, and a slot for E displaced the answer (held out, docs/decisions/recall-fusion.md)."""
    choice = order_choice(query)  # "Which came first, the yoga class or the marathon?"
    if choice is not None:
        return list(choice)
    body = query.strip().rstrip("?.! ")
    for pattern in (r"\bbetween\s+(.+?)\s+and\s+(.+)$", r"\bboth\s+(.+?)\s+and\s+(.+)$"):
        m = re.search(pattern, body, re.IGNORECASE)
        if m:
            first, second = _shared_head(m[1], m[2])
            return [first, _elided(second, first)]
    m = re.search(r"^(.+?)\s+\bbefore\s+or\s+after\s+(.+)$", body, re.IGNORECASE)
    if m and _not_a_date(m[2]):
        return [m[1], m[2]]
    # "Which city was she in before Lisbon?": a thing of a kind (or a place) ordered against a
    # name, so the answer needs E's turn too; not "What did Jon do after Paris?" nor "after the
    # accident", where E is the context of X.
    m = re.search(r"^(.+?)\s+\b(before|after)\s+((?:[A-Z][\w'\u2019-]*\s*){1,3})$", body)
    if (
        m
        and _ASKS_FOR_A_KIND.match(body)
        and not set(m[3].lower().split()) & _NOT_NAMES
        and _not_a_date(f"{m[2]} {m[3]}")
    ):
        return [m[1], m[3].strip()]
    # "How long after the wedding did they move?": the cue's object, then the clause.
    m = re.search(
        rf"\b{_LENGTH_OF_TIME}\s+(?:after|before|since)\s+(.+?)\s+\b(?:{_AUXILIARIES})\s+(.+)$",
        body,
        re.IGNORECASE,
    )
    if m and _not_a_date(m[1]):
        return [m[2], m[1]]
    # "How long had she been volunteering when she got the award?": the clause, then the event
    # it is measured against (a length needs both ends' turns).
    m = _LENGTH_TO_EVENT.search(body)
    if m and _not_a_date(m[2]):
        return [m[1], m[2]]
    return []


def _not_a_date(phrase: str) -> bool:
    return not query_dates(phrase) and not resolve(phrase, date(2000, 1, 1))


#: A question's opening that asks for a length of time and names no event.
_LENGTH_OF_TIME = r"how\s+(?:long|soon|much\s+time|many\s+\w+(?:\s+\w+)?)"
#: The verbs a question's clause starts with after its cue's object ("... did they move").
_AUXILIARIES = "did|does|do|was|were|is|are|had|has|have|will|would"
#: A question for a thing of a kind ("Which city", "What country") or a place ("Where").
_ASKS_FOR_A_KIND = re.compile(
    rf"\s*(?:(?:which|what)\s+(?!(?:{_AUXILIARIES})\b)[a-z]+\b|where\b)", re.IGNORECASE
)
#: A length of time or an age measured up to an event: "How long had she been volunteering
#: when she got the award?", "How long did it take Nate to finish his game after buying a
#: computer?", "How old was Jon's son when they moved?" (the clause, the event).
_LENGTH_TO_EVENT = re.compile(
    rf"^\s*(?:{_LENGTH_OF_TIME}|how\s+old)\s+(?:{_AUXILIARIES})\s+(?:it\s+take\s+(?:for\s+)?)?"
    r"(.+?)\s+\b(?:after|before|since|when|until)\s+(.+)$",
    re.IGNORECASE,
)
#: Ordinals a second event may be said by alone.
_ORDINALS = "first|second|third|fourth|fifth|next|last|other|new|old|older|younger"


def _elided(second: str, first: str) -> str:
    """`second` in full when it is an ordinal alone ("the second", "the other one") and
    `first` holds an ordinal: `first` with its ordinal replaced ("adopting the first dog",
    "the second" -> "adopting the second dog"); else `second` as it is."""
    alone = re.fullmatch(rf"(?:the\s+)?({_ORDINALS})(?:\s+one)?", second.strip(), re.IGNORECASE)
    if not alone:
        return second
    replaced, count = re.subn(
        rf"\b(?:{_ORDINALS})\b", alone[1], first, count=1, flags=re.IGNORECASE
    )
    return replaced if count else second


def _shared_head(first: str, second: str) -> tuple[str, str]:
    """Both events in full when `first` ends with an ordinal and `second` is another ordinal
    with the noun they share ("Sam's first", "second doctor's appointment" -> "Sam's first
    doctor's appointment", "Sam's second doctor's appointment"); else both as they are."""
    ends = re.fullmatch(rf"(.*?\b)?({_ORDINALS})", first.strip(), re.IGNORECASE)
    opens = re.fullmatch(rf"(?:the\s+)?({_ORDINALS})\s+(.+)", second.strip(), re.IGNORECASE)
    if not ends or not opens:
        return first, second
    owner = ends[1] or ""
    return f"{owner}{ends[2]} {opens[2]}", f"{owner}{opens[1]} {opens[2]}"


def part_text(part: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """What the dense model embeds for a part: the part without the speakers' names (as
    `plain_query`), or the part itself when nothing else is left."""
    return plain_query(part, speakers) or part


def query_parts(query: str, speakers: list[str] | set[str] | frozenset[str]) -> list[str]:
    """The parts of a question about two entities or two events, each a sub-query of its own
    (no LLM: the question's own names and event phrases), or [] for any other query.

    Two entities: "What subject have Caroline and Melanie both painted?" gives "What subject
    have Caroline painted?" and "What subject have Melanie painted?" (one per name: the
    speakers it names, or two capitalised names joined by "and" or "or"). Two events (`_event_parts`):
    "How long was it between the wedding and the move to Lisbon?" gives "the wedding" and "the
    move to Lisbon"; "How long after the wedding did they move to Boston?" gives "they move to
    Boston" and "the wedding"; "How long had she been volunteering when she got the award?"
    gives "she been volunteering" and "she got the award". Only a question (a "?", at most
    MAX_PART_QUERY characters) with a cue word (between, before, after, since, both, and), or a
    length of time or an age up to an event ("when", "until"), is split; each part must keep a
    content word. `HybridIndex.rank` keeps each part's best documents in the top PART_WINDOW
    (`RecallParams.part_budget` of them)."""
    if "?" not in query or len(query) > MAX_PART_QUERY:
        return []
    if not _PAIR_CUE.search(query):  # "when" or "until" alone: only a length up to an event
        return _kept(_event_parts(query), query) if _LENGTH_TO_EVENT.search(query) else []
    names = _entity_names(query, speakers)
    if names:
        parts = [_without_name(query, names[1]), _without_name(query, names[0])]
    else:
        parts = _event_parts(query)
    return _kept(parts, query)


def _kept(parts: list[str], query: str) -> list[str]:
    """The parts that keep a content word and are not the query itself; [] unless two are left."""
    parts = [p for p in dict.fromkeys(parts) if _content_words(p) and p != query]
    return parts if len(parts) >= 2 else []


@dataclass(frozen=True, slots=True)
class Prepared:
    """A query's candidates from each ranker (positions, best first) and what the boosts
    need from the query (`named`: the one speaker it names, lowercased); fused by
    `HybridIndex.rank`. Internal: the index hands it to itself or to the bench."""

    lexical: list[int] = field(default_factory=list)
    dense: list[int] = field(default_factory=list)
    linked: list[int] = field(default_factory=list)
    #: The days a chat's question names through the day it is asked ("yesterday"; each span at
    #: most `DATED_SPAN_DAYS`): the documents said on them or speaking of them are candidates of
    #: the learned fusion whatever their words (`dated`), and hold slots in its top window
    #: (`HybridIndex.rank`).
    asked_days: tuple[TimeSpan, ...] = ()
    dated: list[int] = field(default_factory=list)
    named: str | None = None
    dates: list[QueryDate] = field(default_factory=list)
    asks_when: bool = False
    #: The dense ranking of the query without the speakers' names (`plain_query`), and both
    #: query vectors, unit length (None: no usable vector).
    plain: list[int] = field(default_factory=list)
    vector: np.ndarray | None = None
    plain_vector: np.ndarray | None = None
    #: A two-event question's parts (`query_parts`), each prepared as a query of its own.
    parts: tuple[Prepared, ...] = ()


def query_texts(
    query: str,
    speakers: list[str] | set[str] | frozenset[str],
    params: RecallParams = DEFAULT_PARAMS,
) -> list[str]:
    """What recall embeds for `query`, in one call: `embedded_text` (the query without the
    speakers' names, as a stored turn is embedded), the one text both dense rankers are asked
    with; for a question about two events or entities, each part
    (core.recall.query_parts, as core.recall.part_text). The query as asked, names and all, is
    not embedded: held out it added nothing (docs/decisions/recall-fusion.md)."""
    query = topical_text(query, speakers)
    return list(
        dict.fromkeys(
            [
                vector_text(query, speakers),
                *(part_text(p, speakers) for p in _parts(query, speakers, params)),
            ]
        )
    )


#: What a "Name:" label or a "Name," address leaves at the start of a line once the name is
#: taken out (":", ",", ":," ...).
_LEFT_OVER = re.compile(r"^[\s:,;]+")
_WORD = re.compile(r"\w")


def embedded_text(text: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """What the dense model embeds for a query and for a memory row alike: each line without
    the speakers' names (`plain_query`) and without what a "Name:" label or a "Name," address
    leaves at its start, the lines joined by a space; the text itself when that leaves no word.

    One function for both sides, so a chat message asked as a query ("Caroline: I went ...",
    under the other speaker's name, or under none) and the turn it is stored as ("Caroline: I
    went ...") embed as one text, and the commit stores the vector the query computed. Held
    out, rows embedded this way recall 0.836 against 0.829 with the names and labels in
    (docs/decisions/recall-fusion.md)."""
    lines = (plain_query(line, speakers) for line in text.splitlines())
    stripped = (_LEFT_OVER.sub("", line, count=1) for line in lines)
    joined = " ".join(line for line in stripped if line)
    return joined if _WORD.search(joined) else text


#: The second person's verbs once a name became "you" ("What does you like?").
_AGREEMENT = (
    ("does you", "do you"),
    ("has you", "have you"),
    ("is you", "are you"),
    ("was you", "were you"),
    ("you has", "you have"),
    ("you is", "you are"),
    ("you was", "you were"),
    ("you does", "you do"),
)


def asked_of(query: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """A question about one speaker as if asked of them ("What did Caroline research?" ->
    "What did you research?", "Caroline's" -> "your"), each line after its "Name:" label
    (`asked_about`'s): what `vector_text` embeds. Without the name the bare question read "What
    did research?", and the turn it should meet says "I researched ...": held out 0.836 ->
    0.841 (docs/decisions/recall-fusion.md). A name the message only addresses, a question
    about two speakers or none, and a query that is only the name stay as they are."""
    lines = _labelled_lines(query, speakers)
    # A name the message only calls its listener by ("Melanie, it was great") is not whom it
    # asks about (`named_in`).
    spoken_of = named_in("\n".join(t for _, t in lines), sorted(speakers))
    name = re.escape(spoken_of[0]) if len(spoken_of) == 1 else ""
    if not name or not any(
        _WORD.search(re.sub(rf"\b{name}\b", "", t, flags=re.I)) for _, t in lines
    ):
        return query  # no one speaker, or nothing but the name: as `embedded_text` has it
    out = []
    for head, text in lines:
        text = re.sub(rf"\b{name}(?:'s|\u2019s)", "your", text, flags=re.I)
        text = re.sub(rf"\b{name}\b", "you", text, flags=re.I)
        for said, agreed in _AGREEMENT:
            text = re.sub(rf"\b{said}\b", agreed, text)
        out.append(head + text)
    return "\n".join(out)


def vector_text(query: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """The text recall embeds for `query` itself: `embedded_text` of its sentences that name a
    topic (`topical_text`)."""
    return embedded_text(asked_of(topical_text(query, speakers), speakers), speakers)


def _parts(
    query: str, speakers: list[str] | set[str] | frozenset[str], params: RecallParams
) -> list[str]:
    """The parts recall asks (none when `params` give them no slots: nothing to embed)."""
    return query_parts(query, speakers) if params.part_budget else []


def embedded_query(
    query: str,
    speakers: list[str] | set[str] | frozenset[str],
    known: dict[str, Any],
    params: RecallParams = DEFAULT_PARAMS,
) -> tuple[Any, np.ndarray | None, list[tuple[str, np.ndarray | None]]]:
    """(vector, plain_vector, parts) for `HybridIndex.search`, from the embeddings of
    `query_texts(query, speakers, params)` by text (`known`): the one vector, of the query
    without the speakers' names, and no separate plain vector (the index asks both dense
    rankings with it)."""
    query = topical_text(query, speakers)
    parts = [
        (p, np.asarray(known[part_text(p, speakers)], dtype=np.float32))
        for p in _parts(query, speakers, params)
    ]
    return known[vector_text(query, speakers)], None, parts
