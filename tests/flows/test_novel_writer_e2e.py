"""End to end: the writer in control (issue 14). The story bible is edited between runs,
guidance steers one chapter, `--redo-from` rewrites chapters, outlines follow the book.

Same setup as test_novel_e2e: `python -m flows.novel` in a subprocess, the scripted
OpenAI-compatible server over HTTP, the session's real graph. Books are small (1 scene per
chapter, 1 act) to keep CI fast.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from core.settings import Settings
from tasks.steering import load_steering
from tests.conftest import REPO_ROOT
from tests.support.ebook_reading import read_docx, read_epub
from tests.support.novel_runs import export, kg, novel, run_env, wipe_graph, write_book
from tests.support.novel_script import PREMISE, script_novel, scripted_draft
from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
)

SMALL = ("--scenes-per-chapter", "1", "--acts", "1")


def _summary(request: ScriptedRequest) -> dict[str, object]:
    number = re.search(r"Chapter (\d+):", request.last_user)
    return {
        "summary": f"SUMMARY-OF-CHAPTER-{number.group(1) if number else 0}: Mara and Tobias talk.",
        "key_events": ["talk"],
    }


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        script_novel(server)
        server.on(schema="ChapterSummary", respond=_summary)
        yield server


_CHAPTER_OF = (
    re.compile(r"Chapter (\d+), scene \d+ of"),  # scene draft
    re.compile(r"Outline chapter (\d+):"),  # outline refresh
    re.compile(r"Scene \d+ of chapter (\d+):"),  # extraction
    re.compile(r"Chapter (\d+) was planned as"),  # editor
    re.compile(r"^Chapter (\d+):", re.MULTILINE),  # scene plan, summary
)


def chapter_of(request: ScriptedRequest) -> int | None:
    """The chapter a chat request works on (embedding requests: None)."""
    for pattern in _CHAPTER_OF:
        found = pattern.search(request.last_user)
        if found:
            return int(found.group(1))
    return None


def requests_since(llm: ScriptedLLM, start: int) -> list[ScriptedRequest]:
    return [r for r in llm.requests[start:] if r.messages]


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# --- guidance and outlines (one book: 3 chapters, then 5) -------------------------------------


@pytest.fixture(scope="module")
def three_chapters(
    llm: ScriptedLLM,
    graph_settings: Settings,
    prefect_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, str]]:
    project = tmp_path_factory.mktemp("steer") / "book"
    env = write_book(
        llm,
        graph_settings,
        prefect_home,
        project,
        "--premise",
        PREMISE + " (guidance)",
        "--chapters",
        "3",
        *SMALL,
    )
    return project, env


def test_guidance_steers_its_chapter_and_redrafts_only_from_it(
    three_chapters: tuple[Path, dict[str, str]], llm: ScriptedLLM
) -> None:
    project, env = three_chapters
    chapters = project / "chapters"
    first = (
        (chapters / "chapter_001.md").stat().st_mtime_ns,
        (chapters / "chapter_001.md").read_text(),
    )
    old_second = (chapters / "chapter_002.md").read_text()
    (project / "guidance").mkdir()
    (project / "guidance" / "chapter_002.md").write_text(
        "Mara must lie to Tobias about the letter. GUIDE-MARK-7\n"
    )
    start = len(llm.requests)
    result = novel(project, env, "--chapters", "3", *SMALL)
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    by_chapter: dict[int | None, list[ScriptedRequest]] = {}
    for request in made:
        by_chapter.setdefault(chapter_of(request), []).append(request)
    assert 1 not in by_chapter, "chapter 1 must replay from the cache"
    assert None not in by_chapter, [r.last_user[:200] for r in by_chapter.get(None, [])]
    second = by_chapter[2]
    kinds = {
        "outline": "Outline chapter 2:",
        "plan": "Plan exactly",
        "draft": "Chapter 2, scene 1 of",
    }
    for kind, marker in kinds.items():
        steered = [r for r in second if marker in r.last_user]
        assert steered and all("GUIDE-MARK-7" in r.text for r in steered), kind
    # Chapter 3 depends on chapter 2, so it is written again too (its draft is asked again only
    # if its prompt changed: the scripted drafts of chapter 2 end as before), never with the guidance.
    assert not any("GUIDE-MARK-7" in r.text for r in by_chapter.get(3, []))
    assert (
        (chapters / "chapter_001.md").stat().st_mtime_ns,
        (chapters / "chapter_001.md").read_text(),
    ) == first
    assert (chapters / "chapter_002.md").read_text() != old_second
    kept = {p.name: p.read_text() for p in (chapters / "replaced").glob("*/chapter_*.md")}
    assert (
        set(kept) == {"chapter_002.md", "chapter_003.md"} and kept["chapter_002.md"] == old_second
    )
    assert (chapters / "chapter_003.md").is_file()
    # Nothing changed since: the same command asks nothing.
    start = len(llm.requests)
    assert novel(project, env, "--chapters", "3", *SMALL).returncode == 0
    assert requests_since(llm, start) == []


def test_chapters_past_the_plan_are_outlined_from_the_summaries(
    three_chapters: tuple[Path, dict[str, str]], llm: ScriptedLLM
) -> None:
    project, env = three_chapters
    start = len(llm.requests)
    result = novel(project, env, "--chapters", "5", *SMALL)
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    assert not any(chapter_of(r) in (1, 2, 3) for r in made), (
        "chapters 1-3 must replay from the cache"
    )
    for number in (4, 5):
        outline = [r for r in made if f"Outline chapter {number}:" in r.last_user]
        assert len(outline) == 1, number
        for earlier in range(1, number):
            assert f"SUMMARY-OF-CHAPTER-{earlier}" in outline[0].last_user, (number, earlier)
        assert "past the initial plan" in outline[0].last_user
    assert (project / "chapters" / "chapter_005.md").is_file()


# --- models and settings changed between runs ---------------------------------------------------


def test_another_model_setting_writes_the_next_chapters_and_never_the_written_ones(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "retuned"
    args = ("--premise", PREMISE + " (retuned)", *SMALL)
    env = write_book(llm, graph_settings, prefect_home, project, *args, "--chapters", "2")
    chapters = project / "chapters"
    polished = "Mara read the letter twice, then burned it. (The writer's own line.)\n"
    with (chapters / "chapter_001.md").open("a") as chapter_one:
        chapter_one.write(polished)  # the writer polishes a written chapter by hand
    written = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in chapters.glob("*.md")}
    two_chapters = export(project, env, "two")
    chapter_two = (chapters / "chapter_002.md").read_bytes()
    (chapters / "chapter_002.md").unlink()  # and deletes another by mistake
    # Every tier's temperature changed: each LLM stage's cache key changes with it.
    retuned = {
        **env,
        **{
            f"SKALD_TIERS__{tier}__TEMPERATURE": "0.13"
            for tier in ("LARGE", "MEDIUM", "SMALL", "NARRATIVE")
        },
    }
    start = len(llm.requests)
    result = novel(project, retuned, *args, "--chapters", "3")
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    # Neither the book's plan nor a written chapter is asked again; the new chapter is, so.
    assert made and {chapter_of(r) for r in made} == {3}, [r.last_user[:80] for r in made]
    assert all(r.body.get("temperature") == 0.13 for r in made)
    manuscript = (project / "exports" / "manuscript.md").read_text()
    assert polished in manuscript
    assert (chapters / "chapter_001.md").stat().st_mtime_ns == written["chapter_001.md"][1]
    # The deleted chapter is written again as it was written, not by the new settings.
    assert (chapters / "chapter_002.md").read_bytes() == chapter_two
    assert "chapter 2: its file was deleted" in result.stderr + result.stdout
    assert {p.name: p.read_bytes() for p in chapters.glob("chapter_00[12].md")} == {
        name: text for name, (text, _) in written.items()
    }
    # An old command run again (--chapters 2) would export the book without chapter 3 while
    # the graph keeps it: refused in one line, nothing asked or changed.
    three_chapters = (project / "exports" / "manuscript.md").read_bytes()
    start = len(llm.requests)
    shorter = novel(project, retuned, *args, "--chapters", "2")
    assert shorter.returncode == 2 and len(llm.requests) == start, shorter.stderr[-3000:]
    assert "--chapters 2 would leave out chapter(s) 3" in one_error_line(shorter.stderr)
    assert (project / "exports" / "manuscript.md").read_bytes() == three_chapters
    # Exact: taking chapter 3 away leaves the graph as the two chapters left it.
    rolled = kg(project, retuned, "rollback", "--chapter", "3")
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    assert export(project, retuned, "three-minus") == two_chapters
    # The look-alike: once rolled back, the book may end at chapter 2.
    assert novel(project, retuned, *args, "--chapters", "2").returncode == 0
    assert "Chapter 3" not in (project / "exports" / "manuscript.md").read_text()


# --- the story bible ----------------------------------------------------------------------------


def test_bible_edit_reaches_graph_and_prompts_and_is_never_overwritten(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "bible"
    env = write_book(
        llm,
        graph_settings,
        prefect_home,
        project,
        "--premise",
        PREMISE + " (bible)",
        *SMALL,
        "--chapters",
        "1",
    )
    before = export(project, env, "before")
    sheet_path = project / "characters" / "mara_quill.yaml"
    sheet = yaml.safe_load(sheet_path.read_text())

    # Invalid edits: one line naming file, field and what is allowed; nothing asked or written.
    for bad, field, allowed in (
        ({**sheet, "mood": "grim"}, "mood", "allowed fields: name, role"),
        ({**sheet, "traits": "brave"}, "traits", "list"),
    ):
        sheet_path.write_text(yaml.safe_dump(bad, sort_keys=False))
        start = len(llm.requests)
        result = novel(project, env, "--chapters", "2", *SMALL)
        assert result.returncode == 2, result.stderr[-3000:]
        line = one_error_line(result.stderr)
        assert "characters/mara_quill.yaml" in line and f"'{field}'" in line and allowed in line, (
            line
        )
        assert len(llm.requests) == start
        assert export(project, env, "after-bad") == before
        assert not (project / "chapters" / "chapter_002.md").exists()

    edited = {
        **sheet,
        "traits": [*sheet["traits"], "haunted"],
        "motivation": "find her sister alive",
    }
    sheet_path.write_text(yaml.safe_dump(edited, sort_keys=False))
    written = sheet_path.read_bytes()
    start = len(llm.requests)
    result = novel(project, env, "--chapters", "2", *SMALL)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sheet_path.read_bytes() == written, "Skald must not overwrite the writer's file"
    graph = json.loads(export(project, env, "edited"))
    mara = next(
        n["properties"] for n in graph["nodes"] if n["properties"].get("name") == "Mara Quill"
    )
    assert "haunted" in mara["traits"]
    assert "find her sister alive" in json.dumps(mara)
    changesets = sorted(
        n["properties"]["chapter"] for n in graph["nodes"] if "ChangeSet" in n["labels"]
    )
    assert changesets == [-1, 0, 1, 2]
    drafts = [r for r in requests_since(llm, start) if "Chapter 2, scene 1 of" in r.last_user]
    assert drafts and all("find her sister alive" in r.text and "haunted" in r.text for r in drafts)
    assert not any(chapter_of(r) == 1 for r in requests_since(llm, start))

    # The same command again: nothing asked, nothing synced twice, the file as the writer left it.
    settled = export(project, env, "settled")
    start = len(llm.requests)
    assert novel(project, env, "--chapters", "2", *SMALL).returncode == 0
    assert len(llm.requests) == start
    assert sheet_path.read_bytes() == written
    assert export(project, env, "again") == settled


# --- redo ---------------------------------------------------------------------------------------


def test_redo_from_two_rewrites_chapters_two_and_three_exactly(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "redo"
    args = ("--premise", PREMISE + " (redo)", *SMALL)
    env = write_book(llm, graph_settings, prefect_home, project, *args, "--chapters", "3")
    chapters = project / "chapters"
    old = {n: (chapters / f"chapter_00{n}.md").read_text() for n in (1, 2, 3)}
    first_mtime = (chapters / "chapter_001.md").stat().st_mtime_ns
    polished = old[2] + "\nMara kept the key. (The writer's own line.)\n"
    (chapters / "chapter_002.md").write_text(polished)
    # The reference: the graph with chapter 1 only.
    assert kg(project, env, "rollback", "--chapter", "2", "--cascade").returncode == 0
    after_one = export(project, env, "after-one")
    assert novel(project, env, "--chapters", "3", *SMALL).returncode == 0  # back from the cache
    # Written again, chapter 2 does not overwrite the writer's hand edits: they are set aside.
    assert (chapters / "chapter_002.md").read_text() == old[2]
    kept = list((chapters / "replaced").glob("*/chapter_*.md"))
    assert [(p.name, p.read_text()) for p in kept] == [("chapter_002.md", polished)]
    shutil.rmtree(chapters / "replaced")  # the redo's own set-aside is checked alone below

    # The writer edits written chapter 2's plan: nothing is rewritten, and the run says so.
    plans_path = project / "outline" / "chapters.yaml"
    plans = yaml.safe_load(plans_path.read_text())
    new_plan = "Mara finds a brass key under the lighthouse stairs."
    plans_path.write_text(
        yaml.safe_dump(
            [{**p, "summary": new_plan} if p["number"] == 2 else p for p in plans], sort_keys=False
        )
    )
    start = len(llm.requests)
    result = novel(project, env, "--chapters", "3", *SMALL)
    assert result.returncode == 0 and len(llm.requests) == start, result.stderr[-4000:]
    warned = [line for line in result.stderr.splitlines() if "chapters.yaml: the plan" in line]
    assert len(warned) == 1 and "written chapter(s) 2 changed" in warned[0], warned
    assert "--redo-from 2" in warned[0]

    start = len(llm.requests)
    result = novel(project, env, "--chapters", "3", "--redo-from", "2", *SMALL)
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    assert not any(chapter_of(r) == 1 for r in made), "chapter 1 must cost no request"
    # The redo writes chapter 2 to its new plan, and the next run has nothing to say of it.
    assert any("Outline chapter 2:" in r.last_user and new_plan in r.last_user for r in made), [
        r.last_user[:120] for r in made if "Outline chapter" in r.last_user
    ]
    assert "chapters.yaml: the plan" not in result.stderr
    for number in (2, 3):
        drafts = [r for r in made if f"Chapter {number}, scene 1 of" in r.last_user]
        assert drafts and all("take 2" in r.text for r in drafts), number
        assert (chapters / f"chapter_00{number}.md").read_text() != old[number]
    assert (chapters / "chapter_001.md").read_text() == old[1]
    assert (chapters / "chapter_001.md").stat().st_mtime_ns == first_mtime
    aside = {p.name: p.read_text() for p in (chapters / "replaced").glob("*/chapter_*.md")}
    assert aside == {"chapter_002.md": old[2], "chapter_003.md": old[3]}
    # Exact: taking the new chapters 2-3 away again leaves the graph as after chapter 1.
    rolled = kg(project, env, "rollback", "--chapter", "2", "--cascade")
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    assert export(project, env, "redo-minus") == after_one


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_killed_redo_given_again_is_resumed_with_the_takes_it_asked_for(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "killed-redo"
    args = ("--premise", PREMISE + " (killed redo)", *SMALL, "--chapters", "3")
    env = write_book(llm, graph_settings, prefect_home, project, *args)
    reached, release = threading.Event(), threading.Event()

    def held_draft(request: ScriptedRequest) -> str:
        reached.set()
        release.wait(timeout=600)  # held until the run is killed: it dies drafting chapter 3
        return scripted_draft(request)

    llm.on(contains="Chapter 3, scene 1 of", respond=held_draft, times=1)
    redo = [sys.executable, "-m", "flows.novel", "--project-dir", str(project), *args]
    with (tmp_path / "killed-redo.log").open("w") as log:
        child = subprocess.Popen(
            [*redo, "--redo-from", "2"],
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the kill takes the whole run
        )
        try:
            assert reached.wait(timeout=600), (tmp_path / "killed-redo.log").read_text()[-3000:]
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
        finally:
            release.set()
            if child.poll() is None:
                child.kill()
    second_take = (project / "chapters" / "chapter_002.md").read_text()
    assert load_steering(project / ".saga").takes == {2: 2, 3: 2}

    # The same command again resumes the redo: chapter 2's take 2 stands (no request), chapter 3
    # is written as take 2, as the run never killed would have written it; not as take 3.
    start = len(llm.requests)
    result = novel(project, env, *args, "--redo-from", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    assert not any(chapter_of(r) in (1, 2) for r in made)
    drafts = [r for r in made if "Chapter 3, scene 1 of" in r.last_user]
    assert drafts and all("(take 2)" in r.text for r in drafts)
    assert (project / "chapters" / "chapter_002.md").read_text() == second_take
    steering = load_steering(project / ".saga")
    assert (steering.takes, steering.redo_pending) == ({2: 2, 3: 2}, None)

    # Once a redo has finished, the same command asks for new takes again (a redo is an action).
    start = len(llm.requests)
    result = novel(project, env, *args, "--redo-from", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    for number in (2, 3):
        drafts = [
            r for r in requests_since(llm, start) if f"Chapter {number}, scene 1 of" in r.last_user
        ]
        assert drafts and all("(take 3)" in r.text for r in drafts), number
    assert load_steering(project / ".saga").redo_pending is None


def test_bad_redo_from_fails_with_one_line(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    env = run_env(llm, graph_settings, prefect_home)
    start = len(llm.requests)
    result = novel(
        tmp_path / "nope", env, "--premise", PREMISE, "--chapters", "2", "--redo-from", "3"
    )
    assert result.returncode == 2
    assert "--redo-from must be between 1 and --chapters 2" in one_error_line(result.stderr)
    assert len(llm.requests) == start


# --- import -------------------------------------------------------------------------------------

MANUSCRIPT = """# The Salt Road

