"""Ebook stage: the manuscript (`exports/manuscript.md`) as `exports/manuscript.epub` and
`exports/manuscript.docx`, the files writers read and send.

Contract: the input is the manuscript `tasks.export.export_manuscript` writes: a first line
`# <book title>`, then one `## Chapter N: <title>` heading per chapter, in order. Both books
carry the title as the book's title (EPUB `dc:title`, DOCX core property and title
paragraph), one chapter per EPUB content document and per DOCX Heading 1 (each chapter on a
new page), the language and, in the EPUB, an identifier that stays the same for the same
title (a UUID5 of it), so a revised book is the same publication to a reader's library.
A manuscript without the title line is refused with InvalidInputError; a failed conversion
raises ExportError. Files are written atomically and only when their bytes changed.

Same manuscript, same bytes: the dates pandoc would take from the clock (EPUB `dc:date`
and `dcterms:modified`, DOCX created/modified, zip entry times) come from SOURCE_DATE_EPOCH,
fixed here at 1980-01-01, the earliest time a zip entry can hold (Skald knows no publication
date); the identifier is derived, never random; the pandoc is the one inside the
pypandoc-binary wheel, never another on PATH whose version would change the output; and
`--sandbox` with an empty data directory keeps a user's pandoc templates and any file a
manuscript links to out of the book. The filter `ebook.lua` beside this module starts each
DOCX chapter on a new page and keeps only the text of images and links (a book of prose has
no media; a target the EPUB does not hold would make it invalid).

Why pandoc (through pypandoc-binary): one maintained converter writes both formats from the
markdown Skald already has, with valid EPUB 3 (navigation document, NCX, title page;
epubcheck reports no error) and DOCX with real heading styles, and the wheel ships the
binary, so nothing is installed outside pip. ebooklib + python-docx would need a markdown
renderer and the EPUB navigation and the DOCX styles written by hand.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pypandoc
from prefect import get_run_logger
from pydantic import BaseModel, Field

from core.content import USER_TEXT_ENCODING, write_if_changed
from core.errors import ExportError, InvalidInputError, disk_full
from tasks.policy import plain_task

EbookFormat = Literal["epub", "docx"]
EBOOK_FORMATS: tuple[EbookFormat, ...] = ("epub", "docx")

#: Skald's prompts write English; an imported book is taken to be English too.
BOOK_LANGUAGE = "en"
#: 1980-01-01T00:00:00Z: the fixed date of every book file (see the module docstring).
BOOK_DATE_EPOCH = 315532800
#: The namespace of the books' UUID5 identifiers (a UUID5 of the URL namespace, fixed forever:
#: changing it would give every book a new identity).
BOOK_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://skald.invalid/book")

# The manuscript is prose: markup-looking text in it is printed as written. Off: YAML blocks
# (a scene break `---` must not open a metadata block), raw HTML/TeX (never copied into the
# EPUB's XHTML, where it could make it invalid), `$...$` maths (prices are not formulas).
_MARKDOWN = "markdown-yaml_metadata_block-raw_html-raw_tex-raw_attribute-tex_math_dollars"
_PANDOC_WRITER: dict[EbookFormat, str] = {"epub": "epub3", "docx": "docx"}
_FILTER = Path(__file__).with_name("ebook.lua")
_TITLE_LINE = re.compile(r"\A\ufeff?[ \t]*#[ \t]+(?P<title>\S[^\n]*)")


class BookMetadata(BaseModel):
    """What the book files say about the book besides its chapters."""

    title: str = Field(min_length=1)
    language: str = BOOK_LANGUAGE
    identifier: str = Field(description="urn:uuid:<UUID5 of the title>, the EPUB's dc:identifier")


def book_metadata(manuscript: str) -> BookMetadata:
    """The metadata of a manuscript, from its first line `# <title>`."""
    match = _TITLE_LINE.match(manuscript)
    if match is None:
        first = manuscript.lstrip("\ufeff").split("\n", 1)[0][:80]
        raise InvalidInputError(
            f"the manuscript does not start with its title line '# <title>' (it starts {first!r})",
            hint="export from the manuscript `exports/manuscript.md` Skald writes",
        )
    title = match.group("title").strip()
    return BookMetadata(title=title, identifier=f"urn:uuid:{uuid.uuid5(BOOK_ID_NAMESPACE, title)}")


def bundled_pandoc() -> Path:
    """The pandoc binary inside the pypandoc-binary wheel."""
    path = Path(pypandoc.__file__).parent / "files" / "pandoc"
    if not os.access(path, os.X_OK):
        raise ExportError(
            f"pandoc is missing from the pypandoc-binary package ({path})",
            hint="reinstall Skald's dependencies (make install)",
        )
    return path


def render_ebook(manuscript: str, fmt: EbookFormat) -> bytes:
    """The manuscript as an EPUB 3 or DOCX file's bytes."""
    meta = book_metadata(manuscript)
    # The title line becomes the book's title (shift -1 promotes a leading level-1 heading to
    # the title), the chapters' level-2 headings become level 1: one chapter per EPUB file.
    args = [
        "--from",
        _MARKDOWN,
        "--to",
        _PANDOC_WRITER[fmt],
        "--shift-heading-level-by=-1",
        "--sandbox",
        "--lua-filter",
        str(_FILTER),
        "--metadata",
        f"lang={meta.language}",
        "--metadata",
        f"identifier={meta.identifier}",
        "--output",
        "-",
    ]
    with tempfile.TemporaryDirectory(prefix="skald-pandoc-") as empty:
        env = {"SOURCE_DATE_EPOCH": str(BOOK_DATE_EPOCH), "HOME": empty, "LANG": "C.UTF-8"}
        try:
            done = subprocess.run(
                [str(bundled_pandoc()), "--data-dir", empty, *args],
                input=manuscript.encode("utf-8"),
                capture_output=True,
                cwd=empty,
                env=env,
                check=False,
            )
        except OSError as exc:
            raise ExportError(f"pandoc could not be started: {exc}") from None
    if done.returncode != 0 or not done.stdout:
        why = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        raise ExportError(
            f"pandoc could not write the {fmt.upper()} (exit {done.returncode}): "
            f"{why[-1] if why else 'no output'}"
        )
    return done.stdout


