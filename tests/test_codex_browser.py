"""The codex of a scripted 3-chapter book, as the novel flow writes it, in a real browser.

`python -m flows.novel` writes the book against the scripted OpenAI-compatible server over
real HTTP and the real graph (friends who fall out, a newcomer with a key, a death), and with
it `exports/codex.html` after every chapter. The page then opens from disk in headless
Chromium with the network off: its script runs without a console error, the graph holds
the book's characters as nodes and draws its relationships with their history, the slider
steps back through the chapters, and the timeline shows the chapters. A screenshot is kept
under build/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from tests.browser import open_page, require_chromium
from tests.conftest import REPO_ROOT
from tests.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
    scripted_prose,
)
from tests.test_novel_e2e import kg, novel, run_env, script_novel, wipe_graph

SCREENSHOTS = REPO_ROOT / "build"
TITLES = {1: "The Letter", 2: "The Brass Key", 3: "The Betrayal"}
SCENES = {
    1: "Mara Quill met Tobias Venn at Gull Rock lighthouse. The gulls wheeled over the reef.",
    2: "Mara Quill and Tobias Venn found Ilse Marrow at Gull Rock lighthouse. Ilse Marrow held the brass key.",
    3: "Tobias Venn struck Mara Quill at Gull Rock lighthouse. Ilse Marrow drowned in the sea caves below.",
}
CAST = {1: ["Mara Quill", "Tobias Venn"], 2: ["Mara Quill", "Tobias Venn", "Ilse Marrow"],
        3: ["Mara Quill", "Tobias Venn", "Ilse Marrow"]}
READY = "document.documentElement.dataset.codexReady === 'true'"


def _chapter(request: ScriptedRequest) -> int:
    found = re.search(r"Chapter (\d+)", request.text)
    return int(found.group(1)) if found else 1


def _outline(request: ScriptedRequest) -> dict[str, object]:
    number = int(re.search(r"Outline chapter (\d+)", request.text).group(1))  # type: ignore[union-attr]
    return {"title": TITLES[number], "summary": f"What happens in chapter {number}.", "pov": "Mara Quill",
            "setting": "Gull Rock lighthouse", "key_beats": [f"beat {number}"]}


def _plan(request: ScriptedRequest) -> dict[str, object]:
    number = int(re.search(r"Chapter (\d+)", request.text).group(1))  # type: ignore[union-attr]
    return {"scenes": [{"title": f"{TITLES[number]}, part {i}", "pov": "Mara Quill", "setting": "Gull Rock lighthouse",
                        "characters": CAST[number], "beats": [f"beat {i}"]} for i in (1, 2)]}


def _draft(request: ScriptedRequest) -> str:
    where = re.search(r"Chapter (\d+), scene (\d+)", request.text)
    chapter, scene = (int(where.group(1)), int(where.group(2))) if where else (1, 1)  # type: ignore[union-attr]
    opening = SCENES[chapter] if scene == 1 else f"Mara Quill, Tobias Venn and {'Ilse Marrow' if chapter > 1 else 'the gulls'} " \
        "kept watch at Gull Rock lighthouse."
    return f"{opening} {scripted_prose(100 + chapter * 10 + scene)}"


def _extract(request: ScriptedRequest) -> dict[str, object]:
    text = scene_text_of(request)
    people = [{"name": n, "kind": "Character"} for n in ("Mara Quill", "Tobias Venn", "Ilse Marrow")]
    things = [{"name": "Gull Rock lighthouse", "kind": "Location"}, {"name": "brass key", "kind": "Item"}]
    relationships, statuses = [], []
    if "met Tobias Venn" in text:
        relationships = [{"source": "Mara Quill", "target": "Tobias Venn", "type": "FRIEND_OF"},
                         {"source": "Mara Quill", "target": "Gull Rock lighthouse", "type": "LOCATED_IN"}]
    elif "held the brass key" in text:
        relationships = [{"source": "Ilse Marrow", "target": "brass key", "type": "OWNS"}]
    elif "struck Mara Quill" in text:
        relationships = [{"source": "Tobias Venn", "target": "Mara Quill", "type": "ENEMY_OF"}]
        statuses = [{"name": "Ilse Marrow", "status": "dead"}]
    return quoting_extraction(text, people + things, relationships, statuses)


@pytest.fixture(scope="module")
def book(graph_settings: Settings, prefect_home: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str], str]]:
    with ScriptedLLM() as llm:
        script_novel(llm)
        llm.on(schema="OutlineRelationships", respond={
            "relationships": [{"source": "Tobias Venn", "target": "Mara Quill", "type": "PROTECTS",
                               "description": "He rows her out in any weather."}],
            "locations": [{"name": "Gull Rock lighthouse", "description": "The light on the reef."}]})
        llm.on(schema="ChapterOutlineRefresh", respond=_outline)
        llm.on(schema="ScenePlan", respond=_plan)
        llm.on(schema="SceneExtraction", respond=_extract)
        llm.on(schema="ChapterSummary", respond=lambda r: {"summary": f"Summary of chapter {_chapter(r)}.",
                                                           "key_events": [f"event {_chapter(r)}"]})
        llm.on(schema=None, contains="Write the scene", respond=_draft)
        project = tmp_path_factory.mktemp("codex") / "book"
        wipe_graph(graph_settings)
        # INFO logs on the console whatever an earlier test left in the environment: in CI the
        # run printed only its warnings, and the codex lines below are INFO.
        env = {**run_env(llm, graph_settings, prefect_home), "PREFECT_LOGGING_LEVEL": "INFO"}
        result = novel(project, env, "--premise", "A keeper, a ferryman and a drowned sister.", "--chapters", "3",
                       "--scenes-per-chapter", "2", "--acts", "1")
        assert result.returncode == 0, result.stderr[-4000:]
        yield project, env, result.stderr


def _page_data(path: Path) -> dict[str, object]:
    html = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="codex-data">(.*?)</script>', html, re.DOTALL)
    assert found, "the page carries its data"
    return json.loads(found.group(1))


def test_the_novel_flow_writes_the_codex_after_every_chapter(book: tuple[Path, dict[str, str], str]) -> None:
    project, _, stderr = book
    codex = project / "exports" / "codex.html"
    assert codex.is_file()
    # The console handler may wrap a long log line: read the log as one run of words.
    words = " ".join(stderr.split())
    said = [line for line in stderr.splitlines() if "codex" in line]
    for number in (1, 2, 3):
        assert f"codex as of chapter {number} (" in words, (f"no codex after chapter {number}", said)
    graph = _page_data(codex)["graph"]
    assert graph["last"] == 3  # type: ignore[index]


def test_the_codex_opens_offline_in_chromium_with_the_world(book: tuple[Path, dict[str, str], str]) -> None:
    require_chromium()
    project, _, _ = book
    codex = project / "exports" / "codex.html"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with open_page(codex, ready=READY) as (page, report):
        nodes = page.evaluate("window.codex.cy.nodes().map(n => [n.data('name'), n.data('kind')])")
        characters = {name for name, kind in nodes if kind == "Character"}
        assert {"Mara Quill", "Tobias Venn", "Ilse Marrow"} <= characters
        chapters = page.eval_on_selector_all("#timeline li.chapter h3", "els => els.map(e => e.textContent)")
        assert [c for c in chapters if c.startswith("Chapter")] == [
            f"Chapter {n}: {TITLES[n]}" for n in (1, 2, 3)]
        # As of chapter 3: the friends are enemies (the friendship drawn as ended), Ilse is dead.
        edges = page.evaluate("window.codex.cy.edges().map(e => [e.data('label'), e.hasClass('ended'), "
                              "e.hasClass('off')])")
        assert ["ENEMY_OF", False, False] in edges and ["FRIEND_OF", True, False] in edges
        assert page.evaluate("window.codex.cy.nodes().filter(n => n.hasClass('dead')).map(n => n.data('name'))") == [
            "Ilse Marrow"]
        page.screenshot(path=str(SCREENSHOTS / "codex-browser.png"), full_page=False)
        # Clicking a relationship tells its story, with the quote that states it.
        page.evaluate("window.codex.cy.edges().filter(e => e.data('label') === 'FRIEND_OF').emit('tap')")
        details = page.inner_text("#details")
        assert "FRIEND_OF" in details and "Mara Quill met Tobias Venn at Gull Rock lighthouse" in details
        assert "ENEMY_OF" in details  # what ended it
        # Hovering one shows its type and history.
        page.evaluate("window.codex.cy.edges().filter(e => e.data('label') === 'ENEMY_OF').emit('mouseover')")
        assert "ENEMY_OF" in page.inner_text("#tip") and "ch 3 sc 1" in page.inner_text("#tip")
        # Back to chapter 1: no enemies yet, the friendship active, nobody dead, Ilse not yet there.
        page.eval_on_selector("#asof-slider", "s => { s.value = '1'; s.dispatchEvent(new Event('input')); }")
        edges = page.evaluate("window.codex.cy.edges().map(e => [e.data('label'), e.hasClass('ended'), "
                              "e.hasClass('off')])")
        assert ["ENEMY_OF", False, True] in edges and ["FRIEND_OF", False, False] in edges
        assert page.evaluate("window.codex.cy.$id(window.codex.data.graph.nodes.find("
                             "n => n.name === 'Ilse Marrow').id).hasClass('off')")
        assert page.inner_text("#asof-label") == "chapter 1"
        page.screenshot(path=str(SCREENSHOTS / "codex-browser-full.png"), full_page=True)
    assert report.page_errors == [] and report.console_errors == [], report
    assert report.network == [], "the page must need no network"


def test_the_page_holds_every_fact_with_its_evidence_and_the_quality_chart(
        book: tuple[Path, dict[str, str], str]) -> None:
    project, _, _ = book
    html = (project / "exports" / "codex.html").read_text(encoding="utf-8")
    for quote in ("Ilse Marrow held the brass key.", "Tobias Venn struck Mara Quill at Gull Rock lighthouse.",
                  "Ilse Marrow drowned in the sea caves below."):
        assert quote in html
    # The timeline names what changed: the death, the new enemies, the ended friendship.
    assert re.search(r"Ilse Marrow: dead</a> <q>Ilse Marrow drowned", html)
    assert "Mara Quill FRIEND_OF Tobias Venn ended (now Tobias Venn ENEMY_OF Mara Quill)" in html
    assert html.count('<figure class="chart">') >= 4 and html.count("<tr") >= 4  # charts and the table


def test_kg_codex_writes_the_page_as_of_an_earlier_chapter(book: tuple[Path, dict[str, str], str],
                                                           tmp_path: Path) -> None:
    project, env, _ = book
    out = tmp_path / "as-of-2.html"
    made = kg(project, env, "codex", "--as-of-chapter", "2", "--out", str(out))
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.startswith("codex of ") and "as of chapter 2" in made.stdout
    data = _page_data(out)
    labels = {e["label"] for e in data["graph"]["edges"]}  # type: ignore[index]
    assert "FRIEND_OF" in labels and "ENEMY_OF" not in labels
    html = out.read_text(encoding="utf-8")
    assert "Chapter 3" not in html and "Ilse Marrow drowned" not in html
    again = kg(project, env, "codex", "--as-of-chapter", "2", "--out", str(out))
    assert again.returncode == 0 and out.read_text(encoding="utf-8") == html  # deterministic
    too_far = kg(project, env, "codex", "--as-of-chapter", "9", "--out", str(tmp_path / "no.html"))
    assert too_far.returncode == 2 and not (tmp_path / "no.html").exists()
    assert too_far.stderr.strip().splitlines()[-1] == (
        "kg: error: --as-of-chapter 9 is past the book: the graph holds chapters 1-3")
