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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from core.settings import Settings
from tests.conftest import REPO_ROOT
from tests.support import process_guard
from tests.support.ebook_reading import read_docx, read_epub
from tests.support.novel_runs import export, kg, novel, run_env, wipe_graph, write_book
from tests.support.novel_script import PREMISE, script_novel, scripted_draft
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        script_novel(server)
        yield server


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
    epub, docx = (
        read_epub(project / "exports/manuscript.epub"),
        read_docx(project / "exports/manuscript.docx"),
    )
    assert epub.title == docx.title == title
    assert len(epub.chapter_headings) == 2 and epub.chapter_headings == docx.headings
    # The unscripted outline refresh titles every chapter "text": the second chapter does not
    # repeat the first's title and keeps the one planned for it.
    assert epub.chapter_headings == ["Chapter 1: text", "Chapter 2: The Letter"]
    graph = json.loads(exported)
    chapters = [n for n in graph["nodes"] if "Chapter" in n["labels"]]
    assert sorted(n["properties"]["number"] for n in chapters) == [1, 2]
    assert all(n["properties"].get("summary") for n in chapters)
    names = {n["properties"].get("name") for n in graph["nodes"]}
    assert {"Mara Quill", "Tobias Venn", "Gull Rock lighthouse"} <= names
    # Each vector names the model that made it: retrieval compares a query only with its own's.
    vectors = [n["properties"] for n in graph["nodes"] if {"Scene", "Chapter"} & set(n["labels"])]
    assert len(vectors) == 6 and all(p.get("embedding") for p in vectors)
    assert {p["embedded_by"] for p in vectors} == {
        f"{env['SKALD_EMBEDDING_BASE_URL']}|text-embedding-3-small"
    }


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


@pytest.mark.parametrize(
    ("state", "broken", "hint"),
    [
        (".saga/steering.json", '{"takes": {"2": "twice"}', "delete it (chapters are then taken"),
        (".saga/bible/written.json", "[]", "delete it (Skald then rewrites no bible file"),
        (".saga/project.json", "", "restore it or start a new --project-dir"),
    ],
)
def test_a_corrupted_state_file_stops_the_run_with_one_line_and_changes_nothing(
    first_run: tuple[Path, dict[str, str], str],
    llm: ScriptedLLM,
    state: str,
    broken: str,
    hint: str,
) -> None:
    project, env, exported = first_run
    path = project / state
    kept = path.read_bytes()
    path.write_text(broken)
    try:
        before_files, before = snapshot_files(project), llm.request_count
        result = novel(project, env, *ARGS)
        assert result.returncode == 2, result.stderr[-4000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"novel: error: {path} is corrupted: "), result.stderr[-4000:]
        assert hint in last and "Traceback" not in result.stderr
        assert "validation error" not in last and "errors.pydantic.dev" not in last  # one problem
        assert llm.request_count == before
        assert snapshot_files(project) == before_files
        assert path.read_text() == broken
        assert export(project, env, "corrupted") == exported
    finally:
        path.write_bytes(kept)


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
        (("--premise", PREMISE, "--chapters", "1", "--acts", "0"), "--acts must be between 1"),
        (
            ("--premise", PREMISE, "--chapters", "1", "--characters", "21"),
            "--characters must be between 1 and 20 (got 21)",
        ),
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


