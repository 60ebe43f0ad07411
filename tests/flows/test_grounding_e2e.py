"""End to end: a chapter whose extraction invents, misquotes and takes a title for a person.

`python -m flows.novel` against the scripted OpenAI-compatible server over real HTTP and the
real graph: what the scene's own words support is committed with its evidence (and
`python -m kg facts` shows it), everything else is dropped and counted, the look-alikes
that only look suspicious are kept, the model's answer as returned stays in the content
store, and a chapter written to its plan passes the plan and run-on checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from tests.support.novel_runs import export, kg, novel, run_env, wipe_graph
from tests.support.novel_script import CHARACTERS, script_novel
from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
    scripted_prose,
)

SCENE_1 = (
    "Mara Quill met Mary-Jane and Jean-Luc Picard at The Hollow Library. Ilse's father waited outside "
    "with Zoë Brontë. Quill smiled at them all."
)
SCENE_2 = "Tobias Venn rowed Mara Quill home past Gull Rock lighthouse. The tide was turning."


def _plan(request: ScriptedRequest) -> dict[str, object]:
    return {
        "scenes": [
            {
                "title": "The library",
                "pov": "Mara Quill",
                "setting": "The Hollow Library",
                "characters": ["Mara Quill", "Mary-Jane"],
                "beats": ["they meet"],
            },
            {
                "title": "Home",
                "pov": "Mara Quill",
                "setting": "Gull Rock lighthouse",
                "characters": ["Tobias Venn", "Mara Quill"],
                "beats": ["the crossing"],
            },
        ]
    }


def _draft(request: ScriptedRequest) -> str:
    scene = int(re.search(r"Chapter \d+, scene (\d+)", request.text).group(1))  # type: ignore[union-attr]
    return f"{SCENE_1 if scene == 1 else SCENE_2} {scripted_prose(40 + scene)}"


def _extract(request: ScriptedRequest) -> dict[str, object]:
    text = scene_text_of(request)
    if "Hollow Library" not in text:  # scene 2
        return quoting_extraction(
            text,
            [
                {"name": "Tobias Venn", "kind": "Character"},
                {"name": "Mara Quill", "kind": "Character"},
                {"name": "Gull Rock lighthouse", "kind": "Location"},
                # A sentence taken for a name.
                {
                    "name": "Tobias rowed Mara home",
                    "kind": "Event",
                    "quote": "Tobias Venn rowed Mara Quill home",
                },
            ],
            [{"source": "Tobias Venn", "target": "Gull Rock lighthouse", "type": "TRAVELS_TO"}],
            # A death the scene does not tell.
            [
                {
                    "name": "Tobias Venn",
                    "status": "dead",
                    "quote": "Tobias Venn drowned at the slipway",
                }
            ],
        )
    people = ["Mara Quill", "Mary-Jane", "Jean-Luc Picard", "Ilse's father", "Zoë Brontë"]
    entities = [
        {"name": n, "kind": "Character", "traits": ["curious"] if n == "Mary-Jane" else []}
        for n in people
    ]
    entities += [
        {"name": "The Hollow Library", "kind": "Location"},
        # Invented: the scene never names her (a small model's "Elise" for "Ilse").
        {
            "name": "Elise Marrow",
            "kind": "Character",
            "quote": "Elise Marrow waited outside with Zoë Brontë",
        },
        # The chapter's title taken for a person.
        {
            "name": "The Letter",
            "kind": "Character",
            "quote": "Mara Quill met Mary-Jane and Jean-Luc Picard",
        },
    ]
    relationships = [
        {"source": "Mara Quill", "target": "Mary-Jane", "type": "FRIEND_OF"},
        {
            "source": "Mara Quill",
            "target": "The Letter",
            "type": "FAMILY_OF",
            "quote": "Mara Quill met Mary-Jane and Jean-Luc Picard at The Hollow Library",
        },
        # A quote the scene does not contain.
        {
            "source": "Jean-Luc Picard",
            "target": "Mara Quill",
            "type": "ENEMY_OF",
            "quote": "Jean-Luc Picard had hated Mara Quill since the wreck",
        },
    ]
    return quoting_extraction(text, entities, relationships)


@pytest.fixture(scope="module")
def book(
    graph_settings: Settings, prefect_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, str], dict[str, object]]]:
    with ScriptedLLM() as llm:
        script_novel(llm)
        llm.on(
            schema="ChapterOutlineRefresh",
            respond={
                "title": "The Letter",
                "summary": "Mara meets friends at the library and rows home.",
                "pov": "Mara Quill",
                "setting": "The Hollow Library",
                "key_beats": ["they meet", "the crossing"],
            },
        )
        llm.on(schema="ScenePlan", respond=_plan)
        llm.on(schema="SceneExtraction", respond=_extract)
        llm.on(schema=None, contains="Write the scene", respond=_draft)
        project = tmp_path_factory.mktemp("grounded") / "book"
        wipe_graph(graph_settings)
        env = run_env(llm, graph_settings, prefect_home)
        result = novel(
            project,
            env,
            "--premise",
            "A keeper and a letter.",
            "--chapters",
            "1",
            "--scenes-per-chapter",
            "2",
        )
        assert result.returncode == 0, result.stderr[-4000:]
        assert (
            "grounding kept 12 extracted facts, dropped 6 (scene 1: 4, scene 2: 2)" in result.stderr
        )
        yield project, env, json.loads(result.stdout.strip().splitlines()[-1])


def test_only_supported_facts_are_committed_with_their_evidence(
    book: tuple[Path, dict[str, str], dict],
) -> None:
    project, env, _ = book
    graph = json.loads(export(project, env, "grounded"))
    entities = {n["properties"]["name"]: n for n in graph["nodes"] if "Entity" in n["labels"]}
    for kept in (
        "Mara Quill",
        "Mary-Jane",
        "Jean-Luc Picard",
        "Ilse's father",
        "Zoë Brontë",
        "The Hollow Library",
        "Tobias Venn",
        "Gull Rock lighthouse",
    ):
        assert kept in entities, kept
    assert "Elise Marrow" not in entities and "The Letter" not in entities
    assert "Tobias rowed Mara home" not in entities
    assert entities["Tobias Venn"]["properties"]["status_values"] == [
        "alive"
    ]  # his death was never told
    rels = {
        r["type"]: r
        for r in graph["relationships"]
        if r["type"] in ("FRIEND_OF", "FAMILY_OF", "ENEMY_OF", "TRAVELS_TO")
    }
    assert set(rels) == {"FRIEND_OF", "TRAVELS_TO"}
    assert rels["FRIEND_OF"]["properties"]["quote"].startswith("Mara Quill met Mary-Jane")
    assert rels["FRIEND_OF"]["properties"]["scene"] == 1
    mary = json.loads(entities["Mary-Jane"]["properties"]["sources_json"])
    assert {"trait", None} == {s.get("fact") for s in mary}
    assert all(s["quote"].startswith("Mara Quill met Mary-Jane") for s in mary)
    learned = sorted(p.stem for p in (project / "characters/learned").glob("*.yaml"))
    assert "elise_marrow" not in learned and "the_letter" not in learned and "mary_jane" in learned


def test_dropped_facts_are_counted_and_the_raw_answer_is_kept(
    book: tuple[Path, dict[str, str], dict],
) -> None:
    project, _, summary = book
    quality = json.loads((project / ".saga/quality/chapter_001.json").read_text())
    scene1, scene2, chapter = quality
    # Elise Marrow and The Letter (entities), FAMILY_OF to the title and the misquoted ENEMY_OF.
    assert (scene1["facts_dropped"], scene2["facts_dropped"], chapter["facts_dropped"]) == (4, 2, 6)
    assert (scene1["facts_kept"], scene2["facts_kept"], chapter["facts_kept"]) == (8, 4, 12)
    assert summary["chapter_quality"][0]["facts_dropped"] == 6  # the run's exit summary says so too
    raw = "\n".join(p.read_text() for p in (project / ".saga/content/extracted").rglob("*.json"))
    assert "Elise Marrow" in raw and "hated Mara Quill" in raw
    reports = [
        json.loads(p.read_text()) for p in (project / ".saga/content/grounding").rglob("*.json")
    ]
    reasons = {d["fact"]: d["reason"] for r in reports for s in r["scenes"] for d in s["dropped"]}
    assert reasons["Character 'Elise Marrow'"] == "name not in the scene"
    assert "title" in reasons["Character 'The Letter'"]
    assert "not in the text" in reasons["Jean-Luc Picard -ENEMY_OF-> Mara Quill"]
    assert "sentence" in reasons["Event 'Tobias rowed Mara home'"]
    assert "not in the text" in reasons["Tobias Venn: dead"]


def test_a_chapter_written_to_plan_passes_the_plan_and_run_on_checks(
    book: tuple[Path, dict[str, str], dict],
) -> None:
    project, _, _ = book
    quality = json.loads((project / ".saga/quality/chapter_001.json").read_text())
    assert [row["plan_problems"] for row in quality] == ["", "", 0]
    assert all(row["setting_named"] is True for row in quality[:2])
    assert all(0 < row["mean_sentence_words"] <= 30 for row in quality)
    assert not list((project / "chapters").glob("replaced/*")), "no revision was needed"


def test_kg_facts_shows_where_a_fact_came_from(book: tuple[Path, dict[str, str], dict]) -> None:
    project, env, _ = book
    shown = kg(project, env, "facts", "--entity", "mary-jane")
    assert shown.returncode == 0, shown.stderr[-2000:]
    print(shown.stdout)  # what a writer sees (pytest -s shows it)
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("Mary-Jane [Character")
    assert any(
        re.match(r"\s+ch 1 sc 1\s+FRIEND_OF <- Mara Quill\s+\"Mara Quill met Mary-Jane", line)
        for line in lines
    )
    assert any(
        re.match(r"\s+ch 1 sc 1\s+trait: curious\s+\"Mara Quill met", line) for line in lines
    )
    bible = kg(project, env, "facts", "--entity", CHARACTERS[0]["name"], "--json")
    facts = json.loads(bible.stdout)[0]["facts"]
    assert {"bible", "mention", "relationship"} <= {f["kind"] for f in facts}
    missing = kg(project, env, "facts", "--entity", "Elise Marrow")
    assert missing.returncode != 0 and "no entity is named" in missing.stderr