## Chapter 1: Harbor

Ilse Marrow counted the crates on the quay of Saltmere harbor while the gulls screamed overhead.

* * *

Captain Oren Hale came down the Saltmere gangway and asked her for the ledger she had hidden.

## Chapter 2: The Ledger

Ilse Marrow read the ledger by candlelight in the customs house of Saltmere and found her father's name.

## Chapter 3: Night Tide

Captain Oren Hale sailed out of Saltmere harbor on the night tide with Ilse Marrow aboard.
"""


def _imported_extraction(request: ScriptedRequest) -> dict[str, object]:
    text = scene_text_of(request)
    entities = [
        {"name": "Saltmere harbor", "kind": "Location", "description": "A grey port."},
        {
            "name": "Ilse Marrow",
            "kind": "Character",
            "description": "A customs clerk.",
            "traits": ["watchful"],
        },
        {
            "name": "Captain Oren Hale",
            "kind": "Character",
            "description": "A smuggler captain.",
            "traits": ["bold"],
        },
    ]
    rels = [{"source": "Ilse Marrow", "target": "Captain Oren Hale", "type": "DISTRUSTS"}]
    extraction = quoting_extraction(text, entities, rels)
    if len(extraction["entities"]) < 3:  # the relationship only where the scene has both
        extraction["relationships"] = []
    return extraction


def test_import_manuscript_then_continue_it(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    wipe_graph(graph_settings)
    project = tmp_path / "imported"
    env = run_env(llm, graph_settings, prefect_home)
    source = tmp_path / "salt_road.md"
    source.write_text(MANUSCRIPT)
    llm.on(schema="SceneExtraction", contains="Saltmere", respond=_imported_extraction)
    cmd = [
        sys.executable,
        "-m",
        "flows.novel",
        "import",
        "--project-dir",
        str(project),
        "--manuscript",
        str(source),
    ]
    result = subprocess.run(
        cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["title"] == "The Salt Road" and report["chapters"] == 3
    assert sorted(report["characters"]) == ["Captain Oren Hale", "Ilse Marrow"]
    assert (project / "characters" / "ilse_marrow.yaml").is_file()
    assert "Night Tide" in (project / "chapters" / "chapter_003.md").read_text()
    imported_headings = ["Chapter 1: Harbor", "Chapter 2: The Ledger", "Chapter 3: Night Tide"]
    assert report["ebooks"] == [
        str(project / "exports" / f"manuscript.{fmt}") for fmt in ("epub", "docx")
    ]
    epub, docx = (
        read_epub(project / "exports/manuscript.epub"),
        read_docx(project / "exports/manuscript.docx"),
    )
    assert epub.title == docx.title == "The Salt Road"
    assert epub.chapter_headings == docx.headings == imported_headings
    graph = json.loads(export(project, env, "imported"))
    chapters = sorted(n["properties"]["number"] for n in graph["nodes"] if "Chapter" in n["labels"])
    assert chapters == [1, 2, 3]
    changesets = sorted(
        n["properties"]["chapter"] for n in graph["nodes"] if "ChangeSet" in n["labels"]
    )
    assert changesets == [0, 1, 2, 3]
    scenes = [
        n for n in graph["nodes"] if "Scene" in n["labels"] and n["properties"].get("chapter") == 1
    ]
    assert len(scenes) == 2

    imported_two = (project / "chapters" / "chapter_002.md").read_bytes()
    (project / "chapters" / "chapter_002.md").unlink()  # deleted by mistake
    start = len(llm.requests)
    result = novel(project, env, "--chapters", "4", "--scenes-per-chapter", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    assert not any(chapter_of(r) in (1, 2, 3) for r in made), "imported chapters are not rewritten"
    # The deleted chapter is the writer's text again, and the manuscript holds it.
    assert (project / "chapters" / "chapter_002.md").read_bytes() == imported_two
    outline = [r for r in made if "Outline chapter 4:" in r.last_user]
    plan = [r for r in made if "Plan exactly" in r.last_user]
    assert outline and plan
    for request in (*outline, *plan):
        assert "Ilse Marrow" in request.last_user and "Captain Oren Hale" in request.last_user
    assert all(f"SUMMARY-OF-CHAPTER-{n}" in outline[0].last_user for n in (1, 2, 3))
    assert (project / "chapters" / "chapter_004.md").is_file()
    continued = read_epub(project / "exports/manuscript.epub")
    assert continued.title == "The Salt Road" and continued.identifier == epub.identifier
    assert (
        continued.chapter_headings[:3] == imported_headings and len(continued.chapter_headings) == 4
    )
    assert read_docx(project / "exports/manuscript.docx").headings == continued.chapter_headings
    # Chapter 4 brought new people in (the scripted drafts name them): learned, next to the bible.
    learned = yaml.safe_load((project / "characters" / "learned" / "mara_quill.yaml").read_text())
    assert (
        learned["name"] == "Mara Quill"
        and not (project / "characters" / "mara_quill.yaml").exists()
    )
    assert "Night Tide" in (project / "chapters" / "chapter_003.md").read_text()
    names = {
        n["properties"].get("name") for n in json.loads(export(project, env, "continued"))["nodes"]
    }
    assert {"Ilse Marrow", "Captain Oren Hale", "Saltmere harbor"} <= names


# --- narrative enrichment -------------------------------------------------------------------------


def _enrich(request: ScriptedRequest) -> str:
    draft = request.last_user.split('"""')[1].strip()
    return (
        draft
        + " Brine stung her lips, and somewhere below ENRICHED-MARK-3 the bell buoy tolled for the drowned."
    )


def test_enrichment_is_off_by_default_and_when_on_is_what_is_committed(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    assert not any("Enrich this scene" in r.text for r in llm.requests), (
        "enrichment must be off by default"
    )
    wipe_graph(graph_settings)
    project = tmp_path / "enriched"
    env = run_env(llm, graph_settings, prefect_home, SKALD_LIMITS__ENRICH_NARRATIVE="true")
    llm.on(schema=None, contains="Enrich this scene", respond=_enrich)
    start = len(llm.requests)
    result = novel(project, env, "--premise", PREMISE + " (enriched)", "--chapters", "1", *SMALL)
    assert result.returncode == 0, result.stderr[-4000:]
    made = requests_since(llm, start)
    assert len([r for r in made if "Enrich this scene" in r.last_user]) == 1
    extraction = [r for r in made if "Scene 1 of chapter 1:" in r.last_user]
    editor = [r for r in made if "Chapter 1 was planned as" in r.last_user]
    assert extraction and all("ENRICHED-MARK-3" in r.last_user for r in extraction)
    assert editor and all("ENRICHED-MARK-3" in r.last_user for r in editor)
    assert "ENRICHED-MARK-3" in (project / "chapters" / "chapter_001.md").read_text()
