"""Cutting text where a sentence ends, never in the middle of a word or a sentence.

Skald bounds text in several places: the grammar of the embedded tiny model caps every
string (core.llm.schemas), prompts carry the end of the previous scene and a bounded share
of a chapter, the context envelope fits items into a token budget. A plain slice leaves
"who has dedicated a " in a character sheet, or starts a prompt with "ling at the door".
These helpers cut at the last sentence end that fits (or, failing that, a clause end, which
then closes the sentence), and start excerpts at a sentence start.

Written here rather than taken from a sentence splitter (pysbd, nltk's punkt, spaCy): the
cuts only need the ends the text itself marks, and the splitters' abbreviation handling
would move cut points for no reader's benefit (nltk and spaCy also need model downloads).
"""

from __future__ import annotations

import re

#: A sentence ends at . ! ? or … (optionally followed by closing quotes or brackets).
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)")
#: A clause ends at , ; : or a dash followed by a space.
_CLAUSE_END = re.compile(r"\s*(?:[,;:]|\s[-–—])(?=\s)")
#: A sentence starts after a sentence end and whitespace, or after a line break.
_SENTENCE_START = re.compile(r"(?:(?<=[.!?…])[\"'”’)\]]*\s+|\n\s*)(?=\S)")
_TERMINAL = re.compile(r"[.!?…][\"'”’)\]]*$")
#: Common abbreviations whose full stop ends no sentence ("Dr. Venn", "St. Ives").
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof capt col gen lt sgt rev vs etc mt no".split()
)
#: A clause end is worth cutting at only if it keeps this share of the text.
MIN_KEPT_SHARE = 0.3
#: A clause closed as a sentence must say something: at least this many words.
MIN_CLAUSE_WORDS = 4
#: Words no English sentence ends on: articles, coordinating conjunctions, determiners that
#: need their noun. (Prepositions, auxiliaries and "her" or "that" can end one: "the place she
#: came from", "she knew she could", "he loved her".) A text ending on one was cut ("She is the").
DANGLING_WORDS = frozenset(
    "the a an and or but nor because than my your our their its whose".split()
)


def ends_sentence(text: str) -> bool:
    """Whether the text ends where a sentence ends (terminal punctuation, maybe a closing quote)."""
    return bool(_TERMINAL.search(text.rstrip()))


def _sentence_ends(text: str) -> list[int]:
    ends = []
    for match in _SENTENCE_END.finditer(text):
        # The word before the mark (from a short window: the whole text before it, copied for
        # each mark, cost the square of a long text's length).
        before = text[max(0, match.start() - 64) : match.start()].rsplit(None, 1)
        word = before[-1].lower() if before else ""
        if (
            match.group().startswith(".")
            and len(match.group()) == 1
            and (word in _ABBREVIATIONS or len(word) == 1)
        ):
            continue  # "Dr." or an initial: no sentence ends here
        ends.append(match.end())
    return ends


def clip_to_sentence(text: str, max_chars: int) -> str:
    """The longest start of `text`, at most `max_chars` long, that ends a sentence.

    Falls back to the last clause end (closed with a full stop) when no sentence end fits,
    and to "" when neither does: a fragment is worth less than nothing in a bible or prompt.
    """
    text = text.strip()
    if len(text) <= max_chars:
        return text
    window = text[: max_chars + 1]
    ends = [e for e in _sentence_ends(window) if e <= max_chars]
    if ends:
        return window[: ends[-1]].strip()
    return _close_at_clause(window[:max_chars])


def _close_at_clause(text: str) -> str:
    clauses = [m.start() for m in _CLAUSE_END.finditer(text)]
    if clauses and clauses[-1] >= MIN_KEPT_SHARE * len(text):
        return text[: clauses[-1]].rstrip() + "."
    return ""


def finish_cut_text(text: str) -> str:
    """A text that was cut off (by a length bound), ended at its last sentence or clause end.

    A clause end after the last full sentence wins when it closes a clause of at least
    `MIN_CLAUSE_WORDS` words (it keeps more of what was said); a text that already ends a
    sentence is returned as it is; one with no sentence or clause end comes back empty."""
    text = text.rstrip()
    if ends_sentence(text):
        return text
    ends = _sentence_ends(text)
    last = ends[-1] if ends else 0
    clauses = [m.start() for m in _CLAUSE_END.finditer(text) if m.start() > last]
    if clauses and len(text[last : clauses[-1]].split()) >= MIN_CLAUSE_WORDS:
        return text[: clauses[-1]].rstrip() + "."
    if ends and last >= MIN_KEPT_SHARE * len(text):
        return text[:last].strip()
    closed = _close_at_clause(text)
    if closed:
        return closed
    return text[:last].strip() if ends else ""


def as_sentence(text: str) -> str:
    """A model's free-text field as a finished sentence: one that ends without punctuation
    gets its full stop, one that ends on a comma or dash ends there instead, and one whose last
    sentence stops on a word no sentence ends on ("She is the") loses that sentence. (Text cut
    off by a length bound is `finish_cut_text`'s: a full stop would not mend a cut word.)"""
    text = " ".join(text.split())
    if not text or ends_sentence(text):
        return text
    text = text.rstrip(" ,;:-–—")
    words = text.split()
    if words and words[-1].lower() in DANGLING_WORDS:
        # Cut mid-sentence (a full stop would not finish it): the sentences before it, or nothing.
        ends = _sentence_ends(text)
        return text[: ends[-1]].strip() if ends else ""
    return f"{text}." if text else ""


def whole_words(text: str) -> str:
    """A text that was cut off, without its last (maybe partial) word."""
    text = text.rstrip()
    cut = text.rsplit(None, 1)
    return cut[0].rstrip(" ,;:-–—") if len(cut) == 2 else ""


def tail_from_sentence(text: str, max_chars: int) -> str:
    """The end of `text`, at most `max_chars` long, starting where a sentence starts.

    When no sentence starts inside the window (one very long sentence), the tail starts at
    a word instead: still no broken word, and the end of the text is what matters."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    offset = len(text) - max_chars
    window = text[offset:]
    if text[offset - 1].isspace() and ends_sentence(text[:offset]):
        return window.strip()  # the window starts where a sentence starts
    start = _SENTENCE_START.search(window)
    if start is not None and start.end() < len(window):
        return window[start.end() :].strip()
    space = window.find(" ")
    return window[space + 1 :].strip() if space >= 0 else window
