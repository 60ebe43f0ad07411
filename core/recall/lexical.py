"""The lexical part of a `HybridIndex`: BM25 (Lucene's formula) over its own postings and
exact statistics, text analysed by tantivy's analyzer (tokenized, lowercased, English function
words dropped, stemmed); and the documents' words as typed, by which `spelled` reads a query's
typos as the words they mean (rapidfuzz's edit distance over the memory's words, and
pyspellchecker's English word list: no dictionary or edit search of our own).

Contract: `index` receives each document's body by position, in order (only the last one is
ever re-indexed, when its body changes); `ranking` orders positions by BM25, best first, ties
by position, from the exact statistics of what is held, so the ranking does not depend on how
the documents were batched. Why our own postings rather than a tantivy index:
docs/decisions/recall-fusion.md.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import OSA

from core.recall.columns import Column
from core.recall.query import STOP_WORDS

#: Terms found in more than this share of the documents are left out of a query: their BM25
#: weight is near zero, yet their postings are the longest (a speaker's name is in half the
#: turns), and they would make the cost of a query grow with the conversation.
MAX_TERM_SHARE = 0.05
#: ... but a term in at most this many documents is always kept.
ALWAYS_KEPT_DOC_FREQ = 200
#: A query's word no document holds and the English word list lacks, at least this long, is
#: read as the word one edit away it most likely means (a typo: `LexicalIndex.spelled`).
TYPO_MIN_LENGTH = 5
#: ... and at most this long (a longer run of letters is no word a typo spoiled).
TYPO_MAX_LENGTH = 30
#: The least share of a text's words the English word list or the memory knows for its other
#: words to be read as typos: English questions hold 0.8 or more (the shared dialogues' 1,986,
#: the least 0.8), a short one with a typo half ("Which torunament?"), a Spanish, German or
#: Italian message 0.2-0.3.
ENGLISH_SHARE = 0.5
#: BM25's constants (Lucene's and tantivy's).
BM25_K1 = 1.2
BM25_B = 0.75


@functools.cache
def english_words() -> Any:
    """pyspellchecker's English word list (160,000 words with their frequencies), loaded at the
    first query with a word that may be a typo and no document holds (about 0.8 s, once per
    process; the sidecar loads it before it serves)."""
    from spellchecker import SpellChecker

    return SpellChecker(language="en", distance=1)


def _may_be_typo(word: str) -> bool:
    """Whether `word` (lower case) is one `LexicalIndex.spelled` may read as a typo: ASCII
    letters only, `TYPO_MIN_LENGTH` to `TYPO_MAX_LENGTH` of them."""
    return TYPO_MIN_LENGTH <= len(word) <= TYPO_MAX_LENGTH and word.isascii() and word.isalpha()


#: A word as tantivy's simple tokenizer cuts it (letters and digits).
_WORD = re.compile(r"[^\W_]+")


class Postings:
    """One term's postings: positions (ascending, documents are indexed in order) and the
    term's frequency in each."""

    __slots__ = ("_positions", "_frequencies")

    def __init__(self) -> None:
        self._positions = Column(np.int64, 4)
        self._frequencies = Column(np.int32, 4)

    def append(self, position: int, frequency: int) -> None:
        self._positions.append(position)
        self._frequencies.append(frequency)

    def set_last(self, position: int, frequency: int) -> bool:
        """Update the frequency of `position` if it is the last posting (a re-indexed document)."""
        held = self._positions.values
        if len(held) and held[-1] == position:
            self._frequencies.set(len(held) - 1, frequency)
            return True
        return False

    def drop_last(self, position: int) -> None:
        held = self._positions.values
        if len(held) and held[-1] == position:
            self._positions.drop_last()
            self._frequencies.drop_last()

    @property
    def positions(self) -> np.ndarray:
        return self._positions.values

    @property
    def frequencies(self) -> np.ndarray:
        return self._frequencies.values


