"""The learned fusion's inputs: for a prepared query, the candidate documents (every ranker's,
and their in-group neighbours) and their `FEATURES`, one row each (`features`).

Contract: only the candidates are read (their vectors by position, the rest from per-position
columns by index), so the cost does not grow with the memory; a candidate's row depends only
on the query and the documents, never on which other candidates are scored with it.
"""

from __future__ import annotations

from datetime import date

import numpy as np

from core.recall.dense import DenseIndex, exact_cosines
from core.recall.documents import DocumentColumns
from core.recall.params import FEATURES, RecallParams
from core.recall.query import Prepared
from core.timex import TimeSpan

#: The column of each feature in the matrix `features` returns.
COLUMN = {name: i for i, name in enumerate(FEATURES)}


def first_occurrences(values: np.ndarray) -> np.ndarray:
    """`values` without repeats, each kept where it first occurs (as `dict.fromkeys`)."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


def features(
    prepared: Prepared, params: RecallParams, columns: DocumentColumns, dense: DenseIndex
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, matrix): the candidate documents (every ranker's, and their in-group
    neighbours) and their FEATURES, one row each; numpy throughout, no loop over the candidates."""
    count = len(columns.said)
    column = COLUMN
    seeds_list = [
        *prepared.lexical,
        *prepared.dense,
        *prepared.plain,
        *prepared.linked,
        *prepared.dated,
    ]
    if not seeds_list:
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(FEATURES)), dtype=np.float64)
    group = columns.group.values[:count]
    positions = _candidates(seeds_list, group, count)
    n = len(positions)
    by_position = np.argsort(positions)
    sorted_positions = positions[by_position]

    def row_of(ranking: list[int]) -> np.ndarray:
        return by_position[np.searchsorted(sorted_positions, np.asarray(ranking, dtype=np.int64))]

    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    rows: dict[str, np.ndarray] = {}
    for name, ranking in (
        ("lexical", prepared.lexical),
        ("dense", prepared.dense),
        ("plain", prepared.plain),
    ):
        rows[name] = row_of(ranking)
        ranks = np.arange(len(ranking), dtype=np.int64)
        for depth in (10, 60):
            x[rows[name], column[f"{name}_{depth}"]] = 1.0 / (depth + ranks + 1)
    around, plain_cosine = _cosines(x, prepared, positions, count, dense)
    _group_features(
        x,
        positions,
        group,
        columns.several_speakers.values[:count],
        by_position,
        sorted_positions,
        around,
        plain_cosine,
    )
    if prepared.named is not None:
        same = columns.said_by(positions, prepared.named)
        x[:, column["speaker"]] = same
        x[:, column["other_speaker"]] = ~same
    _time_features(x, prepared, positions, columns)
    x[:, column["caption"]] = columns.has_extra.values[positions]
    x[:, column["length"]] = columns.length.values[positions]
    x[:, column["question_share"]] = columns.question_share.values[positions]
    rrf = np.zeros(n, dtype=np.float64)
    for name, weight in (("lexical", params.lexical_weight), ("dense", params.dense_weight)):
        ranks = np.arange(len(rows[name]), dtype=np.int64)
        rrf[rows[name]] += weight / (params.rrf_k + ranks + 1)
    x[:, column["rrf"]] = rrf
    return positions, x


def _candidates(seeds_list: list[int], group: np.ndarray, count: int) -> np.ndarray:
    """The candidates in the order the rankers name them, then their in-group neighbours
    (before, then after, each seed's) not named already."""
    seeds = first_occurrences(np.asarray(seeds_list, dtype=np.int64))
    around_seeds = np.stack([seeds - 1, seeds + 1], axis=1).ravel()
    source = np.repeat(seeds, 2)
    inside = (around_seeds >= 0) & (around_seeds < count)
    around_seeds, source = around_seeds[inside], source[inside]
    around_seeds = around_seeds[group[around_seeds] == group[source]]
    return first_occurrences(np.concatenate([seeds, around_seeds]))


