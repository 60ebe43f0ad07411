"""Reading the book files Skald writes (tasks/ebook.py) the way a reader does: the EPUB's
package document, spine and navigation; the DOCX's core properties and paragraph styles; and
Debian's `epubcheck`, the EPUB validator, where it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from pathlib import Path, PurePosixPath
from xml.etree import ElementTree

from pydantic import BaseModel

NS = {
    "container": "urn:oasis:names:tc:opendocument:xmlns:container",
    "opf": "http://www.idpf.org/2007/opf",
    "dc": "http://purl.org/dc/elements/1.1/",
    "xhtml": "http://www.w3.org/1999/xhtml",
    "epub": "http://www.idpf.org/2007/ops",
    "w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
    "cp": "http://schemas.openxmlformats.org/package/2006/metadata/core-properties",
}


class EpubBook(BaseModel):
    title: str
    language: str
    identifier: str
    title_page: str  # the front matter's text
    chapter_headings: list[str]  # each body-matter document's first h1, in reading order
    toc: list[str]  # the navigation document's table of contents


class DocxBook(BaseModel):
    title: str  # the core property
    title_paragraph: str
    headings: list[str]  # Heading1 paragraphs in order
    page_breaks: int


def _text(element: ElementTree.Element) -> str:
    return "".join(element.itertext()).strip()


def read_epub(path: Path) -> EpubBook:
    with zipfile.ZipFile(path) as book:
        assert book.namelist()[0] == "mimetype" and book.read("mimetype") == b"application/epub+zip"
        container = ElementTree.fromstring(book.read("META-INF/container.xml"))
        rootfile = container.find(".//container:rootfile", NS)
        assert rootfile is not None
        opf_path = PurePosixPath(rootfile.attrib["full-path"])
        opf = ElementTree.fromstring(book.read(str(opf_path)))
        metadata = opf.find("opf:metadata", NS)
        assert metadata is not None
        hrefs = {
            item.attrib["id"]: (item.attrib["href"], item.attrib.get("properties", ""))
            for item in opf.iterfind("opf:manifest/opf:item", NS)
        }
        headings, front = [], []
        for itemref in opf.iterfind("opf:spine/opf:itemref", NS):
            href, _ = hrefs[itemref.attrib["idref"]]
            body = ElementTree.fromstring(book.read(str(opf_path.parent / href))).find(
                "xhtml:body", NS
            )
            assert body is not None
            if body.attrib.get(f"{{{NS['epub']}}}type") == "bodymatter":
                h1 = body.find(".//xhtml:h1", NS)
                headings.append(_text(h1) if h1 is not None else "")
            else:
                front.append(_text(body))
        nav_href = next(href for href, properties in hrefs.values() if "nav" in properties.split())
        nav = ElementTree.fromstring(book.read(str(opf_path.parent / nav_href)))
        toc = next(
            n
            for n in nav.iterfind(".//xhtml:nav", NS)
            if n.attrib.get(f"{{{NS['epub']}}}type") == "toc"
        )
        return EpubBook(
            title=_text(metadata.find("dc:title", NS)),  # type: ignore[arg-type]
            language=_text(metadata.find("dc:language", NS)),  # type: ignore[arg-type]
            identifier=_text(metadata.find("dc:identifier", NS)),  # type: ignore[arg-type]
            title_page="\n".join(front),
            chapter_headings=headings,
            toc=[_text(a) for a in toc.iterfind(".//xhtml:a", NS)],
        )


def read_docx(path: Path) -> DocxBook:
    with zipfile.ZipFile(path) as book:
        core = ElementTree.fromstring(book.read("docProps/core.xml"))
        document = ElementTree.fromstring(book.read("word/document.xml"))
    styled: list[tuple[str, str]] = []
    for paragraph in document.iterfind(".//w:body/w:p", NS):
        style = paragraph.find("w:pPr/w:pStyle", NS)
        styled.append(
            (style.attrib[f"{{{NS['w']}}}val"] if style is not None else "", _text(paragraph))
        )
    breaks = [
        br
        for br in document.iterfind(".//w:br", NS)
        if br.attrib.get(f"{{{NS['w']}}}type") == "page"
    ]
    return DocxBook(
        title=_text(core.find("dc:title", NS)),  # type: ignore[arg-type]
        title_paragraph=next(text for style, text in styled if style == "Title"),
        headings=[text for style, text in styled if style == "Heading1"],
        page_breaks=len(breaks),
    )


def epubcheck_command() -> list[str] | None:
    """How to run Debian's epubcheck here, or None. Debian installs it as /usr/bin/epubcheck, a
    link to the jar itself (run through binfmt where that is set up), so the jar is given to java."""
    found = shutil.which("epubcheck")
    if found is None:
        return None
    real = Path(found).resolve()
    if real.suffix == ".jar":
        java = shutil.which("java")
        # One short run: the quick compiler and one GC thread start it in a third of the time
        # on a loaded machine (14 s against 46 s measured).
        return (
            [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-jar", str(real)]
            if java
            else None
        )
    return [found]


class EpubcheckResult(BaseModel):
    exit_code: int
    fatals: int
    errors: int
    warnings: int
    summary: str  # epubcheck's own line: "Messages: 0 fatals / 0 errors / 0 warnings / 0 infos"
    output: str


def run_epubcheck(command: list[str], path: Path) -> EpubcheckResult:
    done = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    found = re.search(r"Messages: (\d+) fatals? / (\d+) errors? / (\d+) warnings?[^\n]*", output)
    assert found, output[-3000:]
    return EpubcheckResult(
        exit_code=done.returncode,
        fatals=int(found.group(1)),
        errors=int(found.group(2)),
        warnings=int(found.group(3)),
        summary=found.group(0),
        output=output,
    )
