"""The scripted long book (tests/support/long_story.py, which bench/long_book.py writes 100
chapters of) stays a valid book: `python -m flows.novel` writes 12 chapters of it against the
scripted OpenAI-compatible server over real HTTP and the real graph, with healing and QA every 5
chapters, and the graph grows the way the story says, healing included.

No timing here: bench/long_book.py measures.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from core.settings import Settings
from tests.support.cli import graph_env, run_module
from tests.support.long_story import PREMISE, LongStory
from tests.support.novel_runs import export, novel, run_env, wipe_graph
from tests.support.scripted_llm import ScriptedLLM
from tests.support.vault_reading import front, unresolved_links

CHAPTERS = 12

Book = tuple[LongStory, Path, dict[str, object], dict[str, object]]


@pytest.fixture(scope="module")
def book(
    graph_settings: Settings, prefect_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Book]:
    story = LongStory(CHAPTERS)
    with ScriptedLLM() as llm:
        story.install(llm)
        project = tmp_path_factory.mktemp("long") / "book"
        wipe_graph(graph_settings)
        env = run_env(llm, graph_settings, prefect_home, SKALD_LIMITS__QA_EVERY="5")
        result = novel(
            project,
            env,
            "--premise",
            PREMISE,
            "--chapters",
            str(CHAPTERS),
            "--scenes-per-chapter",
            "2",
            "--acts",
            "3",
        )
        assert result.returncode == 0, result.stderr[-4000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        yield story, project, summary, json.loads(export(project, env, "long"))


def _entities(graph: dict[str, object]) -> dict[str, dict[str, object]]:
    """Entity properties by name, with the node's export reference under "ref"."""
    return {
        n["properties"]["name"]: {**n["properties"], "ref": n["ref"]}  # type: ignore[index]
        for n in graph["nodes"]
        if "Entity" in n["labels"]
    }  # type: ignore[union-attr, index]


def test_every_chapter_is_written_to_plan_on_its_first_draft(book: Book) -> None:
    story, project, summary, _ = book
    assert summary["chapters"] == CHAPTERS
    for row in summary["chapter_quality"]:
        assert row["iterations"] == 1, row
        assert row["facts_dropped"] == 0 and row["plan_problems"] == 0 and not row["flags"], row
    assert not list((project / "chapters").glob("replaced/*")), "no chapter was revised"
    text = (project / "chapters" / f"chapter_{CHAPTERS:03d}.md").read_text(encoding="utf-8")
    assert story.chapter(CHAPTERS).scenes[0].met() in text


def test_the_graph_grows_with_the_story(book: Book) -> None:
    story, _, _, graph = book
    entities = _entities(graph)
    for name in story.introduced(CHAPTERS):  # a new character every third chapter
        assert entities[name]["label"] == "Character", name
    assert {"Amber Wharf", "Hollow Keep", "Heron Mill"} <= set(
        entities
    )  # a new place every fifth chapter
    for name, chapter in story.deaths(CHAPTERS).items():
        person = entities[name]
        assert person["status_values"][-1] == "dead" and person["status_from"][-1] == chapter, (
            person
        )
    chapters = sorted(n["properties"]["number"] for n in graph["nodes"] if "Chapter" in n["labels"])
    assert chapters == list(range(1, CHAPTERS + 1))
    # A relationship that changed as the pair kept meeting: both states stay in the graph, dated.
    william = entities["William Turner"]["ref"]
    mara = entities["Mara Quill"]["ref"]
    kinds = {
        (r["type"], r["properties"]["chapter"])
        for r in graph["relationships"]
        if {r["start"], r["end"]} == {mara, william} and r["type"] != "LOCATED_IN"
    }
    assert {k for k, _ in kinds} >= {"KNOWS", "RIVAL_OF"}, kinds


def test_healing_merges_the_name_written_two_ways(book: Book) -> None:
    story, project, _, graph = book
    variants = story.variants(10)  # written before the last healing run (after chapter 10)
    assert variants, "the story writes a name two ways before chapter 10"
    entities = _entities(graph)
    for variant, name in variants.items():
        assert variant not in entities, f"{variant} was not merged into {name}"
        assert variant in entities[name]["aliases"], entities[name]
    runs = [
        json.loads(p.read_text()) for p in sorted((project / ".saga/healing").glob("heal-*.json"))
    ]
    assert len(runs) == CHAPTERS // 5
    merged = {
        n for run in runs for m in run["merges"] if not m.get("skipped") for n in m["merged_names"]
    }
    assert set(variants) <= merged
    assert sum(len(run["graduated"]) for run in runs) > 0, (
        "healing confirms the characters the chapters introduced"
    )


def test_qa_finds_no_error_in_the_scripted_book(book: Book) -> None:
    _, project, _, _ = book
    reports = sorted((project / ".saga/qa").glob("qa-*.parquet"))
    assert reports, "QA ran"
    findings = pq.read_table(reports[-1]).to_pylist()
    assert [f for f in findings if f["severity"] == "error"] == []


def test_the_vault_of_the_book_links_every_note_and_keeps_the_writers(
    book: Book, graph_settings: Settings, tmp_path: Path
) -> None:
    story, project, _, _ = book
    env = graph_env(graph_settings)
    done = run_module("kg", "vault", "--project-dir", str(project), "--out", str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    found, bad = unresolved_links(tmp_path)
    assert bad == [] and found > 1000, (found, bad[:10])
    sheets = [front(p.read_text(encoding="utf-8")) for p in (tmp_path / "Characters").glob("*.md")]
    people = {str(sheet["name"]): sheet for sheet in sheets}
    assert set(story.introduced(CHAPTERS)) <= set(people)
    for name in story.deaths(CHAPTERS):
        assert (people[name]["status"], people[name]["type"]) == ("dead", "character"), people[name]
    for variant, name in story.variants(
        10
    ).items():  # merged by healing: [[variant]] finds the note
        assert variant in people[name]["aliases"], people[name]
    chapters = sorted(
        int(front(p.read_text(encoding="utf-8"))["chapter"])
        for p in (tmp_path / "Chapters").glob("*.md")
    )
    assert chapters == list(range(1, CHAPTERS + 1))
    assert len(list((tmp_path / "Scenes").glob("*.md"))) == 2 * CHAPTERS
    # The writer's own note, and one of Skald's they edited, survive the next export unchanged.
    mine = tmp_path / "Plot" / "Ending.md"
    mine.parent.mkdir()
    mine.write_text("Mara burns the ledger in [[Chapter 12]].\n", encoding="utf-8")
    edited = tmp_path / "Characters" / "Mara Quill.md"
    edited.write_text(
        edited.read_text(encoding="utf-8").replace("# Mara Quill", "# Mara Quill, keeper"),
        encoding="utf-8",
    )
    kept = {p: p.read_bytes() for p in (mine, edited)}
    again = run_module(
        "kg", "vault", "--project-dir", str(project), "--out", str(tmp_path), env=env
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p: p.read_bytes() for p in kept} == kept
    assert " 0 written, " in again.stdout and " 1 kept as yours, " in again.stdout, again.stdout
