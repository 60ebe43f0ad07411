"""Deterministic prose metrics: the degeneration guard's measurements.

Small models (and, per SAGA's users, real local models too) fall into loops: one sentence
family repeated until the token cap. An LLM editor does not reliably notice, so a draft is
measured before anyone reads it:

- distinct-n: distinct word n-grams / all word n-grams (human prose: trigrams > 0.9);
- the most-repeated sentence and how often it occurs;
- zlib compression ratio: compressed / raw bytes (English prose ~0.35-0.45, loops ~0.1);
- length against the target, in words.

Plain regular expressions and `zlib` are enough here: a sentence splitter from NLP libraries
(nltk, spaCy) would add a model download for a count that only needs to be stable.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter

from pydantic import BaseModel, Field

from core.settings import ProseThresholds

_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z0-9]+)*")
# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) then whitespace,
# or at a line break (dialogue lines, headings).
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|\n+")


class ProseMetrics(BaseModel):
    """What the guard measured on one text, and whether it passes the thresholds."""

    words: int = Field(ge=0)
    target_words: int = Field(ge=0)
    distinct_bigrams: float
    distinct_trigrams: float
    max_sentence_repeats: int = Field(ge=0)
    most_repeated_sentence: str = ""
    compression_ratio: float
    failures: list[str] = Field(
        default_factory=list, description="why the text fails, empty when clean"
    )

    @property
    def clean(self) -> bool:
        return not self.failures

    @property
    def length_ratio(self) -> float:
        return self.words / self.target_words if self.target_words else 1.0

    def brief(self) -> str:
        return (
            f"{self.words} words, distinct trigrams {self.distinct_trigrams:.2f}, "
            f"max sentence repeats {self.max_sentence_repeats}, compression {self.compression_ratio:.2f}"
        )


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def distinct_n(words: list[str], n: int) -> float:
    """Distinct n-grams / all n-grams; 1.0 for texts too short to have any."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def sentences_of(text: str) -> list[str]:
    """Sentences normalised for comparison: lower case, words only (so punctuation or
    spacing changes do not make a repeated sentence look new)."""
    out = []
    for raw in _SENTENCE_END.split(text):
        normalised = " ".join(words_of(raw))
        if normalised:
            out.append(normalised)
    return out


#: A line of a list, not of prose: "1. ...", "2) ...", "**3.** ...", "* ...", "- ...", "• ..."
#: (not a scene break "* * *", not a dialogue dash "— ..." or "–").
_LIST_LINE = re.compile(r"^ {0,3}(?:\*\*)?(?:\d{1,2}[.)]|[*\u2022-])(?:\*\*)?\s+(?![*\s]*$)")
#: A template's slot a model echoed instead of filling it: "[A]", "[X]", "[Name]", "[insert
#: location]" (not "[sic]", a footnote's "[1]" or a bracketed aside of several words).
_PLACEHOLDER = re.compile(
    r"\[[A-Z]\]|(?i:\[(?:name|character|character\s+name|location|place|setting|protagonist"
    r"|antagonist|insert\b[^\]\n]{0,30})\])"
)


#: Dialogue in double quotes, which may say anything ("Let me know if you need help," she said).
_QUOTED = re.compile(r"[\"\u201c][^\"\u201c\u201d]*[\"\u201d]")
#: A line of dialogue after a dash ("\u2014 Let me know, Mara said.").
_DASH_LINE = re.compile(r"^\s*[\u2014\u2013]")
#: A sentence in which the model talks to whoever asked for the text, about the text, instead of
#: telling the story: SmolLM2 answered a scene prompt with "I will give you one possible way to
#: make this paragraph more impactful ... Here's an alternative version - the original text
#: needs refinement". Each form names the request or the text as a piece of writing, or is a
#: chat assistant's formula; none is a thing a narrator says.
_ASSISTANT_TALK = re.compile(
    r"(?i:\b(?:here(?:'s|\u2019s|\s+is|\s+are)|below\s+is|i(?:'ve|\u2019ve|\s+have)\s+"
    r"(?:written|revised|rewritten|made))\b[^.!?\n]{0,40}?\b(?:(?:revised|rewritten|alternative"
    r"|improved|updated|edited|polished|possible|suggested)\s+(?:version|draft|scene|story|chapter"
    r"|paragraph|passage|text)|rewrite|revision|continuation)\b"
    r"|\b(?:you|your)\b[^.!?\n]{0,60}?\b(?:this|the|your|my)\s+(?:paragraph|passage|prompt"
    r"|rewrite|revision|feedback)\b"
    r"|\b(?:this|the|your|my)\s+(?:paragraph|passage|prompt|rewrite|revision|feedback)\b"
    r"[^.!?\n]{0,60}?\b(?:you|your)\b"
    r"|\b(?:i\s+hope\s+(?:this|that|it)\s+helps|let\s+me\s+know\s+if|as\s+an\s+ai\b|(?:a|an)\s+(?:ai|large)\s+language\s+model|happy\s+to\s+help"
    r"|would\s+you\s+like\s+me\s+to|the\s+(?:story|scene|chapter|text)\s+(?:above|below)"
    r"|in\s+this\s+(?:scene|chapter|story|passage),?\s+(?:we|you|i|the\s+reader)\b))"
)