def _cosines(
    x: np.ndarray, prepared: Prepared, positions: np.ndarray, count: int, dense: DenseIndex
) -> tuple[np.ndarray, np.ndarray]:
    """The cosine features of the candidates; returns the candidates and their neighbours
    (`around`, ascending) with their plain cosines (for the neighbour feature)."""
    around = np.unique(np.concatenate([positions - 1, positions, positions + 1]))
    around = around[(around >= 0) & (around < count)]
    held = dense.held(around)
    cosine = np.zeros(len(around), dtype=np.float64)
    plain_cosine = np.zeros(len(around), dtype=np.float64)
    if held.any() and (prepared.vector is not None or prepared.plain_vector is not None):
        matrix = dense.rows(around[held])
        if prepared.vector is not None:
            cosine[held] = exact_cosines(matrix, prepared.vector)
        if prepared.plain_vector is not None:
            plain_cosine[held] = exact_cosines(matrix, prepared.plain_vector)
    x[:, COLUMN["cosine"]] = cosine[np.searchsorted(around, positions)]
    x[:, COLUMN["plain_cosine"]] = plain_cosine[np.searchsorted(around, positions)]
    return around, plain_cosine


def _group_features(
    x: np.ndarray,
    positions: np.ndarray,
    group: np.ndarray,
    several: np.ndarray,
    by_position: np.ndarray,
    sorted_positions: np.ndarray,
    around: np.ndarray,
    plain_cosine: np.ndarray,
) -> None:
    """Session relevance and the neighbours' features (needs the rank and cosine columns).
    `group` and `several`: per position held, its group and whether several speakers said it
    (then it has no neighbours: HybridIndex._neighbour)."""
    count = len(group)
    column = COLUMN
    n = len(positions)
    lexical_60 = x[:, column["lexical_60"]]
    # Session relevance: each candidate's group's best match among the candidates.
    own_group = group[positions]
    groups, group_row = np.unique(own_group, return_inverse=True)
    session_match = lexical_60 + 0.5 * x[:, column["plain_60"]]
    best = np.zeros(len(groups), dtype=np.float64)
    np.maximum.at(best, group_row, session_match)
    x[:, column["session"]] = best[group_row]
    # Neighbours (the document before and after, in the same group, both said by one
    # speaker): the best lexical match among those that are candidates, and the best plain
    # cosine (0: no neighbour).
    neighbour_lexical = np.zeros(n, dtype=np.float64)
    neighbour_cosine = np.full(n, -np.inf)
    has_neighbour = np.zeros(n, dtype=bool)
    for step in (-1, 1):
        other = positions + step
        valid = (other >= 0) & (other < count)
        valid[valid] = (group[other[valid]] == own_group[valid]) & ~several[other[valid]]
        valid &= ~several[positions]
        slot = np.minimum(np.searchsorted(sorted_positions, other), n - 1)
        candidate = valid & (sorted_positions[slot] == other)
        neighbour_lexical = np.maximum(
            neighbour_lexical, np.where(candidate, lexical_60[by_position[slot]], 0.0)
        )
        where = np.searchsorted(around, other[valid])
        neighbour_cosine[valid] = np.maximum(neighbour_cosine[valid], plain_cosine[where])
        has_neighbour |= valid
    x[:, column["neighbour_lexical"]] = neighbour_lexical
    x[:, column["neighbour_plain_cosine"]] = np.where(has_neighbour, neighbour_cosine, 0.0)


def _time_features(
    x: np.ndarray, prepared: Prepared, positions: np.ndarray, columns: DocumentColumns
) -> None:
    """A date the query names matched by the document's own day or a day it speaks of; a
    when-question and a document that speaks of a time."""
    column = COLUMN
    has_events = columns.has_events.values[positions]
    if prepared.dates:
        # The days said, each distinct one tested once; the days spoken of, per candidate
        # that speaks of any.
        days, day_row = np.unique(columns.said_day.values[positions], return_inverse=True)
        matched = np.asarray(
            [
                day >= 0
                and any(
                    d.matches(TimeSpan(date.fromordinal(day), date.fromordinal(day)))
                    for d in prepared.dates
                )
                for day in days.tolist()
            ],
            dtype=bool,
        )
        x[:, column["date"]] = matched[day_row]
        events = columns.events
        for i in np.flatnonzero(has_events).tolist():
            p = int(positions[i])
            x[i, column["event_date"]] = float(
                any(d.contains(e) for d in prepared.dates for e in events[p])
            )
    if prepared.asks_when:
        x[:, column["when"]] = has_events
