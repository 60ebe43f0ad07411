"""The long-dialogue regression batch: both shared dialogues through `python -m flows.regression`
against the scripted model, a planted gate failure, the gates themselves, and sharding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from core.cli import run_main
from core.settings import Settings
from deployments.regression import shard_parameters
from flows.regression import (
    RegressionParams,
    RegressionSummary,
    main,
    plan_dialogues,
    regression_flow,
)
from tasks.dialogue.models import TurnConfig
from tasks.dialogue.report import GateConfig, evaluate_gates
from tests.conftest import REPO_ROOT, prefect_api_env
from tests.support.cli import graph_vars
from tests.support.dialogue_script import DIALOGUES, DialogueScript
from tests.support.logged_process import START_DEADLINE_S, LoggedProcess
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest

FILES = [str(DIALOGUES / "locomo-26.turns.jsonl"), str(DIALOGUES / "locomo-30.turns.jsonl")]
SPEAKERS = ["Caroline", "Melanie", "Jon", "Gina"]


@pytest.fixture()
def scripted() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


def _batch(project: Path, *options: str) -> list[str]:
    """`python -m flows.regression` over both dialogues into `project`."""
    batch = [sys.executable, "-m", "flows.regression", "--project-dir", str(project)]
    return [*batch, "--dialogues", *FILES, *options]


def _batch_env(graph_settings: Settings, scripted: ScriptedLLM) -> dict[str, str]:
    return {
        **os.environ,
        **graph_vars(graph_settings),
        "OPENAI_BASE_URL": scripted.base_url,
        "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
        **prefect_api_env(),
    }


def test_the_batch_over_both_dialogues_passes_and_writes_its_report(
    graph_settings: Settings, scripted: ScriptedLLM, tmp_path: Path, prefect_api: str
) -> None:
    DialogueScript(SPEAKERS).install(scripted)
    done = subprocess.run(
        _batch(tmp_path, "--concurrency", "2"),
        cwd=REPO_ROOT,
        env=_batch_env(graph_settings, scripted),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # locomo-26 opens with "Hey Mel!": nobody the memory knows yet, so the relation its
    # extractor proposes for turn 1 is not grounded and the gate blocks the turn (its text is
    # remembered all the same). Every other turn commits.
    assert "PASSED" in done.stdout and "39/40 turns committed" in done.stdout
    report_path = Path(re.search(r"report: (\S+)", done.stdout).group(1))  # type: ignore[union-attr]
    out = report_path.parent
    assert out.parent == tmp_path / ".saga" / "regression"
    report = report_path.read_text()
    assert report.startswith("# Long-dialogue regression") and "PASSED" in report
    assert "| locomo-26 | relation_mutations |" in report and "| locomo-30 | milestones |" in report
    assert "## Recall probe" in report and "temporal" in report

    turns = pl.read_parquet(out / "turns.parquet")
    assert turns.height == 40 and turns["committed"].sum() == 39
    opening = turns.filter((pl.col("dialogue_id") == "locomo-26") & (pl.col("turn_id") == 1)).row(
        0, named=True
    )
    assert not opening["committed"] and opening["reason"] == "commit gate: no relation actions"
    assert turns.filter(pl.col("dialogue_id") == "locomo-26")["turn_id"].to_list() == list(
        range(1, 21)
    )
    turns = turns.filter(pl.col("committed"))
    assert sorted(turns["dialogue_id"].unique().to_list()) == ["locomo-26", "locomo-30"]
    assert (
        turns["states"][0].to_list()[-1] == "COMMITTED" and len(turns["state_elapsed_ms"][0]) == 10
    )
    assert (turns["extractor_ms"] > 0).all() and (turns["prompt_tokens"] > 0).all()
    assert (turns["actions_evolve"] > 0).all() and turns["milestones"].sum() > 0
    assert turns["conversation_id"][0].startswith("regression-")
    recall = pl.read_parquet(out / "recall.parquet")
    assert recall.height > 0 and set(recall["dialogue_id"]) == {"locomo-26", "locomo-30"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["passed"] is True and summary["params"]["turns"] == 20
    assert list(out.glob("llm-calls-*.parquet"))
    # ... there only: not again with a sidecar's logs.
    assert not list((tmp_path / ".saga" / "runs").rglob("llm-calls-*.parquet"))


def test_a_planted_gate_failure_exits_non_zero_and_names_the_gate(
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The planted failure: an extractor that never proposes a relation action. Turns still
    # commit (--no-require-actions), so only the relation-mutation gate can catch it.
    DialogueScript(SPEAKERS, mutations="none").install(scripted)
    for name, value in {
        **graph_vars(graph_settings),
        "OPENAI_BASE_URL": scripted.base_url,
        "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
    }.items():
        monkeypatch.setenv(name, value)
    args = [
        "--project-dir",
        str(tmp_path),
        "--dialogues",
        FILES[0],
        "--turns",
        "3",
        "--no-require-actions",
        "--run-id",
        "planted-failure",
    ]
    with pytest.raises(SystemExit) as exited:
        run_main(main, "regression", args)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "gate failed: locomo-26:relation_mutations=0.0" in err and "commit_ratio" not in err
    report = (tmp_path / ".saga" / "regression" / "planted-failure" / "report.md").read_text()
    assert "FAILED" in report

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["long-dialogue-regression"]))
        )
    assert any(a.type == "table" and "planted-failure" in (a.description or "") for a in artifacts)

    # With the default commit gate the same script blocks every turn: the commit ratio fails too.
    with pytest.raises(SystemExit) as exited:
        run_main(main, "regression", [*args[:-3], "--run-id", "gate-blocks-all"])
    assert exited.value.code == 1
    assert "commit_ratio=0.0" in capsys.readouterr().err


def test_a_failed_gate_ends_the_flow_run_failed_with_its_report_written(
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    DialogueScript(SPEAKERS, mutations="none").install(scripted)
    for name, value in {
        **graph_vars(graph_settings),
        "OPENAI_BASE_URL": scripted.base_url,
        "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
    }.items():
        monkeypatch.setenv(name, value)
    params = RegressionParams(
        project_dir=str(tmp_path),
        dialogues=[FILES[0]],
        turns=3,
        run_id="failed-state",
        turn_config=TurnConfig(require_actions=False),
    )
    state = regression_flow(params, return_state=True)
    assert state.is_failed() and "relation_mutations" in (state.message or "")
    summary = state.result(raise_on_failure=False)
    assert isinstance(summary, RegressionSummary) and not summary.passed
    assert (
        "FAILED" in (tmp_path / ".saga" / "regression" / "failed-state" / "report.md").read_text()
    )

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        recorded = client.read_flow_run(state.state_details.flow_run_id)  # type: ignore[arg-type]
    assert recorded.state is not None and recorded.state.type.value == "FAILED"
    assert recorded.run_count == 1  # a failed gate is not retried

    # The look-alike: the same batch with the gate off passes and ends Completed.
    passing = regression_flow(
        params.model_copy(
            update={
                "run_id": "completed-state",
                "gates": GateConfig(require_relation_mutations=False),
            }
        ),
        return_state=True,
    )
    assert passing.is_completed() and passing.result().passed


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_killed_batch_keeps_the_call_log_of_the_dialogues_it_finished(
    graph_settings: Settings, scripted: ScriptedLLM, tmp_path: Path, prefect_api: str
) -> None:
    """The call log used to be written only when a batch ended: one killed after a day's
    dialogues left no record of what their calls cost."""
    DialogueScript(SPEAKERS).install(scripted)
    # locomo-30's turns wait, so the batch is surely running while locomo-26's calls are
    # looked for (the deadlines are for a loaded machine: nothing here times anything).
    second_dialogue_reached, let_go = threading.Event(), threading.Event()

    def waiting(request: ScriptedRequest) -> str:
        second_dialogue_reached.set()
        let_go.wait(timeout=600)
        return "{}"

    scripted.on(contains="\nJon: ", respond=waiting)
    scripted.on(contains="\nGina: ", respond=waiting)
    (tmp_path / "skald.toml").write_text("[limits]\nllm_timeout_s = 3600\n")
    env = _batch_env(graph_settings, scripted)
    command = _batch(
        tmp_path,
        "--turns",
        "3",
        "--concurrency",
        "1",
        "--turn-timeout",
        "3600",
        "--min-commit-ratio",
        "0.6",  # locomo-26's opening turn is held back by the commit gate (the test above)
        "--run-id",
        "killed",
    )
    out = tmp_path / ".saga" / "regression" / "killed"
    batch = LoggedProcess(command, tmp_path / "killed.log", env, new_session=True)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not (second_dialogue_reached.is_set() and list(out.glob("llm-calls-*.parquet"))):
            assert batch.proc.poll() is None, batch.output()[-3000:]
            assert time.monotonic() < deadline, "no call log while the second dialogue ran"
            time.sleep(0.2)
    finally:
        batch.kill()
        let_go.set()
    (log,) = out.glob("llm-calls-*.parquet")
    calls = pl.read_parquet(log)
    # locomo-26's three turns, each through the extractor, the judge and the historian.
    slots = calls.filter(pl.col("tier") != "embedding")
    assert slots.height >= 9 and (slots["outcome"] == "ok").all(), slots
    assert not (out / "report.md").exists()

    # Resumed with its run id, the batch finishes; its calls go to a file of their own, and
    # the killed start's file is kept as it was.
    scripted.reset()
    DialogueScript(SPEAKERS).install(scripted)
    before = log.read_bytes()
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    logs = sorted(out.glob("llm-calls-*.parquet"))
    assert len(logs) == 2 and log in logs and log.read_bytes() == before
    (resumed,) = (p for p in logs if p != log)
    assert pl.read_parquet(resumed).filter(pl.col("tier") != "embedding").height > 0


def test_gates_count_rollbacks_timeouts_and_recall() -> None:
    rows = []
    for turn in range(10):
        rows.append(
            {
                "dialogue_id": "d",
                "committed": turn < 8,
                "state": "COMMITTED" if turn < 8 else "ROLLED_BACK",
                "timed_out": turn == 9,
                "actions_evolve": 1,
                "actions_replace": 0,
                "actions_delete": 0,
                "milestones": 0,
            }
        )
    turns = pl.DataFrame(rows)
    recall = pl.DataFrame(
        {"dialogue_id": ["d", "d"], "recall": [1.0, 0.0], "hit": [True, False], "category": [1, 2]}
    )
    results = {
        g.gate: g
        for g in evaluate_gates(
            turns, recall, GateConfig(max_rollbacks=1, min_recall=0.6, require_milestones=True)
        )
    }
    assert (results["commit_ratio"].value, results["commit_ratio"].passed) == (0.8, False)
    assert (results["rollbacks"].value, results["rollbacks"].passed) == (2, False)
    assert (results["timeouts"].value, results["timeouts"].passed) == (1, False)
    assert results["relation_mutations"].passed and not results["milestones"].passed
    assert (results["recall@5"].value, results["recall@5"].passed) == (0.5, False)
    relaxed = evaluate_gates(
        turns, recall, GateConfig(min_commit_ratio=0.8, max_timeouts=1, require_milestones=False)
    )
    assert all(g.passed for g in relaxed)


def test_shards_split_the_dialogues_and_share_one_run() -> None:
    base = RegressionParams(dialogues=FILES, turns=2)
    assert [s.dialogue_id for s in plan_dialogues(base)] == ["locomo-26", "locomo-30"]
    shards = shard_parameters(base, 2, "run-1")
    planned = [plan_dialogues(RegressionParams.model_validate(p["params"])) for p in shards]
    assert [[s.dialogue_id for s in p] for p in planned] == [["locomo-26"], ["locomo-30"]]
    assert {p["params"]["run_id"] for p in shards} == {"run-1"}
    twice = plan_dialogues(RegressionParams(dialogues=[FILES[0], FILES[0]], turns=1))
    assert [s.dialogue_id for s in twice] == ["locomo-26", "locomo-26-2"]
    with pytest.raises(ValueError, match="I/N"):
        RegressionParams(dialogues=FILES, shard="2/2")
    deployment = regression_flow.to_deployment(
        name="test", parameters={"params": base.model_dump(mode="json")}
    )
    assert deployment.parameters["params"]["turns"] == 2
