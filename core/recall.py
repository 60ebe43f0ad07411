"""Hybrid retrieval, shared by the dialogue sidecar and the novel's scene context.

One `HybridIndex` holds the documents of one memory (a conversation's turns, a novel's
scenes) in order, and answers a query with the top-k documents by fusing:

- lexical: BM25 (Lucene's formula) over each document with its date, the dates it speaks of
  (core.timex: "yesterday" said on 8 May is indexed as 7 May 2023) and the documents before
  and after it in the same group (session or chapter), tokenized, stemmed and stripped of
  English function words by tantivy's analyzer, near-universal terms left out of queries. The
  postings and statistics are the index's own and exact (adding a turn re-indexes the turn
  before it), so the scores do not depend on how the documents were batched;
- dense: cosine over sentence embeddings (core.embedder by default), exact up to
  EXACT_DENSE_MAX documents; past it a usearch HNSW index (approximate, search cost ~log n)
  proposes a wide candidate set that exact cosine orders;
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
Held-out recall@10 (categories 1-4) is 0.826 on average over the four folds with the learned
fusion, 0.797 with the reciprocal-rank fusion (still used for scenes: no data to fit them on). A cross-encoder reranker would add more, but no registry package ships
one offline, so there is none (`rerank` is a hook for one).

A question about two entities or two events ("What have Ann and Bob both painted?", "How long
between adopting Coco and Shadow?", "Which city before Lisbon?") can be split into parts without
an LLM (`query_parts`: the names it joins, the events around between/both/before/after/since),
each asked as a query of its own and given `part_budget` slots in the top 10 (`rank`). Measured
held out it gained nothing on the shared dialogues (every fold chose no slots), so it is off in
DEFAULT_PARAMS and the parts are not even embedded (see `RecallParams.part_budget`).

`k` counts documents: each hit is one document. Derived structures only: the graph is the
record, and an index is rebuilt from it by the caller (incrementally, by position).

Deterministic: the same documents give the same rankings bit for bit whatever the hash seed,
the machine's cores, and whether the index grew one document at a time or was rebuilt at once
(a restarted sidecar recalls exactly what the running one would have). Every ranking is
sorted on (score descending, position ascending); every score is computed the same way for
a document whatever else is scored with it.
"""

from __future__ import annotations

import dataclasses
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
    #: 0.1 by folds 30, 41, 42; 0.3 by fold 26.
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
    #: Two-event questions (`query_parts`): how many of each part's own best documents are
    #: kept in the top PART_WINDOW (0: the parts are not asked). 0 by all four folds (each fold
    #: chose among 0-3 slots and depths 1 and 10 on its training dialogues; a slot for each part
    #: moved no held-out figure up: the protocol prints them as "always on").
    part_budget: int = Field(0, ge=0, le=3, description="slots per part of a two-event question in the top 10")
    #: Of how many of a part's own best documents its slots are filled (the ones the whole
    #: question ranks highest; 1: the part's own best). Chosen with part_budget (unused at 0).
    part_depth: int = Field(10, ge=1, le=100, description="a part's slots are filled from its best part_depth")
    #: The fusion of conversation turns (indexes with neighbours): a learned model over FEATURES
    #: instead of the reciprocal-rank fusion and its boosts above (which then only shape its
    #: `rrf` feature). None: reciprocal-rank fusion with the boosts. Scenes always use the RRF.
    fusion: LearnedFusion | None = Field(None, description="learned fusion of conversation turns")


