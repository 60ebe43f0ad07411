"""One memory's hybrid index (`HybridIndex`): its documents in order, composed of a lexical
index (core.recall.lexical), a dense index (core.recall.dense) and the per-document columns the
fusion reads (core.recall.documents), fused by core.recall.fusion.

Contract: `add` appends documents not yet held (by key) and leaves the index in the same state
however the documents were split into calls; `prepare` asks the rankers once, `rank` fuses
under any `RecallParams`, `search` does both and hands back `Hit`s. Every public method takes
the index's lock, so one index serves several threads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import date

import numpy as np

from core.heap import keep_large_allocations_mapped
from core.recall.dense import DenseIndex
from core.recall.documents import DocumentColumns, Hit, MemoryDoc
from core.recall.features import features
from core.recall.fusion import Ranked, budgeted, learned_rank, rrf_rank
from core.recall.lexical import LexicalIndex
from core.recall.params import (
    ASKED_DAY_SHARE,
    CANDIDATES,
    DATED_SPAN_DAYS,
    DEFAULT_PARAMS,
    RecallParams,
)
from core.recall.query import (
    PART_WINDOW,
    Prepared,
    named_in,
    topical_text,
    unaddressed,
    without_phrases,
)
from core.timex import (
    QueryDate,
    TimeSpan,
    asks_when,
    date_notes,
    parse_when,
    query_dates,
    resolved_and_deictic,
)


class HybridIndex:
    """Documents of one memory with a lexical and a dense index, appended in order."""

    def __init__(self, dimensions: int, *, neighbours: bool = True) -> None:
        """`neighbours`: index each document with the ones around it in its group and smooth
        scores over them (chat turns lean on each other); off for self-contained documents
        such as scene summaries."""
        self.dimensions = dimensions
        self.neighbours = neighbours
        #: Lexical: our own postings and exact BM25 statistics. A tantivy index counted a
        #: re-indexed document's old version in its statistics until a merge, so an index grown
        #: turn by turn scored differently from one rebuilt at start.
        self.lexical = LexicalIndex()
        keep_large_allocations_mapped()
        #: Dense: every vector, unit length, by position (exact cosine); past EXACT_DENSE_MAX
        #: documents a usearch HNSW index proposes candidates.
        self.dense = DenseIndex(dimensions)
        #: Per position: the days said and spoken of, group, speaker, ... (for the fusion).
        self.columns = DocumentColumns()
        self.docs: list[MemoryDoc] = []
        self.positions: dict[str, int] = {}
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.docs)

    def adopt_dimensions(self, dimensions: int) -> None:
        """While the index holds no vector, make its vectors `dimensions` long (the documents
        held stay lexical only): a memory whose every vector is another model's, then the first
        of the model in use, of another length."""
        with self.lock:
            if self.dense.count or dimensions == self.dimensions:
                return
            self.dimensions = dimensions
            self.dense = DenseIndex(dimensions)
            self.dense.append([None] * len(self.docs))

    def add(self, docs: list[MemoryDoc], vectors: np.ndarray | None) -> int:
        """Append documents not yet held (by key); `vectors` row i belongs to docs[i]
        (None: lexical only). Returns how many were added. The index holds the same state
        however the documents were split into calls (one call at start, or one per turn)."""
        with self.lock:
            fresh: list[tuple[int, MemoryDoc]] = [
                (i, d) for i, d in enumerate(docs) if d.key not in self.positions
            ]
            if not fresh:
                return 0
            batch: list[np.ndarray | None] = []
            first = len(self.docs)
            for i, doc in fresh:
                self.positions[doc.key] = len(self.docs)
                self.docs.append(doc)
                self.columns.append(doc, parse_when(doc.when))
                usable = (
                    vectors is not None
                    and len(vectors) > i
                    and vectors.shape[-1] == self.dimensions
                )
                batch.append(vectors[i] if usable else None)  # type: ignore[index]
            # Bodies once the batch is in place, so each sees the document after it. The one
            # document before the batch gains a next one: it is re-indexed (its statistics
            # replaced exactly), so the postings do not depend on how the documents were batched.
            if (
                self.neighbours
                and first > 0
                and self.docs[first - 1].group == self.docs[first].group
            ):
                self.lexical.index(first - 1, self._body(first - 1), reindex=True)
            for position in range(first, len(self.docs)):
                self.lexical.index(position, self._body(position), reindex=False)
            self.dense.append(batch)
            return len(fresh)

    def _body(self, position: int) -> str:
        """What BM25 indexes for a document: its date and the dates it speaks of, the
        neighbours in its group (`_neighbour`: a reply names what it answers only through
        them), its text and its lexical-only extras."""
        doc = self.docs[position]
        dates = " ".join(
            [
                doc.when,
                _day_in_words(doc.when, self.columns.said[position]),
                *(span.label() for span in self.columns.events[position]),
            ]
        ).strip()
        if not self.neighbours:
            return "\n".join(part for part in (dates, doc.text, doc.extra) if part)
        before, after = self._neighbour(position, -1), self._neighbour(position, 1)
        parts = (
            dates,
            before.text if before else "",
            doc.text,
            doc.extra,
            after.text if after else "",
        )
        return "\n".join(part for part in parts if part)

    def _neighbour(self, position: int, step: int) -> MemoryDoc | None:
        """The document `step` away in the same group, when both are said by one speaker. One
        said by several (a front end's message and its reply) holds its exchange already: the
        documents around it are other exchanges, not what it answers or what answers it."""
        other = position + step
        several = self.columns.several_speakers.values
        if (
            0 <= other < len(self.docs)
            and self.docs[other].group == self.docs[position].group
            and not several[position]
            and not several[other]
        ):
            return self.docs[other]
        return None

    def spelled(self, query: str) -> str:
        """`query` with its typos read as the memory's words ("resaerch" -> "research";
        `LexicalIndex.spelled`): what recall embeds and searches for it. Held out, a typo in
        each question's longest word cost recall@10 0.066 (docs/decisions/recall-fusion.md)."""
        return self.lexical.spelled(query)

    def prepare(
        self,
        query: str,
        vector: np.ndarray | None,
        *,
        names: list[str] | None = None,
        linked: list[str] | None = None,
        plain_vector: np.ndarray | None = None,
        parts: list[tuple[str, np.ndarray | None]] | None = None,
        asked_on: date | None = None,
    ) -> Prepared:
        """Everything a query needs from the indexes (the rankers' candidates), before the
        fusion: `rank` fuses it under any `RecallParams` without asking the indexes again.
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`).
        `parts`: a two-event question's parts (`query_parts`), each with the embedding of its
        `plain_query`; each is prepared as a query of its own (lexical, and dense on that vector).
        `asked_on`: the day the query is asked, when known (a chat's pending message, a
        benchmark's question date): its relative dates ("yesterday", "last Saturday") are then
        dates it names, as "on May 3, 2023" is; without it they name none."""
        with self.lock:
            prepared = self._prepare(query, vector, names, linked, plain_vector, asked_on)
            if not parts:
                return prepared
            own = [
                self._prepare(text, part_vector, names, None, part_vector)
                for text, part_vector in parts
            ]
            return dataclasses.replace(
                prepared,
                parts=tuple(
                    dataclasses.replace(part, dates=prepared.dates, asks_when=prepared.asks_when)
                    for part in own
                ),
            )

    def _prepare(
        self,
        query: str,
        vector: np.ndarray | None,
        names: list[str] | None,
        linked: list[str] | None,
        plain_vector: np.ndarray | None,
        asked_on: date | None = None,
    ) -> Prepared:
        # What the query asks about: its sentences that name a topic, without the names it only
        # addresses ("Thanks, Seraphina.").
        query = topical_text(query, names or [])
        spoken = unaddressed(query, names or [])
        named = named_in(spoken, names or [])
        dense = self.dense.ranking(vector, CANDIDATES) if self.docs else []
        plain = (
            self.dense.ranking(plain_vector, CANDIDATES)
            if self.docs and plain_vector is not None
            else dense
        )
        # A date named through the day asked ("yesterday"): its words match no turn that
        # speaks of that day, its turns are candidates (the fusion's `date` feature weighs them).
        resolved, deictic = resolved_and_deictic(query, asked_on)
        asked_days = tuple(span for span in deictic if span.days <= DATED_SPAN_DAYS)
        lexical_query = without_phrases(spoken, [span.phrase for span in deictic])
        return Prepared(
            lexical=(
                self.lexical.ranking(lexical_query, CANDIDATES, len(self.docs)) if self.docs else []
            ),
            dense=dense,
            dated=self.columns.of_days(asked_days, len(self.docs), CANDIDATES),
            asked_days=asked_days,
            linked=[
                self.positions[key] for key in dict.fromkeys(linked or []) if key in self.positions
            ],
            named=named[0].lower() if len(named) == 1 else None,
            # Absolute dates, and those relative to an event a document dated ("the week
            # before the wedding").
            dates=[
                *query_dates(query),
                *self.columns.question_dates(query),
                *(QueryDate(span=span) for span in resolved),
            ],
            asks_when=asks_when(query),
            plain=plain,
            vector=self.dense.unit(vector),
            plain_vector=self.dense.unit(plain_vector if plain_vector is not None else vector),
        )

    def features(
        self, prepared: Prepared, params: RecallParams = DEFAULT_PARAMS
    ) -> tuple[np.ndarray, np.ndarray]:
        """(positions, matrix): the candidate documents (every ranker's, and their in-group
        neighbours) and their FEATURES, one row each (core.recall.features)."""
        return features(prepared, params, self.columns, self.dense)

    def rank(
        self,
        prepared: Prepared,
        params: RecallParams = DEFAULT_PARAMS,
        limit: int | None = None,
        shown: Callable[[int], bool] | None = None,
    ) -> list[tuple[int, float, dict[str, float]]]:
        """(position, score, per-signal shares) of every candidate (the first `limit`), best first.

        Reciprocal-rank fusion of the rankers (lexical, dense, and the documents the graph
        links to the query), then: neighbour smoothing (a document next to a strong hit in
        its group gains a share of its score), session relevance (a document gains a share
        of its group's best score: a session that matches raises its turns), and the boosts
        (the speaker the query names; a date the query names matched by the document's own
        date or by a date it speaks of; a when-question and a document that speaks of a
        time).

        With `params.fusion` (conversation turns only) the candidates are scored by the learned
        model instead (`features`); the per-signal shares are then its terms, grouped.

        A two-event question's parts (`prepared.parts`, with `params.part_budget`): each part is
        ranked as a query of its own, and its best `part_budget` documents are kept in the top
        PART_WINDOW (or the first `limit`, when fewer), in place of the last of the question's
        own; the rest follows in the question's order.

        `shown`: documents (by position) the asker already shows (a chat front end's window):
        each ranking puts them after every other candidate (`shown_last`), so they keep a place
        only when too few others are left, and a part's slot goes to a document not shown.

        A chat question about a day it names through its own ("What did we talk about
        yesterday?", `prepared.asked_days`): the documents said on that day or speaking of it
        hold ASKED_DAY_SHARE of the same window, the best of them by the question's order (a
        slot as a part's, marked with a `date` signal)."""
        with_parts = bool(prepared.parts and params.part_budget)
        if not with_parts and not prepared.asked_days:
            return self._rank_one(prepared, params, limit, shown)
        ranked = self._rank_one(prepared, params, None, shown)
        window = PART_WINDOW if limit is None else min(limit, PART_WINDOW)
        if with_parts:
            part_rankings = [
                self._rank_one(part, params, params.part_depth, shown) for part in prepared.parts
            ]
            ranked = budgeted(ranked, part_rankings, params.part_budget, window)
        if prepared.asked_days:
            of_the_days = [
                row
                for row in ranked
                if self.columns.within_days(row[0], prepared.asked_days)
                and not (shown is not None and shown(row[0]))
            ]
            slots = max(1, int(window * ASKED_DAY_SHARE))
            ranked = budgeted(ranked, [of_the_days], slots, window, signal="date")
        return ranked[:limit]

    def _rank_one(
        self,
        prepared: Prepared,
        params: RecallParams,
        limit: int | None,
        shown: Callable[[int], bool] | None,
    ) -> list[Ranked]:
        if params.fusion is not None and self.neighbours:
            return learned_rank(
                prepared, params, params.fusion, limit, self.columns, self.dense, shown
            )
        return rrf_rank(prepared, params, limit, self.docs, self.columns, self.neighbours, shown)

    def events(self, position: int) -> tuple[TimeSpan, ...]:
        """The days the document at `position` speaks of (resolved against its own date)."""
        return self.columns.events[position]

    def search(
        self,
        query: str,
        vector: np.ndarray | None,
        k: int,
        *,
        names: list[str] | None = None,
        linked: list[str] | None = None,
        params: RecallParams = DEFAULT_PARAMS,
        rerank: Callable[[str, list[Hit]], list[Hit]] | None = None,
        plain_vector: np.ndarray | None = None,
        parts: list[tuple[str, np.ndarray | None]] | None = None,
        shown: Callable[[str], bool] | None = None,
        asked_on: date | None = None,
    ) -> list[Hit]:
        """Top-k documents for `query` (its embedding in `vector`, or None: lexical only).
        `names`: entity names the graph knows (speakers, characters); the one the query names
        boosts the documents it spoke. `linked`: keys of documents the graph's facts tie to
        the query (the turns an entity or relation it names was extracted from), best first.
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`).
        `parts`: a two-event question's parts (`query_parts`) with the embeddings of their
        `part_text` (see `rank`). `shown`: whether a document's text is one the asker already
        shows (see `rank`). `asked_on`: the day the query is asked (see `prepare`)."""
        if k <= 0:
            return []
        prepared = self.prepare(
            query,
            vector,
            names=names,
            linked=linked,
            plain_vector=plain_vector,
            parts=parts if params.part_budget else None,
            asked_on=asked_on,
        )
        with self.lock:
            if not self.docs:
                return []
            docs = self.docs
            ranked = self.rank(
                prepared,
                params,
                k * (3 if rerank else 1),
                None if shown is None else (lambda p: shown(docs[p].text)),
            )
            hits = [
                Hit(
                    key=self.docs[p].key,
                    position=p,
                    score=round(score, 6),
                    text=self.docs[p].text,
                    speaker=self.docs[p].speaker,
                    when=self.docs[p].when,
                    signals={n: round(v, 6) for n, v in signals.items()},
                    meta=self.docs[p].meta,
                    events=date_notes(self.columns.events[p]),
                )
                for p, score, signals in ranked
            ]
        if rerank is not None:
            hits = rerank(query, hits)
        return hits[:k]


def _day_in_words(when: str, said: TimeSpan | None) -> str:
    """The day said, in words ("8 May 2023"), when the time as written does not name its month:
    an ISO 8601 or Unix time, which a question asking for "May 2023" would not meet. Empty for
    a time that names it ("1:56 pm on 8 May, 2023", "May 8, 2023 1:56pm")."""
    if said is None or f"{said.start:%B}".lower() in when.lower():
        return ""
    return f"{said.start.day} {said.start:%B} {said.start.year}"
