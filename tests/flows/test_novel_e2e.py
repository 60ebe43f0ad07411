"""End to end: `python -m flows.novel` as a user runs it, against the scripted
OpenAI-compatible server over real HTTP and the real graph server.

The graph is the session's (via NEO4J_URI, as a production user would configure it), so
tests here run one after another and clean it first.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.graph_server import graph_endpoint
from core.settings import Settings
from tests.conftest import REPO_ROOT, child_pythonpath, prefect_api_env
from tests.support import process_guard
from tests.support.ebook_reading import read_docx, read_epub
from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
    scripted_prose,
)

PREMISE = "A lighthouse keeper finds a letter from a sister who drowned ten years ago."
CHARACTERS = [
    {
        "name": "Mara Quill",
        "role": "protagonist",
        "description": "The keeper of Gull Rock light.",
        "traits": ["stubborn", "brave"],
        "motivation": "learn the truth",
        "backstory": "Lost her sister.",
        "voice": "Clipped, salty sentences.",
    },
    {
        "name": "Tobias Venn",
        "role": "supporting",
        "description": "The ferryman.",
        "traits": ["kind"],
        "motivation": "protect Mara",
        "backstory": "Grew up on the mainland.",
        "voice": "Slow and gentle, full of tide lore.",
    },
]


def _plan(request: ScriptedRequest) -> dict[str, object]:
    wanted = int(re.search(r"Plan exactly (\d+) scenes", request.text).group(1))  # type: ignore[union-attr]
    return {
        "scenes": [
            {
                "title": f"Scene {i}",
                "pov": "Mara Quill",
                "setting": "Gull Rock lighthouse",
                "characters": ["Mara Quill", "Tobias Venn"],
                "beats": [f"beat {i}"],
            }
            for i in range(1, wanted + 1)
        ]
    }


SCENERY = [
    "Rain hammered the gallery glass while gulls wheeled over the reef.",
    "The lamp room smelled of paraffin, brass polish and old rope.",
    "Fog swallowed the ferry bell and the tide crept over the slipway.",
    "A storm lantern swung above the chart table, throwing long shadows.",
    "Morning sun lit the cliffs and the kelp beds glittered below.",
    "Snow dusted the keeper's cottage and the generator coughed awake.",
    "The letter's wax seal cracked like river ice under her thumb.",
    "Waves boomed in the sea caves beneath the northern stairs.",
]


def _draft(request: ScriptedRequest) -> str:
    where = re.search(r"Chapter (\d+), scene (\d+)", request.text)
    chapter, scene = (int(where.group(1)), int(where.group(2))) if where else (0, 0)
    # Distinct scenery and prose per scene keep scenes from looking like duplicates to the
    # validator; enough varied words pass the degeneration guard.
    scenery = SCENERY[(chapter * 3 + scene) % len(SCENERY)]
    body = scripted_prose(chapter * 3 + scene)
    if "## Guidance" in request.text:  # revision guidance rides in the prompt's guidance section
        return f"Mara Quill climbed the stairs of Gull Rock lighthouse with Tobias Venn, revised. {scenery} {body}"
    marker = " A Drowned Phantom watched." if "REJECT-ME" in request.text else ""
    return f"Mara Quill met Tobias Venn at Gull Rock lighthouse. {scenery}{marker} {body}"


def _extract(request: ScriptedRequest) -> dict[str, object]:
    entities = [
        {"name": "Mara Quill", "kind": "Character", "description": "The keeper.", "traits": ["brave"]},
        {"name": "Tobias Venn", "kind": "Character", "description": "The ferryman."},
        {"name": "Gull Rock lighthouse", "kind": "Location", "description": "A lighthouse."},
        {"name": "Drowned Phantom", "kind": "Character", "description": "A ghost."},
    ]
    relationships = [
        {"source": "Mara Quill", "target": "Tobias Venn", "type": "FRIEND_OF"},
        {"source": "Mara Quill", "target": "Gull Rock lighthouse", "type": "LOCATED_IN"},
    ]
    return quoting_extraction(scene_text_of(request), entities, relationships)


def script_novel(server: ScriptedLLM) -> None:
    server.on(schema="CharacterSheets", respond={"characters": CHARACTERS})
    server.on(
        schema="GlobalOutline",
        respond={
            "title": "The Drowned Letter",
            "logline": "A keeper chases a ghost's letter.",
            "setting": "Gull Rock",
            "themes": ["grief"],
            "acts": [
                {"number": 1, "summary": "The letter."},
                {"number": 2, "summary": "The truth."},
            ],
        },
    )
    server.on(
        schema="ChapterOutlines",
        respond=lambda r: {
            "chapters": [
                {
                    "number": 1,
                    "title": "The Letter",
                    "summary": "Mara finds the letter.",
                    "pov": "Mara Quill",
                    "setting": "Gull Rock lighthouse",
                    "key_beats": ["finds letter"],
                }
            ]
        },
    )
    server.on(schema="ScenePlan", respond=_plan)
    server.on(schema="SceneExtraction", respond=_extract)
    server.on(
        schema="QualityScores",
        respond={
            "coherence": 0.9,
            "prose_quality": 0.9,
            "plot_advancement": 0.9,
            "pacing": 0.9,
            "tone_consistency": 0.9,
            "feedback": "Good.",
        },
    )
    server.on(
        schema="ChapterSummary",
        respond=lambda r: {
            "summary": "Mara and Tobias meet at the lighthouse.",
            "key_events": ["meeting"],
        },
    )
    server.on(schema=None, contains="Write the scene", respond=_draft)


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        script_novel(server)
        yield server


def run_env(
    llm: ScriptedLLM, settings: Settings, prefect_home: Path, **extra: str
) -> dict[str, str]:
    endpoint = graph_endpoint(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKALD_", "NEO4J_", "OPENAI_"))}
    env.update(
        {
            "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "test-key",
            "SKALD_EMBEDDING_BASE_URL": llm.base_url,
            "NEO4J_URI": endpoint.uri,
            "NEO4J_USERNAME": endpoint.username,
            "NEO4J_PASSWORD": endpoint.password,
            "NEO4J_DATABASE": endpoint.database,
            "PREFECT_HOME": str(prefect_home),
            "SKALD_LIMITS__LLM_MAX_ATTEMPTS": "2",
            "PYTHONPATH": child_pythonpath(),
            **prefect_api_env(),  # `prefect_home` starts the session's API
        }
    )
    env.update(extra)
    return env


def novel(
    project: Path, env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "flows.novel", "--project-dir", str(project), *args]
    return subprocess.run(
        cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def kg(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kg", *args, "--project-dir", str(project)]
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def export(project: Path, env: dict[str, str], name: str) -> str:
    out = project.parent / f"{project.name}-{name}.json"
    result = kg(project, env, "export", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    return out.read_text(encoding="utf-8")


def write_book(
    llm: ScriptedLLM, settings: Settings, prefect_home: Path, project: Path, *args: str, **extra: str
) -> dict[str, str]:
    """On an empty graph, `python -m flows.novel` for `project` with `args`, which must succeed;
    returns the run's environment for the next commands."""
    wipe_graph(settings)
    env = run_env(llm, settings, prefect_home, **extra)
    result = novel(project, env, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    return env


def wipe_graph(settings: Settings) -> None:
    from kg.store import GraphStore

    store = GraphStore.open(settings, migrate=False)
    try:
        store.wipe()
    finally:
        store.close()


def snapshot_files(project: Path) -> dict[str, tuple[int, bytes]]:
    files = {}
    for folder in ("chapters", "characters", "outline", "world", "exports"):
        for path in sorted((project / folder).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(project))] = (
                    path.stat().st_mtime_ns,
                    path.read_bytes(),  # exports/ holds the EPUB and DOCX too
                )
    return files


