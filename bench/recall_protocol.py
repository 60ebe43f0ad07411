"""Leave-one-dialogue-out protocol for the recall fusion: tune on some dialogues, report on another.

    python -m bench.recall_protocol [--dialogues DIR] [--cache DIR] [--json FILE] [--embedder NAME]

Every shared dialogue (../shared/data/dialogues, four LoCoMo conversations) is held out once.
A fold tunes the fusion's constants (`core.recall.RecallParams`) on the other dialogues and
is measured on the one held out: recall@10 and recall@5 over the questions of categories 1-4
that have evidence, each question as `flows.regression --mode ingest` asks it (the same
memory rows, the same index, the same embeddings: core.embedder, no LLM). The output shows,
per fold, what it chose, its tuned-on figure (the training dialogues) beside its held-out
one, per category; then the mean and the spread over folds, which folds chose each value
(docs/decisions/recall-fusion.md quotes them), the defaults measured on every
dialogue (tuned on all, so not a held-out figure), and the alternatives that were measured
and not adopted, each under the same protocol. Two-event questions (`core.recall.query_parts`)
are a choice of each fold's learned fusion: the slots per part and their depth
(`PART_BUDGETS`, `PART_DEPTHS`) are chosen on the training dialogues like a knob, and the
held-out figures without the parts and with each setting always on are printed beside it.

Tuning is coordinate ascent over a small grid (`KNOBS`), from the reference values (the
constants before the protocol existed), two passes: a knob moves only for a gain of at least
`MIN_GAIN` on the training dialogues, so noise-level gains do not move it. Embeddings are
computed once (about 30 s on 2 cores; `--cache DIR` keeps them between runs, keyed by the
model, the side (query or passage) and the texts), then every configuration is a fusion of cached candidates
(`HybridIndex.prepare` once per question, `HybridIndex.rank` per configuration).

`--embedder NAME` measures another embedding model (bench.embedders: each ships its weights
in a package) under the same protocol, the fusion refitted on the same folds: the turns are
embedded as passages, the questions and their parts as queries, each with the prefixes its
authors specify. The default is the product's (core.embedder).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.embedders import CANDIDATES, DEFAULT, Embedder, embedder
from core.embedder import EmbedderUnavailableError
from core.recall import (
    DEFAULT_PARAMS,
    FEATURES,
    HybridIndex,
    LearnedFusion,
    Prepared,
    RecallParams,
    part_text,
    plain_query,
    query_parts,
)
from tasks.dialogue.benchmarks import dialogue_files
from tasks.dialogue.ingest import memory_rows
from tasks.dialogue.replay import DialogueSpec, load_dialogue
from tasks.dialogue.retriever import TurnMemoryIndex

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


def _evidence(spec: DialogueSpec) -> list[tuple[int, str, list[str]]]:
    """Questions as the regression's whole-dialogue probe asks them (split lists of turns,
    only evidence that names turns of the dialogue)."""
    refs = {row.dia_id for row in spec.turns if row.dia_id}
    out = []
    for item in spec.qa:
        evidence = list(
            dict.fromkeys(p for e in item.evidence for p in re.split(r"[;,\s]+", e) if p)
        )
        if evidence and set(evidence) <= refs and item.category in CATEGORIES:
            out.append((item.category, item.question, evidence))
    return out


def load(path: Path, cache_dir: Path | None) -> Dialogue:
    spec = load_dialogue(path)
    rows = memory_rows(spec, spec.dialogue_id)
    vectors = _embed([r.text for r in rows], cache_dir)
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
    asked = _evidence(spec)
    question_vectors = _embed([q for _, q, _ in asked], cache_dir, "query")
    names = sorted(memory.speakers)
    plain_vectors = _embed([plain_query(q, names) for _, q, _ in asked], cache_dir, "query")
    # Two-event questions' parts (core.recall.query_parts), each embedded without the names.
    parts = [query_parts(q, names) for _, q, _ in asked]
    every_part = list(dict.fromkeys(part_text(p, names) for ps in parts for p in ps))
    part_vectors = dict(
        zip(every_part, _embed(every_part, cache_dir, "query") if every_part else [], strict=True)
    )
    dialogue = Dialogue(spec.dialogue_id, index, refs, vectors)
    for (category, text, evidence), vector, plain, own in zip(
        asked, question_vectors, plain_vectors, parts, strict=True
    ):
        prepared = index.prepare(
            text,
            vector,
            names=names,
            plain_vector=plain,
            parts=[(p, part_vectors[part_text(p, names)]) for p in own],
        )
        dialogue.questions.append(Question(category, text, set(evidence), prepared, vector))
    return dialogue


Reranker = Callable[[Dialogue, Question, list[int]], list[int]]


def scores(
    dialogue: Dialogue, params: RecallParams, rerank: Reranker | None = None, tag: object = None
) -> list[tuple[int, float, float]]:
    """(category, recall@5, recall@10) per question under `params` (memoized)."""
    key = (params, tag)
    if key in dialogue.cache:
        return dialogue.cache[key]
    out = []
    for question in dialogue.questions:
        order = [
            p for p, _, _ in dialogue.index.rank(question.prepared, params)[: 30 if rerank else 10]
        ]
        if rerank is not None:
            order = rerank(dialogue, question, order)
        got = [dialogue.refs[p] for p in order]
        out.append(
            (
                question.category,
                len(question.evidence & set(got[:5])) / len(question.evidence),
                len(question.evidence & set(got[:10])) / len(question.evidence),
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
#: model has 19 weights and thousands of candidates per fold, so it hardly matters.
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


def _part_budget(train: list[Dialogue], params: RecallParams) -> RecallParams:
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


def _alternative(
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


def _forced(
    folds: list[tuple[Dialogue, list[Dialogue], RecallParams]], name: str, rerank: Reranker
) -> float:
    global _current_params
    held = []
    for held_out, _, params in folds:
        _current_params = params
        held.append(pooled(scores(held_out, params, rerank, (name, id(rerank)))))
    _current_params = DEFAULT_PARAMS
    return float(np.mean(held))


def _changed(params: RecallParams) -> str:
    diff = {k: getattr(params, k) for k in KNOBS if getattr(params, k) != getattr(REFERENCE, k)}
    return ", ".join(f"{k}={v:g}" for k, v in diff.items()) or "(reference values)"


def _consensus(knob: str, chosen: list[RecallParams]) -> float:
    values = [getattr(p, knob) for p in chosen]
    reference = getattr(REFERENCE, knob)
    return max(set(values), key=lambda v: (values.count(v), -abs(v - reference)))


def _short(name: str) -> str:
    return name.rsplit("-", 1)[-1]


def _learned(dialogues: list[Dialogue]) -> dict[str, object]:
    """The learned fusion, held out: each fold fits it on the other dialogues (`fit_fusion`)."""
    print("\nlearned fusion (core.recall.FEATURES), fitted per fold on the training dialogues:")
    print(
        "fold (held out) | tuned on | tuned-on r@10 | held-out r@10 | held-out r@5 | c1 | c2 | c3 | c4 | "
        "tuned-on c1 | c2 | c3 | c4"
    )
    rows, fusions, every = [], [], []
    without_parts: list[float] = []
    budgets: list[str] = []
    for held_out in dialogues:
        train = [d for d in dialogues if d is not held_out]
        fusion = fit_fusion(train)
        fusions.append(fusion)
        params = _part_budget(train, REFERENCE.model_copy(update={"fusion": fusion}))
        without_parts.append(pooled(scores(held_out, params.model_copy(update={"part_budget": 0}))))
        budgets.append(f"{params.part_budget}/{params.part_depth}" if params.part_budget else "0")
        held = scores(held_out, params)
        tuned = [r for d in train for r in scores(d, params)]
        every += held
        row = {
            "held_out": held_out.name,
            "tuned_on": [d.name for d in train],
            "fusion": fusion.model_dump(),
            "tuned_on_recall_at_10": round(pooled(tuned), 4),
            "tuned_on_recall_at_5": round(pooled(tuned, 1), 4),
            "recall_at_10": round(pooled(held), 4),
            "recall_at_5": round(pooled(held, 1), 4),
            "categories": {str(c): round(pooled(held, 2, c), 4) for c in CATEGORIES},
            "tuned_on_categories": {str(c): round(pooled(tuned, 2, c), 4) for c in CATEGORIES},
        }
        rows.append(row)
        print(
            f"{held_out.name} | {'+'.join(_short(d.name) for d in train)} | {row['tuned_on_recall_at_10']:.3f} | "
            f"{row['recall_at_10']:.3f} | {row['recall_at_5']:.3f} | "
            + " | ".join(f"{row['categories'][str(c)]:.3f}" for c in CATEGORIES)
            + " | "
            + " | ".join(f"{row['tuned_on_categories'][str(c)]:.3f}" for c in CATEGORIES)
        )
    held10 = [r["recall_at_10"] for r in rows]
    tuned10 = [r["tuned_on_recall_at_10"] for r in rows]
    summary = {
        "held_out_mean_recall_at_10": round(float(np.mean(held10)), 4),
        "held_out_spread_recall_at_10": [round(min(held10), 4), round(max(held10), 4)],
        "tuned_on_mean_recall_at_10": round(float(np.mean(tuned10)), 4),
        "held_out_mean_recall_at_5": round(float(np.mean([r["recall_at_5"] for r in rows])), 4),
        "tuned_on_mean_recall_at_5": round(
            float(np.mean([r["tuned_on_recall_at_5"] for r in rows])), 4
        ),
        "held_out_pooled_recall_at_10": round(pooled(every), 4),
        "held_out_pooled_categories": {str(c): round(pooled(every, 2, c), 4) for c in CATEGORIES},
    }
    print(
        f"\nheld-out recall@10: mean {summary['held_out_mean_recall_at_10']:.3f} (folds "
        f"{min(held10):.3f}-{max(held10):.3f}); tuned-on mean {summary['tuned_on_mean_recall_at_10']:.3f}; gap "
        f"{summary['tuned_on_mean_recall_at_10'] - summary['held_out_mean_recall_at_10']:+.3f}"
    )
    print(
        f"held-out recall@5: mean {summary['held_out_mean_recall_at_5']:.3f}; tuned-on mean "
        f"{summary['tuned_on_mean_recall_at_5']:.3f}"
    )
    print(
        "held-out, every question judged by the fold that held it out: recall@10 "
        f"{summary['held_out_pooled_recall_at_10']:.3f} ("
        + ", ".join(f"c{c} {v:.3f}" for c, v in summary["held_out_pooled_categories"].items())
        + ")"
    )
    print(
        "two-event questions (core.recall.query_parts), slots per part / depth chosen on the training dialogues: "
        + ", ".join(
            f"{b} without {_short(d.name)}" for b, d in zip(budgets, dialogues, strict=True)
        )
        + f"; held-out mean recall@10 without the parts {np.mean(without_parts):.3f}, with them "
        f"{summary['held_out_mean_recall_at_10']:.3f}"
    )
    forced_parts = {}
    for budget in PART_BUDGETS[1:]:
        for depth in PART_DEPTHS:
            forced_parts[f"{budget}/{depth}"] = round(
                float(
                    np.mean(
                        [
                            pooled(
                                scores(
                                    held_out,
                                    REFERENCE.model_copy(
                                        update={
                                            "fusion": fusion,
                                            "part_budget": budget,
                                            "part_depth": depth,
                                        }
                                    ),
                                )
                            )
                            for held_out, fusion in zip(dialogues, fusions, strict=True)
                        ]
                    )
                ),
                4,
            )
    print(
        "  always on (slots per part / depth), held-out mean recall@10: "
        + ", ".join(f"{k} {v:.3f}" for k, v in forced_parts.items())
    )
    summary["part_budgets"] = budgets
    summary["parts_always_on_held_out_mean_recall_at_10"] = forced_parts
    summary["held_out_mean_recall_at_10_without_parts"] = round(float(np.mean(without_parts)), 4)
    print("weights per fold (held out: " + ", ".join(_short(d.name) for d in dialogues) + "):")
    for i, name in enumerate(FEATURES):
        print(f"  {name}: " + " ".join(f"{f.weights[i]:g}" for f in fusions))
    print("  bias: " + " ".join(f"{f.bias:g}" for f in fusions))
    consensus = mean_fusion(fusions)
    print(
        f"the folds' mean (core.recall.LEARNED_FUSION): weights={consensus.weights}, bias={consensus.bias}"
    )
    if DEFAULT_PARAMS.fusion != consensus:
        print("  NOTE: core.recall.DEFAULT_PARAMS.fusion differs from it")
    return {"folds": rows, "summary": summary, "consensus": consensus.model_dump()}


def run(paths: list[Path], cache_dir: Path | None, learned_only: bool = False) -> dict[str, object]:
    started = time.perf_counter()
    dialogues = [load(path, cache_dir) for path in paths]
    print(
        f"{len(dialogues)} dialogues, {sum(len(d.questions) for d in dialogues)} questions of categories 1-4 "
        f"with evidence, loaded in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    learned = _learned(dialogues)
    if learned_only:
        print(f"\n(done in {time.perf_counter() - started:.0f} s)")
        return {"learned": learned}
    print(
        "\nfor comparison, reciprocal-rank fusion with its boosts (fusion=None), the knobs tuned per fold:"
    )
    folds: list[tuple[Dialogue, list[Dialogue], RecallParams]] = []
    rows = []
    print(
        "fold (held out) | tuned on | chosen | tuned-on r@10 | held-out r@10 | held-out r@5 | "
        "c1 | c2 | c3 | c4"
    )
    for held_out in dialogues:
        train = [d for d in dialogues if d is not held_out]
        params, tuned_value = tune(train)
        folds.append((held_out, train, params))
        held = scores(held_out, params)
        row = {
            "held_out": held_out.name,
            "tuned_on": [d.name for d in train],
            "params": params.model_dump(),
            "tuned_on_recall_at_10": round(tuned_value, 4),
            "tuned_on_recall_at_5": round(
                pooled((r for d in train for r in scores(d, params)), 1), 4
            ),
            "recall_at_10": round(pooled(held), 4),
            "recall_at_5": round(pooled(held, 1), 4),
            "categories": {str(c): round(pooled(held, 2, c), 4) for c in CATEGORIES},
            "tuned_on_categories": {
                str(c): round(pooled((r for d in train for r in scores(d, params)), 2, c), 4)
                for c in CATEGORIES
            },
        }
        rows.append(row)
        cats = " | ".join(f"{row['categories'][str(c)]:.3f}" for c in CATEGORIES)
        print(
            f"{held_out.name} | {'+'.join(_short(d.name) for d in train)} | {_changed(params)} | "
            f"{row['tuned_on_recall_at_10']:.3f} | {row['recall_at_10']:.3f} | {row['recall_at_5']:.3f} | {cats}"
        )
    held10 = [r["recall_at_10"] for r in rows]
    tuned10 = [r["tuned_on_recall_at_10"] for r in rows]
    held5 = [r["recall_at_5"] for r in rows]
    every = [r for held_out, _, params in folds for r in scores(held_out, params)]
    summary = {
        "held_out_mean_recall_at_10": round(float(np.mean(held10)), 4),
        "held_out_spread_recall_at_10": [round(min(held10), 4), round(max(held10), 4)],
        "held_out_stdev_recall_at_10": round(statistics.stdev(held10), 4)
        if len(held10) > 1
        else 0.0,
        "tuned_on_mean_recall_at_10": round(float(np.mean(tuned10)), 4),
        "held_out_mean_recall_at_5": round(float(np.mean(held5)), 4),
        "tuned_on_mean_recall_at_5": round(
            float(np.mean([r["tuned_on_recall_at_5"] for r in rows])), 4
        ),
        "held_out_pooled_recall_at_10": round(pooled(every), 4),
        "held_out_pooled_categories": {str(c): round(pooled(every, 2, c), 4) for c in CATEGORIES},
    }
    print(
        f"\nheld-out recall@10: mean {summary['held_out_mean_recall_at_10']:.3f} (folds "
        f"{min(held10):.3f}-{max(held10):.3f}, stdev {summary['held_out_stdev_recall_at_10']:.3f}); "
        f"tuned-on mean {summary['tuned_on_mean_recall_at_10']:.3f}; gap "
        f"{summary['tuned_on_mean_recall_at_10'] - summary['held_out_mean_recall_at_10']:+.3f}"
    )
    print(
        f"held-out recall@5: mean {summary['held_out_mean_recall_at_5']:.3f}; tuned-on mean "
        f"{summary['tuned_on_mean_recall_at_5']:.3f}"
    )
    print(
        "held-out, every question judged by the fold that held it out: recall@10 "
        f"{summary['held_out_pooled_recall_at_10']:.3f} ("
        + ", ".join(f"c{c} {v:.3f}" for c, v in summary["held_out_pooled_categories"].items())
        + ")"
    )

    print("\nwhich folds chose each value (reference value in brackets):")
    choices: dict[str, dict[str, list[str]]] = {}
    for knob in KNOBS:
        by_value: dict[str, list[str]] = {}
        for held_out, _, params in folds:
            by_value.setdefault(f"{getattr(params, knob):g}", []).append(
                f"without {_short(held_out.name)}"
            )
        choices[knob] = by_value
        print(
            f"  {knob} [{getattr(REFERENCE, knob):g}]: "
            + "; ".join(f"{v} by {len(f)} ({', '.join(f)})" for v, f in by_value.items())
        )

    rrf_defaults = DEFAULT_PARAMS.model_copy(update={"fusion": None})
    consensus = rrf_defaults.model_copy(
        update={knob: _consensus(knob, [p for _, _, p in folds]) for knob in KNOBS}
    )
    print(
        f"the folds' choice (per knob, the value most folds chose; a tie goes to the value nearer the "
        f"reference): {_changed(consensus)}"
    )
    if consensus != rrf_defaults:
        print(f"  NOTE: core.recall.DEFAULT_PARAMS differs from it ({_changed(DEFAULT_PARAMS)})")

    reference = [r for d in dialogues for r in scores(d, REFERENCE)]
    rrf_all = [r for d in dialogues for r in scores(d, rrf_defaults)]
    print(
        f"\nreciprocal-rank fusion with core.recall.DEFAULT_PARAMS's knobs on all dialogues (not held out): "
        f"recall@10 {pooled(rrf_all):.3f}, recall@5 {pooled(rrf_all, 1):.3f}"
    )
    defaults = [r for d in dialogues for r in scores(d, DEFAULT_PARAMS)]
    print(
        f"reference values (before the protocol) on all dialogues: recall@10 {pooled(reference):.3f}, "
        f"recall@5 {pooled(reference, 1):.3f}"
    )
    print(
        f"core.recall.DEFAULT_PARAMS on all dialogues (tuned on all of them: not held out): recall@10 "
        f"{pooled(defaults):.3f}, recall@5 {pooled(defaults, 1):.3f}; "
        + ", ".join(f"{_short(d.name)} {pooled(scores(d, DEFAULT_PARAMS)):.3f}" for d in dialogues)
    )

    print(
        "\nalternatives, held out the same way (each fold adopts an option only for a training gain "
        f">= {MIN_GAIN}):"
    )
    alternatives = {}
    for title, options in ALTERNATIVES.items():
        mean, chosen = _alternative(folds, options)
        forced = {name: round(_forced(folds, name, rerank), 4) for name, rerank in options}
        alternatives[title] = {
            "held_out_mean_recall_at_10": round(mean, 4),
            "chosen_by_folds": chosen,
            "always_on_held_out_mean": forced,
        }
        print(
            f"  {title}: held-out mean {mean:.3f} (folds chose: {', '.join(chosen)}); always on: "
            + ", ".join(f"{n} {v:.3f}" for n, v in forced.items())
        )
    print(f"\n(done in {time.perf_counter() - started:.0f} s)")
    return {
        "learned": learned,
        "folds": rows,
        "summary": summary,
        "choices": choices,
        "alternatives": alternatives,
        "consensus": consensus.model_dump(),
        "reference_all": round(pooled(reference), 4),
        "defaults_all": round(pooled(defaults), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recall_protocol",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
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
    parser.add_argument(
        "--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON"
    )
    parser.add_argument(
        "--embedder",
        choices=sorted(CANDIDATES),
        default=DEFAULT,
        help=f"the embedding model measured (bench.embedders; default {DEFAULT}, the product's)",
    )
    parser.add_argument(
        "--learned-only",
        action="store_true",
        help="only the learned fusion (the product's), without the reciprocal-rank comparison and "
        "the alternatives (minutes instead of half an hour on a busy machine)",
    )
    args = parser.parse_args()
    paths = dialogue_files(args.dialogues)
    if published := [p for p in paths if not p.name.endswith(".jsonl")]:
        parser.error(f"the protocol reads *.turns.jsonl dialogues (one a file); got {published[0]}")
    if len(paths) < 2:
        parser.error("leave-one-out needs at least two dialogues")
    global _model_name
    _model_name = args.embedder
    print(f"embedder: {args.embedder}", flush=True)
    try:
        result = run(paths, args.cache, args.learned_only)
    except EmbedderUnavailableError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
