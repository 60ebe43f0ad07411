"""The leave-one-dialogue-out protocol's parts (bench/recall_protocol.py prints the report).

A dialogue is loaded as `flows.regression --mode ingest` reads it (the same memory rows, the
same index, the same embeddings) with its questions of categories 1-4 prepared once; `scores`
is recall@5 and recall@10 per question under one `RecallParams` (memoized per dialogue);
`tune` is the coordinate ascent over `KNOBS`; `fit_fusion` fits the learned fusion on training
dialogues; `ALTERNATIVES` are the rerankers measured and not adopted, `_alternative` and
`_forced` their held-out figures. `use_embedder` chooses the embedding model (`--embedder`).
"""

from __future__ import annotations

import argparse
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.embedders import DEFAULT, Embedder, embedder
from core.errors import InvalidInputError
from core.recall import (
    DEFAULT_PARAMS,
    FEATURES,
    HybridIndex,
    LearnedFusion,
    Prepared,
    RecallParams,
    part_text,
    query_parts,
    topical_text,
    vector_text,
)
from tasks.dialogue.benchmarks import dialogue_files
from tasks.dialogue.ingest import memory_rows
from tasks.dialogue.replay import DialogueSpec, load_dialogue
from tasks.dialogue.retriever import TurnMemoryIndex, row_texts

DIALOGUES = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "dialogues"
CATEGORIES = (1, 2, 3, 4)
#: The constants before the protocol existed: where every fold's tuning starts.
REFERENCE = RecallParams(
    dense_weight=0.5,
    rrf_k=60,
    neighbour_share=0.2,
    entity_boost=0.3,
    date_boost=0.1,
    event_boost=0.0,
    when_boost=0.0,
    session_share=0.0,
    part_budget=0,
)
#: Slots per part of a two-event question (core.recall.query_parts) each fold may choose for
#: the learned fusion, on its training dialogues (0: the parts are not asked).
PART_BUDGETS = (0, 1, 2, 3)
#: ... and how deep in each part's own ranking its slots are filled from (1: the part's best).
PART_DEPTHS = (1, 10)
#: The grid: a few values per knob. lexical_weight is the unit (not tuned); linked_weight
#: needs extracted facts, which no run here has (it is measured with the scripted server).
KNOBS: dict[str, tuple[float, ...]] = {
    "dense_weight": (0.35, 0.5, 0.75, 1.0),
    "rrf_k": (10, 30, 60),
    "neighbour_share": (0.1, 0.2, 0.3),
    "entity_boost": (0.3, 0.6, 1.0),
    "date_boost": (0.0, 0.1, 0.3),
    "event_boost": (0.0, 0.25, 0.5, 1.0),
    "when_boost": (0.0, 0.15, 0.3, 0.6),
    "session_share": (0.0, 0.1, 0.2, 0.35, 0.5),
}
#: Smallest gain in training recall@10 that moves a knob (about one question in 400).
MIN_GAIN = 0.0025
PASSES = 2


@dataclass
class Question:
    category: int
    text: str
    evidence: set[str]
    prepared: Prepared
    vector: np.ndarray
    #: Its line in the .qa.jsonl file (from 0) and its words there, before `text`'s respelling:
    #: what an evidence audit names it by (bench.evidence_audit).
    number: int = -1
    published: str = ""
    #: The evidence an audit cites instead of `evidence`, if it re-cites the question.
    audited: set[str] | None = None


@dataclass
class Dialogue:
    name: str
    index: HybridIndex
    refs: list[str]
    vectors: np.ndarray
    questions: list[Question] = field(default_factory=list)
    cache: dict[tuple[object, ...], list[tuple[int, float, float]]] = field(default_factory=dict)
    #: Per question: the learned fusion's candidates and FEATURES rows, and which are evidence.
    features: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)


#: The embedding model measured (`--embedder`).
_model: Embedder | None = None
_model_name = DEFAULT


def use_embedder(name: str) -> None:
    """Measure `name` (bench.embedders) from here on; its model loads at the first embedding."""
    global _model, _model_name
    _model, _model_name = None, name


def _embed(texts: list[str], cache_dir: Path | None, side: str = "passage") -> np.ndarray:
    """`side`: "passage" (a turn) or "query" (a question or its part): models such as e5 embed
    the two differently."""
    global _model
    key = hashlib.sha256("\n\x00".join([_model_name, side, *texts]).encode("utf-8")).hexdigest()[
        :24
    ]
    path = cache_dir / f"{key}.npy" if cache_dir else None
    if path is not None and path.exists():
        return np.load(path)
    if _model is None:
        _model = embedder(_model_name)
    vectors = _model.queries(texts) if side == "query" else _model.passages(texts)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
    return vectors


