"""The fusions of a prepared query's candidates into one ranking: the learned model over
`FEATURES` (`learned_rank`, conversation turns), the reciprocal-rank fusion with its smoothing
and boosts (`rrf_rank`, scenes), and the slots of a two-event question's parts (`budgeted`).

Contract: a ranking is (position, score, per-signal shares), best first, sorted on (score
descending, position ascending); a document's score is computed the same way whatever else is
scored with it. What each fusion measured: docs/decisions/recall-fusion.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from core.recall.dense import DenseIndex
from core.recall.documents import DocumentColumns, MemoryDoc, speaker_names
from core.recall.features import features
from core.recall.params import FEATURES, SIGNAL_OF, LearnedFusion, RecallParams
from core.recall.query import Prepared

#: One ranked document: (position, score, per-signal shares).
Ranked = tuple[int, float, dict[str, float]]


def learned_rank(
    prepared: Prepared,
    params: RecallParams,
    fusion: LearnedFusion,
    limit: int | None,
    columns: DocumentColumns,
    dense: DenseIndex,
    shown: Callable[[int], bool] | None = None,
) -> list[Ranked]:
    """The candidates scored by the learned model, the graph's links added apart; those `shown`
    names after all the others (`shown_last`)."""
    positions, x = features(prepared, params, columns, dense)
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
    ranked = np.lexsort((positions, -scores)).tolist()
    order = shown_last(ranked, None if shown is None else lambda i: shown(int(positions[i])), limit)
    out = []
    for i in order:
        signals: dict[str, float] = {}
        for name, value in zip(FEATURES, contributions[i].tolist(), strict=True):
            if value:
                group = SIGNAL_OF[name]
                signals[group] = signals.get(group, 0.0) + value
        position = int(positions[i])
        if position in linked:
            signals["linked"] = linked[position]
        out.append((position, float(scores[i]), signals))
    return out


def rrf_rank(
    prepared: Prepared,
    params: RecallParams,
    limit: int | None,
    docs: list[MemoryDoc],
    columns: DocumentColumns,
    neighbours: bool,
    shown: Callable[[int], bool] | None = None,
) -> list[Ranked]:
    """Reciprocal-rank fusion of the rankers, neighbour smoothing (with `neighbours`), session
    relevance and the boosts (see `HybridIndex.rank`); the documents `shown` names after all
    the others (`shown_last`)."""
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
    # Neighbour smoothing over the candidates only (no scan of the memory).
    smoothed = dict(fused)
    if neighbours and params.neighbour_share > 0:
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
        if (
            prepared.named is not None
            and params.entity_boost
            and prepared.named in speaker_names(docs[position].speaker.lower())
        ):
            factor += params.entity_boost
            entry["graph"] = params.entity_boost
        if prepared.dates:
            events = columns.events[position]
            said = columns.said[position]
            if params.event_boost and any(d.contains(e) for d in prepared.dates for e in events):
                factor += params.event_boost
                entry["event_time"] = params.event_boost
            elif (
                params.date_boost
                and said is not None
                and any(d.matches(said) for d in prepared.dates)
            ):
                factor += params.date_boost
                entry["time"] = params.date_boost
        if prepared.asks_when and params.when_boost and columns.events[position]:
            factor += params.when_boost
            entry["when"] = params.when_boost
        smoothed[position] *= factor
    order = shown_last(sorted(smoothed, key=lambda p: (-smoothed[p], p)), shown, limit)
    return [(p, smoothed[p], signals.get(p, {})) for p in order]


def shown_last(
    order: list[int], shown: Callable[[int], bool] | None, limit: int | None = None
) -> list[int]:
    """The first `limit` of `order` with the items `shown` names (documents a chat front end's
    window already shows) after all the others, both kept in their order. `shown` is asked only
    until `limit` others are found (a memory query's hot path)."""
    if shown is None:
        return order[:limit]
    others: list[int] = []
    held: list[int] = []
    for item in order:
        (held if shown(item) else others).append(item)
        if limit is not None and len(others) >= limit:
            return others
    return (others + held)[:limit]


def budgeted(
    ranked: list[tuple[int, float, dict[str, float]]],
    part_rankings: list[list[tuple[int, float, dict[str, float]]]],
    budget: int,
    window: int,
    signal: str = "part",
) -> list[tuple[int, float, dict[str, float]]]:
    """`ranked` with `budget` documents of each part in its first `window`: of the part's own
    best (`part_rankings`, each as deep as `RecallParams.part_depth`), the ones the whole question ranks highest (so a part's pick agrees with the
    question where it can: a part alone, "the accident", is a weak query). Those already in the
    window stay; the others take the places of the question's last ones (a document the
    question did not rank at all keeps the part's score). The window keeps the question's
    order, the documents let in by a part marked with `signal` (`part`; `date` for the slots of a
    day the question names); the rest follows in the question's order."""
    rank_of = {row[0]: i for i, row in enumerate(ranked)}
    reserved: dict[int, tuple[int, float, dict[str, float]]] = {}
    for part in part_rankings:
        own_order = {row[0]: i for i, row in enumerate(part)}
        picks = sorted(part, key=lambda row: (rank_of.get(row[0], len(ranked)), own_order[row[0]]))
        for row in picks[:budget]:
            reserved.setdefault(row[0], ranked[rank_of[row[0]]] if row[0] in rank_of else row)
    reserved = dict(list(reserved.items())[:window])
    own = [row for row in ranked if row[0] not in reserved][: window - len(reserved)]
    let_in = [
        row if rank_of.get(row[0], window) < window else (row[0], row[1], {**row[2], signal: 1.0})
        for row in reserved.values()
    ]
    head = sorted([*own, *let_in], key=lambda row: (rank_of.get(row[0], len(ranked)), row[0]))
    taken = {row[0] for row in head}
    return head + [row for row in ranked if row[0] not in taken]