@pytest.mark.parametrize("command", ["novel", "import"])
def test_a_new_book_never_overwrites_chapter_files_no_project_wrote(
    command: str, llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    env = run_env(llm, graph_settings, prefect_home)
    project = tmp_path / "own"
    (project / "chapters").mkdir(parents=True)
    own = "# Chapter 1: Mine\n\nThe writer's own first chapter.\n"
    (project / "chapters" / "chapter_001.md").write_text(own)
    manuscript = tmp_path / "book.md"
    manuscript.write_text("# Harbor\n\nIlse counted the crates.\n")
    before = llm.request_count
    if command == "import":
        # `import` is a subcommand: it comes first.
        result = subprocess.run(
            [sys.executable, "-m", "flows.novel", "import", "--project-dir", str(project)]
            + ["--manuscript", str(manuscript)],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    else:
        result = novel(project, env, *ARGS)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "holds no Skald project but has chapters/chapter_001.md" in lines[0]
    assert (project / "chapters" / "chapter_001.md").read_text() == own
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
        return scripted_draft(request)

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
    assert left == [], (
        f"SIGKILL of flows.novel left processes behind: {[(p.pid, p.cmdline) for p in left]}"
    )
    # What the killed run's calls cost is on disk up to its last finished chapter:
    # initialization's and chapter 1's calls (chapter 2's, in flight at the kill, are not).
    (call_log,) = (project / ".saga" / "runs").glob("llm_calls_*.parquet")
    purposes = pl.read_parquet(call_log)["purpose"].to_list()
    assert "global_outline" in purposes and purposes.count("summarize_chapter") == 1, purposes
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


def _sigint_as_a_terminal_sends_it() -> None:
    # A pytest-xdist worker may have SIGINT ignored, and an ignored signal stays ignored
    # across exec; Ctrl-C in a terminal meets the default disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: What the shell script around a run prints when it goes on after the run (`_run_held_at`).
SCRIPT_WENT_ON = "the-script-went-on-to-its-next-command"


@contextmanager
def _run_held_at(
    llm: ScriptedLLM,
    scene: str,
    project: Path,
    env: dict[str, str],
    args: tuple[str, ...],
    in_script: bool = False,
    **popen: Any,
) -> Iterator[tuple[subprocess.Popen[str], list[process_guard.ProcessInfo]]]:
    """`python -m flows.novel` with Prefect's temporary API server of its own, as a user's run
    has, its draft of `scene` ("Chapter 2, scene 2 of 2") held once asked: yields the process
    and its children at that moment, and releases the draft and reaps the process after.
    `in_script`: the command is run by a shell script that goes on with `SCRIPT_WENT_ON` (on
    stderr) after it; the process yielded is the script's shell."""
    reached, release = threading.Event(), threading.Event()

    def held_draft(request: ScriptedRequest) -> str:
        reached.set()
        release.wait(timeout=600)  # held until the run is stopped
        return scripted_draft(request)

    llm.on(contains=scene, respond=held_draft, times=1)
    command = [sys.executable, "-m", "flows.novel", "--project-dir", str(project), *args]
    if in_script:
        command = ["bash", "-c", f'"$@"; echo {SCRIPT_WENT_ON} >&2', "bash", *command]
    proc = subprocess.Popen(
        command,
        env={k: v for k, v in env.items() if k != "PREFECT_API_URL"},
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    hang_bound = threading.Timer(900, proc.kill)  # a bound for a hang, not a margin
    hang_bound.start()
    try:
        assert reached.wait(timeout=300), "chapter 2 never started"
        yield proc, process_guard.descendants(proc.pid)
    finally:
        hang_bound.cancel()
        release.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_ctrl_c_ends_the_run_with_one_line_and_its_resume_repeats_no_finished_call(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    """Ctrl-C sends SIGINT to the terminal's whole foreground process group. The run's own
    children (Prefect's temporary API server) must not die of it under the run: the run then
    spent minutes retrying the dead API to report its end, printing ConnectError tracebacks.
    The run is started by a shell script, as batch runs are: after the run's clean stop the
    script must stop too, not go on to its next command (it did while the run exited 130)."""
    wipe_graph(graph_settings)
    args = ("--premise", PREMISE + " (ctrl-c)", *ARGS[2:])
    env = run_env(llm, graph_settings, prefect_home)
    start = len(llm.requests)
    project = tmp_path / "interrupted"
    with _run_held_at(
        llm,
        "Chapter 2, scene 2 of 2",
        project,
        env,
        args,
        in_script=True,
        start_new_session=True,  # the group a terminal's Ctrl-C reaches
        preexec_fn=_sigint_as_a_terminal_sends_it,
    ) as (proc, children):
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stderr is not None
        lines, servers_at_the_line = [], None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("novel: interrupted;") and servers_at_the_line is None:
                servers_at_the_line = [
                    c.cmdline
                    for c in process_guard.descendants(proc.pid)
                    if "uvicorn" in c.cmdline and c.alive
                ]
        proc.wait()
    stderr = "\n".join(lines)
    assert any("uvicorn" in c.cmdline for c in children), [c.cmdline for c in children]
    # The run ended by SIGINT itself (a shell shows 130), so the script stopped too (bash ends
    # by SIGINT when the command it waited for did).
    assert SCRIPT_WENT_ON not in stderr, stderr[-3000:]
    assert proc.returncode == -signal.SIGINT, stderr[-3000:]
    assert "ConnectError" not in stderr and "Error logging to API" not in stderr, stderr[-3000:]
    # The line that says what to do is the terminal's last: the temporary API server, whose
    # stderr is the terminal's too, was stopped before it (stopped at exit, it could print a
    # traceback of its cancelled background work under the line).
    assert servers_at_the_line == [], stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith("novel: interrupted;"), stderr[-2000:]
    assert process_guard.wait_until_gone({c.pid for c in children}, deadline_s=60) == []
    finished_before = {
        _key(r) for r in llm.requests[start:] if "Chapter 2, scene 2 of 2" not in r.text
    }
    resume_start = len(llm.requests)
    result = novel(project, env, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    assert not [r for r in llm.requests[resume_start:] if _key(r) in finished_before]


def test_sigterm_to_every_process_of_the_run_ends_it_cleanly(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    """A service manager stops a unit by sending SIGTERM to every process in it at once
    (systemd's default `KillMode=control-group`), Prefect's temporary API server included.
    That server must outlive it: killed beside the run, it left the run retrying the dead API
    to report its end (156 s, exit 1, `ConnectError` tracebacks, on the embedded defaults)."""
    wipe_graph(graph_settings)
    args = ("--premise", PREMISE + " (service stop)", *ARGS[2:])
    env = run_env(llm, graph_settings, prefect_home)
    stopped = tmp_path / "stopped"
    with _run_held_at(llm, "Chapter 2, scene 1 of 2", stopped, env, args) as (proc, children):
        for pid in (proc.pid, *(c.pid for c in children)):
            os.kill(pid, signal.SIGTERM)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        proc.wait()
    assert any("uvicorn" in c.cmdline for c in children), [c.cmdline for c in children]
    # Ended by SIGTERM itself, as a service manager counts a clean stop: Prefect reports the
    # crash, then the signal ends the process (core.interrupt), not an exit status 143.
    assert proc.returncode == -signal.SIGTERM, stderr[-3000:]
    assert "Crash detected! Execution was aborted by a termination signal." in stderr
    for failure in ("ConnectError", "Error logging to API", "Traceback"):
        assert failure not in stderr, stderr[-3000:]
    assert process_guard.wait_until_gone({c.pid for c in children}, deadline_s=60) == []


def test_a_run_that_fails_leaves_the_log_of_what_its_calls_cost(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    """A run that fails at chapter 2 (the endpoint refuses its key) leaves its LLM call log:
    initialization's and chapter 1's calls, and the call that failed."""
    wipe_graph(graph_settings)
    args = ("--premise", PREMISE + " (failed run)", *ARGS[2:])
    llm.on(contains="Chapter 2, scene 1 of 2", fault="http_401", times=1)
    project = tmp_path / "failed"
    result = novel(project, run_env(llm, graph_settings, prefect_home), *args)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("novel: error:"), result.stderr
    (call_log,) = (project / ".saga" / "runs").glob("llm_calls_*.parquet")
    calls = pl.read_parquet(call_log)
    assert calls["purpose"].to_list().count("summarize_chapter") == 1
    assert calls.filter(pl.col("outcome") != "ok").height >= 1, calls["outcome"].to_list()


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
    env = run_env(
        llm, graph_settings, prefect_home, SKALD_EMBEDDING_BASE_URL="http://127.0.0.1:9/v1"
    )
    result = novel(
        project,
        env,
        "--premise",
        PREMISE,
        "--chapters",
        "1",
        "--scenes-per-chapter",
        "2",
        "--acts",
        "1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "continuing without vectors" in result.stderr
    assert (project / "chapters/chapter_001.md").is_file()
    scenes = [
        n for n in json.loads(export(project, env, "novectors"))["nodes"] if "Scene" in n["labels"]
    ]
    assert len(scenes) == 2 and all(
        "embedding" not in n["properties"] and "embedded_by" not in n["properties"] for n in scenes
    )
