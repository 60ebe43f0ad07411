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

For conversation turns the fusion above is replaced by a learned one (`LearnedFusion`, a
logistic model over `FEATURES` of each candidate, the same signals and the rankers' raw
scores), and the dense ranker is asked a second time with the query without the speakers'
names (`plain_query`). The constants (`RecallParams`, `LEARNED_FUSION`) are chosen by
`python -m bench.recall_protocol`, which fits them on some shared LoCoMo dialogues and
measures them on another (leave one dialogue out), and each says which folds chose it.
Held-out recall@10 (categories 1-4) is 0.827 on average over the four folds with the learned
fusion, 0.793 with the reciprocal-rank fusion (still used for scenes: no data to fit them on). A cross-encoder reranker would add more, but no registry package ships
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
from datetime import date
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from core.heap import keep_large_allocations_mapped
from core.timex import QueryDate, TimeSpan, asks_when, parse_when, query_dates, resolve

#: What the learned fusion weighs for each candidate document (`HybridIndex.features`): the
#: reciprocal rank in each ranker at two depths (lexical; dense with the query as asked; dense
#: with the query without the speakers' names, `plain_query`), the cosines themselves, the
#: best of the in-group neighbours (lexical rank, cosine), the group's best match (session
#: relevance), whether the document's speaker is the one the query names or the other one,
#: a date the query names matched by the document's own date or by one it speaks of, a
#: when-question and a document that speaks of a time, an image caption, the text's length
#: (log characters) and the reciprocal-rank fusion of lexical and dense (`rrf`). The graph's
#: links are added apart (`HybridIndex._learned_rank`): no shared dialogue has facts to fit them.
FEATURES = ("lexical_10", "lexical_60", "dense_10", "dense_60", "plain_10", "plain_60", "cosine", "plain_cosine",
            "neighbour_lexical", "neighbour_plain_cosine", "session", "speaker", "other_speaker", "date",
            "event_date", "when", "caption", "length", "rrf")


class LearnedFusion(BaseModel):
    """A logistic model over `FEATURES`: a document's score is `bias + weights . features`
    (the log-odds that it is evidence for the query). Fitted by `python -m bench.recall_protocol`
    on the training dialogues of each fold; the weights in use are the mean of the four folds'."""

    model_config = ConfigDict(frozen=True)

    weights: tuple[float, ...] = Field(description="one per FEATURES, on the features' own scale")
    bias: float = 0.0


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
    #: The fusion of conversation turns (indexes with neighbours): a learned model over FEATURES
    #: instead of the reciprocal-rank fusion and its boosts above (which then only shape its
    #: `rrf` feature). None: reciprocal-rank fusion with the boosts. Scenes always use the RRF.
    fusion: LearnedFusion | None = Field(None, description="learned fusion of conversation turns")


#: The learned fusion in use: the mean of the four folds' fits (`python -m bench.recall_protocol`,
#: each fold fitted on the three dialogues it did not hold out; the folds' weights agree in sign
#: and size but for the collinear dense_10/dense_60 pair). Held out, it gives recall@10 0.827 on
#: average over the four folds (0.858, 0.839, 0.858, 0.753 for 26, 30, 41, 42), against 0.793
#: for the reciprocal-rank fusion with its boosts and knobs tuned the same way. What it learned,
#: in short: a speaker the query names but who did not say the turn costs it the most (-2.9
#: log-odds); near-top lexical ranks, the plain query's dense ranks, a neighbour's lexical match
#: and the session's best match carry it; image captions and a date match help.
LEARNED_FUSION = LearnedFusion(
    weights=(49.888, -51.8187, -0.2672, -5.5078, 36.6225, 71.3438, 4.5397, -5.0061, 74.9374, 1.6313, 68.6674,
             -0.1065, -2.878, 1.0919, 0.9349, 0.3824, 0.5564, 0.5793, -40.3934),
    bias=-7.4181,
)
#: The constants in use (see RecallParams).
DEFAULT_PARAMS = RecallParams(fusion=LEARNED_FUSION)
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