ARGS = ("--premise", PREMISE, "--chapters", "2", "--scenes-per-chapter", "2", "--acts", "2")


@pytest.fixture(scope="module")
def first_run(
    llm: ScriptedLLM,
    graph_settings: Settings,
    prefect_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, str], str]:
    project = tmp_path_factory.mktemp("novel") / "book"
    env = write_book(llm, graph_settings, prefect_home, project, *ARGS)
    return project, env, export(project, env, "first")


def test_first_run_writes_files_and_graph(first_run: tuple[Path, dict[str, str], str]) -> None:
    project, env, exported = first_run
    for rel in (
        "chapters/chapter_001.md",
        "chapters/chapter_002.md",
        "exports/manuscript.md",
        "outline/global_outline.md",
        "outline/chapters.yaml",
        "world/locations.yaml",
        "characters/mara_quill.yaml",
        "characters/tobias_venn.yaml",
    ):
        assert (project / rel).is_file(), rel
    assert "Mara Quill met Tobias Venn" in (project / "chapters/chapter_002.md").read_text()
    assert "Mara Quill met Tobias Venn" in (project / "exports/manuscript.md").read_text()
    title = (project / "exports/manuscript.md").read_text().splitlines()[0].removeprefix("# ")
    epub, docx = read_epub(project / "exports/manuscript.epub"), read_docx(project / "exports/manuscript.docx")
    assert epub.title == docx.title == title
    assert len(epub.chapter_headings) == 2 and epub.chapter_headings == docx.headings
    assert [h.split(":")[0] for h in epub.chapter_headings] == ["Chapter 1", "Chapter 2"]
    graph = json.loads(exported)
    chapters = [n for n in graph["nodes"] if "Chapter" in n["labels"]]
    assert sorted(n["properties"]["number"] for n in chapters) == [1, 2]
    assert all(n["properties"].get("summary") for n in chapters)
    names = {n["properties"].get("name") for n in graph["nodes"]}
    assert {"Mara Quill", "Tobias Venn", "Gull Rock lighthouse"} <= names


