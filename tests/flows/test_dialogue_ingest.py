"""Bulk ingest and the whole-dialogue recall regression, through the real CLI and flows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from core.cli import run_main
from core.graph_server import EmbeddedArcadeDB
from core.settings import Settings, load_settings
from flows.regression import main as regression_main
from kg.dialogue import DialogueRepository
from kg.store import GraphStore
from tasks.dialogue.ingest import memory_rows
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.remember import remember_rows
from tasks.dialogue.replay import load_dialogue
from tasks.dialogue.retriever import row_texts
from tests.conftest import DIALOGUES_DIR, REPO_ROOT, child_pythonpath, prefect_api_env
from tests.support.cli import graph_vars
from tests.support.logged_process import START_DEADLINE_S, LoggedProcess
from tests.support.scripted_llm import ScriptedLLM
from tests.support.served_graph import Served, embedded_graph_env

DIALOGUE = DIALOGUES_DIR / "locomo-30.turns.jsonl"
TURNS = 369
#: A short ingest (one write batch): the test is about the lost owner, not throughput.
OWNER_GONE_TURNS = 80
#: A bound on a finished run's exit, for a loaded machine: the exit used to hang for ever.
EXIT_BOUND_S = 600


@pytest.fixture()
def scripted() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


def _env(graph_settings: Settings, scripted: ScriptedLLM) -> dict[str, str]:
    # Embeddings from the scripted server: this test is about exactly-once, not recall.
    return {
        **os.environ,
        **graph_vars(graph_settings),
        "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
        "PYTHONPATH": child_pythonpath(),
    }


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_killed_ingest_run_again_leaves_every_turn_exactly_once(
    graph_settings: Settings, scripted: ScriptedLLM, tmp_path: Path, prefect_api: str
) -> None:
    conv = f"ingest-kill-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable,
        "-m",
        "flows.dialogue",
        "ingest",
        "--project-dir",
        str(tmp_path),
        "--dialogue",
        str(DIALOGUE),
        "--conversation-id",
        conv,
        "--batch-size",
        "8",
    ]
    env = {**_env(graph_settings, scripted), **prefect_api_env()}
    store = GraphStore.open(graph_settings)
    try:
        repo = DialogueRepository(store)
        log = tmp_path / "killed-run.log"
        with log.open("w") as stderr:
            # Its own process group: the kill takes the whole ingest down (not the session's
            # Prefect API it reports to).
            child = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                deadline = time.monotonic() + 300
                remembered = 0
                while remembered == 0 and child.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    remembered = repo.memory_count(conv)[0]
            finally:
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL, log.read_text()[-2000:]
        at_kill = repo.memory_count(conv)
        assert (
            0 < at_kill[0] < TURNS and at_kill[0] == at_kill[1]
        )  # killed mid-way, nothing doubled

        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout)[0]
        assert report["turns"] == TURNS and report["already"] >= at_kill[0]
        assert report["added"] + report["already"] == TURNS
        assert "remembering turns" in done.stderr  # the progress bar

        assert repo.memory_count(conv) == (TURNS, TURNS)
        head, reset, rows = repo.memory_since(conv)
        assert head == TURNS and not reset
        assert [r.seq for r in rows] == list(range(1, TURNS + 1))
        assert [r.turn_id for r in rows] == [
            str(i) for i in range(1, TURNS + 1)
        ]  # transcript order
        assert all(len(r.embedding) > 0 and r.source_refs for r in rows)
    finally:
        store.close()


def test_remembering_a_partly_remembered_transcript_embeds_only_the_missing_turns_in_order(
    graph_settings: Settings, scripted: ScriptedLLM
) -> None:
    settings = load_settings(graph_settings.project_dir, embedding_base_url=scripted.base_url)
    conv = f"ingest-resume-{uuid.uuid4().hex[:8]}"
    rows = memory_rows(load_dialogue(DIALOGUE), conv)
    service = DialogueService(settings)
    try:
        # A first run that stopped after 100 turns (cut inside a batch of the second run).
        assert remember_rows(service, conv, rows[:100], batch_size=64) == (100, 0)
        assert service.store_connected
        scripted.reset()
        assert remember_rows(service, conv, rows, batch_size=64) == (TURNS - 100, 100)
        embedded = [
            text
            for r in scripted.requests
            if r.path.endswith("/embeddings")
            for text in r.body["input"]
        ]
        assert sorted(embedded) == sorted(
            row_texts(rows)[100:]
        )  # each missing turn once, as a memory row embeds it, no other

        assert remember_rows(service, conv, rows, batch_size=64) == (
            0,
            TURNS,
        )  # a third run: nothing to do
        repo = DialogueRepository(service.store)
        assert repo.memory_count(conv) == (TURNS, TURNS)
        head, _, stored = repo.memory_since(conv)
        assert head == TURNS and [r.turn_id for r in stored] == [
            r.turn_id for r in rows
        ]  # transcript order
        assert all(len(r.embedding) == len(stored[0].embedding) > 0 for r in stored)
    finally:
        service.close()


def test_regression_ingest_mode_reports_recall_per_category_and_gates_on_it(
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    prefect_api: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in _env(graph_settings, scripted).items():
        monkeypatch.setenv(name, value)
    args = ["--project-dir", str(tmp_path), "--dialogues", str(DIALOGUE), "--mode", "ingest"]
    # The gate is on by default in this mode; the scripted bag-of-words embeddings are no
    # sentence model, so 0.99 cannot be met and the run must fail, naming the gate.
    with pytest.raises(SystemExit) as exited:
        run_main(
            regression_main, "regression", [*args, "--min-recall", "0.99", "--run-id", "strict"]
        )
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert "gate failed: (all):recall@10 (categories 1-4)" in captured.err
    assert (
        "recall@10 categories 1-4:" in captured.out
        and "category 5 (adversarial, apart)" in captured.out
    )

    with pytest.raises(SystemExit) as exited:
        run_main(
            regression_main, "regression", [*args, "--min-recall", "0.3", "--run-id", "lenient"]
        )
    assert exited.value.code == 0
    out = tmp_path / ".saga" / "regression" / "lenient"
    summary = json.loads((out / "summary.json").read_text())
    at_k = summary["recall_at_k"]
    assert set(at_k) == {"5", "10"} and set(at_k["10"]) == {"all", "1", "2", "3", "4"}
    assert at_k["10"]["all"] >= at_k["5"]["all"] > 0.3
    probe = pl.read_parquet(out / "recall.parquet")
    main = probe.filter(pl.col("category") <= 4)
    assert main.height == 81 and abs(main["recall_at_10"].mean() - at_k["10"]["all"]) < 1e-3  # type: ignore[operator]
    assert probe.filter(pl.col("category") == 5).height == summary["adversarial"]["questions"] > 0
    assert (probe["retrieved"].list.len() == 10).all()
    assert summary["questions"]["skipped"] == {"locomo-30": {}}
    assert pl.read_parquet(out / "ingest.parquet")["turns"].to_list() == [TURNS]
    report = (out / "report.md").read_text()
    assert "## Recall per category" in report and "| locomo-30 | 5 | adversarial |" in report
    assert not (out / "turns.parquet").exists()
    # Its model calls (here the embeddings: no --extract) are logged as a replay's are.
    calls = pl.concat([pl.read_parquet(p) for p in out.glob("llm-calls-*.parquet")])
    assert calls.height > 0 and set(calls["tier"]) == {"embedding"}
    assert (calls["outcome"] == "ok").all()

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["whole-dialogue-recall"]))
        )
    assert any(a.type == "table" and "lenient" in (a.description or "") for a in artifacts)


def test_an_ingest_shard_whose_graph_owner_exits_takes_the_graph_over_and_exits(
    scripted: ScriptedLLM, tmp_path: Path, prefect_api: str
) -> None:
    # The shard of a batch on the embedded default: another process (here `kg serve`, in a
    # batch the first shard) serves the project's graph, and exits while this shard's
    # dialogue is between its embedding and its first write. The task fails with the one
    # line naming the lost owner, Prefect retries it, the retry serves the graph from this
    # process (started from the task's worker thread) and skips nothing, and the process
    # then exits: it used to hang at exit in the JVM's shutdown, waiting for that thread.
    project = tmp_path / "project"
    project.mkdir()
    owner = Served(project, tmp_path / "owner.log")
    try:
        owner.wait_ready()
        scripted.hold()  # every embedding request waits until the owner is gone
        shard = LoggedProcess(
            [
                sys.executable,
                "-m",
                "flows.regression",
                "--project-dir",
                str(project),
                "--dialogues",
                str(DIALOGUE),
                "--mode",
                "ingest",
                "--turns",
                str(OWNER_GONE_TURNS),
                "--conversation-prefix",
                "",
                "--min-recall",
                "0",
                "--run-id",
                "owner-gone",
            ],
            tmp_path / "shard.log",
            {
                **embedded_graph_env(),
                "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
                **prefect_api_env(),
                # The retried task's line is INFO: shown whatever level an earlier test left
                # in the environment (in CI the run printed only its warnings).
                "PREFECT_LOGGING_LEVEL": "INFO",
            },
        )
        deadline = time.monotonic() + START_DEADLINE_S
        while scripted.held == 0:
            assert shard.proc.poll() is None, shard.output()[-3000:]
            assert time.monotonic() < deadline, shard.output()[-3000:]
            time.sleep(0.1)
        # While `kg serve` serves the project, the shard can only be its client.
        assert owner.stop(signal.SIGTERM) == 0
    finally:
        scripted.release()
        if owner.proc.poll() is None:
            owner.proc.kill()
    try:
        returncode = shard.proc.wait(timeout=EXIT_BOUND_S)
    finally:
        if shard.proc.poll() is None:
            shard.proc.kill()
    output = shard.output()
    assert returncode == 0, output[-3000:]
    assert f"process {owner.proc.pid}, which exited mid-run" in output
    ingested = pl.read_parquet(
        project / ".saga" / "regression" / "owner-gone" / "ingest.parquet"
    ).to_dicts()
    assert [(r["turns"], r["added"] + r["already"]) for r in ingested] == [
        (OWNER_GONE_TURNS, OWNER_GONE_TURNS)
    ]

    # Every turn is in the graph once, in order (read through a new owner).
    again = Served(project, tmp_path / "owner-again.log")
    try:
        again.wait_ready()
        with GraphStore(EmbeddedArcadeDB.for_dir(project / ".saga" / "graph").endpoint()) as store:
            repo = DialogueRepository(store)
            assert repo.memory_count("locomo-30") == (OWNER_GONE_TURNS, OWNER_GONE_TURNS)
            head, _, rows = repo.memory_since("locomo-30")
            assert head == OWNER_GONE_TURNS
            assert [r.turn_id for r in rows] == [str(i) for i in range(1, OWNER_GONE_TURNS + 1)]
    finally:
        assert again.stop(signal.SIGTERM) == 0


def test_a_malformed_transcript_is_one_line_before_any_flow_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.dialogue import main as dialogue_main

    bad = tmp_path / "bad.turns.jsonl"
    first = '{"conversation_id": "x", "turn_id": 1, "speaker": "A", "text": "hi"}'
    bad.write_text(f"{first}\n{{bad json\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        run_main(
            dialogue_main,
            "dialogue",
            ["ingest", "--project-dir", str(tmp_path / "p"), "--dialogue", str(bad)],
        )
    err = capsys.readouterr().err
    # The file and the line, alone: no Prefect server started, no flow run failed.
    assert exited.value.code == 2 and err.count("\n") == 1, err
    assert f"{bad}:2" in err and "Flow run" not in err
    assert not (tmp_path / "p" / ".saga").exists()