def _evidence(spec: DialogueSpec) -> list[tuple[int, int, str, list[str]]]:
    """Questions as the regression's whole-dialogue probe asks them (split lists of turns,
    only evidence that names turns of the dialogue): (line number, category, question,
    evidence)."""
    refs = {row.dia_id for row in spec.turns if row.dia_id}
    out = []
    for number, item in enumerate(spec.qa):
        evidence = list(
            dict.fromkeys(p for e in item.evidence for p in re.split(r"[;,\s]+", e) if p)
        )
        if evidence and set(evidence) <= refs and item.category in CATEGORIES:
            out.append((number, item.category, item.question, evidence))
    return out


def load(
    path: Path, cache_dir: Path | None, reword: Callable[[str, list[str]], str] | None = None
) -> Dialogue:
    """`reword`: each question as asked instead (given the speakers' names; bench.recall_chat)."""
    spec = load_dialogue(path)
    rows = memory_rows(spec, spec.dialogue_id)
    vectors = _embed(row_texts(rows), cache_dir)  # each row as the product embeds it
    memory = TurnMemoryIndex()
    memory.sync(
        [
            r.model_copy(update={"seq": i + 1, "embedding": v.tolist()})
            for i, (r, v) in enumerate(zip(rows, vectors, strict=True))
        ],
        reset=False,
    )
    assert memory.index is not None
    index = memory.index
    refs = [str((d.meta.get("source_refs") or [d.key])[0]) for d in index.docs]
    names = sorted(memory.speakers)
    # Each question as recall asks it: its typos read as the memory's words.
    published = _evidence(spec)
    asked = [(c, index.spelled(reword(q, names) if reword else q), e) for _, c, q, e in published]
    # Each question embedded once, as recall embeds it: its sentences that name a topic,
    # without the speakers' names (core.recall.vector_text); both dense rankings are asked
    # with that vector.
    question_vectors = _embed([vector_text(q, names) for _, q, _ in asked], cache_dir, "query")
    # Two-event questions' parts (core.recall.query_parts), each embedded without the names.
    parts = [query_parts(topical_text(q, names), names) for _, q, _ in asked]
    every_part = list(dict.fromkeys(part_text(p, names) for ps in parts for p in ps))
    part_vectors = dict(
        zip(every_part, _embed(every_part, cache_dir, "query") if every_part else [], strict=True)
    )
    dialogue = Dialogue(spec.dialogue_id, index, refs, vectors)
    for (category, text, evidence), vector, own, (number, _, source, _) in zip(
        asked, question_vectors, parts, published, strict=True
    ):
        prepared = index.prepare(
            text,
            vector,
            names=names,
            parts=[(p, part_vectors[part_text(p, names)]) for p in own],
        )
        dialogue.questions.append(
            Question(category, text, set(evidence), prepared, vector, number, source)
        )
    return dialogue


Reranker = Callable[[Dialogue, Question, list[int]], list[int]]


def scores(
    dialogue: Dialogue,
    params: RecallParams,
    rerank: Reranker | None = None,
    tag: object = None,
    audited: bool = False,
) -> list[tuple[int, float, float]]:
    """(category, recall@5, recall@10) per question under `params` (memoized); `audited`:
    against the evidence an audit cites instead, where it re-cites a question."""
    key = (params, tag, audited)
    if key in dialogue.cache:
        return dialogue.cache[key]
    out = []
    for question in dialogue.questions:
        evidence = question.evidence
        if audited and question.audited is not None:
            evidence = question.audited
        order = [
            p for p, _, _ in dialogue.index.rank(question.prepared, params)[: 30 if rerank else 10]
        ]
        if rerank is not None:
            order = rerank(dialogue, question, order)
        got = [dialogue.refs[p] for p in order]
        out.append(
            (
                question.category,
                len(evidence & set(got[:5])) / len(evidence),
                len(evidence & set(got[:10])) / len(evidence),
            )
        )
    dialogue.cache[key] = out
    return out


def pooled(
    rows: Iterable[tuple[int, float, float]], column: int = 2, category: int | None = None
) -> float:
    values = [r[column] for r in rows if category is None or r[0] == category]
    return float(np.mean(values)) if values else float("nan")


