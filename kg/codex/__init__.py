"""The codex: the world a book (or a sidecar conversation) built, as one HTML page a writer
reads while writing, with the relationships drawn as an interactive graph.

- `novel`: the book's page model as of a chapter (entities with their sheet, status and
  evidence, relationships with their history, the timeline, the quality tables, QA findings);
- `dialogue`: the same page for one sidecar conversation (entities, relations with their
  event history, milestones);
- `render`: the page as one self-contained HTML file (template, style, script and the graph
  library inlined: it opens from disk with no network and no server);
- `cypher`: the page's reads; `records`: their rows as frozen models, and the two read
  transactions;
- `relations`: a book's relationships with their statements and the spans they hold in;
- `quality`: the project's files a book's page shows (quality tables, the newest QA report).

`python -m kg codex` writes it; the novel flow writes `exports/codex.html` after each chapter
(tasks/codex.py) and `python -m flows.maintenance qa` marks its findings in it.
"""

from __future__ import annotations

from pathlib import Path

from core.content import write_if_changed
from kg.codex.dialogue import build_dialogue_codex
from kg.codex.models import CodexPage
from kg.codex.novel import build_novel_codex
from kg.codex.quality import latest_qa_report
from kg.codex.render import render_codex

#: Where a project's codex lives.
CODEX_FILE = Path("exports") / "codex.html"


def write_codex(page: CodexPage, path: Path) -> bool:
    """Render `page` to `path` (atomically, and only when it changed); True if written."""
    return write_if_changed(path, render_codex(page))


__all__ = [
    "CODEX_FILE",
    "CodexPage",
    "build_dialogue_codex",
    "build_novel_codex",
    "latest_qa_report",
    "render_codex",
    "write_codex",
]