#: The learned fusion in use: the mean of the four folds' fits (`python -m bench.recall_protocol`,
#: each fold fitted on the three dialogues it did not hold out; the folds' weights agree in sign
#: and size but for the collinear dense_10/dense_60 pair). Held out, it gives recall@10 0.826 on
#: average over the four folds (0.856, 0.833, 0.858, 0.759 for 26, 30, 41, 42; refitted when
#: "how long" questions became when-questions and "for three years" a date: 0.824 before), against
#: 0.797 for the reciprocal-rank fusion with its boosts and knobs tuned the same way. What
#: it learned, in short: a speaker the query names but who did not say the turn costs it the most
#: (-2.8 log-odds); near-top lexical ranks, the plain query's dense ranks, a neighbour's lexical
#: match and the session's best match carry it; a when-question and a turn that speaks of a
#: time, image captions and a date match help.
LEARNED_FUSION = LearnedFusion(
    weights=(49.3925, -50.0081, 0.5058, -12.348, 36.5211, 74.5864, 4.7401, -5.0786, 73.5814, 1.6704, 67.2727,
             -0.1092, -2.849, 1.1431, 0.8577, 0.8865, 0.5518, 0.598, -41.7929),
    bias=-7.5632,
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


#: Only a question this short is split into parts (a chat turn's long text is not a question
#: about two events, and each part costs a ranking).
MAX_PART_QUERY = 240
#: The top documents a two-event question's parts are guaranteed slots in (`part_budget`).
PART_WINDOW = 10
#: Words that mark a question about two events or two entities.
_PAIR_CUE = re.compile(r"\b(?:between|before|after|since|both|and)\b", re.IGNORECASE)
#: Capitalised words that are not names an entity part could be split on.
_NOT_NAMES = frozenset("""
i january february march april may june july august september october november december monday tuesday
wednesday thursday friday saturday sunday what when where which who whom whose why how did do does was were
is are has have had can could would should will
""".split())


def _content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z][A-Za-z'\u2019-]*", text) if w.lower() not in STOP_WORDS]


def _without_name(query: str, name: str) -> str:
    """`query` without `name` and the "and" (or comma, "&") that joins it to the next or the
    last name; without "both" and "together": "What have Ann and Bob both painted?" without
    Bob is "What have Ann painted?", without Ann "What have Bob painted?"."""
    name_re = rf"\b{re.escape(name)}(?:'s|\u2019s)?\b"
    joined, count = re.subn(rf"{name_re}\s*(?:,\s*and\b|,|\band\b|&)\s*", "", query, count=1, flags=re.IGNORECASE)
    if not count:
        joined = re.sub(rf"\s*(?:,\s*and\b|,|\band\b|&)\s*{name_re}", "", query, count=1, flags=re.IGNORECASE)
    joined = re.sub(r"\b(?:both|together)\b", "", joined, flags=re.IGNORECASE)
    joined = re.sub(r"\s+([?,.!])", r"\1", joined)
    return re.sub(r"\s+", " ", joined).strip()


_JOIN = r"\s*(?:,\s*and\b|,|\band\b|&)\s*"


def _entity_names(query: str, speakers: list[str] | set[str] | frozenset[str]) -> list[str]:
    """Two names joined by "and" (or a comma, "&") in the question: two of the speakers, or
    else two capitalised words that are not question words, months or days ("Which city have
    both Jean and John visited?"). Two speakers named apart ("What did Nate give Joanna?")
    are one event, not two."""
    named = [s for s in sorted(speakers, key=len, reverse=True) if s]
    if named:
        alternatives = "|".join(re.escape(s) for s in named)
        pair = re.search(rf"\b({alternatives})(?:'s|\u2019s)?{_JOIN}({alternatives})\b", query, re.IGNORECASE)
        if pair and pair[1].lower() != pair[2].lower():
            return [pair[1], pair[2]]
    pair = re.search(rf"\b([A-Z][a-z]+){_JOIN}([A-Z][a-z]+)\b", query)
    if pair and pair.start() > 0 and not {pair[1].lower(), pair[2].lower()} & _NOT_NAMES:
        return [pair[1], pair[2]]
    return []


def _event_parts(query: str) -> list[str]:
    """The two events of a question: "between A and B" (A, B), "both A and B" (A, B),
    "X before/after/since E" (X, E) where E is not a date (a date the question names is the
    time feature's business, not a second event)."""
    body = query.strip().rstrip("?.! ")
    for pattern in (r"\bbetween\s+(.+?)\s+and\s+(.+)$", r"\bboth\s+(.+?)\s+and\s+(.+)$"):
        m = re.search(pattern, body, re.IGNORECASE)
        if m:
            return [m[1], m[2]]
    m = re.search(r"^(.+?)\s+\b(?:before|after|since)\s+(.+)$", body, re.IGNORECASE)
    if m and not query_dates(m[2]) and not resolve(m[2], date(2000, 1, 1)):
        return [m[1], m[2]]
    return []


def part_text(part: str, speakers: list[str] | set[str] | frozenset[str]) -> str:
    """What the dense model embeds for a part: the part without the speakers' names (as
    `plain_query`), or the part itself when nothing else is left."""
    return plain_query(part, speakers) or part


def query_parts(query: str, speakers: list[str] | set[str] | frozenset[str]) -> list[str]:
    """The parts of a question about two entities or two events, each a sub-query of its own
    (no LLM: the question's own names and event phrases), or [] for any other query.

    Two entities: "What subject have Caroline and Melanie both painted?" gives "What subject
    have Caroline painted?" and "What subject have Melanie painted?" (one per name: the
    speakers it names, or two capitalised names joined by "and"). Two events: "How many weeks
    passed between Maria adopting Coco and Shadow?" gives "Maria adopting Coco" and "Shadow";
    "When did Melanie go on a hike after the roadtrip?" gives "When did Melanie go on a hike"
    and "the roadtrip". Only a question (a "?", at most MAX_PART_QUERY characters) with a cue
    word (between, before, after, since, both, and) is split; each part must keep a content
    word. `HybridIndex.rank` keeps each part's best documents in the top PART_WINDOW."""
    if "?" not in query or len(query) > MAX_PART_QUERY or not _PAIR_CUE.search(query):
        return []
    names = _entity_names(query, speakers)
    if names:
        parts = [_without_name(query, names[1]), _without_name(query, names[0])]
    else:
        parts = _event_parts(query)
    parts = [p for p in dict.fromkeys(parts) if _content_words(p) and p != query]
    return parts if len(parts) >= 2 else []


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


#: BM25's constants (Lucene's and tantivy's).
BM25_K1 = 1.2
BM25_B = 0.75
#: Up to this many documents dense search compares the query with every vector (exact, and
#: independent of the order the index was built in); past it an HNSW index proposes
#: max(DENSE_WIDEN x limit, DENSE_MIN_CANDIDATES) candidates that exact cosine orders.
EXACT_DENSE_MAX = 20_000
DENSE_WIDEN = 4
DENSE_MIN_CANDIDATES = 400
#: Rows per block of `_exact_cosines` (bounds its float64 temporaries to a few MB).
COSINE_BLOCK_ROWS = 2048


class _Column:
    """A per-position numpy column that grows by appending (capacity doubles), so the
    features of a query's candidates are read by fancy indexing, not a Python loop."""

    __slots__ = ("_data", "_size")

    def __init__(self, dtype: Any, capacity: int = 64) -> None:
        self._data = np.zeros(capacity, dtype=dtype)
        self._size = 0

    def append(self, value: Any) -> None:
        if self._size == len(self._data):
            grown = np.zeros(2 * len(self._data), dtype=self._data.dtype)
            grown[: self._size] = self._data
            self._data = grown
        self._data[self._size] = value
        self._size += 1

    def set(self, index: int, value: Any) -> None:
        self._data[index] = value

    @property
    def values(self) -> np.ndarray:
        return self._data[: self._size]


class _Postings:
    """One term's postings: positions (ascending, documents are indexed in order) and the
    term's frequency in each."""

    __slots__ = ("_positions", "_frequencies")

    def __init__(self) -> None:
        self._positions = _Column(np.int64, 4)
        self._frequencies = _Column(np.int32, 4)

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
            self._positions._size -= 1
            self._frequencies._size -= 1

    @property
    def positions(self) -> np.ndarray:
        return self._positions.values

    @property
    def frequencies(self) -> np.ndarray:
        return self._frequencies.values


class _Matrix:
    """Unit vectors by position (zeros where a document has none), growing by doubling."""

    def __init__(self, dimensions: int) -> None:
        self._data = np.zeros((64, dimensions), dtype=np.float32)
        self._size = 0
        self._held = _Column(np.bool_)
        self.count = 0  # vectors held

    def __len__(self) -> int:
        return self._size

    def append(self, vector: np.ndarray | None) -> None:
        if self._size == len(self._data):
            grown = np.zeros((2 * len(self._data), self._data.shape[1]), dtype=np.float32)
            grown[: self._size] = self._data
            self._data = grown
        if vector is not None:
            v = np.asarray(vector, dtype=np.float64).reshape(-1)
            norm = float(np.sqrt(np.sum(v * v)))
            self._data[self._size] = v / norm if norm > 0 else 0.0
            self.count += 1
        self._held.append(vector is not None)
        self._size += 1

    def held(self) -> np.ndarray:
        """Positions that hold a vector, ascending."""
        return np.flatnonzero(self._held.values).astype(np.int64)

    def rows(self, positions: np.ndarray) -> np.ndarray:
        return self._data[np.asarray(positions, dtype=np.int64)]


def _exact_cosines(matrix: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Each row's dot product with `unit`, computed row by row in float64 (the products of two
    float32 are exact there; numpy sums each row the same way whatever the other rows): the
    value of a row never depends on which rows are computed with it, nor on BLAS's threads."""
    v = np.asarray(unit, dtype=np.float64).reshape(-1)
    out = np.empty(len(matrix), dtype=np.float64)
    for start in range(0, len(matrix), COSINE_BLOCK_ROWS):
        block = np.asarray(matrix[start : start + COSINE_BLOCK_ROWS], dtype=np.float64)
        out[start : start + len(block)] = np.sum(block * v, axis=1)
    return out


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
        self._analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(STOP_WORDS))
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        # Lexical: our own postings and exact BM25 statistics (see `_lexical_ranking`). A
        # tantivy index counted a re-indexed document's old version in its statistics until a
        # merge, so an index grown turn by turn scored differently from one rebuilt at start.
        self._term_ids: dict[str, int] = {}
        self._postings: list[_Postings] = []
        self._doc_freq: list[int] = []
        self._doc_length = _Column(np.float64)
        self._total_length = 0
        #: The terms (id -> frequency) of the last document: the only one ever re-indexed.
        self._last_terms: dict[int, int] = {}
        keep_large_allocations_mapped()
        #: Dense: every vector, unit length, by position (exact cosine, see `_dense_ranking`);
        #: past EXACT_DENSE_MAX documents a usearch HNSW index (filled then) proposes candidates.
        self._vectors = _Matrix(dimensions)
        self._hnsw: Any = None
        self._hnsw_class = Index
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
        (None: lexical only). Returns how many were added. The index holds the same state
        however the documents were split into calls (one call at start, or one per turn)."""
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
            # document before the batch gains a next one: it is re-indexed (its statistics
            # replaced exactly), so the postings do not depend on how the documents were batched.
            if self.neighbours and first > 0 and self.docs[first - 1].group == self.docs[first].group:
                self._index_body(first - 1, reindex=True)
            for position in range(first, len(self.docs)):
                self._index_body(position, reindex=False)
            by_position = dict(zip(keys, rows, strict=True))
            for position in range(first, len(self.docs)):
                row = by_position.get(position)
                self._vectors.append(None if row is None else vectors[row])  # type: ignore[index]
            if self._hnsw is None and len(self.docs) > EXACT_DENSE_MAX:
                # Past exact search's size: an HNSW index proposes candidates (see _dense_ranking),
                # filled with every vector so far in position order, then grown with each batch.
                self._hnsw = self._hnsw_class(ndim=self.dimensions, metric="cos", dtype="f16")
                keys = [p for p in range(len(self.docs)) if self._has_vector.values[p]]
            if self._hnsw is not None and keys:
                positions = np.asarray(keys, dtype=np.int64)
                # One thread: a multi-threaded HNSW build depends on scheduling.
                self._hnsw.add(positions.astype(np.uint64), self._vectors.rows(positions), threads=1)
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

    def _index_body(self, position: int, *, reindex: bool) -> None:
        """Postings and statistics of the document at `position` (`reindex`: it is the last
        document and its body changed: its old terms and length are taken out first)."""
        counts: dict[int, int] = {}
        for token in self._analyzer.analyze(self._body(position)):
            term = self._term_ids.get(token)
            if term is None:
                term = self._term_ids[token] = len(self._postings)
                self._postings.append(_Postings())
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

    def _lexical_ranking(self, query: str, limit: int) -> list[int]:
        """BM25 (Lucene's: k1 1.2, b 0.75) with the exact statistics of the documents held,
        best first, ties by position: the same ranking whatever order of calls built the index."""
        terms = list(dict.fromkeys(self._analyzer.analyze(query)))
        if not terms:
            return []
        total = max(len(self.docs), 1)
        frequency = {t: (self._doc_freq[self._term_ids[t]] if t in self._term_ids else 0) for t in terms}
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

    def _dense_ranking(self, vector: np.ndarray | None, limit: int) -> list[int]:
        """Positions by exact cosine to `vector`, best first, ties by position. Up to
        EXACT_DENSE_MAX documents every vector is compared; past it HNSW (approximate, its graph
        shaped by insertion order) proposes a wide candidate set that exact cosine orders."""
        unit = self._unit(vector)
        if unit is None or not self._vectors.count:
            return []
        if self._hnsw is None:
            positions = self._vectors.held()
        else:
            wide = min(max(DENSE_WIDEN * limit, DENSE_MIN_CANDIDATES), len(self._hnsw))
            matches = self._hnsw.search(unit.astype(np.float32), wide)
            positions = np.unique(np.asarray(matches.keys, dtype=np.int64))
        if not len(positions):
            return []
        cosine = _exact_cosines(self._vectors.rows(positions), unit)
        order = np.lexsort((positions, -cosine))[:limit]
        return [int(p) for p in positions[order]]

    def prepare(self, query: str, vector: np.ndarray | None, *, names: list[str] | None = None,
                linked: list[str] | None = None, plain_vector: np.ndarray | None = None,
                parts: list[tuple[str, np.ndarray | None]] | None = None) -> Prepared:
        """Everything a query needs from the indexes (the rankers' candidates), before the
        fusion: `rank` fuses it under any `RecallParams` without asking the indexes again.
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`).
        `parts`: a two-event question's parts (`query_parts`), each with the embedding of its
        `plain_query`; each is prepared as a query of its own (lexical, and dense on that vector)."""
        with self.lock:
            prepared = self._prepare(query, vector, names, linked, plain_vector)
            if not parts:
                return prepared
            own = [self._prepare(text, part_vector, names, None, part_vector) for text, part_vector in parts]
            return dataclasses.replace(prepared, parts=tuple(
                dataclasses.replace(part, dates=prepared.dates, asks_when=prepared.asks_when) for part in own))

    def _prepare(self, query: str, vector: np.ndarray | None, names: list[str] | None, linked: list[str] | None,
                 plain_vector: np.ndarray | None) -> Prepared:
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
            matrix = self._vectors.rows(around[held])
            if prepared.vector is not None:
                cosine[held] = _exact_cosines(matrix, prepared.vector)
            if prepared.plain_vector is not None:
                plain_cosine[held] = _exact_cosines(matrix, prepared.plain_vector)
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
        model instead (`features`); the per-signal shares are then its terms, grouped.

        A two-event question's parts (`prepared.parts`, with `params.part_budget`): each part is
        ranked as a query of its own, and its best `part_budget` documents are kept in the top
        PART_WINDOW (or the first `limit`, when fewer), in place of the last of the question's
        own; the rest follows in the question's order."""
        if not prepared.parts or not params.part_budget:
            return self._rank_one(prepared, params, limit)
        ranked = self._rank_one(prepared, params, None)
        window = PART_WINDOW if limit is None else min(limit, PART_WINDOW)
        part_rankings = [self._rank_one(part, params, params.part_depth) for part in prepared.parts]
        return _budgeted(ranked, part_rankings, params.part_budget, window)[:limit]

    def _rank_one(self, prepared: Prepared, params: RecallParams,
                  limit: int | None) -> list[tuple[int, float, dict[str, float]]]:
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
        parts: list[tuple[str, np.ndarray | None]] | None = None,
    ) -> list[Hit]:
        """Top-k documents for `query` (its embedding in `vector`, or None: lexical only).
        `names`: entity names the graph knows (speakers, characters); the one the query names
        boosts the documents it spoke. `linked`: keys of documents the graph's facts tie to
        the query (the turns an entity or relation it names was extracted from), best first.
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`).
        `parts`: a two-event question's parts (`query_parts`) with the embeddings of their
        `part_text` (see `rank`)."""
        if k <= 0:
            return []
        prepared = self.prepare(query, vector, names=names, linked=linked, plain_vector=plain_vector,
                                parts=parts if params.part_budget else None)
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


def _budgeted(ranked: list[tuple[int, float, dict[str, float]]],
              part_rankings: list[list[tuple[int, float, dict[str, float]]]], budget: int,
              window: int) -> list[tuple[int, float, dict[str, float]]]:
    """`ranked` with `budget` documents of each part in its first `window`: of the part's own
    best (`part_rankings`, each as deep as `RecallParams.part_depth`), the ones the whole question ranks highest (so a part's pick agrees with the
    question where it can: a part alone, "the accident", is a weak query). Those already in the
    window stay; the others take the places of the question's last ones (a document the
    question did not rank at all keeps the part's score). The window keeps the question's
    order, the documents let in by a part marked with a `part` signal; the rest follows in the
    question's order."""
    rank_of = {row[0]: i for i, row in enumerate(ranked)}
    reserved: dict[int, tuple[int, float, dict[str, float]]] = {}
    for part in part_rankings:
        own_order = {row[0]: i for i, row in enumerate(part)}
        picks = sorted(part, key=lambda row: (rank_of.get(row[0], len(ranked)), own_order[row[0]]))
        for row in picks[:budget]:
            reserved.setdefault(row[0], ranked[rank_of[row[0]]] if row[0] in rank_of else row)
    reserved = dict(list(reserved.items())[:window])
    own = [row for row in ranked if row[0] not in reserved][: window - len(reserved)]
    let_in = [row if rank_of.get(row[0], window) < window else (row[0], row[1], {**row[2], "part": 1.0})
              for row in reserved.values()]
    head = sorted([*own, *let_in], key=lambda row: (rank_of.get(row[0], len(ranked)), row[0]))
    taken = {row[0] for row in head}
    return head + [row for row in ranked if row[0] not in taken]


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
    #: A two-event question's parts (`query_parts`), each prepared as a query of its own.
    parts: tuple[Prepared, ...] = ()


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