#: The signal name each learned feature's term is reported under (`Hit.signals`).
_SIGNAL_OF = {"lexical_10": "lexical", "lexical_60": "lexical", "dense_10": "dense", "dense_60": "dense",
              "cosine": "dense", "plain_10": "plain", "plain_60": "plain", "plain_cosine": "plain",
              "neighbour_lexical": "neighbour", "neighbour_plain_cosine": "neighbour", "session": "session",
              "speaker": "graph", "other_speaker": "graph", "date": "time", "event_date": "event_time",
              "when": "when", "caption": "caption", "length": "length", "rrf": "rrf"}


def plain_query(query: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """The query without the conversation's speakers' names (and their possessive 's), for the
    dense model. Every turn is embedded as "Speaker: text" and speakers call each other by name,
    so a name in the question draws the greetings that name the speaker, not what was said;
    who said it is the speaker feature's business. Measured on the four shared dialogues, the
    dense model alone: recall@10 0.48/0.47/0.56/0.44 with the names, 0.65/0.60/0.63/0.55 without."""
    for name in sorted(speakers, key=len, reverse=True):
        if name:
            query = re.sub(rf"\b{re.escape(name)}(?:'s|\u2019s)?\b", "", query, flags=re.IGNORECASE)
    query = re.sub(r"\s+([?,.!])", r"\1", query)
    return re.sub(r"\s+", " ", query).strip()


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
    events: list[str] = Field(default_factory=list, description='the time expressions of the text resolved '
                              'against when it was said, "yesterday = Sunday 7 May 2023" (core.timex)')


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


class _Column:
    """A per-position numpy column that grows by appending (capacity doubles), so the
    features of a query's candidates are read by fancy indexing, not a Python loop."""

    __slots__ = ("_data", "_size")

    def __init__(self, dtype: Any) -> None:
        self._data = np.zeros(64, dtype=dtype)
        self._size = 0

    def append(self, value: Any) -> None:
        if self._size == len(self._data):
            grown = np.zeros(2 * len(self._data), dtype=self._data.dtype)
            grown[: self._size] = self._data
            self._data = grown
        self._data[self._size] = value
        self._size += 1

    @property
    def values(self) -> np.ndarray:
        return self._data[: self._size]


#: Values (rows x dimensions) per matrix-vector product in `_cosines`. OpenBLAS (numpy's BLAS)
#: runs a product of 460,800 values or more on every core: on 2 cores shared with other work
#: its threads wait for each other (measured, 1,400 vectors of 384, the size a 100k-turn query
#: reads: p99 8.1 ms threaded, 0.6 ms in blocks of 1,024 rows), and the threaded result differs
#: from the single-threaded one in the last bit, so it depended on the machine's core count.
#: Below that size it runs on the calling thread, and the products of row blocks equal the
#: whole product's single-threaded result bit for bit (checked up to 4,000 rows).
GEMV_VALUES = 393_216


def _cosines(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """`matrix @ vector` in blocks of rows OpenBLAS computes on the calling thread: the
    same values whatever the number of cores (see GEMV_VALUES)."""
    rows = max(16, GEMV_VALUES // max(matrix.shape[1], 1) // 16 * 16)
    if len(matrix) <= rows:
        return matrix @ vector
    return np.concatenate([matrix[start : start + rows] @ vector for start in range(0, len(matrix), rows)])


def _first_occurrences(values: np.ndarray) -> np.ndarray:
    """`values` without repeats, each kept where it first occurs (as `dict.fromkeys`)."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


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
        #: Per position: whether the dense index holds its vector (a lexical-only run has none).
        self._has_vector = _Column(np.bool_)
        #: Per position, as numpy columns for `features`: the group (an id per distinct group),
        #: the speaker (an id per distinct lowercased speaker), the day said (an ordinal, -1:
        #: none), whether it speaks of a time, whether it has lexical extras (a caption), and
        #: log1p of the text's length.
        self._group_ids: dict[str, int] = {}
        self._group = _Column(np.int64)
        self._speaker_ids: dict[str, int] = {}
        self._speaker = _Column(np.int64)
        self._said_day = _Column(np.int64)
        self._has_events = _Column(np.bool_)
        self._has_extra = _Column(np.bool_)
        self._length = _Column(np.float64)
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
                usable = vectors is not None and len(vectors) > i and vectors.shape[-1] == self.dimensions
                self._has_vector.append(bool(usable))
                self._group.append(self._group_ids.setdefault(doc.group, len(self._group_ids)))
                self._speaker.append(self._speaker_ids.setdefault(doc.speaker.lower(), len(self._speaker_ids)))
                self._said_day.append(said.toordinal() if said is not None else -1)
                self._has_events.append(bool(self._events[-1]))
                self._has_extra.append(bool(doc.extra))
                self._length.append(float(np.log1p(len(doc.text))))
                if usable:
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
        # Equal scores: tantivy orders them by segment, and the segments depend on how the index
        # grew (batch by batch, or rebuilt at once after a restart). Ask until the cut falls
        # between two different scores (a tie group is bounded: terms in more than
        # MAX_TERM_SHARE of the documents are dropped above), then order ties by position: the
        # same documents in the same order however the index was built.
        wanted = limit + 1
        while True:
            hits = searcher.search(parsed, wanted).hits
            if len(hits) < wanted or hits[-1][0] < hits[limit - 1][0] or wanted > 8 * limit:
                break
            wanted *= 2
        ranked = sorted((-score, int(searcher.doc(address)["position"][0])) for score, address in hits)
        return [position for _, position in ranked[:limit]]

    def _dense_ranking(self, vector: np.ndarray | None, limit: int) -> list[int]:
        if vector is None or len(self._dense) == 0 or vector.shape[-1] != self.dimensions:
            return []
        matches = self._dense.search(np.asarray(vector, dtype=np.float32).reshape(-1), min(limit, len(self._dense)))
        # Equal distances (the same text twice) by position, not by the order the graph search met them.
        return [int(k) for _, k in sorted(zip(np.asarray(matches.distances).tolist(),
                                               np.asarray(matches.keys).tolist(), strict=True))]

    def prepare(self, query: str, vector: np.ndarray | None, *, names: list[str] | None = None,
                linked: list[str] | None = None, plain_vector: np.ndarray | None = None) -> Prepared:
        """Everything a query needs from the indexes (the rankers' candidates), before the
        fusion: `rank` fuses it under any `RecallParams` without asking the indexes again.
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`)."""
        with self.lock:
            named = [n for n in dict.fromkeys(names or []) if n and re.search(rf"\b{re.escape(n)}\b", query, re.IGNORECASE)]
            dense = self._dense_ranking(vector, CANDIDATES) if self.docs else []
            plain = self._dense_ranking(plain_vector, CANDIDATES) if self.docs and plain_vector is not None else dense
            return Prepared(
                lexical=self._lexical_ranking(query, CANDIDATES) if self.docs else [],
                dense=dense,
                linked=[self.positions[key] for key in dict.fromkeys(linked or []) if key in self.positions],
                named=named[0].lower() if len(named) == 1 else None,
                dates=query_dates(query),
                asks_when=asks_when(query),
                plain=plain,
                vector=self._unit(vector),
                plain_vector=self._unit(plain_vector if plain_vector is not None else vector),
            )

    def _unit(self, vector: np.ndarray | None) -> np.ndarray | None:
        if vector is None or vector.shape[-1] != self.dimensions:
            return None
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else None

    def features(self, prepared: Prepared, params: RecallParams = DEFAULT_PARAMS) -> tuple[np.ndarray, np.ndarray]:
        """(positions, matrix): the candidate documents (every ranker's, and their in-group
        neighbours) and their FEATURES, one row each. Only the candidates are read (their
        vectors by key, the rest from per-position columns by index), so the cost does not
        grow with the memory; numpy throughout, no loop over the candidates."""
        count = len(self.docs)
        column = {name: i for i, name in enumerate(FEATURES)}
        seeds_list = [*prepared.lexical, *prepared.dense, *prepared.plain, *prepared.linked]
        if not seeds_list:
            return np.zeros(0, dtype=np.int64), np.zeros((0, len(FEATURES)), dtype=np.float64)
        group = self._group.values[:count]
        # The candidates in the order the rankers name them, then their in-group neighbours
        # (before, then after, each seed's) not named already.
        seeds = _first_occurrences(np.asarray(seeds_list, dtype=np.int64))
        around_seeds = np.stack([seeds - 1, seeds + 1], axis=1).ravel()
        source = np.repeat(seeds, 2)
        inside = (around_seeds >= 0) & (around_seeds < count)
        around_seeds, source = around_seeds[inside], source[inside]
        around_seeds = around_seeds[group[around_seeds] == group[source]]
        positions = _first_occurrences(np.concatenate([seeds, around_seeds]))
        n = len(positions)
        by_position = np.argsort(positions)
        sorted_positions = positions[by_position]

        def row_of(ranking: list[int]) -> np.ndarray:
            return by_position[np.searchsorted(sorted_positions, np.asarray(ranking, dtype=np.int64))]

        x = np.zeros((n, len(FEATURES)), dtype=np.float64)
        rows: dict[str, np.ndarray] = {}
        for name, ranking in (("lexical", prepared.lexical), ("dense", prepared.dense), ("plain", prepared.plain)):
            rows[name] = row_of(ranking)
            ranks = np.arange(len(ranking), dtype=np.int64)
            for depth in (10, 60):
                x[rows[name], column[f"{name}_{depth}"]] = 1.0 / (depth + ranks + 1)
        # Cosines of the candidates and of their neighbours (for the neighbour feature).
        around = np.unique(np.concatenate([positions - 1, positions, positions + 1]))
        around = around[(around >= 0) & (around < count)]
        held = self._has_vector.values[around]
        cosine = np.zeros(len(around), dtype=np.float64)
        plain_cosine = np.zeros(len(around), dtype=np.float64)
        if held.any() and (prepared.vector is not None or prepared.plain_vector is not None):
            matrix = np.asarray(self._dense.get(around[held].astype(np.uint64)), dtype=np.float32)
            norms = np.linalg.norm(matrix, axis=1)
            matrix = matrix / np.where(norms > 0, norms, 1.0)[:, None]
            if prepared.vector is not None:
                cosine[held] = _cosines(matrix, prepared.vector)
            if prepared.plain_vector is not None:
                plain_cosine[held] = _cosines(matrix, prepared.plain_vector)
        x[:, column["cosine"]] = cosine[np.searchsorted(around, positions)]
        x[:, column["plain_cosine"]] = plain_cosine[np.searchsorted(around, positions)]
        lexical_60 = x[:, column["lexical_60"]]
        # Session relevance: each candidate's group's best match among the candidates.
        own_group = group[positions]
        groups, group_row = np.unique(own_group, return_inverse=True)
        session_match = lexical_60 + 0.5 * x[:, column["plain_60"]]
        best = np.zeros(len(groups), dtype=np.float64)
        np.maximum.at(best, group_row, session_match)
        x[:, column["session"]] = best[group_row]
        # Neighbours (the document before and after, in the same group): the best lexical
        # match among those that are candidates, and the best plain cosine (0: no neighbour).
        neighbour_lexical = np.zeros(n, dtype=np.float64)
        neighbour_cosine = np.full(n, -np.inf)
        has_neighbour = np.zeros(n, dtype=bool)
        for step in (-1, 1):
            other = positions + step
            valid = (other >= 0) & (other < count)
            valid[valid] = group[other[valid]] == own_group[valid]
            slot = np.minimum(np.searchsorted(sorted_positions, other), n - 1)
            candidate = valid & (sorted_positions[slot] == other)
            neighbour_lexical = np.maximum(neighbour_lexical,
                                           np.where(candidate, lexical_60[by_position[slot]], 0.0))
            where = np.searchsorted(around, other[valid])
            neighbour_cosine[valid] = np.maximum(neighbour_cosine[valid], plain_cosine[where])
            has_neighbour |= valid
        x[:, column["neighbour_lexical"]] = neighbour_lexical
        x[:, column["neighbour_plain_cosine"]] = np.where(has_neighbour, neighbour_cosine, 0.0)
        if prepared.named is not None:
            same = self._speaker.values[positions] == self._speaker_ids.get(prepared.named, -1)
            x[:, column["speaker"]] = same
            x[:, column["other_speaker"]] = ~same
        has_events = self._has_events.values[positions]
        if prepared.dates:
            # The days said, each distinct one tested once; the days spoken of, per candidate
            # that speaks of any.
            days, day_row = np.unique(self._said_day.values[positions], return_inverse=True)
            matched = np.asarray([
                day >= 0 and any(d.matches(TimeSpan(date.fromordinal(day), date.fromordinal(day)))
                                 for d in prepared.dates)
                for day in days.tolist()], dtype=bool)
            x[:, column["date"]] = matched[day_row]
            events = self._events
            for i in np.flatnonzero(has_events).tolist():
                p = int(positions[i])
                x[i, column["event_date"]] = float(any(d.contains(e) for d in prepared.dates for e in events[p]))
        if prepared.asks_when:
            x[:, column["when"]] = has_events
        x[:, column["caption"]] = self._has_extra.values[positions]
        x[:, column["length"]] = self._length.values[positions]
        rrf = np.zeros(n, dtype=np.float64)
        for name, weight in (("lexical", params.lexical_weight), ("dense", params.dense_weight)):
            ranks = np.arange(len(rows[name]), dtype=np.int64)
            rrf[rows[name]] += weight / (params.rrf_k + ranks + 1)
        x[:, column["rrf"]] = rrf
        return positions, x

    def _learned_rank(self, prepared: Prepared, params: RecallParams, fusion: LearnedFusion,
                      limit: int | None = None) -> list[tuple[int, float, dict[str, float]]]:
        positions, x = self.features(prepared, params)
        if not len(positions):
            return []
        weights = np.asarray(fusion.weights, dtype=np.float64)
        contributions = x * weights
        scores = contributions.sum(axis=1) + fusion.bias
        # The graph's links: no LoCoMo run has extracted facts to fit them on, so a linked
        # document gains what the same rank in the plain dense ranking earns (as in the RRF,
        # where linked_weight is the dense ranker's weight), scaled by linked_weight/dense_weight.
        linked: dict[int, float] = {}
        if prepared.linked and params.linked_weight > 0:
            scale = params.linked_weight / max(params.dense_weight, 1e-9)
            w10, w60 = weights[FEATURES.index("plain_10")], weights[FEATURES.index("plain_60")]
            at = {int(p): i for i, p in enumerate(positions)}
            for rank, position in enumerate(prepared.linked):
                gain = scale * (w10 / (10 + rank + 1) + w60 / (60 + rank + 1))
                linked[position] = gain
                scores[at[position]] += gain
        # Best first, ties by position; the per-signal shares only for the ones handed back.
        order = np.lexsort((positions, -scores))[:limit]
        out = []
        for i in order.tolist():
            signals: dict[str, float] = {}
            for name, value in zip(FEATURES, contributions[i].tolist(), strict=True):
                if value:
                    group = _SIGNAL_OF[name]
                    signals[group] = signals.get(group, 0.0) + value
            position = int(positions[i])
            if position in linked:
                signals["linked"] = linked[position]
            out.append((position, float(scores[i]), signals))
        return out

    def rank(self, prepared: Prepared, params: RecallParams = DEFAULT_PARAMS,
             limit: int | None = None) -> list[tuple[int, float, dict[str, float]]]:
        """(position, score, per-signal shares) of every candidate (the first `limit`), best first.

        Reciprocal-rank fusion of the rankers (lexical, dense, and the documents the graph
        links to the query), then: neighbour smoothing (a document next to a strong hit in
        its group gains a share of its score), session relevance (a document gains a share
        of its group's best score: a session that matches raises its turns), and the boosts
        (the speaker the query names; a date the query names matched by the document's own
        date or by a date it speaks of; a when-question and a document that speaks of a
        time).

        With `params.fusion` (conversation turns only) the candidates are scored by the learned
        model instead (`features`); the per-signal shares are then its terms, grouped."""
        if params.fusion is not None and self.neighbours:
            return self._learned_rank(prepared, params, params.fusion, limit)
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
        order = sorted(smoothed, key=lambda p: (-smoothed[p], p))[:limit]
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
        plain_vector: np.ndarray | None = None,
    ) -> list[Hit]:
        """Top-k documents for `query` (its embedding in `vector`, or None: lexical only).
        `names`: entity names the graph knows (speakers, characters); the one the query names
        boosts the documents it spoke. `linked`: keys of documents the graph's facts tie to
        the query (the turns an entity or relation it names was extracted from), best first.
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`)."""
        if k <= 0:
            return []
        prepared = self.prepare(query, vector, names=names, linked=linked, plain_vector=plain_vector)
        with self.lock:
            if not self.docs:
                return []
            ranked = self.rank(prepared, params, k * (3 if rerank else 1))
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
                    events=[f"{span.phrase} = {span.describe()}" for span in self._events[p]],
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
    #: The dense ranking of the query without the speakers' names (`plain_query`), and both
    #: query vectors, unit length (None: no usable vector).
    plain: list[int] = field(default_factory=list)
    vector: np.ndarray | None = None
    plain_vector: np.ndarray | None = None


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
