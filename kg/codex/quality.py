"""The project's own files a book's codex shows: each chapter's quality table
(`.saga/quality/chapter_NNN.json`, scene rows then the chapter row) and the newest QA report
(`.saga/qa/qa-chNNNN-csNNNNNN.parquet`, read with pyarrow, which wrote it).

A quality row is the table's JSON object as written (its columns are open: a new gauge is a
new column), so it stays a mapping; what the page shows of it is `QualityChapter` and a
chapter's flags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from kg.codex.models import QualityChapter

#: One row of a chapter's quality table: the JSON object as written (open columns).
QualityRow = dict[str, Any]

#: Quality-table columns shown first (the rest follow in the file's order).
QUALITY_COLUMNS = (
    "words",
    "distinct_trigrams",
    "max_sentence_repeats",
    "compression_ratio",
    "mean_sentence_words",
    "max_sentence_words",
    "list_share",
    "plan_problems",
    "facts_kept",
    "facts_dropped",
    "editor_mean",
    "coherence",
    "prose_quality",
    "plot_advancement",
    "pacing",
    "tone_consistency",
    "drafts",
    "clean",
    "failures",
)
_QA_STAMP = re.compile(r"^qa-(\d{8}T\d{6}Z)$")  # a report from before story-time names
_QA_STORY = re.compile(r"^qa-ch(\d+)-cs(\d+)$")


def chapter_quality(saga_dir: Path, chapters: Iterable[int]) -> dict[int, list[QualityRow]]:
    """Each chapter's quality rows (scene rows, then the chapter row), where the file exists."""
    found: dict[int, list[QualityRow]] = {}
    for number in chapters:
        path = saga_dir / "quality" / f"chapter_{number:03d}.json"
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            rows = [
                {
                    "part": "chapter",
                    "failures": f"unreadable quality table {path.name}",
                    "clean": False,
                }
            ]
        if isinstance(rows, list):
            found[number] = [r for r in rows if isinstance(r, dict)]
    return found


def latest_qa_report(saga_dir: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """(which QA run it is, its findings) from the newest `.saga/qa/qa-chNNNN-csNNNNNN.parquet`.

    The run is named by the chapter it checked through, not by the clock: the codex is the
    same bytes however long the book took to write, or how often it was interrupted. The
    newest is the one `.saga/qa/state.json` names (a rollback can leave a report for a later
    chapter behind), else the highest chapter and change-set; reports named by their UTC
    time (written before story-time names) count as older, and are labelled by the state's
    chapter as before, or by their time without a state."""
    # (story-named, chapter, change-set, UTC time): story-named reports sort after the old ones.
    reports: dict[Path, tuple[int, int, int, str]] = {}
    for p in (saga_dir / "qa").glob("qa-*.parquet"):
        if story := _QA_STORY.match(p.stem):
            reports[p] = (1, int(story.group(1)), int(story.group(2)), "")
        elif old := _QA_STAMP.match(p.stem):
            reports[p] = (0, 0, 0, old.group(1))
    if not reports:
        return None, []
    try:
        state = json.loads((saga_dir / "qa" / "state.json").read_text(encoding="utf-8"))
        current = (1, int(state["through"]), int(state["seq"]), "")
    except (OSError, ValueError, TypeError, KeyError):
        current = None
    path = next((p for p, key in reports.items() if key == current), None) or max(
        reports, key=reports.__getitem__
    )
    story_named, through, _, stamp = reports[path]
    if story_named:
        label = f"after chapter {through}"
    elif current is not None and current[1] > 0:
        label = f"after chapter {current[1]}"
    else:
        label = f"of {datetime.strptime(stamp, '%Y%m%dT%H%M%SZ'):%Y-%m-%d %H:%M} UTC"
    return label, pq.read_table(path).to_pylist()


def chapter_flags(rows: list[QualityRow]) -> list[str]:
    """Why a chapter is flagged: its chapter row's failures (the degeneration guard) and the
    scenes' plan problems."""
    flags = []
    for row in rows:
        part = str(row.get("part", ""))
        if part == "chapter":
            if row.get("clean") is False and row.get("failures"):
                flags += [f for f in str(row["failures"]).split("; ") if f]
        elif row.get("plan_problems"):
            flags.append(f"{part}: {row['plan_problems']}")
    return flags


def quality_table(
    quality: dict[int, list[QualityRow]], titles: dict[int, str]
) -> tuple[list[QualityChapter], list[str]]:
    chapters: list[QualityChapter] = []
    seen: dict[str, None] = {}
    for number in sorted(quality):
        row = next((r for r in quality[number] if r.get("part") == "chapter"), None)
        if row is None:
            continue
        values = {
            k: v
            for k, v in row.items()
            if k != "part" and (v is None or isinstance(v, str | int | float))
        }
        seen.update(dict.fromkeys(values))
        chapters.append(
            QualityChapter(
                chapter=number,
                title=titles.get(number, ""),
                values=values,
                flags=chapter_flags(quality[number]),
            )
        )
    columns = [c for c in QUALITY_COLUMNS if c in seen] + [
        c for c in seen if c not in QUALITY_COLUMNS
    ]
    return chapters, columns
