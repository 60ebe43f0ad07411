"""Hybrid retrieval, shared by the dialogue sidecar and the novel's scene context.

One `HybridIndex` holds the documents of one memory (a conversation's turns, a novel's
scenes) in order, and answers a query with the top-k documents by fusing:

- lexical (`core.recall.lexical`): BM25 (Lucene's formula) over each document with its date,
  the dates it speaks of (core.timex: "yesterday" said on 8 May is indexed as 7 May 2023) and
  the documents before and after it in the same group (session or chapter), tokenized,
  stemmed and stripped of English function words by tantivy's analyzer, near-universal terms
  left out of queries. The postings and statistics are the index's own and exact (adding a
  turn re-indexes the turn before it), so the scores do not depend on how the documents were
  batched;
- dense (`core.recall.dense`): cosine over sentence embeddings (core.embedder by default),
  exact up to EXACT_DENSE_MAX documents; past it a usearch HNSW index proposes a wide
  candidate set that exact cosine orders;
- graph: documents spoken by the one entity the query names get a boost, and the documents
  the graph's facts tie to the query (`linked`: the turns a relation or an entity it names was
  extracted from) are a ranker of their own;
- time: a date the query names boosts the documents said on it, or (`event_boost`) those that
  speak of a day within it; a when-question can favour documents that speak of a time;
- reciprocal-rank fusion of the rankers (`core.recall.fusion`), then neighbour smoothing (a
  document next to a strong hit in the same group gains a share of its score) and session
  relevance (a document gains a share of its group's best score).

For conversation turns the fusion above is replaced by a learned one (`LearnedFusion`, a
logistic model over `FEATURES` of each candidate, `core.recall.features`), and the dense
ranker is asked a second time with the query without the speakers' names (`plain_query`).
The constants (`core.recall.params`) are chosen by `python -m bench.recall_protocol`. A
question about two entities or two events can be split into parts without an LLM
(`query_parts`, `core.recall.query`), each given `part_budget` slots in the top 10 (one in
DEFAULT_PARAMS). `rerank` is a hook for a cross-encoder. What each choice measured, and why:
docs/decisions/recall-fusion.md.

`k` counts documents: each hit is one document. Derived structures only: the graph is the
record, and an index is rebuilt from it by the caller (incrementally, by position).

Deterministic: the same documents give the same rankings bit for bit whatever the hash seed,
the machine's cores, and whether the index grew one document at a time or was rebuilt at once
(a restarted sidecar recalls exactly what the running one would have). Every ranking is
sorted on (score descending, position ascending); every score is computed the same way for
a document whatever else is scored with it.

This package re-exports the public names of its modules: callers import from `core.recall`.
"""

from core.recall.dense import COSINE_BLOCK_ROWS, DENSE_MIN_CANDIDATES, DENSE_WIDEN, EXACT_DENSE_MAX
from core.recall.documents import Hit, MemoryDoc
from core.recall.index import HybridIndex
from core.recall.lexical import ALWAYS_KEPT_DOC_FREQ, BM25_B, BM25_K1, MAX_TERM_SHARE
from core.recall.params import (
    CANDIDATES,
    DEFAULT_PARAMS,
    FEATURES,
    LEARNED_FUSION,
    LearnedFusion,
    RecallParams,
)
from core.recall.query import (
    MAX_PART_QUERY,
    PART_WINDOW,
    STOP_WORDS,
    Prepared,
    asked_about,
    asked_of,
    embedded_query,
    embedded_text,
    named_in,
    part_text,
    plain_query,
    query_parts,
    query_texts,
    says_something,
    topical_text,
    unaddressed,
    vector_text,
)
from core.recall.registry import IndexRegistry

__all__ = [
    "asked_of",
    "ALWAYS_KEPT_DOC_FREQ",
    "BM25_B",
    "BM25_K1",
    "CANDIDATES",
    "COSINE_BLOCK_ROWS",
    "DEFAULT_PARAMS",
    "DENSE_MIN_CANDIDATES",
    "DENSE_WIDEN",
    "EXACT_DENSE_MAX",
    "FEATURES",
    "LEARNED_FUSION",
    "MAX_PART_QUERY",
    "MAX_TERM_SHARE",
    "PART_WINDOW",
    "STOP_WORDS",
    "Hit",
    "HybridIndex",
    "IndexRegistry",
    "LearnedFusion",
    "MemoryDoc",
    "Prepared",
    "RecallParams",
    "part_text",
    "plain_query",
    "query_parts",
    "asked_about",
    "embedded_query",
    "embedded_text",
    "named_in",
    "query_texts",
    "says_something",
    "topical_text",
    "unaddressed",
    "vector_text",
]