class LexicalIndex:
    """Postings and BM25 statistics of the documents' bodies, by position."""

    def __init__(self) -> None:
        import tantivy

        self._analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(STOP_WORDS))
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        #: A text's words as typed (lower case), for `spelled`.
        self._words = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.lowercase())
            .build()
        )
        self._term_ids: dict[str, int] = {}
        #: The documents' words as typed (lower case): how many documents hold each, and the
        #: words by their first letter, for `spelled`'s search (a typo seldom changes it).
        self._surface: dict[str, int] = {}
        self._by_initial: dict[str, list[str]] = {}
        self._last_words: set[str] = set()
        self._postings: list[Postings] = []
        self._doc_freq: list[int] = []
        self._doc_length = Column(np.float64)
        self._total_length = 0
        #: The terms (id -> frequency) of the last document: the only one ever re-indexed.
        self._last_terms: dict[int, int] = {}

    def index(self, position: int, body: str, *, reindex: bool) -> None:
        """Postings and statistics of the document at `position` (`reindex`: it is the last
        document and its body changed: its old terms and length are taken out first)."""
        counts: dict[int, int] = {}
        for token in self._analyzer.analyze(body):
            term = self._term_ids.get(token)
            if term is None:
                term = self._term_ids[token] = len(self._postings)
                self._postings.append(Postings())
                self._doc_freq.append(0)
            counts[term] = counts.get(term, 0) + 1
        length = sum(counts.values())
        if reindex:
            for term in self._last_terms:
                if term not in counts:
                    self._postings[term].drop_last(position)
                    self._doc_freq[term] -= 1
            self._total_length -= int(self._doc_length.values[position])
            self._doc_length.set(position, length)
        else:
            self._doc_length.append(length)
        for term, frequency in counts.items():
            if not self._postings[term].set_last(position, frequency):
                self._postings[term].append(position, frequency)
                self._doc_freq[term] += 1
        self._total_length += length
        self._last_terms = counts
        words = set(self._words.analyze(body))
        for word in self._last_words - words if reindex else ():
            self._surface[word] -= 1
        for word in words - self._last_words if reindex else words:
            held = self._surface.get(word)
            if held is None:
                self._by_initial.setdefault(word[:1], []).append(word)
            self._surface[word] = (held or 0) + 1
        self._last_words = words

    def spelled(self, text: str) -> str:
        """`text` with each word no document holds and no English dictionary knows (a typo:
        "resaerch") replaced by the word one edit away (a letter added, dropped, changed, or
        two swapped) that it most likely means (`_meant`). Only in a text mostly of words the
        dictionary or the memory knows (`ENGLISH_SHARE`): in another language every word is
        one the English list lacks, and "Recuerdas cuando fuimos al parque?" is no typo of
        "parquet". A word of fewer than `TYPO_MIN_LENGTH` letters or more than
        `TYPO_MAX_LENGTH`, or with a digit, stays: too many words are one edit from a short one;
        so does a word in another alphabet or with an accent (the word list is English)."""
        words = [w.lower() for w in _WORD.findall(text) if len(w) >= 2 and w.isalpha()]
        if not any(_may_be_typo(w) and not self._surface.get(w) for w in words):
            return text  # every word the memory's or no word a typo could be: no dictionary
        known = english_words().known(words)
        if sum(w in known or bool(self._surface.get(w)) for w in words) < ENGLISH_SHARE * len(
            words
        ):
            return text
        meant_of: dict[str, str] = {}

        def replace(found: re.Match[str]) -> str:
            typed = found.group(0)
            word = typed.lower()
            if not _may_be_typo(word) or self._surface.get(word) or word in known:
                return typed
            if word not in meant_of:  # a word typed twice is looked up once
                meant_of[word] = self._meant(word)
            meant = meant_of[word]
            if meant == word:
                return typed
            return meant.capitalize() if typed[:1].isupper() else meant

        return _WORD.sub(replace, text)

    def _meant(self, word: str) -> str:
        """The word one edit from `word` it most likely means: the same letters swapped first
        ("recieved" is "received", not "relieved"), then a word the memory holds, the more
        documents the better ("pottry" in a chat about pottery is not "poetry"; "hoodies" is
        the memory's "hoodie", not the dictionary's "goodies"), then the dictionary's
        commonest; `word` itself when there is none. Deterministic: ties go to the word's order."""
        held = {
            w: self._surface[w]
            for w, _, _ in process.extract(
                word,
                self._by_initial.get(word[:1], []),
                scorer=OSA.distance,
                score_cutoff=1,
                limit=None,
            )
            if self._surface.get(w)
        }
        english = english_words()
        candidates = held.keys() | {w for w in english.candidates(word) or () if w.isalpha()}
        candidates.discard(word)
        if not candidates:
            return word
        return min(
            candidates,
            key=lambda w: (
                sorted(w) != sorted(word),
                -held.get(w, 0),
                -english.word_frequency[w],
                w,
            ),
        )

    def ranking(self, query: str, limit: int, documents: int) -> list[int]:
        """BM25 (Lucene's: k1 1.2, b 0.75) with the exact statistics of the `documents` held,
        best first, ties by position: the same ranking whatever order of calls built the index."""
        terms = list(dict.fromkeys(self._analyzer.analyze(query)))
        if not terms:
            return []
        total = max(documents, 1)
        frequency = {
            t: (self._doc_freq[self._term_ids[t]] if t in self._term_ids else 0) for t in terms
        }
        # Small memories keep every term (cheap anyway); large ones drop the near-universal.
        ceiling = max(MAX_TERM_SHARE * total, ALWAYS_KEPT_DOC_FREQ)
        kept = [t for t in terms if 0 < frequency[t] <= ceiling]
        if not kept:  # only common words: the rarest of them still orders the documents
            present = [t for t in terms if frequency[t] > 0]
            kept = [min(present, key=lambda t: (frequency[t], t))] if present else []
        if not kept:
            return []
        lengths = self._doc_length.values
        average = self._total_length / total if self._total_length else 1.0
        found: list[np.ndarray] = []
        gains: list[np.ndarray] = []
        for term in kept:
            postings = self._postings[self._term_ids[term]]
            positions, tf = postings.positions, postings.frequencies.astype(np.float64)
            df = frequency[term]
            idf = np.log(1.0 + (total - df + 0.5) / (df + 0.5))
            norm = BM25_K1 * (1.0 - BM25_B + BM25_B * lengths[positions] / average)
            found.append(positions)
            gains.append(idf * (BM25_K1 + 1.0) * tf / (tf + norm))
        every = np.concatenate(found)
        held, inverse = np.unique(every, return_inverse=True)
        scores = np.zeros(len(held), dtype=np.float64)
        np.add.at(scores, inverse, np.concatenate(gains))  # per document, in the query's term order
        order = np.lexsort((held, -scores))[:limit]
        return [int(p) for p in held[order]]