def tune(
    train: list[Dialogue],
    start: RecallParams = REFERENCE,
    knobs: dict[str, tuple[float, ...]] = KNOBS,
) -> tuple[RecallParams, float]:
    """Coordinate ascent on the pooled training recall@10 (see the module docstring)."""

    def value(params: RecallParams) -> float:
        return pooled(r for d in train for r in scores(d, params))

    best, best_value = start, value(start)
    for _ in range(PASSES):
        moved = False
        for knob, values in knobs.items():
            for candidate in values:
                params = best.model_copy(update={knob: candidate})
                v = value(params)
                if v >= best_value + MIN_GAIN:
                    best, best_value, moved = params, v, True
        if not moved:
            break
    return best, best_value


#: The learned fusion's ridge penalty (on standardised features), fixed before any fit: the
#: model has 20 weights and thousands of candidates per fold, so it hardly matters.
L2 = 1.0


def _features(dialogue: Dialogue) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    if not dialogue.features:
        for question in dialogue.questions:
            positions, x = dialogue.index.features(question.prepared, REFERENCE)
            y = np.asarray(
                [dialogue.refs[p] in question.evidence for p in positions.tolist()],
                dtype=np.float64,
            )
            dialogue.features.append((positions, x, y))
    return dialogue.features


def fit_fusion(train: list[Dialogue]) -> LearnedFusion:
    """Logistic regression of "the candidate is evidence" on FEATURES over the training
    dialogues' questions (Newton's method, ridge L2 on standardised features). Each question
    weighs the same: an evidence turn counts 1/(its question's evidence turns), as in recall,
    and the other candidates share one unit. Returns the weights on the features' own scale."""
    xs, ys, ws = [], [], []
    for dialogue in train:
        for question, (_, x, y) in zip(dialogue.questions, _features(dialogue), strict=True):
            xs.append(x)
            ys.append(y)
            ws.append(
                np.where(y > 0, 1.0 / len(question.evidence), 1.0 / max(len(y) - y.sum(), 1.0))
            )
    x, y, w = np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    z = np.c_[(x - mean) / scale, np.ones(len(x))]
    beta = np.zeros(z.shape[1])
    penalty = L2 * np.diag(np.r_[np.ones(len(FEATURES)), 0.0])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(z @ beta)))
        gradient = z.T @ (w * (p - y)) + penalty @ beta
        hessian = (z * (w * p * (1 - p))[:, None]).T @ z + penalty
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-9:
            break
    weights = beta[:-1] / scale
    return LearnedFusion(
        weights=tuple(round(float(v), 4) for v in weights),
        bias=round(float(beta[-1] - (weights * mean).sum()), 4),
    )


def part_budget_for(train: list[Dialogue], params: RecallParams) -> RecallParams:
    """The slots per part (PART_BUDGETS) and their depth (PART_DEPTHS) that give the training dialogues the best recall@10,
    from none: a budget is taken only for a gain of at least MIN_GAIN."""
    best, best_value = params, pooled(r for d in train for r in scores(d, params))
    for budget in PART_BUDGETS[1:]:
        for depth in PART_DEPTHS:
            candidate = params.model_copy(update={"part_budget": budget, "part_depth": depth})
            value = pooled(r for d in train for r in scores(d, candidate))
            if value >= best_value + MIN_GAIN:
                best, best_value = candidate, value
    return best


def mean_fusion(fusions: list[LearnedFusion]) -> LearnedFusion:
    return LearnedFusion(
        weights=tuple(round(float(v), 4) for v in np.mean([f.weights for f in fusions], axis=0)),
        bias=round(float(np.mean([f.bias for f in fusions])), 4),
    )


# --- alternatives that were measured (each tuned on the training folds, like the rest) -----------


def _session_cap(cap: int) -> Reranker:
    def rerank(dialogue: Dialogue, question: Question, order: list[int]) -> list[int]:
        counts: dict[str, int] = {}
        kept = []
        for p in order:
            group = dialogue.index.docs[p].group
            if counts.get(group, 0) < cap:
                kept.append(p)
                counts[group] = counts.get(group, 0) + 1
        return kept[:10]

    return rerank


def _mmr(weight: float) -> Reranker:
    """Maximal marginal relevance over the top 30 (`weight` on relevance, by rank)."""

    def rerank(dialogue: Dialogue, question: Question, order: list[int]) -> list[int]:
        relevance = {p: 1.0 - i / len(order) for i, p in enumerate(order)}
        vectors = dialogue.vectors
        chosen: list[int] = []
        rest = list(order)
        while rest and len(chosen) < 10:

            def gain(p: int) -> float:
                redundancy = max((float(vectors[p] @ vectors[c]) for c in chosen), default=0.0)
                return weight * relevance[p] - (1 - weight) * redundancy

            pick = max(rest, key=gain)
            chosen.append(pick)
            rest.remove(pick)
        return chosen

    return rerank