def test_rerun_makes_no_llm_request_and_changes_nothing(
    first_run: tuple[Path, dict[str, str], str], llm: ScriptedLLM
) -> None:
    project, env, exported = first_run
    before_files = snapshot_files(project)
    before = llm.request_count
    result = novel(project, env, *ARGS)
    assert result.returncode == 0, result.stderr[-4000:]
    assert llm.request_count == before, "a re-run must be served from the cache"
    assert export(project, env, "rerun") == exported
    assert snapshot_files(project) == before_files


def test_rollback_then_rerun_restores_chapter_from_cache(
    first_run: tuple[Path, dict[str, str], str], llm: ScriptedLLM
) -> None:
    project, env, exported = first_run
    rolled = kg(project, env, "rollback", "--chapter", "2")
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    after_rollback = json.loads(export(project, env, "rolled"))
    assert sorted(
        n["properties"]["number"] for n in after_rollback["nodes"] if "Chapter" in n["labels"]
    ) == [1]
    before = llm.request_count
    result = novel(project, env, *ARGS)
    assert result.returncode == 0, result.stderr[-4000:]
    assert llm.request_count == before
    assert export(project, env, "restored") == exported


def test_forced_revision_leaves_no_trace(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    wipe_graph(graph_settings)
    project = tmp_path / "revised"
    env = run_env(llm, graph_settings, prefect_home)
    # First drafts in this genre carry a marker entity; the editor rejects the first evaluation.
    llm.on(
        schema="QualityScores",
        times=1,
        respond={
            "coherence": 0.1,
            "prose_quality": 0.1,
            "plot_advancement": 0.1,
            "pacing": 0.1,
            "tone_consistency": 0.1,
            "feedback": "Weak.",
        },
    )
    result = novel(
        project,
        env,
        "--premise",
        PREMISE + " REJECT-ME",
        "--chapters",
        "1",
        "--scenes-per-chapter",
        "2",
        "--acts",
        "1",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    exported = export(project, env, "revised")
    assert "Drowned Phantom" not in exported
    text = (project / "chapters/chapter_001.md").read_text()
    assert "revised" in text and "Phantom" not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--premise", PREMISE, "--chapters", "0"), "--chapters must be at least 1"),
        (("--chapters", "2"), "needs a premise"),
    ],
)
def test_bad_arguments_fail_with_one_line(
    args: tuple[str, ...],
    message: str,
    llm: ScriptedLLM,
    graph_settings: Settings,
    prefect_home: Path,
    tmp_path: Path,
) -> None:
    env = run_env(llm, graph_settings, prefect_home)
    before = llm.request_count
    result = novel(tmp_path / "bad", env, *args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert llm.request_count == before


def test_unreachable_llm_fails_cleanly_and_writes_nothing(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    wipe_graph(graph_settings)
    env = run_env(
        llm,
        graph_settings,
        prefect_home,
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        SKALD_EMBEDDING_BASE_URL="http://127.0.0.1:9/v1",
    )
    before = export(tmp_path / "nollm", env, "before")
    result = novel(tmp_path / "nollm", env, *ARGS)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("novel: error:") and "127.0.0.1:9" in last, result.stderr[-2000:]
    assert export(tmp_path / "nollm", env, "after") == before


def test_unreachable_graph_fails_cleanly(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    env = run_env(llm, graph_settings, prefect_home, NEO4J_URI="bolt://127.0.0.1:9")
    before = llm.request_count
    result = novel(tmp_path / "nograph", env, *ARGS)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("novel: error:") and "bolt://127.0.0.1:9" in last, result.stderr[-2000:]
    assert llm.request_count == before


def test_sigkill_during_chapter_two_then_resume(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    """Kill the run while chapter 2 is being drafted; the re-run repeats no finished call
    and ends with the same graph as an uninterrupted run."""
    wipe_graph(graph_settings)
    premise = PREMISE + " (kill test)"
    args = ("--premise", premise, "--chapters", "2", "--scenes-per-chapter", "2", "--acts", "2")
    env = run_env(llm, graph_settings, prefect_home)
    reached = threading.Event()
    release = threading.Event()

    def slow_draft(request: ScriptedRequest) -> str:
        reached.set()
        release.wait(timeout=60)  # hold the request open until the process is killed
        return _draft(request)

    llm.on(contains="Chapter 2, scene 2 of 2", respond=slow_draft, times=1)
    start = len(llm.requests)
    project = tmp_path / "killed"
    # The killed run starts Prefect's temporary server of its own, as a user's run does: that
    # server (a uvicorn child) is what must die with it. The resume and the reference need not.
    own_server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.novel", "--project-dir", str(project), *args],
        env=own_server_env,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reached.wait(timeout=300), "chapter 2 never started"
        time.sleep(0.5)
        # Everything the run started: at least Prefect's temporary API server (uvicorn).
        children = process_guard.descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
    assert any("uvicorn" in c.cmdline for c in children), [c.cmdline for c in children]
    left = process_guard.wait_until_gone({c.pid for c in children}, deadline_s=60)
    assert left == [], f"SIGKILL of flows.novel left processes behind: {[(p.pid, p.cmdline) for p in left]}"
    finished_before_kill = [
        _key(r) for r in llm.requests[start:] if "Chapter 2, scene 2 of 2" not in r.text
    ]
    resume_start = len(llm.requests)
    result = novel(project, env, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    repeated = [
        _key(r) for r in llm.requests[resume_start:] if _key(r) in set(finished_before_kill)
    ]
    assert repeated == [], f"finished calls were repeated: {repeated[:3]}"
    resumed = export(project, env, "resumed")
    # Reference: the same book written without interruption in a fresh graph.
    wipe_graph(graph_settings)
    reference = tmp_path / "reference"
    assert novel(reference, env, *args).returncode == 0
    assert _without_project_paths(resumed) == _without_project_paths(
        export(reference, env, "reference")
    )


def _key(request: ScriptedRequest) -> str:
    return json.dumps([request.path, request.body], sort_keys=True)


def _without_project_paths(exported: str) -> str:
    return re.sub(r'"[^"]*/(killed|reference)/', '"<project>/', exported)


def test_dead_embeddings_endpoint_degrades_gracefully(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    """Embeddings are optional (spec 001 section 7): the book is written without vectors."""
    wipe_graph(graph_settings)
    project = tmp_path / "novectors"
    env = run_env(llm, graph_settings, prefect_home, SKALD_EMBEDDING_BASE_URL="http://127.0.0.1:9/v1")
    result = novel(project, env, "--premise", PREMISE, "--chapters", "1", "--scenes-per-chapter", "2", "--acts", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "continuing without vectors" in result.stderr
    assert (project / "chapters/chapter_001.md").is_file()
    scenes = [n for n in json.loads(export(project, env, "novectors"))["nodes"] if "Scene" in n["labels"]]
    assert len(scenes) == 2 and all("embedding" not in n["properties"] for n in scenes)
