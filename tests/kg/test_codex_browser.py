"""The codex of a scripted 3-chapter book, as the novel flow writes it, in a real browser.

`python -m flows.novel` writes the book against the scripted OpenAI-compatible server over
real HTTP and the real graph (friends who fall out, a newcomer with a key, a death), and with
it `exports/codex.html` after every chapter. The page then opens from disk in headless
Chromium with the network off: its script runs without a console error, the graph holds
the book's characters as nodes and draws its relationships with their history, the slider
steps back through the chapters, and the timeline shows the chapters. Chapter 2's extraction
also gives relationship types that are whole sentences (in capitals with underscores, in camel
case, in plain words): the canvas draws each as a short label of at most 40 characters, and
hovering or clicking one still gives the full type with its quote and history. Screenshots
are kept under build/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from core.settings import Settings
from kg.codex.models import CAPTION_LIMIT
from tests.conftest import REPO_ROOT
from tests.support.browser import open_page, require_chromium
from tests.support.novel_runs import kg, novel, run_env, wipe_graph
from tests.support.novel_script import script_novel
from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
    scripted_prose,
)

SCREENSHOTS = REPO_ROOT / "build"
TITLES = {1: "The Letter", 2: "The Brass Key", 3: "The Betrayal"}
SCENES = {
    1: "Mara Quill met Tobias Venn at Gull Rock lighthouse. The gulls wheeled over the reef.",
    2: "Mara Quill and Tobias Venn found Ilse Marrow at Gull Rock lighthouse. Ilse Marrow held the brass key.",
    3: "Tobias Venn struck Mara Quill at Gull Rock lighthouse. Ilse Marrow drowned in the sea caves below.",
}
CAST = {
    1: ["Mara Quill", "Tobias Venn"],
    2: ["Mara Quill", "Tobias Venn", "Ilse Marrow"],
    3: ["Mara Quill", "Tobias Venn", "Ilse Marrow"],
}
READY = "document.documentElement.dataset.codexReady === 'true'"
#: How long a condition in the page is waited for (the machine may be loaded).
WAIT_MS = 30_000
#: Relationship types as a model writes them when it says a whole sentence: (source, type, target).
LONG_RELATIONSHIPS = (
    ("Ilse Marrow", "LOVES_HER_BROTHER_BUT_RESENTS_HIS_SUCCESS_AT_SEA", "Tobias Venn"),
    ("Ilse Marrow", "secretlyOwesHimTheDeedToTheLighthouseOnTheReef", "Mara Quill"),
    ("Mara Quill", "swore on the drowned letter to keep her from the sea caves", "Ilse Marrow"),
)


def _chapter(request: ScriptedRequest) -> int:
    found = re.search(r"Chapter (\d+)", request.text)
    return int(found.group(1)) if found else 1


def _outline(request: ScriptedRequest) -> dict[str, object]:
    number = int(re.search(r"Outline chapter (\d+)", request.text).group(1))  # type: ignore[union-attr]
    return {
        "title": TITLES[number],
        "summary": f"What happens in chapter {number}.",
        "pov": "Mara Quill",
        "setting": "Gull Rock lighthouse",
        "key_beats": [f"beat {number}"],
    }


def _plan(request: ScriptedRequest) -> dict[str, object]:
    number = int(re.search(r"Chapter (\d+)", request.text).group(1))  # type: ignore[union-attr]
    return {
        "scenes": [
            {
                "title": f"{TITLES[number]}, part {i}",
                "pov": "Mara Quill",
                "setting": "Gull Rock lighthouse",
                "characters": CAST[number],
                "beats": [f"beat {i}"],
            }
            for i in (1, 2)
        ]
    }


def _draft(request: ScriptedRequest) -> str:
    where = re.search(r"Chapter (\d+), scene (\d+)", request.text)
    chapter, scene = (int(where.group(1)), int(where.group(2))) if where else (1, 1)  # type: ignore[union-attr]
    opening = (
        SCENES[chapter]
        if scene == 1
        else f"Mara Quill, Tobias Venn and {'Ilse Marrow' if chapter > 1 else 'the gulls'} "
        "kept watch at Gull Rock lighthouse."
    )
    return f"{opening} {scripted_prose(100 + chapter * 10 + scene)}"


def _extract(request: ScriptedRequest) -> dict[str, object]:
    text = scene_text_of(request)
    people = [
        {"name": n, "kind": "Character"} for n in ("Mara Quill", "Tobias Venn", "Ilse Marrow")
    ]
    things = [
        {"name": "Gull Rock lighthouse", "kind": "Location"},
        {"name": "brass key", "kind": "Item"},
    ]
    relationships, statuses = [], []
    if "met Tobias Venn" in text:
        relationships = [
            {"source": "Mara Quill", "target": "Tobias Venn", "type": "FRIEND_OF"},
            {"source": "Mara Quill", "target": "Gull Rock lighthouse", "type": "LOCATED_IN"},
        ]
    elif "held the brass key" in text:
        relationships = [
            {"source": "Ilse Marrow", "target": "brass key", "type": "OWNS"},
            *({"source": s, "target": t, "type": kind} for s, kind, t in LONG_RELATIONSHIPS),
        ]
    elif "struck Mara Quill" in text:
        relationships = [{"source": "Tobias Venn", "target": "Mara Quill", "type": "ENEMY_OF"}]
        statuses = [{"name": "Ilse Marrow", "status": "dead"}]
    return quoting_extraction(text, people + things, relationships, statuses)


@pytest.fixture(scope="module")
def book(
    graph_settings: Settings, prefect_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, str], str]]:
    with ScriptedLLM() as llm:
        script_novel(llm)
        llm.on(
            schema="OutlineRelationships",
            respond={
                "relationships": [
                    {
                        "source": "Tobias Venn",
                        "target": "Mara Quill",
                        "type": "PROTECTS",
                        "description": "He rows her out in any weather.",
                    }
                ],
                "locations": [
                    {"name": "Gull Rock lighthouse", "description": "The light on the reef."}
                ],
            },
        )
        llm.on(schema="ChapterOutlineRefresh", respond=_outline)
        llm.on(schema="ScenePlan", respond=_plan)
        llm.on(schema="SceneExtraction", respond=_extract)
        llm.on(
            schema="ChapterSummary",
            respond=lambda r: {
                "summary": f"Summary of chapter {_chapter(r)}.",
                "key_events": [f"event {_chapter(r)}"],
            },
        )
        llm.on(schema=None, contains="Write the scene", respond=_draft)
        project = tmp_path_factory.mktemp("codex") / "book"
        wipe_graph(graph_settings)
        # INFO logs on the console whatever an earlier test left in the environment: in CI the
        # run printed only its warnings, and the codex lines below are INFO.
        env = {**run_env(llm, graph_settings, prefect_home), "PREFECT_LOGGING_LEVEL": "INFO"}
        result = novel(
            project,
            env,
            "--premise",
            "A keeper, a ferryman and a drowned sister.",
            "--chapters",
            "3",
            "--scenes-per-chapter",
            "2",
            "--acts",
            "1",
        )
        assert result.returncode == 0, result.stderr[-4000:]
        yield project, env, result.stderr


def _page_data(path: Path) -> dict[str, object]:
    html = path.read_text(encoding="utf-8")
    found = re.search(
        r'<script type="application/json" id="codex-data">(.*?)</script>', html, re.DOTALL
    )
    assert found, "the page carries its data"
    return json.loads(found.group(1))


def test_the_novel_flow_writes_the_codex_after_every_chapter(
    book: tuple[Path, dict[str, str], str],
) -> None:
    project, _, stderr = book
    codex = project / "exports" / "codex.html"
    assert codex.is_file()
    # The console handler may wrap a long log line: read the log as one run of words.
    words = " ".join(stderr.split())
    said = [line for line in stderr.splitlines() if "codex" in line]
    for number in (1, 2, 3):
        assert f"codex as of chapter {number} (" in words, (
            f"no codex after chapter {number}",
            said,
        )
    graph = _page_data(codex)["graph"]
    assert graph["last"] == 3  # type: ignore[index]


def test_the_codex_opens_offline_in_chromium_with_the_world(
    book: tuple[Path, dict[str, str], str],
) -> None:
    require_chromium()
    project, _, _ = book
    codex = project / "exports" / "codex.html"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with open_page(codex, ready=READY) as (page, report):
        nodes = page.evaluate("window.codex.cy.nodes().map(n => [n.data('name'), n.data('kind')])")
        characters = {name for name, kind in nodes if kind == "Character"}
        assert {"Mara Quill", "Tobias Venn", "Ilse Marrow"} <= characters
        chapters = page.eval_on_selector_all(
            "#timeline li.chapter h3", "els => els.map(e => e.textContent)"
        )
        assert [c for c in chapters if c.startswith("Chapter")] == [
            f"Chapter {n}: {TITLES[n]}" for n in (1, 2, 3)
        ]
        # As of chapter 3: the friends are enemies (the friendship drawn as ended), Ilse is dead.
        edges = page.evaluate(
            "window.codex.cy.edges().map(e => [e.data('label'), e.hasClass('ended'), "
            "e.hasClass('off')])"
        )
        assert ["ENEMY_OF", False, False] in edges and ["FRIEND_OF", True, False] in edges
        assert page.evaluate(
            "window.codex.cy.nodes().filter(n => n.hasClass('dead')).map(n => n.data('name'))"
        ) == ["Ilse Marrow"]
        page.screenshot(path=str(SCREENSHOTS / "codex-browser.png"), full_page=False)
        # Clicking a relationship tells its story, with the quote that states it. (The scripts
        # return nothing: Playwright would serialise the cytoscape collection `emit` returns, the
        # whole graph through its back references, which took it 11 s a call.)
        page.evaluate(
            "() => { window.codex.cy.edges().filter(e => e.data('label') === 'FRIEND_OF')"
            ".emit('tap'); }"
        )
        details = page.inner_text("#details")
        assert (
            "FRIEND_OF" in details
            and "Mara Quill met Tobias Venn at Gull Rock lighthouse" in details
        )
        assert "ENEMY_OF" in details  # what ended it
        # Hovering one shows its type and history.
        page.evaluate(
            "() => { window.codex.cy.edges().filter(e => e.data('label') === 'ENEMY_OF')"
            ".emit('mouseover'); }"
        )
        assert "ENEMY_OF" in page.inner_text("#tip") and "ch 3 sc 1" in page.inner_text("#tip")
        # Back to chapter 1: no enemies yet, the friendship active, nobody dead, Ilse not yet there.
        page.eval_on_selector(
            "#asof-slider", "s => { s.value = '1'; s.dispatchEvent(new Event('input')); }"
        )
        edges = page.evaluate(
            "window.codex.cy.edges().map(e => [e.data('label'), e.hasClass('ended'), "
            "e.hasClass('off')])"
        )
        assert ["ENEMY_OF", False, True] in edges and ["FRIEND_OF", False, False] in edges
        assert page.evaluate(
            "window.codex.cy.$id(window.codex.data.graph.nodes.find("
            "n => n.name === 'Ilse Marrow').id).hasClass('off')"
        )
        assert page.inner_text("#asof-label") == "chapter 1"
        page.screenshot(path=str(SCREENSHOTS / "codex-browser-full.png"), full_page=True)
    assert report.page_errors == [] and report.console_errors == [], report
    assert report.network == [], "the page must need no network"


def test_the_canvas_draws_long_relationship_types_short_and_the_panel_tells_them_whole(
    book: tuple[Path, dict[str, str], str],
) -> None:
    require_chromium()
    project, _, _ = book
    codex = project / "exports" / "codex.html"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Conditions are waited on with Playwright's assertions (they poll from outside the page):
    # page.wait_for_function polls by `eval`, which the page's policy forbids.
    with open_page(codex, ready=READY) as (page, report):
        assert page.is_checked("#edge-labels")  # a small graph draws its edge labels
        # What Cytoscape draws: each visible edge's computed `label` style, not the page's data.
        drawn = page.evaluate(
            "window.codex.cy.edges(':visible').map(e => e.pstyle('label').strValue)"
        )
        assert drawn and all(drawn), drawn
        assert max(len(text) for text in drawn) <= CAPTION_LIMIT, [
            t for t in drawn if len(t) > CAPTION_LIMIT
        ]
        assert {"FRIEND_OF", "ENEMY_OF", "OWNS"} <= set(drawn)  # short types drawn whole
        cut = sorted(t for t in drawn if t.endswith("\u2026"))
        assert cut == [
            "LOVES_HER_BROTHER_BUT_RESENTS_HIS\u2026",
            "secretlyOwesHimTheDeedToTheLighthouseOn\u2026",
            "swore on the drowned letter to keep her\u2026",
        ]
        page.locator("#graph").screenshot(path=str(SCREENSHOTS / "codex-labels.png"))
        quote = "Mara Quill and Tobias Venn found Ilse Marrow at Gull Rock lighthouse."
        for source, kind, target in LONG_RELATIONSHIPS:
            full = f"{source} \u2014 RELATES_TO ({kind}) \u2192 {target}"
            edge = f"window.codex.cy.edges().filter(e => e.data('label').startsWith({json.dumps(kind[:20])}))"
            assert page.evaluate(f"{edge}.length") == 1
            # The pointer over the middle of the drawn line: the tooltip gives the full type and its history.
            box = page.locator("#cy").bounding_box()
            point = page.evaluate(f"{edge}[0].renderedMidpoint()")
            page.mouse.move(box["x"] + point["x"], box["y"] + point["y"])  # type: ignore[index]
            expect(page.locator("#tip")).to_be_visible(timeout=WAIT_MS)
            expect(page.locator("#tip")).to_contain_text(full, timeout=WAIT_MS)
            assert "ch 2 sc 1" in page.inner_text("#tip") and quote in page.inner_text("#tip")
            # A click there: the side panel tells the whole story, with the quote.
            page.mouse.click(box["x"] + point["x"], box["y"] + point["y"])  # type: ignore[index]
            expect(page.locator("#details")).to_contain_text(full, timeout=WAIT_MS)
            details = page.inner_text("#details")
            assert (
                "Active as of chapter 3" in details
                and f"ch 2 sc 1: RELATES_TO ({kind}) " in details
                and quote in details
            ), details
            page.mouse.move(box["x"] + 3, box["y"] + 3)  # type: ignore[index]  # empty canvas (fit pads 24 px)
            expect(page.locator("#tip")).to_be_hidden(timeout=WAIT_MS)
    assert report.page_errors == [] and report.console_errors == [], report


def test_the_page_holds_every_fact_with_its_evidence_and_the_quality_chart(
    book: tuple[Path, dict[str, str], str],
) -> None:
    project, _, _ = book
    html = (project / "exports" / "codex.html").read_text(encoding="utf-8")
    for quote in (
        "Ilse Marrow held the brass key.",
        "Tobias Venn struck Mara Quill at Gull Rock lighthouse.",
        "Ilse Marrow drowned in the sea caves below.",
    ):
        assert quote in html
    # The timeline names what changed: the death, the new enemies, the ended friendship.
    assert re.search(r"Ilse Marrow: dead</a> <q>Ilse Marrow drowned", html)
    assert "Mara Quill FRIEND_OF Tobias Venn ended (now Tobias Venn ENEMY_OF Mara Quill)" in html
    assert (
        html.count('<figure class="chart">') >= 4 and html.count("<tr") >= 4
    )  # charts and the table


def test_kg_codex_writes_the_page_as_of_an_earlier_chapter(
    book: tuple[Path, dict[str, str], str], tmp_path: Path
) -> None:
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
        "kg: error: --as-of-chapter 9 is past the book: the graph holds chapters 1-3"
    )
