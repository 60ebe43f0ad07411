"""Determinism and crash equivalence of the novel pipeline, in small (bench/crash/novel.py is the
full form): a scripted 2-chapter book written twice, under two hash seeds in two directories,
is the same bytes; and a run SIGKILLed (its whole process group) at seeded moments and resumed
writes the same bytes as the run that was never interrupted. Healing and QA run after chapter
2 (`qa_every=2`), so their graph writes, QA report and the codex's QA label are compared too.

The scripted long book (tests/support/long_story.py) is served from its own process; each run is
`python -m flows.novel` with its own embedded graph. No timing is asserted: a kill that comes
after the run has finished is fine, the assertion is identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from bench.crash.harness import differing
from bench.crash.novel import GRAPH_EXPORT, Book, RunResult, clean_run, killed_by_progress
from bench.long_book import ScriptedServer

BOOK = Book(chapters=2, scenes=2, qa_every=2, timeout_s=900)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer(BOOK.chapters, BOOK.scenes)
    yield scripted
    scripted.close()


@pytest.fixture(scope="module")
def book(prefect_api: str) -> Book:
    """BOOK, its runs reporting to the session's Prefect API (no temporary server per start)."""
    return replace(BOOK, prefect_api_url=prefect_api)


@pytest.fixture(scope="module")
def uninterrupted(
    server: ScriptedServer, book: Book, tmp_path_factory: pytest.TempPathFactory
) -> RunResult:
    result = clean_run(server, tmp_path_factory.mktemp("clean"), book, hash_seed=1)
    assert result.exit_code == 0, (result.project.parent / "run.log").read_text()[-4000:]
    return result


def test_two_hash_seeds_in_two_directories_write_the_same_bytes(
    server: ScriptedServer,
    book: Book,
    uninterrupted: RunResult,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    other = clean_run(
        server, tmp_path_factory.mktemp("another") / "deeper" / "place", book, hash_seed=2
    )
    assert other.exit_code == 0, (other.project.parent / "run.log").read_text()[-4000:]
    assert GRAPH_EXPORT in uninterrupted.digest
    assert {f"chapters/chapter_{n:03d}.md" for n in (1, 2)} <= set(uninterrupted.digest)
    assert any(name.startswith("exports/codex") for name in uninterrupted.digest)
    assert ".saga/qa/state.json" in uninterrupted.digest  # healing and QA ran inside the book
    # The records of the book's plan and of each written chapter a later run follows.
    assert {".saga/initialized.json", ".saga/written/chapter_002.json"} <= set(uninterrupted.digest)
    assert any(name.startswith(".saga/qa/qa-ch0002-cs") for name in uninterrupted.digest)
    assert differing(uninterrupted.digest, other.digest) == []
    assert other.requests == uninterrupted.requests


def test_a_killed_and_resumed_run_writes_what_the_uninterrupted_run_wrote(
    server: ScriptedServer,
    book: Book,
    uninterrupted: RunResult,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Each kill comes once the series has made a seeded number of LLM calls (and up to 2 s more),
    # so it lands in the work however slow the machine; one after the end would be harmless.
    resumed, series = killed_by_progress(
        server,
        tmp_path_factory.mktemp("killed"),
        book,
        hash_seed=7,
        seed=3,
        kills=2,
        calls=uninterrupted.requests,
    )
    assert series.final_exit == 0, (resumed.project.parent / "run.log").read_text()[-4000:]
    assert differing(uninterrupted.digest, resumed.digest) == []