def ebook_path(manuscript: Path, fmt: EbookFormat) -> Path:
    return manuscript.with_suffix(f".{fmt}")


def write_ebooks(manuscript: Path, formats: Sequence[EbookFormat] = EBOOK_FORMATS) -> list[Path]:
    """Write the manuscript's book files next to it (`manuscript.epub`, `manuscript.docx`);
    their paths, in the order of `formats`."""
    try:
        text = manuscript.read_text(encoding=USER_TEXT_ENCODING)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(
            f"cannot read the manuscript {manuscript}: {exc}", hint="write or import the book first"
        ) from None
    paths = []
    for fmt in dict.fromkeys(formats):
        path = ebook_path(manuscript, fmt)
        write_if_changed(path, render_ebook(text, fmt))
        paths.append(path)
    return paths


@plain_task("export_ebooks")
def export_ebooks(manuscript: str) -> list[str]:
    """`exports/manuscript.epub` and `exports/manuscript.docx` from `exports/manuscript.md`."""
    return [str(path) for path in write_ebooks(Path(manuscript))]


def export_ebooks_or_log(manuscript: str) -> list[str]:
    """The book files, or none: a failure is logged as an error and never fails the run that
    asked (its chapters and `manuscript.md` are written; `python -m flows.novel export`
    writes the books again)."""
    try:
        return export_ebooks(manuscript)
    except (ExportError, InvalidInputError, OSError) as exc:
        if disk_full(exc):
            raise  # not the books' failure: the run's next write fails too, so it stops here
        get_run_logger().error("the EPUB and DOCX could not be written (continuing): %s", exc)
        return []