def assistant_talk(text: str) -> list[str]:
    """The sentences in which `text` talks to its requester about itself ("I will give you one
    possible way to make this paragraph more impactful", "Here's an alternative version", "I
    hope this helps!"), each once, in order: outside dialogue in quotes or after a dash, where
    a character may say anything."""
    found: list[str] = []
    for line in text.splitlines():
        if _DASH_LINE.match(line):
            continue
        for sentence in _SENTENCE_END.split(_QUOTED.sub(" ", line)):
            if _ASSISTANT_TALK.search(sentence):
                found.append(" ".join(sentence.split())[:160])
    return list(dict.fromkeys(found))


def listed(text: str) -> tuple[int, float]:
    """(lines, share of words): `text`'s lines written as list items and the share of its
    words they hold. Many such lines holding most words are an outline or notes about the
    story, not the story (a small model answers a scene prompt with "1. The story begins with
    ..."); a short list inside prose (a note a character reads) holds few of its words."""
    words = listed_words = lines = 0
    for line in text.splitlines():
        count = len(words_of(line))
        words += count
        if _LIST_LINE.match(line):
            lines += 1
            listed_words += count
    return lines, round(listed_words / words, 4) if words else 0.0


def placeholders(text: str) -> list[str]:
    """The template slots `text` holds unfilled ("[A]", "[Name]"), each once, in order."""
    return list(dict.fromkeys(m.group(0) for m in _PLACEHOLDER.finditer(text)))


def sentence_lengths(text: str) -> list[int]:
    """Words in each sentence, in order (the same splitter as `sentences_of`)."""
    return [n for n in (len(words_of(raw)) for raw in _SENTENCE_END.split(text)) if n]


def most_repeated_sentence(text: str) -> tuple[str, int]:
    counts = Counter(sentences_of(text))
    if not counts:
        return "", 0
    sentence, count = counts.most_common(1)[0]
    return sentence, count


def compression_ratio(text: str) -> float:
    """zlib-compressed bytes / raw bytes (level 9); 1.0 for empty text.

    Very short texts compress badly whatever they say (the stream has a fixed overhead), so
    they score high: the ratio only catches loops, which need length to form.
    """
    raw = text.encode("utf-8")
    if not raw:
        return 1.0
    return len(zlib.compress(raw, 9)) / len(raw)


def measure(text: str, target_words: int, thresholds: ProseThresholds) -> ProseMetrics:
    words = words_of(text)
    sentence, repeats = most_repeated_sentence(text)
    metrics = ProseMetrics(
        words=len(words),
        target_words=target_words,
        distinct_bigrams=round(distinct_n(words, 2), 4),
        distinct_trigrams=round(distinct_n(words, 3), 4),
        max_sentence_repeats=repeats,
        most_repeated_sentence=sentence[:200],
        compression_ratio=round(compression_ratio(text), 4),
    )
    metrics.failures = failures(metrics, thresholds)
    return metrics


def failures(metrics: ProseMetrics, thresholds: ProseThresholds) -> list[str]:
    """Each threshold the metrics break, as a short phrase for logs and revision guidance."""
    found = []
    if metrics.distinct_trigrams < thresholds.min_distinct_trigrams:
        found.append(
            f"distinct word-trigram ratio {metrics.distinct_trigrams:.2f} "
            f"< {thresholds.min_distinct_trigrams:.2f}"
        )
    if metrics.distinct_bigrams < thresholds.min_distinct_bigrams:
        found.append(
            f"distinct word-bigram ratio {metrics.distinct_bigrams:.2f} "
            f"< {thresholds.min_distinct_bigrams:.2f}"
        )
    if metrics.max_sentence_repeats > thresholds.max_sentence_repeats:
        found.append(
            f"one sentence occurs {metrics.max_sentence_repeats} times "
            f"(at most {thresholds.max_sentence_repeats}): {metrics.most_repeated_sentence[:80]!r}"
        )
    if metrics.compression_ratio < thresholds.min_compression_ratio:
        found.append(
            f"zlib compression ratio {metrics.compression_ratio:.2f} "
            f"< {thresholds.min_compression_ratio:.2f} (repetitive text)"
        )
    if metrics.target_words:
        if metrics.length_ratio < thresholds.min_length_ratio:
            found.append(
                f"{metrics.words} words is under {thresholds.min_length_ratio:.0%} "
                f"of the {metrics.target_words}-word target"
            )
        elif metrics.length_ratio > thresholds.max_length_ratio:
            found.append(
                f"{metrics.words} words is over {thresholds.max_length_ratio:.0%} "
                f"of the {metrics.target_words}-word target"
            )
    return found