def _rocchio(beta: float) -> Reranker:
    """Dense pseudo-relevance feedback: the query vector moved toward its top 3, asked again."""

    def rerank(dialogue: Dialogue, question: Question, order: list[int]) -> list[int]:
        vector = question.vector + beta * dialogue.vectors[order[:3]].mean(axis=0)
        vector = vector / np.linalg.norm(vector)
        prepared = question.prepared
        dense = [
            int(p) for p in np.argsort(-(dialogue.vectors @ vector))[: len(prepared.dense) or 100]
        ]
        again = Prepared(
            lexical=prepared.lexical,
            dense=dense,
            linked=prepared.linked,
            named=prepared.named,
            dates=prepared.dates,
            asks_when=prepared.asks_when,
        )
        return [p for p, _, _ in dialogue.index.rank(again, _current_params)[:10]]

    return rerank


_current_params = DEFAULT_PARAMS
ALTERNATIVES: dict[str, list[tuple[str, Reranker]]] = {
    "one slot per session (cap per session in the top 10)": [
        (f"cap {c}", _session_cap(c)) for c in (1, 2, 3)
    ],
    "MMR diversification of the top 30": [(f"weight {w}", _mmr(w)) for w in (0.5, 0.7, 0.85)],
    "pseudo-relevance feedback (dense Rocchio, top 3)": [
        (f"beta {b}", _rocchio(b)) for b in (0.3, 0.6)
    ],
}


def held_out_with_choice(
    folds: list[tuple[Dialogue, list[Dialogue], RecallParams]], options: list[tuple[str, Reranker]]
) -> tuple[float, list[str]]:
    """Held-out mean when each fold may adopt one option (chosen on its training dialogues,
    against not adopting any: an option must gain MIN_GAIN)."""
    global _current_params
    held, chosen = [], []
    for held_out, train, params in folds:
        _current_params = params
        base = pooled(r for d in train for r in scores(d, params))
        best_name, best_rerank, best_value = "none", None, base
        for name, rerank in options:
            tag = (name, id(rerank))
            value = pooled(r for d in train for r in scores(d, params, rerank, tag))
            if value >= best_value + MIN_GAIN:
                best_name, best_rerank, best_value = name, rerank, value
        tag = (best_name, id(best_rerank)) if best_rerank else None
        held.append(pooled(scores(held_out, params, best_rerank, tag)))
        chosen.append(best_name)
    _current_params = DEFAULT_PARAMS
    return float(np.mean(held)), chosen


def held_out_forced(
    folds: list[tuple[Dialogue, list[Dialogue], RecallParams]], name: str, rerank: Reranker
) -> float:
    global _current_params
    held = []
    for held_out, _, params in folds:
        _current_params = params
        held.append(pooled(scores(held_out, params, rerank, (name, id(rerank)))))
    _current_params = DEFAULT_PARAMS
    return float(np.mean(held))


def changed_knobs(params: RecallParams) -> str:
    diff = {k: getattr(params, k) for k in KNOBS if getattr(params, k) != getattr(REFERENCE, k)}
    return ", ".join(f"{k}={v:g}" for k, v in diff.items()) or "(reference values)"


def consensus_value(knob: str, chosen: list[RecallParams]) -> float:
    values = [getattr(p, knob) for p in chosen]
    reference = getattr(REFERENCE, knob)
    return max(set(values), key=lambda v: (values.count(v), -abs(v - reference)))


def short_name(name: str) -> str:
    return name.rsplit("-", 1)[-1]


def add_dialogue_options(parser: argparse.ArgumentParser) -> None:
    """The options every leave-one-dialogue-out report takes: which dialogues, and where the
    embeddings are kept between runs."""
    parser.add_argument(
        "--dialogues",
        nargs="+",
        type=Path,
        default=[DIALOGUES],
        metavar="PATH",
        help="*.turns.jsonl files or directories of them, each with its .qa.jsonl (default: the "
        "shared dialogues)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the embeddings here between runs (default: embed every run)",
    )


def dialogue_paths(parser: argparse.ArgumentParser, given: list[Path]) -> list[Path]:
    """The dialogues `--dialogues` names, at least two (a usage error otherwise)."""
    try:
        paths = dialogue_files(given)
    except InvalidInputError as exc:
        parser.error(str(exc))
    if published := [p for p in paths if not p.name.endswith(".jsonl")]:
        parser.error(f"the protocol reads *.turns.jsonl dialogues (one a file); got {published[0]}")
    if len(paths) < 2:
        parser.error("leave-one-out needs at least two dialogues")
    return paths
