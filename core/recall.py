"""Hybrid retrieval, shared by the dialogue sidecar and the novel's scene context.

One `HybridIndex` holds the documents of one memory (a conversation's turns, a novel's
scenes) in order, and answers a query with the top-k documents by fusing:

- lexical: BM25 from tantivy (a maintained Rust search library with incremental indexing:
  adding turns re-indexes at most the turn before them) over each document with its date, the
  dates it speaks of (core.timex: "yesterday" said on 8 May is indexed as 7 May 2023) and the
  documents before and after it in the same group (session or chapter), stemmed, English
  function words out, and near-universal terms left out of queries;
- dense: cosine over sentence embeddings (core.embedder by default), in a usearch HNSW index
  (incremental, search cost ~log n: the 100k-turn p95 stays near the 1k one);
- graph: documents spoken by the one entity the query names get a boost, and the documents
  the graph's facts tie to the query (`linked`: the turns a relation or an entity it names was
  extracted from) are a ranker of their own;
- time: a date the query names boosts the documents said on it, or (`event_boost`) those that
  speak of a day within it; a when-question can favour documents that speak of a time;
- reciprocal-rank fusion of the rankers, then neighbour smoothing (a document next to a
  strong hit in the same group gains a share of its score: answers often sit in the turn
  after the one that names the topic) and session relevance (a document gains a share of its
  group's best score: a session that matches raises its turns).

The constants (`RecallParams`) are chosen by `python -m bench.recall_protocol`, which tunes
them on some shared LoCoMo dialogues and measures them on another (leave one dialogue out),
and each says which folds chose it. Held-out recall@10 (categories 1-4) is 0.793 on average
over the four folds. A cross-encoder reranker would add more, but no registry package ships
one offline, so there is none (`rerank` is a hook for one).

`k` counts documents: each hit is one document. Derived structures only: the graph is the
record, and an index is rebuilt from it by the caller (incrementally, by position).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from core.heap import keep_large_allocations_mapped
from core.timex import QueryDate, TimeSpan, asks_when, parse_when, query_dates, resolve


class RecallParams(BaseModel):
    """The fusion's constants. `DEFAULT_PARAMS` holds the values in use, each chosen by the
    leave-one-dialogue-out protocol (`python -m bench.recall_protocol`): every shared LoCoMo
    dialogue is held out once, the three others tune the constants (recall@10, categories 1-4,
    a knob moves only for a gain of at least 0.0025), and the value kept is the one most of the
    four folds chose (a tie goes to the value nearer the reference, the constant before the
    protocol). "folds 26, 30, 41, 42" below name the folds by the dialogue each held out."""

    model_config = ConfigDict(frozen=True)

    #: The unit of the fusion: not tuned.
    lexical_weight: float = Field(1.0, ge=0, description="RRF weight of BM25")
    #: 0.5 by folds 26, 41, 42; 0.35 by fold 30.
    dense_weight: float = Field(0.5, ge=0, description="RRF weight of the sentence embeddings")
    #: 60 by folds 30, 41, 42; 10 by fold 26.
    rrf_k: int = Field(60, ge=1, description="RRF's k: lower trusts the top ranks more")
    #: 0.2 by folds 41, 42; 0.3 by fold 26; 0.1 by fold 30.
    neighbour_share: float = Field(0.2, ge=0, description="share of a hit's score its group neighbours gain")
    #: 0.3 by folds 30, 41, 42; 0.6 by fold 26.
    entity_boost: float = Field(0.3, ge=0, description="documents of the one speaker the query names")
    #: 0.1 by all four folds.
    date_boost: float = Field(0.1, ge=0, description="the document's own date matches a date the query names")
    #: 0 by all four folds: the turns whose event dates lie within a day or month a question
    #: names were already found through their text and their indexed dates (BM25).
    event_boost: float = Field(0.0, ge=0, description="a date the document speaks of lies within one the query names")
    #: 0 by folds 30, 41; 0.6 by fold 26; 0.15 by fold 42.
    when_boost: float = Field(0.0, ge=0, description="a when-question, and the document speaks of a time")
    #: Chosen by every fold: 0.2 by folds 30, 41; 0.5 by folds 26, 42 (the tie goes to 0.2).
    session_share: float = Field(0.2, ge=0, description="share of its group's best score a document gains")
    #: Not tuned by the protocol (the LoCoMo runs have no extracted facts): the weight the
    #: dense ranker has, a ranker of its own; measured with the scripted server's facts.
    linked_weight: float = Field(0.5, ge=0, description="RRF weight of documents the graph's facts link to the query")


#: The constants in use (see RecallParams).
DEFAULT_PARAMS = RecallParams()
#: Candidates each ranker hands to the fusion.
CANDIDATES = 100

#: Terms found in more than this share of the documents are left out of a query: their BM25
#: weight is near zero, yet their postings are the longest (a speaker's name is in half the
#: turns), and they would make the cost of a query grow with the conversation.
MAX_TERM_SHARE = 0.05
#: ... but a term in at most this many documents is always kept.
ALWAYS_KEPT_DOC_FREQ = 200
#: English function words (NLTK's list, plus question words): tantivy's own English list is
#: Lucene's 33 words and keeps "what", "did", "when" in every query.
STOP_WORDS = sorted(set("""
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself yourselves
""".split()))

class MemoryDoc(BaseModel):
    """One retrievable document, in memory order."""

    key: str = Field(description="stable identity: a turn key, a scene id")
    text: str = Field(description="what the dense model embeds and the caller shows, e.g. `speaker: text`")
    extra: str = Field("", description="indexed lexically only: image captions, extracted facts")
    speaker: str = ""
    group: str = Field("", description="session or chapter: neighbours are looked for within it")
    when: str = Field("", description="free-text date, indexed and matched against dates in queries")
    meta: dict[str, Any] = Field(default_factory=dict, description="provenance handed back with a hit")


class Hit(BaseModel):
    key: str
    position: int
    score: float
    text: str
    speaker: str = ""
    when: str = ""
    signals: dict[str, float] = Field(default_factory=dict, description="rank-fusion share per signal")
    meta: dict[str, Any] = Field(default_factory=dict)


def _import_onnxruntime_before_usearch() -> None:
    """Load onnxruntime (the embedded embedder's runtime) before usearch, when it is installed.

    Measured with usearch 2.26.6 and onnxruntime 1.32.0: `python -c "import usearch,
    onnxruntime"` dies with SIGSEGV inside onnxruntime's module init (in libstdc++'s
    `codecvt`), while `import onnxruntime, usearch` works. A sidecar builds a conversation's
    index (usearch) before it embeds the first query (onnxruntime), so without this the
    process crashes on its first recall unless something else happened to load first.
    """
    try:
        import onnxruntime  # noqa: F401
    except ImportError:  # an embedding endpoint is configured and the runtime is not installed
        pass


#: tantivy's smallest per-thread indexing arena.
WRITER_HEAP_BYTES = 15_000_000


class HybridIndex:
    """Documents of one memory with a lexical and a dense index, appended in order."""

    def __init__(self, dimensions: int, *, neighbours: bool = True) -> None:
        """`neighbours`: index each document with the ones around it in its group and smooth
        scores over them (chat turns lean on each other); off for self-contained documents
        such as scene summaries."""
        import tantivy

        _import_onnxruntime_before_usearch()
        from usearch.index import Index

        self.dimensions = dimensions
        self.neighbours = neighbours
        builder = tantivy.SchemaBuilder()
        builder.add_integer_field("position", stored=True, indexed=True, fast=True)
        builder.add_text_field("body", stored=False, tokenizer_name="skald_en")
        self._schema = builder.build()
        self._lexical = tantivy.Index(self._schema)  # in RAM: rebuilt from the graph
        self._analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(STOP_WORDS))
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        self._lexical.register_tokenizer("skald_en", self._analyzer)
        # No IndexWriter is kept open: each one holds an indexing thread, merge threads and
        # its arena (measured: 20 idle writers, ~120 threads and ~60 MB resident); `add`
        # opens one per batch and closes it. Its ~15 MB arena must not stay in a thread heap.
        keep_large_allocations_mapped()
        self._dense = Index(ndim=dimensions, metric="cos", dtype="f32")
        self.docs: list[MemoryDoc] = []
        self.positions: dict[str, int] = {}
        #: Per position: the day the document was said, and the days it speaks of (core.timex).
        self._said: list[TimeSpan | None] = []
        self._events: list[tuple[TimeSpan, ...]] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, docs: list[MemoryDoc], vectors: np.ndarray | None) -> int:
        """Append documents not yet held (by key); `vectors` row i belongs to docs[i]
        (None: lexical only). Returns how many were added."""
        import tantivy

        with self.lock:
            fresh: list[tuple[int, MemoryDoc]] = [
                (i, d) for i, d in enumerate(docs) if d.key not in self.positions
            ]
            if not fresh:
                return 0
            keys: list[int] = []
            rows: list[int] = []
            first = len(self.docs)
            for i, doc in fresh:
                position = len(self.docs)
                self.docs.append(doc)
                self.positions[doc.key] = position
                said = parse_when(doc.when)
                self._said.append(TimeSpan(said, said) if said is not None else None)
                self._events.append(tuple(resolve(doc.text, said)))
                if vectors is not None and len(vectors) > i and vectors.shape[-1] == self.dimensions:
                    keys.append(position)
                    rows.append(i)
            # Bodies once the batch is in place, so each sees the document after it. The one
            # document before the batch gains a next one: re-index it (a delete applies only
            # to what was added before it). Deleted documents still count in BM25 statistics
            # until tantivy merges segments, so this happens once per batch, not per document.
            writer = self._lexical.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
            if self.neighbours and first > 0 and self.docs[first - 1].group == self.docs[first].group:
                writer.delete_documents_by_term("position", first - 1)
                writer.add_document(tantivy.Document(position=first - 1, body=self._body(first - 1)))
            for position in range(first, len(self.docs)):
                writer.add_document(tantivy.Document(position=position, body=self._body(position)))
            writer.commit()
            writer.wait_merging_threads()  # closes the writer: its threads and arena go now
            self._lexical.reload()
            if keys:
                matrix = np.ascontiguousarray(vectors[rows], dtype=np.float32)  # type: ignore[index]
                # One thread: a multi-threaded HNSW build depends on scheduling, so the same turns
                # gave a different graph (and a question or two another top 10) from run to run.
                self._dense.add(np.asarray(keys, dtype=np.uint64), matrix, threads=1)
            return len(fresh)

    def _body(self, position: int) -> str:
        """What BM25 indexes for a document: its date and the dates it speaks of, the
        document before it and the one after it in the same group (a reply names what it
        answers only through them), its text and its lexical-only extras."""
        doc = self.docs[position]
        dates = " ".join([doc.when, *(span.label() for span in self._events[position])]).strip()
        if not self.neighbours:
            return "\n".join(part for part in (dates, doc.text, doc.extra) if part)
        before = self.docs[position - 1] if position > 0 and self.docs[position - 1].group == doc.group else None
        after = (self.docs[position + 1]
                 if position + 1 < len(self.docs) and self.docs[position + 1].group == doc.group else None)
        parts = (dates, before.text if before else "", doc.text, doc.extra, after.text if after else "")
        return "\n".join(part for part in parts if part)

    def _lexical_ranking(self, query: str, limit: int) -> list[int]:
        import tantivy

        terms = list(dict.fromkeys(self._analyzer.analyze(query)))
        if not terms:
            return []
        searcher = self._lexical.searcher()
        total = max(searcher.num_docs, 1)
        frequency = {t: searcher.doc_freq("body", t) for t in terms}
        # Small memories keep every term (cheap anyway); large ones drop the near-universal.
        ceiling = max(MAX_TERM_SHARE * total, ALWAYS_KEPT_DOC_FREQ)
        kept = [t for t in terms if 0 < frequency[t] <= ceiling]
        if not kept:  # only common words: the rarest of them still orders the documents
            present = [t for t in terms if frequency[t] > 0]
            kept = [min(present, key=lambda t: frequency[t])] if present else []
        if not kept:
            return []
        parsed = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "body", t)) for t in kept]
        )
        return [int(searcher.doc(address)["position"][0]) for _, address in searcher.search(parsed, limit).hits]

    def _dense_ranking(self, vector: np.ndarray | None, limit: int) -> list[int]:
        if vector is None or len(self._dense) == 0 or vector.shape[-1] != self.dimensions:
            return []
        matches = self._dense.search(np.asarray(vector, dtype=np.float32).reshape(-1), min(limit, len(self._dense)))
        return [int(k) for k in matches.keys]

    def prepare(self, query: str, vector: np.ndarray | None, *, names: list[str] | None = None,
                linked: list[str] | None = None) -> Prepared:
        """Everything a query needs from the indexes (the rankers' candidates), before the
        fusion: `rank` fuses it under any `RecallParams` without asking the indexes again."""
        with self.lock:
            named = [n for n in dict.fromkeys(names or []) if n and re.search(rf"\b{re.escape(n)}\b", query, re.IGNORECASE)]
            return Prepared(
                lexical=self._lexical_ranking(query, CANDIDATES) if self.docs else [],
                dense=self._dense_ranking(vector, CANDIDATES) if self.docs else [],
                linked=[self.positions[key] for key in dict.fromkeys(linked or []) if key in self.positions],
                named=named[0].lower() if len(named) == 1 else None,
                dates=query_dates(query),
                asks_when=asks_when(query),
            )

    def rank(self, prepared: Prepared, params: RecallParams = DEFAULT_PARAMS) -> list[tuple[int, float, dict[str, float]]]:
        """(position, score, per-signal shares) of every candidate, best first.

        Reciprocal-rank fusion of the rankers (lexical, dense, and the documents the graph
        links to the query), then: neighbour smoothing (a document next to a strong hit in
        its group gains a share of its score), session relevance (a document gains a share
        of its group's best score: a session that matches raises its turns), and the boosts
        (the speaker the query names; a date the query names matched by the document's own
        date or by a date it speaks of; a when-question and a document that speaks of a
        time)."""
        signals: dict[int, dict[str, float]] = {}
        for name, ranking, weight in (
            ("lexical", prepared.lexical, params.lexical_weight),
            ("dense", prepared.dense, params.dense_weight),
            ("linked", prepared.linked, params.linked_weight),
        ):
            if weight <= 0:
                continue
            for rank, position in enumerate(ranking):
                signals.setdefault(position, {})[name] = weight / (params.rrf_k + rank + 1)
        fused = {p: sum(s.values()) for p, s in signals.items()}
        docs = self.docs
        # Neighbour smoothing over the candidates only (no scan of the memory).
        smoothed = dict(fused)
        if self.neighbours and params.neighbour_share > 0:
            for position, score in fused.items():
                group = docs[position].group
                for other in (position - 1, position + 1):
                    if 0 <= other < len(docs) and docs[other].group == group:
                        share = params.neighbour_share * score
                        smoothed[other] = smoothed.get(other, 0.0) + share
                        entry = signals.setdefault(other, {})
                        entry["neighbour"] = entry.get("neighbour", 0.0) + share
        if params.session_share > 0:
            best: dict[str, float] = {}
            for position, score in fused.items():
                group = docs[position].group
                best[group] = max(best.get(group, 0.0), score)
            for position in smoothed:
                share = params.session_share * best.get(docs[position].group, 0.0)
                if share:
                    smoothed[position] += share
                    signals.setdefault(position, {})["session"] = share
        for position in smoothed:
            factor = 1.0
            entry = signals.setdefault(position, {})
            if prepared.named is not None and params.entity_boost and docs[position].speaker.lower() == prepared.named:
                factor += params.entity_boost
                entry["graph"] = params.entity_boost
            if prepared.dates:
                events = self._events[position]
                said = self._said[position]
                if params.event_boost and any(d.contains(e) for d in prepared.dates for e in events):
                    factor += params.event_boost
                    entry["event_time"] = params.event_boost
                elif params.date_boost and said is not None and any(d.matches(said) for d in prepared.dates):
                    factor += params.date_boost
                    entry["time"] = params.date_boost
            if prepared.asks_when and params.when_boost and self._events[position]:
                factor += params.when_boost
                entry["when"] = params.when_boost
            smoothed[position] *= factor
        order = sorted(smoothed, key=lambda p: (-smoothed[p], p))
        return [(p, smoothed[p], signals.get(p, {})) for p in order]

    def events(self, position: int) -> tuple[TimeSpan, ...]:
        """The days the document at `position` speaks of (resolved against its own date)."""
        return self._events[position]

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
    ) -> list[Hit]:
        """Top-k documents for `query` (its embedding in `vector`, or None: lexical only).
        `names`: entity names the graph knows (speakers, characters); the one the query names
        boosts the documents it spoke. `linked`: keys of documents the graph's facts tie to
        the query (the turns an entity or relation it names was extracted from), best first."""
        if k <= 0:
            return []
        prepared = self.prepare(query, vector, names=names, linked=linked)
        with self.lock:
            if not self.docs:
                return []
            ranked = self.rank(prepared, params)[: max(k, 0) * (3 if rerank else 1)]
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
                )
                for p, score, signals in ranked
            ]
        if rerank is not None:
            hits = rerank(query, hits)
        return hits[:k]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A query's candidates from each ranker (positions, best first) and what the boosts
    need from the query (`named`: the one speaker it names, lowercased); fused by
    `HybridIndex.rank`. Internal: the index hands it to itself or to the bench."""

    lexical: list[int] = field(default_factory=list)
    dense: list[int] = field(default_factory=list)
    linked: list[int] = field(default_factory=list)
    named: str | None = None
    dates: list[QueryDate] = field(default_factory=list)
    asks_when: bool = False


class IndexRegistry:
    """Bounded LRU of indexes per (graph, memory): the least recently used are dropped (and
    rebuilt from the graph if asked for again) while there are more than `max_indexes` or
    they hold more than `max_documents` documents together (`len(index)`), so the memory
    they take is bounded by what they hold, not by how many memories a process has seen.
    The index just asked for is never dropped."""

    def __init__(self, max_indexes: int = 32, max_documents: int | None = None) -> None:
        self._indexes: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._max = max_indexes
        self._max_documents = max_documents
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, graph: str, memory: str, factory: Callable[[], Any]) -> Any:
        with self._lock:
            key = (graph, memory)
            index = self._indexes.get(key)
            if index is None:
                index = factory()
                self._indexes[key] = index
            self._indexes.move_to_end(key)
            while len(self._indexes) > 1 and (len(self._indexes) > self._max or self._over_budget()):
                self._indexes.popitem(last=False)
                self.evictions += 1
            return index

    def peek(self, graph: str, memory: str) -> Any | None:
        """The cached index, if there is one (nothing built, recency unchanged)."""
        with self._lock:
            return self._indexes.get((graph, memory))

    def _over_budget(self) -> bool:
        return self._max_documents is not None and sum(len(i) for i in self._indexes.values()) > self._max_documents

    def documents(self) -> int:
        with self._lock:
            return sum(len(i) for i in self._indexes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._indexes)
