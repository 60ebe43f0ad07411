"""Codex stage: write `exports/codex.html`, the world the book built as one page (kg/codex),
and link the Prefect run to it.

Never cached (it reads the graph as it is) and written only when its text changed, so a
re-run of a finished book leaves the file and its mtime alone. The page holds the whole
book, so building it costs what the book's size demands; `codex_due` spaces the rewrites of
a long book so that their cost per chapter stays flat (bench/long_book.py measures it). The link artifact (key
`codex`) carries the file's `file://` address: a run in the Prefect UI leads to the world.
"""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_link_artifact

from core.errors import disk_full
from kg.codex import CODEX_FILE, build_novel_codex, write_codex
from tasks.policy import graph_task
from tasks.services import Services

#: Up to this many chapters the codex is rewritten after every chapter; past it, every
#: ceil(chapters / FLAT_CODEX_CHAPTERS) chapters (and after the last chapter of every run), so a
#: page that grows with the book is rebuilt about FLAT_CODEX_CHAPTERS times per that many
#: chapters written and its cost per chapter does not grow: at chapter 100 it lags at most
#: 4 chapters behind while the run goes on, and is current when the run ends.
FLAT_CODEX_CHAPTERS = 20


def codex_due(chapter: int, last_of_run: int) -> bool:
    """Whether the novel flow rewrites the codex after `chapter` (the run stops after
    `last_of_run`)."""
    every = max(1, -(-chapter // FLAT_CODEX_CHAPTERS))
    return chapter >= last_of_run or chapter % every == 0


@graph_task("write_codex")
def write_project_codex(services: Services) -> str:
    """Build the codex as of the latest chapter (with the newest QA findings) and write it;
    returns its path."""
    settings = services.settings
    page = build_novel_codex(
        services.graph_reader, settings.saga_dir, project_name=settings.project_dir.name
    )
    path = settings.project_dir / CODEX_FILE
    written = write_codex(page, path)
    where = "the story bible" if page.as_of == 0 else f"chapter {page.as_of}"
    get_run_logger().info(
        "codex as of %s (%d entities, %d relationships%s): %s%s",
        where,
        page.stats.entities,
        page.stats.relationships,
        f", {len(page.findings)} QA findings" if page.findings else "",
        path,
        "" if written else " (unchanged)",
    )
    create_link_artifact(
        key="codex",
        link=path.resolve().as_uri(),
        link_text=f"Codex of {page.title}",
        description=f"The world as of {where}: characters, places, items, the relationship "
        "graph, the timeline, chapter quality (open the file in a browser)",
    )
    return str(path)


def write_codex_or_log(services: Services, when: str) -> str | None:
    """Write the codex; the codex is a view of the graph, so a failure to write it is logged as
    an error and never fails the run that asked (its chapters are committed and written)."""
    try:
        return write_project_codex(services)
    except Exception as exc:
        if disk_full(exc):
            raise  # not the codex's failure: the run's next write fails too, so it stops here
        get_run_logger().error("codex %s could not be written (continuing): %s", when, exc)
        return None
