"""The book as EPUB and DOCX (tasks/ebook.py): a scripted 3-chapter manuscript, built the way
`export_manuscript` builds it, through the real pandoc; the files read back as a reader's
software reads them (tests/support/ebook_reading.py) and checked by Debian's epubcheck."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from core.errors import InvalidInputError
from tasks.ebook import BOOK_ID_NAMESPACE, book_metadata, render_ebook, write_ebooks
from tasks.export import chapter_markdown, manuscript_markdown
from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support.ebook_reading import epubcheck_command, read_docx, read_epub, run_epubcheck

TITLE = "The Salt Road"
HEADINGS = ["Chapter 1: Harbor", "Chapter 2: The Ledger", "Chapter 3: Night Tide"]
# Prose that looks like markup: a YAML block (would vanish into metadata), raw HTML (would
# be copied into the XHTML), dollar amounts (would be maths), an image and a link whose
# targets the book cannot hold.
CHAPTERS = [
    chapter_markdown(
        1,
        "Harbor",
        "Ilse counted the crates on the quay.\n\n* * *\n\nThe captain asked for the ledger.",
    ),
    chapter_markdown(
        2,
        "Chapter 2: The Ledger",
        "The ledger paid $5 and $10 a crate.\n\n---\ntitle: Not the book\n...\n\n"
        "Her note said <br> and <div>nothing</div>.",
    ),
    chapter_markdown(
        3,
        "Night Tide",
        "She drew ![the reef](reef.png) on the chart, as [the map](map.html) showed.",
    ),
]


def manuscript(chapters: list[str] = CHAPTERS, title: str = TITLE) -> str:
    return manuscript_markdown(title, chapters)


@pytest.fixture(scope="module")
def books(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    exports = tmp_path_factory.mktemp("book") / "exports"
    exports.mkdir()
    source = exports / "manuscript.md"
    source.write_text(manuscript(), encoding="utf-8")
    epub, docx = write_ebooks(source)
    return {"manuscript": source, "epub": epub, "docx": docx}


def epub_page_text(path: Path, number: int) -> str:
    with zipfile.ZipFile(path) as book:
        return book.read(f"EPUB/text/ch{number:03d}.xhtml").decode("utf-8")


def test_epub_is_the_book_with_its_chapters_in_order(books: dict[str, Path]) -> None:
    assert (
        books["epub"].name == "manuscript.epub"
        and books["epub"].parent == books["manuscript"].parent
    )
    book = read_epub(books["epub"])
    assert book.title == TITLE
    assert book.language == "en"
    assert book.identifier == f"urn:uuid:{uuid.uuid5(BOOK_ID_NAMESPACE, TITLE)}"
    assert book.title_page == TITLE
    assert book.chapter_headings == HEADINGS
    assert book.toc == HEADINGS
    ledger, night = epub_page_text(books["epub"], 2), epub_page_text(books["epub"], 3)
    assert "title: Not the book" in ledger, (
        "a YAML-looking block in the prose stays prose, not metadata"
    )
    assert "$5 and $10" in ledger
    assert (
        "&lt;br&gt;" in ledger
        and "<br" not in ledger
        and "&lt;div&gt;nothing&lt;/div&gt;" in ledger
    )
    assert "as the map showed" in night and "map.html" not in night and "reef.png" not in night


def test_epubcheck_reports_no_error(books: dict[str, Path]) -> None:
    command = epubcheck_command()
    if command is None:
        pytest.skip("epubcheck is not installed (Debian package epubcheck; .ci/run installs it)")
    result = run_epubcheck(command, books["epub"])
    assert (result.fatals, result.errors) == (0, 0), result.output[-3000:]
    assert result.exit_code == 0, result.output[-3000:]


def test_epubcheck_finds_the_error_a_broken_epub_has(
    books: dict[str, Path], tmp_path: Path
) -> None:
    """The look-alike: the same book with a chapter its spine names taken out is not valid."""
    command = epubcheck_command()
    if command is None:
        pytest.skip("epubcheck is not installed (Debian package epubcheck; .ci/run installs it)")
    broken = tmp_path / "broken.epub"
    with zipfile.ZipFile(books["epub"]) as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            if item.filename != "EPUB/text/ch002.xhtml":
                target.writestr(item, source.read(item.filename))
    assert run_epubcheck(command, broken).errors > 0


def test_docx_is_the_book_with_a_heading_and_a_page_per_chapter(books: dict[str, Path]) -> None:
    book = read_docx(books["docx"])
    assert book.title == TITLE and book.title_paragraph == TITLE
    assert book.headings == HEADINGS
    assert book.page_breaks == len(HEADINGS)


def test_same_manuscript_same_bytes_in_another_process_and_hash_seed(
    books: dict[str, Path], tmp_path: Path
) -> None:
    """`python -m flows.novel export` in a child with another PYTHONHASHSEED writes the bytes
    this process wrote."""
    project = tmp_path / "project"
    (project / "exports").mkdir(parents=True)
    (project / "exports" / "manuscript.md").write_bytes(books["manuscript"].read_bytes())
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "PYTHONHASHSEED": "4242"}
    cmd = [sys.executable, "-m", "flows.novel", "export", "--project-dir", str(project)]
    result = subprocess.run(
        cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for fmt in ("epub", "docx"):
        assert (project / "exports" / f"manuscript.{fmt}").read_bytes() == books[
            fmt
        ].read_bytes(), fmt


def test_files_are_rewritten_only_when_the_book_changed(tmp_path: Path) -> None:
    source = tmp_path / "manuscript.md"
    source.write_text(manuscript(), encoding="utf-8")
    epub, docx = write_ebooks(source)
    stamps = {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in (epub, docx)}
    assert write_ebooks(source) == [epub, docx]
    assert {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in (epub, docx)} == stamps

    revised = [*CHAPTERS[:2], chapter_markdown(3, "Night Tide", "She sailed at midnight.")]
    source.write_text(manuscript(revised), encoding="utf-8")
    assert write_ebooks(source, ["epub"]) == [epub]
    assert epub.read_bytes() != stamps[epub][1] and docx.read_bytes() == stamps[docx][1]
    assert read_epub(epub).identifier == book_metadata(manuscript()).identifier, (
        "a revision is the same book"
    )
    assert (
        book_metadata(manuscript(title="The Salt Road Home")).identifier
        != read_epub(epub).identifier
    )


@pytest.mark.parametrize(
    "text", ["## Chapter 1: Harbor\n\nText.\n", "#The Salt Road\n\nText.\n", "\n# Late title\n", ""]
)
def test_a_manuscript_without_its_title_line_is_refused(text: str) -> None:
    with pytest.raises(InvalidInputError, match="does not start with its title line"):
        render_ebook(text, "epub")


def test_the_title_line_is_the_books_title() -> None:
    assert book_metadata("# The Salt Road \n\n## Chapter 1: Harbor\n").title == "The Salt Road"


def test_export_of_a_project_without_a_manuscript_is_refused(tmp_path: Path) -> None:
    from flows.novel import main

    with pytest.raises(InvalidInputError, match="has no manuscript"):
        main(["export", "--project-dir", str(tmp_path)])
    assert not (tmp_path / "exports").exists()
