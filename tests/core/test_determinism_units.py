"""Orders that reach a prompt or an output file are explicit (issue 33): ties broken by stable
position, however an index grew, and no clock in the codex. Each rule with its look-alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.recall import HybridIndex, MemoryDoc, RecallParams

RRF = RecallParams(fusion=None)


def _scene(i: int, text: str) -> MemoryDoc:
    return MemoryDoc(key=f"s{i}", text=text, group=str(i))


def _grown(texts: list[str], batches: list[int], vectors: np.ndarray | None = None) -> HybridIndex:
    """An index of `texts` added in batches of the given sizes (one tantivy segment each)."""
    index = HybridIndex(4, neighbours=False)
    start = 0
    for size in batches:
        docs = [_scene(i, texts[i]) for i in range(start, start + size)]
        index.add(docs, vectors[start : start + size] if vectors is not None else None)
        start += size
    return index


def test_equal_lexical_scores_rank_by_position_however_the_index_grew() -> None:
    # Five scenes that score the same for the query (the same words, the same length), and
    # one that does not match at all: grown batch by batch (a segment per batch, as a book
    # grows chapter by chapter) and built at once (as after a restart). Without the tie rule a
    # grown index ranked them [3, 4, 5, 0, 1] here, and in another order in each new process.
    texts = [
        f"Mara waited at the {place} lighthouse"
        for place in ("north", "south", "east", "west", "old")
    ]
    texts.insert(2, "Tobias rowed across the harbour")
    grown = _grown(texts, [1, 1, 1, 1, 1, 1])
    rebuilt = _grown(texts, [6])
    grown_ranking = grown.lexical.ranking("lighthouse", 100, len(grown))
    assert (
        grown_ranking == rebuilt.lexical.ranking("lighthouse", 100, len(rebuilt)) == [0, 1, 3, 4, 5]
    )
    # The cut of a tie group keeps the first positions, also when only part of it fits.
    assert (
        grown.lexical.ranking("lighthouse", 2, len(grown))
        == rebuilt.lexical.ranking("lighthouse", 2, len(rebuilt))
        == [0, 1]
    )
    # Look-alike: a better score still wins over an earlier position.
    assert grown.lexical.ranking("Mara old lighthouse", 2, len(grown))[0] == 5


def test_equal_distances_rank_by_position_and_the_fused_search_agrees() -> None:
    texts = [f"Scene {n}: the ledger burned" for n in range(4)]
    same = np.tile(np.asarray([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32), (4, 1))
    grown = _grown(texts, [1, 1, 2], same)
    rebuilt = _grown(texts, [4], same)
    query = np.asarray([1.0, 0.0, 0.0, 0.0], dtype=np.float32)
    assert grown.dense.ranking(query, 100) == rebuilt.dense.ranking(query, 100) == [0, 1, 2, 3]
    keys = [hit.key for hit in grown.search("ledger", query, 3, params=RRF)]
    assert (
        keys
        == [hit.key for hit in rebuilt.search("ledger", query, 3, params=RRF)]
        == ["s0", "s1", "s2"]
    )
    # Look-alike: a closer vector comes first whatever its position.
    closer = np.asarray([0.0, 1.0, 0.0, 0.0], dtype=np.float32)
    vectors = np.stack([query, query, closer, query])
    assert _grown(texts, [4], vectors).dense.ranking(closer, 100)[0] == 2


def _qa_report(saga: Path, stamp: str) -> None:
    (saga / "qa").mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(
        [
            {
                "run_at": "x",
                "check": "c",
                "severity": "warning",
                "message": "m",
                "entity_ids": [],
                "entity_names": [],
                "chapters": [2],
            }
        ]
    )
    pq.write_table(table, saga / "qa" / f"qa-{stamp}.parquet")


def test_the_codex_names_a_qa_run_by_its_chapter_not_its_time(tmp_path: Path) -> None:
    from kg.codex import latest_qa_report

    saga = tmp_path / ".saga"
    _qa_report(saga, "20260101T100000Z")
    _qa_report(saga, "20260102T100000Z")
    (saga / "qa" / "state.json").write_text('{"through": 4, "seq": 5}', encoding="utf-8")
    label, rows = latest_qa_report(saga)
    assert label == "after chapter 4" and rows[0]["chapters"] == [2]
    # Look-alike: a report with no state (written before it was kept) still says when it ran.
    (saga / "qa" / "state.json").unlink()
    assert latest_qa_report(saga)[0] == "of 2026-01-02 10:00 UTC"


def test_the_codex_reads_the_qa_report_of_the_chapter_qa_got_to(tmp_path: Path) -> None:
    """Reports are named by chapter and change-set (tasks/qa.py): the codex shows the one
    state.json names, so a report left behind by a rollback is not shown as the newest."""
    from kg.codex import latest_qa_report

    saga = tmp_path / ".saga"
    _qa_report(
        saga, "20270101T100000Z"
    )  # an old, clock-named report: older than any story-named one
    _qa_report(saga, "ch0002-cs000003")
    _qa_report(saga, "ch0004-cs000010")
    _qa_report(saga, "ch0012-cs000009")
    assert latest_qa_report(saga)[0] == "after chapter 12"  # no state: the highest chapter
    (saga / "qa" / "state.json").write_text('{"through": 4, "seq": 10}', encoding="utf-8")
    assert latest_qa_report(saga)[0] == "after chapter 4"
    # Rolled back to chapter 2 and checked again: the later reports stay, as history, unshown.
    (saga / "qa" / "state.json").write_text('{"through": 2, "seq": 3}', encoding="utf-8")
    assert latest_qa_report(saga)[0] == "after chapter 2"
