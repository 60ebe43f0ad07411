"""The lexical part of a `HybridIndex`: BM25 (Lucene's formula) over its own postings and
exact statistics, text analysed by tantivy's analyzer (tokenized, lowercased, English function
words dropped, stemmed).

Contract: `index` receives each document's body by position, in order (only the last one is
ever re-indexed, when its body changes); `ranking` orders positions by BM25, best first, ties
by position, from the exact statistics of what is held, so the ranking does not depend on how
the documents were batched. Why our own postings rather than a tantivy index:
docs/decisions/recall-fusion.md.
"""

from __future__ import annotations

import numpy as np

from core.recall.columns import Column
from core.recall.query import STOP_WORDS

#: Terms found in more than this share of the documents are left out of a query: their BM25
#: weight is near zero, yet their postings are the longest (a speaker's name is in half the
#: turns), and they would make the cost of a query grow with the conversation.
MAX_TERM_SHARE = 0.05
#: ... but a term in at most this many documents is always kept.
ALWAYS_KEPT_DOC_FREQ = 200
#: BM25's constants (Lucene's and tantivy's).
BM25_K1 = 1.2
BM25_B = 0.75


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
        self._term_ids: dict[str, int] = {}
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
