"""Evidence checks: is a quote in the source text, is a name in it, is a string a name at all.

An extraction model (a scene's, a dialogue turn's, an imported manuscript's) returns each
fact with a short quote from the text that states it. Before a fact reaches the graph, the
quote must be found in the text and the names must be there too (or be known names the text
refers to); a string must also look like a name: the tiny model's `Loca-Lina-Lina-Lina-`,
a chapter title taken for a person, or "Aria's journey begins" are not.

Text is compared normalised: Unicode compatibility form without diacritics, case-folded,
typographic quotes and dashes made plain, possessives ('s) dropped, punctuation as spaces.
Quotes match exactly after that, or fuzzily (rapidfuzz's partial ratio: the best alignment
of the quote inside the text) at `MIN_QUOTE_SCORE`, which forgives a small model's copying
(a changed word, a dropped comma) but not a sentence the text never had. Names match as
whole words only, so "Locatio" is not found in a text that says "location".

The name rules are small and deliberate; each has a look-alike that must pass
(tests/tasks/test_grounding.py): "Mary-Jane" (a repeated fragment rule that needs three),
"Jean-Luc Picard", "The Hollow Library" (capitalised words are names, however many
connectors), "Ilse's father" (one common noun after a possessive is a reference),
"Zoë Brontë" (diacritics), and a known alias (known names skip the rules: the writer's
bible decides).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache

from rapidfuzz import fuzz

#: Fuzzy score (0-100) a quote needs against the text: rapidfuzz partial_ratio after
#: normalisation. One changed word in a ten-word quote scores about 90; an invented clause
#: appended to a real one scores below 85.
MIN_QUOTE_SCORE = 88.0
#: A quote must have this many words to state anything.
MIN_QUOTE_WORDS = 3
#: Names with more words than this (connectors not counted) are descriptions, not names.
MAX_NAME_CONTENT_WORDS = 4
MAX_NAME_WORDS = 7
#: A name that is this share (or more) of a title's words, from its start, is that title.
TITLE_PREFIX_SHARE = 0.6
#: Words a chapter or scene title may have ("The Curious Incident of the Dog in the Night-Time": 9).
MAX_TITLE_WORDS = 14

#: Lower-case words that belong inside names: "Church of Saint Mary", "Ludwig van Beethoven".
CONNECTORS = frozenset(
    "of the a an and de da di del della der den van von la le les du des y al bin ibn ben el los las on upon in at".split()
)
#: Titles and forms of address: "Captain Elias Thorne" is found as "Elias Thorne".
HONORIFICS = frozenset(
    "mr mrs ms miss mx dr doctor captain capt lady lord sir dame madam master mistress professor prof king queen "
    "prince princess saint st old young father mother sister brother aunt uncle grandma grandpa the".split()
)
_HEADING = re.compile(
    r"^\s*(?:#+|(?:chapter|part|book|act|scene|prologue|epilogue|interlude|section|volume)\b)",
    re.IGNORECASE,
)
_NUMBERED = re.compile(
    r"^\s*(?:#+\s*)?(?:(?:chapter|part|book|act|volume)\s+(?:\d+|[ivxlc]+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\b)?\s*[:.\-–—]?\s*",
    re.IGNORECASE,
)
#: A template's slot the model filled in literally: "Title 1", "Chapter Title", "[Title]", "Untitled",
#: "TBD". A title that only numbers the chapter ("Chapter 3") is left to the heading, which drops it.
_PLACEHOLDER_TITLE = re.compile(
    r"""^[\[(<{"'*_]*\s*(?:(?:chapter|scene|book|story|your)\s+)?"""
    r"(?:title|untitled|tbd|tba|placeholder)(?:\s+(?:here|goes\s+here))?"
    r"""(?:\s*[#:.\-]?\s*(?:\d+|[ivxlc]+))?\s*[\])>}"'*_.:]*$""",
    re.IGNORECASE,
)
#: "Luna_Luna12": a small model's variable names. "R2-D2", "HAL 9000" and "Louis XIV" are names.
_IDENTIFIER = re.compile(r"_|[^\W\d_]{3,}\d")
_SENTENCE_PUNCT = re.compile(r"[!?;:]|\.(?=\s|$)|,")
_FRAGMENT_SPLIT = re.compile(r"[\s\-‐-―_]+")
_QUOTES = str.maketrans(
    {
        "‘": "'",
        "’": "'",
        "‚": "'",
        "‛": "'",
        "′": "'",
        "`": "'",
        "´": "'",
        "“": '"',
        "”": '"',
        "„": '"',
        "‟": '"',
        "″": '"',
        "‐": "-",
        "‑": "-",
        "‒": "-",
        "–": "-",
        "—": "-",
        "―": "-",
        "−": "-",
    }
)
_POSSESSIVE = re.compile(r"(?<=\w)'s\b|(?<=s)'(?=\W|$)")
_NON_WORD = re.compile(r"[\W_]+")
_ABBREVIATION = re.compile(r"\b(?:mr|mrs|ms|dr|st|jr|sr|prof|capt|[a-z])\.", re.IGNORECASE)


@lru_cache(maxsize=4096)
def _title_words(title: str) -> tuple[tuple[str, ...], ...]:
    """A title's words, as written, without "Chapter 3:", and each part after a colon of two
    words or more ("A Tribute to a Heroine" of "Lysa the Keeper: A Tribute to a Heroine"). A
    book's titles are asked about for every name of every chapter: normalised once."""
    parts = tuple(tuple(normalise(p).split()) for p in title.split(":")[1:] if len(p.split()) >= 2)
    return (
        tuple(normalise(title).split()),
        tuple(normalise(_NUMBERED.sub("", title)).split()),
        *parts,
    )


def _is_title(name: str, title: str) -> bool:
    """Whether `name` is `title` (or `title` without "Chapter 3:"), or its start cut off: at
    least TITLE_PREFIX_SHARE of its words, the last maybe cut mid-word."""
    words = tuple(normalise(name).split())
    for title_words in _title_words(title):
        if not title_words or not words:
            continue
        if words == title_words:
            return True
        n = len(words)
        if (
            2 <= n <= len(title_words)
            and n >= TITLE_PREFIX_SHARE * len(title_words)
            and words[:-1] == title_words[: n - 1]
            and title_words[n - 1].startswith(words[-1])
        ):
            return True
    return False


def fold(text: str) -> str:
    """Case-folded, without diacritics, typographic quotes and dashes made plain."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return stripped.casefold().translate(_QUOTES)


def normalise(text: str) -> str:
    """Words only, for comparing: folded, possessives dropped, punctuation as single spaces."""
    return " ".join(_NON_WORD.sub(" ", _POSSESSIVE.sub("", fold(text))).split())


#: A list's own numbering a model wrote into an item ("1. 1: Sailing to the cove", "- 2) ...").
_LIST_MARKER = re.compile(r"^(?:\s*(?:[-*\u2022]|\d{1,2}\s*[.:)\]]|\(\d{1,2}\))(?=\s))+\s*")


def distinct_texts(items: Iterable[str], *, unwanted: Iterable[str] = ()) -> list[str]:
    """The items of a model's list that say something, each once: without the list's own
    numbering ("1. 1: Sailing to the cove"), blank items, items with no words ("1.2-1.3-1.4"),
    items that repeat one before them by
    their words, and items that only repeat one of `unwanted` (the book's title as a theme, or
    as an act's event with "Act 1:" before it).
    Order and wording otherwise as written; "Act 2", "3 ships sink", "10:30 the ferry leaves"
    and "-5 degrees at night" keep their numbers."""
    seen = {_item_key(u) for u in unwanted} - {""}
    kept: list[str] = []
    for item in items:
        text = " ".join(_LIST_MARKER.sub("", item, count=1).split())
        key = _item_key(text)
        if key and key not in seen and any(ch.isalpha() for ch in key):
            seen.add(key)
            kept.append(text)
    return kept


#: "Act 1: " or "Chapter 2 - " heading an item; "Chapter 2 ends" is an item of its own.
_ITEM_HEADING = re.compile(
    r"^\s*(?:chapter|part|book|act|scene|volume)\s+(?:\d+|[ivxlc]+)\s*[:.\-\u2013\u2014]\s+",
    re.IGNORECASE,
)


def _item_key(text: str) -> str:
    """An item by its words, an "Act 1:" or "Chapter 2 -" before them aside."""
    return normalise(_ITEM_HEADING.sub("", text, count=1)) or normalise(text)


def _words(name: str) -> list[str]:
    return [w for w in _FRAGMENT_SPLIT.split(name.strip()) if w]


def distinctive_tokens(name: str) -> list[str]:
    """The words of a name that identify it alone ("Mara" and "Quill" of "Mara Quill"): at
    least three letters, not a connector or form of address."""
    return [
        w
        for w in normalise(name).split()
        if len(w) >= 3 and w not in CONNECTORS and w not in HONORIFICS
    ]


def without_honorifics(name: str) -> str:
    words = normalise(name).split()
    while len(words) > 1 and words[0] in HONORIFICS | CONNECTORS:
        words = words[1:]
    return " ".join(words)


class SourceText:
    """A source text, normalised once, asked about many quotes and names."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.norm = normalise(text)
        self._padded = f" {self.norm} "

    def has_phrase(self, phrase: str) -> bool:
        """Whether the normalised phrase occurs in the text as whole words."""
        norm = normalise(phrase)
        return bool(norm) and f" {norm} " in self._padded

    def quote_score(self, quote: str) -> float:
        """How well the quote matches somewhere in the text, 0-100 (100: verbatim)."""
        norm = normalise(quote)
        if not norm or not self.norm:
            return 0.0
        if f" {norm} " in self._padded:
            return 100.0
        return float(fuzz.partial_ratio(norm, self.norm))

    def quote_problem(self, quote: str) -> str | None:
        """None when the quote is evidence from this text, else why not."""
        if not quote.strip():
            return "no quote"
        if len(normalise(quote).split()) < MIN_QUOTE_WORDS:
            return f"quote shorter than {MIN_QUOTE_WORDS} words"
        score = self.quote_score(quote)
        if score < MIN_QUOTE_SCORE:
            return f"quote not in the text (best match {score:.0f}/100)"
        return None

    def names(self, name: str) -> bool:
        """Whether the text names `name` (whole words; a form of address may be left out)."""
        return self.has_phrase(name) or self.has_phrase(without_honorifics(name))


class KnownNames:
    """Names the story already knows (the bible's characters and places, entities committed
    before): a known entity may be referred to by any of its names or aliases, or by one of
    their distinctive words ("Quill" for "Mara Quill")."""

    def __init__(self, entities: Iterable[Sequence[str]] = ()) -> None:
        self._groups: list[tuple[str, ...]] = []
        self._by_key: dict[str, int] = {}
        for names in entities:
            self.add(names)

    def add(self, names: Sequence[str]) -> None:
        group = tuple(n for n in names if n and n.strip())
        if not group:
            return
        index = len(self._groups)
        self._groups.append(group)
        for name in group:
            for key in {normalise(name), without_honorifics(name)}:
                if key:
                    self._by_key.setdefault(key, index)

    def names_of(self, name: str) -> tuple[str, ...] | None:
        """Every name and alias of the known entity `name` names, or None."""
        for key in (normalise(name), without_honorifics(name)):
            if key in self._by_key:
                return self._groups[self._by_key[key]]
        return None

    def is_known(self, name: str) -> bool:
        return self.names_of(name) is not None

    def referred(self, name: str, source: SourceText) -> bool:
        """Whether `name` is a known entity that the text refers to by one of its names."""
        group = self.names_of(name)
        if group is None:
            return False
        if any(source.names(n) for n in group):
            return True
        return any(source.has_phrase(token) for n in group for token in distinctive_tokens(n))

    def __len__(self) -> int:
        return len(self._groups)


def mentions(source: SourceText, name: str, known: KnownNames | None = None) -> bool:
    """Whether `source` (a scene, a turn, a quote) names `name`, or refers to it by a known name."""
    return source.names(name) or (known is not None and known.referred(name, source))


def _repeated_fragment(text: str, common: frozenset[str] = frozenset()) -> str | None:
    """A word a small model's loop repeats: three times anywhere (`common` words aside), or
    twice in a row in a string of more than two words ("Baden-Baden" and "Bora Bora" are names)."""
    fragments = [normalise(w) for w in _words(text)]
    counts: dict[str, int] = {}
    for fragment in fragments:
        if fragment and fragment not in common:
            counts[fragment] = counts.get(fragment, 0) + 1
    repeated = [f for f, c in counts.items() if c >= 3]
    if len(fragments) > 2:
        repeated += [a for a, b in zip(fragments, fragments[1:], strict=False) if a and a == b]
    return repeated[0] if repeated else None


def title_problem(title: str, max_words: int = MAX_TITLE_WORDS) -> str | None:
    """None when `title` can head a chapter or scene, else why not: blank, no letters, a
    template's placeholder ("Title 1"), a loop ("2016: 2016: 2016"), or a paragraph rather than a
    title. Look-alikes that pass: "Bora Bora", "The Lion, the Witch and the Wardrobe" (connectors
    repeat in titles), "Summer of 1984", "Title Fight", "Untitled Love Song"."""
    text = " ".join(title.split())
    if not text:
        return "blank title"
    bare = _NUMBERED.sub("", text, count=1)  # "Chapter 2: ..." is judged by what follows the number
    if not any(ch.isalpha() for ch in bare or text):
        return "no words in the title"
    if _PLACEHOLDER_TITLE.match(bare):
        return "a placeholder, not a title"
    repeated = _repeated_fragment(text, CONNECTORS)
    if repeated:
        return f"repeated fragment {repeated!r}"
    if len(text.split()) > max_words:
        return f"{len(text.split())} words: a paragraph, not a title"
    return None


def usable_title(
    title: str,
    fallback: str,
    max_words: int = MAX_TITLE_WORDS,
    *,
    taken: Sequence[str] = (),
) -> tuple[str, str | None]:
    """`title` tidied, or `fallback` when it cannot be a title; with the reason it could not.

    `taken`: titles it must not repeat (the book's and the chapters' before it: a small model
    heads every chapter with the book's title). Compared by their words, a "Chapter 2:" before
    them aside; `fallback` is the caller's to keep apart from them."""
    problem = title_problem(title, max_words)
    if problem is None and _bare_title(title) in {_bare_title(t) for t in taken}:
        problem = "the book's title or an earlier chapter's"
    return (fallback, problem) if problem else (" ".join(title.split()), None)


def _bare_title(title: str) -> str:
    return normalise(bare_chapter_title(title)) or normalise(title)


# Models often number the title themselves ("Chapter 3: The Ford", "chapter-1" as a slug, seen
# in make run's outline); the heading adds the number.
_NUMBERED_TITLE = re.compile(
    r"^\s*chapter(?:[\s_\-]+(?:\d+|[ivxlc]+)|\d+)\b\s*[:.\-\u2013\u2014]?\s*", re.IGNORECASE
)


def bare_chapter_title(title: str) -> str:
    """A chapter's title without the numbers a model put before it ("Chapter 1: Chapter 1: The
    Tide": "The Tide") and without the brackets they leave around it ("Chapter 1 (The Ford)":
    "The Ford"); "" when the title was only a number ("Chapter 4")."""
    bare = title
    while (stripped := _NUMBERED_TITLE.sub("", bare, count=1)) != bare:
        bare = stripped
    bare = bare.strip()
    if bare.startswith("(") and bare.endswith(")") and "(" not in bare[1:-1]:
        bare = bare[1:-1].strip()
    return bare


def chapter_heading(number: int, title: str) -> str:
    """ "Chapter N: <title>", numbered once; "Chapter N" for a title that was only a number."""
    bare = bare_chapter_title(title)
    return f"Chapter {number}: {bare}" if bare else f"Chapter {number}"


def name_problem(name: str, titles: Sequence[str] = ()) -> str | None:
    """None when `name` can be a name, else why it cannot (a short phrase).

    `titles`: the book's and its chapters' titles, which are never names of people or places.
    Known names do not come here: callers let the bible's names and aliases through first."""
    text = " ".join(name.split())
    if not text:
        return "blank name"
    if _HEADING.match(text):
        return "a heading, not a name"
    if text[-1] in "-‐‑–—'’_" or text.endswith(".."):
        return "name cut short"
    repeated = _repeated_fragment(text)
    if repeated:
        return f"repeated fragment {repeated!r}"
    if _IDENTIFIER.search(text):
        return "an identifier (an underscore, or a word run into a number), not a name"
    plain = text.split()
    content = [w for w in plain if normalise(w) not in CONNECTORS]
    if len(plain) > MAX_NAME_WORDS or len(content) > MAX_NAME_CONTENT_WORDS:
        return f"{len(plain)} words: a description, not a name"
    if _SENTENCE_PUNCT.search(_ABBREVIATION.sub("", text)):
        return "sentence punctuation in a name"
    lower = [w for w in content if w[:1].islower()]
    first_capital = next((i for i, w in enumerate(plain) if w[:1].isupper()), None)
    lower_after_capital = [
        w
        for i, w in enumerate(plain)
        if first_capital is not None
        and i > first_capital
        and w[:1].islower()
        and normalise(w) not in CONNECTORS
    ]
    if len(lower_after_capital) >= 2 or len(lower) >= 3:
        return "reads like a sentence, not a name"
    for title in titles:
        if _is_title(text, title):
            return f"the title {' '.join(title.split())[:60]!r}, not a name"
    return None
