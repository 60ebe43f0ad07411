"""bench.evidence_audit: the protocol re-scored against an audit's evidence (its files written
here in the layout of dial481/locomo-audit's `audit/errors_conv_<k>.json`, about
tests/data/locomo-901, whose dialogue text is ours)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.evidence_audit import apply_audit
from bench.recall_folds import load, scores
from core.errors import InvalidInputError
from core.recall import DEFAULT_PARAMS
from tasks.dialogue.evidence_audit import EvidenceAudit, read_audit
from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support.cli import run_module

DIALOGUE = REPO_ROOT / "tests" / "data" / "locomo-901.turns.jsonl"


def _entry(number: int, question: str, cited: list[str], correct: list[str]) -> dict[str, object]:
    return {
        "question_id": f"locomo_0_qa{number}",
        "question": question,
        "golden_answer": "-",
        "category": 4,
        "error_type": "WRONG_CITATION",
        "cited_evidence": cited,
        "correct_evidence": correct,
        "reasoning": "-",
    }


def _write(folder: Path, entries: list[dict[str, object]]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "errors_conv_0.json").write_text(json.dumps(entries), encoding="utf-8")
    return folder


def test_scores_against_the_audit_change_only_the_questions_it_re_cites(tmp_path: Path) -> None:
    dialogue = load(DIALOGUE, tmp_path / "embeddings")
    by_number = {q.number: q for q in dialogue.questions}
    assert sorted(by_number) == [0, 1, 2, 3, 4]  # categories 1-4 with evidence, by their line
    ranked = [
        dialogue.refs[p] for p, _, _ in dialogue.index.rank(by_number[0].prepared, DEFAULT_PARAMS)
    ]
    top, below = ranked[0], ranked[7]  # in its top 5, and below it
    entries = [
        # Re-cited: its number and words match (case and spaces aside).
        _entry(0, "  what is the name of ilse's FIRST greyhound?", ["D1:1"], [below]),
        _entry(1, by_number[1].published, ["D1:6"], [top]),
        # Look-alikes, none re-cited: another question's words under a number of ours; the
        # audit's evidence as the question cites it; a turn this dialogue does not have.
        _entry(2, "Who painted the corn exchange?", ["D1:6"], [below]),
        _entry(3, by_number[3].published, ["D2:4", "D3:5"], ["D3:5", "D2:4"]),
        _entry(4, by_number[4].published, ["D1:3"], ["D9:1"]),
    ]
    match = apply_audit([dialogue], read_audit(_write(tmp_path / "audit", entries)))
    assert (match.disputed, match.recited) == (4, 2)
    published = scores(dialogue, DEFAULT_PARAMS)
    audited = scores(dialogue, DEFAULT_PARAMS, audited=True)
    numbers = [q.number for q in dialogue.questions]
    assert audited[numbers.index(0)][1] == 0.0  # its audited evidence is not in its top 5
    assert published[numbers.index(0)][1] == 1.0  # the published one is
    second = dialogue.index.rank(by_number[1].prepared, DEFAULT_PARAMS)[:5]
    assert audited[numbers.index(1)][1] == float(top in {dialogue.refs[p] for p, _, _ in second})
    for n in (2, 3, 4):
        assert audited[numbers.index(n)] == published[numbers.index(n)]
    # Applied again without the entries, nothing is re-cited and the scores are the published.
    assert apply_audit([dialogue], EvidenceAudit(folder="-", entries=[])).recited == 0
    assert scores(dialogue, DEFAULT_PARAMS, audited=True) == published


def test_a_folder_that_is_not_an_audit_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no errors_conv_"):
        read_audit(tmp_path)
    (tmp_path / "errors_conv_3.json").write_text('[{"question_id": "q1"}]', encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"errors_conv_3\.json: not an evidence audit"):
        read_audit(tmp_path)
    _write(tmp_path, [_entry(1, "Q?", ["D1:1"], ["D1:2"]) | {"question_id": "conv-26_q1"}])
    (tmp_path / "errors_conv_3.json").unlink()
    with pytest.raises(InvalidInputError, match="'conv-26_q1' is not locomo_<k>_qa<n>"):
        read_audit(tmp_path)


def test_the_protocol_refuses_a_bad_audit_folder_in_one_line_before_embedding(
    tmp_path: Path,
) -> None:
    done = run_module(
        "bench.recall_protocol",
        "--evidence-audit",
        str(tmp_path),
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        f"error: {tmp_path}: no errors_conv_*.json files (the audit/ folder of dial481/locomo-audit)"
    )
    assert "embedder:" not in done.stdout
