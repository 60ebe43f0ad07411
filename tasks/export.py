"""Finalize and export stage: chapter markdown files and the manuscript.

Files are written atomically and only when their content changed, so re-running a
finished project leaves every file (and its mtime) as it was.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from core.content import USER_TEXT_ENCODING, ContentRef, write_if_changed
from core.grounding import chapter_heading
from tasks.policy import plain_task
from tasks.services import Services


def chapter_path(project_dir: Path, number: int) -> Path:
    return project_dir / "chapters" / f"chapter_{number:03d}.md"


def chapter_markdown(number: int, title: str, text: str) -> str:
    return f"# {chapter_heading(number, title)}\n\n{text.strip()}\n"


def set_aside(project_dir: Path, files: list[Path]) -> Path:
    """Move chapter files to `chapters/replaced/<UTC time>/`, kept, never deleted; returns the
    folder. Named by the clock on purpose (setting the same chapter aside twice keeps both):
    nothing reads it back (chapters are chapters/chapter_*.md, not recursive) and its name is
    only logged, so it reaches no compared output."""
    aside = project_dir / "chapters" / "replaced" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    aside.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.move(str(path), aside / path.name)
    return aside


@plain_task("finalize_chapter")
def finalize_chapter(services: Services, number: int, title: str, chapter_text: ContentRef) -> str:
    """Write `chapters/chapter_NNN.md` and show it in the Prefect UI; returns its path. A file
    there with other text (the writer's hand edits of a chapter rolled back with `kg rollback`
    and now written again) is set aside first, never overwritten."""
    path = chapter_path(services.settings.project_dir, number)
    markdown = chapter_markdown(number, title, services.content.get_text(chapter_text))
    if path.is_file() and path.read_bytes() != markdown.encode("utf-8"):
        aside = set_aside(services.settings.project_dir, [path])
        get_run_logger().warning(
            "chapter %d: %s held other text than the chapter written now (edited by hand?); "
            "kept in %s",
            number,
            path.name,
            aside,
        )
    write_if_changed(path, markdown)
    create_markdown_artifact(
        key=f"chapter-{number:03d}", markdown=markdown, description=chapter_heading(number, title)
    )
    return str(path)


def restore_chapter_file(services: Services, number: int, title: str, text: ContentRef) -> str:
    """Write a written chapter's deleted `chapters/chapter_NNN.md` again from its text as written
    (checked against its hash), as `finalize_chapter` wrote it; returns its path. Raises
    ContentIntegrityError when the stored text is missing or changed."""
    path = chapter_path(services.settings.project_dir, number)
    write_if_changed(path, chapter_markdown(number, title, services.content.get_text(text)))
    return str(path)


@plain_task("publish_chapter_quality")
def publish_chapter_quality(services: Services, number: int, rows: list[dict[str, object]]) -> None:
    """The chapter's quality table (scene and chapter prose metrics, editor scores, flags) in
    the Prefect UI; the same rows go to `.saga/quality/chapter_NNN.json`."""
    create_table_artifact(
        key=f"chapter-{number:03d}-quality",
        table=rows,
        description=f"Chapter {number}: degeneration guard metrics and editor scores",
    )
    path = services.settings.saga_dir / "quality" / f"chapter_{number:03d}.json"
    write_if_changed(path, json.dumps(rows, indent=2) + "\n")


def manuscript_markdown(title: str, chapters: list[str]) -> str:
    """The manuscript: `# <title>`, then the chapter files' markdown in order, each chapter's
    heading one level down (`## Chapter N: <title>`)."""
    return "\n".join(
        [f"# {title}\n", *(text.replace("# Chapter", "## Chapter", 1) for text in chapters)]
    )


def manuscript_path(project_dir: Path) -> Path:
    return project_dir / "exports" / "manuscript.md"


@plain_task("export_manuscript")
def export_manuscript(services: Services, title: str, chapter_count: int) -> str:
    """Concatenate finished chapters into `exports/manuscript.md`."""
    chapters = [
        path.read_text(encoding=USER_TEXT_ENCODING)
        for number in range(1, chapter_count + 1)
        if (path := chapter_path(services.settings.project_dir, number)).exists()
    ]
    out = manuscript_path(services.settings.project_dir)
    write_if_changed(out, manuscript_markdown(title, chapters))
    return str(out)
