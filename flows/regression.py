"""`python -m flows.regression`: replay long dialogues through the sidecar and gate a release.

    python -m flows.regression --project-dir DIR --dialogues PATH... [--turns 20] [--concurrency 4]
    python -m flows.regression --project-dir DIR --dialogues PATH... --mode ingest [--extract]

`--mode ingest` measures memory on whole dialogues: every turn is ingested (bulk, no LLM
unless `--extract`, tasks.dialogue.ingest), then EVERY QA item with evidence is asked of the
hybrid retriever: recall@5 and recall@10 per category 1-4 and over 1-4, category 5
(adversarial) apart, skipped questions counted by reason. Outputs ingest.parquet,
recall.parquet, gates.parquet, report.md and summary.json (with
`"recall_at_k": {"5": {"all": r, "1": r, ...}, "10": {...}}`), plus a Prefect table
artifact. Its gates are on by default: every turn remembered exactly once, and recall@10
over categories 1-4 >= INGEST_MIN_RECALL (0.75) over all the run's questions (`--min-recall`, `--recall-k`, `--no-recall-gate`).

Each dialogue file (JSONL turn format, ../shared/data/dialogues) is replayed turn by turn
into its own fresh conversation (`regression-<run_id>/<dialogue id>` unless
`--conversation-prefix` says otherwise); dialogues run in parallel, one Prefect task run per
dialogue on a thread pool of `--concurrency` workers. Inside a dialogue the turns call the
plain pipeline (tasks.dialogue.pipeline) directly: a Prefect flow run per turn would cost
far more than the turn's own non-LLM work (docs/decisions/dialogue-turn-not-a-flow.md).

After the replay, a recall probe asks each QA question (sibling `<id>.qa.jsonl`) whose
evidence lies within the replayed turns, and the release gates are evaluated per dialogue.
Outputs: `<project>/.saga/regression/<run_id>/` (turns.parquet, recall.parquet,
gates.parquet, report.md, summary.json, llm-calls-*.parquet), a Prefect table artifact and a
Markdown artifact. Exit status 0 when every gate passes, 1 when one fails.

A run is resumable: each dialogue's turns are journaled as they end
(`journal/` beside turns.parquet), so the same command again with the run's `--run-id` (printed at the
start) goes on where a killed run stopped, without sending a finished turn again. A graph
failure (its serving process exited, say) is not counted as a rolled-back turn: the
dialogue's task fails with it, and Prefect retries the task (`GRAPH_RETRIES`), which
reconnects and resumes from the journal. A failed gate ends the flow run Failed (after the
report is written).

A big batch spreads over workers with `--shard I/N` (each replays every N-th dialogue;
give them one `--run-id` and they write side by side under `<run_id>/shard-I-of-N/`), most
simply as N flow runs of the deployment (`python -m deployments.regression submit --shards N`)
that the workers of one work pool pick up in parallel.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import polars as pl
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field, field_validator

from core.cli import project_prefect_settings, run_main, setup_logging
from core.errors import GraphUnavailableError, InvalidInputError
from core.settings import load_settings
from kg.dialogue import DialogueRepository
from tasks.dialogue.benchmarks import dialogue_files, load_dialogues
from tasks.dialogue.ingest import ingest
from tasks.dialogue.models import TurnConfig
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tasks.dialogue.replay import (
    DialogueSpec,
    ProbeRow,
    RecallRow,
    TurnRow,
    recall_probe,
    replay,
    whole_dialogue_probe,
)
from tasks.dialogue.report import (
    GateConfig,
    RunInfo,
    adversarial_recall,
    dialogue_summary,
    evaluate_gates,
    evaluate_recall_gates,
    probe_frame,
    recall_at_k,
    recall_frame,
    recall_table,
    render_ingest_report,
    render_report,
    session_recall_at_k,
    turns_frame,
    write_outputs,
)

#: The recall gate of ingest mode: a regression guard below what the four shared dialogues
#: measure (recall@10 0.790; 0.793 held out, bench/recall_protocol.py), not a target.
INGEST_MIN_RECALL = 0.75

#: Task retries after the graph failed under a dialogue (its serving process exited, say):
#: the retry reconnects (to a new owner of an embedded graph) and resumes from the journal.
GRAPH_RETRIES = 2
GRAPH_RETRY_DELAY_S = 5

MAX_CONCURRENCY = 64
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class RegressionParams(BaseModel):
    """Everything a regression run depends on (the flow's parameters)."""

    project_dir: str = "."
    config_file: str | None = None
    dialogues: list[str] = Field(
        min_length=1,
        description="*.turns.jsonl, LoCoMo or LongMemEval JSON files, or directories of them",
    )
    mode: Literal["replay", "ingest"] = Field(
        "replay",
        description="replay: each turn through the sidecar; ingest: bulk-ingest whole dialogues, probe recall",
    )
    extract: bool = Field(False, description="ingest mode: also run the LLM slots on every turn")
    turns: int | None = Field(
        None,
        ge=1,
        description="turns per dialogue from the start (default: 20 replayed; all ingested)",
    )
    concurrency: int = Field(4, ge=1, le=MAX_CONCURRENCY, description="dialogues replayed at once")
    window: int = Field(
        6, ge=0, le=50, description="earlier turns sent with each turn as chat window"
    )
    run_id: str | None = None
    conversation_prefix: str | None = Field(None, description="default regression-<run_id>/")
    shard: str | None = Field(None, description="I/N: replay only dialogues i, i+N, ... (0-based)")
    gates: GateConfig = Field(default_factory=GateConfig)
    sidecar: SidecarOptions = Field(default_factory=SidecarOptions)
    turn_config: TurnConfig = Field(default_factory=TurnConfig)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str | None) -> str | None:
        if value is not None and not _RUN_ID.match(value):
            raise ValueError("use letters, digits, '.', '_' and '-' (at most 80)")
        return value

    @field_validator("shard")
    @classmethod
    def _shard(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = re.fullmatch(r"(\d+)/(\d+)", value)
        if not match or int(match.group(2)) < 1 or int(match.group(1)) >= int(match.group(2)):
            raise ValueError("must be I/N with 0 <= I < N, e.g. 0/4")
        return value


class RegressionSummary(BaseModel):
    run_id: str
    out_dir: str
    passed: bool
    failed_gates: list[str]
    dialogues: int
    turns: int
    committed: int
    rolled_back: int
    timeouts: int
    replay_seconds: float
    turns_per_second: float
    mean_turn_ms: float
    mean_llm_ms: float
    mean_overhead_ms: float


class _DialogueOutcome(BaseModel):
    rows: list[TurnRow]


def _graph_failed(task: Any, task_run: TaskRun, state: State) -> bool:
    """Retry a dialogue's task only when the graph failed under it (not for a bug or bad input)."""
    return isinstance(state.result(raise_on_failure=False), GraphUnavailableError)


# Tasks get plain parameters; the service they share is looked up by run id (one per run).
_services: dict[str, DialogueService] = {}
_services_lock = threading.Lock()


_stops: dict[str, threading.Event] = {}


def _service(run_id: str) -> DialogueService:
    with _services_lock:
        return _services[run_id]


def _stop_event(run_id: str) -> threading.Event:
    with _services_lock:
        return _stops.setdefault(run_id, threading.Event())


@task(
    name="replay-dialogue",
    task_run_name="replay-{conversation_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=GRAPH_RETRIES,
    retry_delay_seconds=GRAPH_RETRY_DELAY_S,
    retry_condition_fn=_graph_failed,
)
def replay_dialogue_task(
    run_id: str,
    spec: DialogueSpec,
    conversation_id: str,
    window: int,
    turn_config: TurnConfig,
    journal: str | None = None,
) -> _DialogueOutcome:
    rows = replay(
        _service(run_id),
        spec,
        conversation_id,
        run_id,
        window=window,
        config=turn_config,
        journal=Path(journal) if journal else None,
        stop=_stop_event(run_id),
    )
    committed = sum(r.committed for r in rows)
    get_run_logger().info("%s: %d/%d turns committed", conversation_id, committed, len(rows))
    return _DialogueOutcome(rows=rows)


@task(
    name="recall-probe",
    task_run_name="recall-{conversation_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=GRAPH_RETRIES,
    retry_delay_seconds=GRAPH_RETRY_DELAY_S,
    retry_condition_fn=_graph_failed,
)
def recall_probe_task(
    run_id: str, spec: DialogueSpec, conversation_id: str, k: int, committed_refs: list[str]
) -> list[RecallRow]:
    return recall_probe(
        _service(run_id), spec, conversation_id, run_id, k=k, committed_refs=set(committed_refs)
    )


def turns_per_dialogue(params: RegressionParams) -> int | None:
    if params.turns is not None:
        return params.turns
    return None if params.mode == "ingest" else 20


def plan_dialogues(params: RegressionParams) -> list[DialogueSpec]:
    specs = [
        spec
        for path in dialogue_files([Path(p) for p in params.dialogues])
        for spec in load_dialogues(path, turns_per_dialogue(params))
    ]
    if params.shard:
        index, count = (int(x) for x in params.shard.split("/"))
        specs = specs[index::count]
        if not specs:
            raise InvalidInputError(
                f"shard {params.shard} has no dialogues ({len(specs)} in total)"
            )
    # The same dialogue given twice replays twice, into two conversations.
    seen: dict[str, int] = {}
    unique = []
    for spec in specs:
        seen[spec.dialogue_id] = seen.get(spec.dialogue_id, 0) + 1
        if seen[spec.dialogue_id] > 1:
            spec = spec.model_copy(
                update={"dialogue_id": f"{spec.dialogue_id}-{seen[spec.dialogue_id]}"}
            )
        unique.append(spec)
    return unique


@flow(name="long-dialogue-regression", log_prints=True)
def regression_flow(params: RegressionParams) -> RegressionSummary | State:
    """The summary when every gate passes; otherwise a Failed state carrying it (the run ends
    Failed in Prefect, its report written all the same). `run_regression` unwraps both."""
    logger = get_run_logger()
    settings = load_settings(params.project_dir, params.config_file)
    run_id = params.run_id or f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    prefix = (
        params.conversation_prefix
        if params.conversation_prefix is not None
        else f"regression-{run_id}/"
    )
    specs = plan_dialogues(params)
    out_dir = settings.saga_dir / "regression" / run_id
    if params.shard:
        # Shards of one run write side by side: read them together with turns.parquet globs.
        index, count = params.shard.split("/")
        out_dir = out_dir / f"shard-{index}-of-{count}"
    service = DialogueService(settings, options=params.sidecar)
    with _services_lock:
        _services[run_id] = service
    try:
        graph = service.store.endpoint.label  # connect (and migrate) once, before the clock starts
        conversations = {spec.dialogue_id: f"{prefix}{spec.dialogue_id}" for spec in specs}
        if params.mode == "ingest":
            return _ingest_mode(params, run_id, specs, conversations, out_dir, service, graph)
        logger.info(
            "run %s: %d dialogue(s) x %d turns, concurrency %d, graph %s (resume a killed run with "
            "--run-id %s)",
            run_id,
            len(specs),
            turns_per_dialogue(params),
            params.concurrency,
            graph,
            run_id,
        )
        started = time.perf_counter()
        # A runner of our own, so `concurrency` holds in deployments too (not only via with_options).
        with ThreadPoolTaskRunner(max_workers=params.concurrency) as runner:
            try:
                futures = [
                    runner.submit(
                        replay_dialogue_task,
                        {
                            "run_id": run_id,
                            "spec": spec,
                            "conversation_id": conversations[spec.dialogue_id],
                            "window": params.window,
                            "turn_config": params.turn_config,
                            "journal": str(out_dir / "journal" / f"{spec.dialogue_id}.jsonl"),
                        },
                    )
                    for spec in specs
                ]
                rows = [row for future in futures for row in future.result().rows]
                replay_seconds = time.perf_counter() - started
                # Every replayed turn is remembered (committed or blocked by the gate), so every
                # question whose evidence was replayed is asked.
                committed_refs = {
                    spec.dialogue_id: [
                        r.dia_id for r in rows if r.dialogue_id == spec.dialogue_id and r.dia_id
                    ]
                    for spec in specs
                }
                probes = [
                    runner.submit(
                        recall_probe_task,
                        {
                            "run_id": run_id,
                            "spec": spec,
                            "conversation_id": conversations[spec.dialogue_id],
                            "k": params.gates.recall_k,
                            "committed_refs": committed_refs[spec.dialogue_id],
                        },
                    )
                    for spec in specs
                    if spec.qa
                ]
                recall_rows = [row for future in probes for row in future.result()]
            except BaseException:
                # SIGTERM (Prefect's TerminationSignal) or Ctrl-C: the runner's exit waits for
                # its threads, so the dialogues stop at their next turn instead of running on.
                _stop_event(run_id).set()
                raise

        turns = turns_frame(rows)
        recall = recall_frame(recall_rows)
        gates = evaluate_gates(turns, recall, params.gates)
        summary_frame = dialogue_summary(turns)
        info = RunInfo(
            run_id=run_id,
            dialogues=[s.dialogue_id for s in specs],
            turns_per_dialogue=turns_per_dialogue(params) or 0,
            concurrency=params.concurrency,
            replay_seconds=round(replay_seconds, 3),
            turns_total=len(rows),
            turns_per_second=round(len(rows) / replay_seconds, 3) if replay_seconds > 0 else 0.0,
            graph=graph,
        )
        report = render_report(info, summary_frame, gates, recall, turns, params.gates)
        failed = [
            f"{g.dialogue_id}:{g.gate}={g.value} (needs {g.threshold})"
            for g in gates
            if not g.passed
        ]
        summary = RegressionSummary(
            run_id=run_id,
            out_dir=str(out_dir),
            passed=not failed,
            failed_gates=failed,
            dialogues=len(specs),
            turns=len(rows),
            committed=sum(r.committed for r in rows),
            rolled_back=sum(r.state == "ROLLED_BACK" for r in rows),
            timeouts=sum(r.timed_out for r in rows),
            replay_seconds=info.replay_seconds,
            turns_per_second=info.turns_per_second,
            mean_turn_ms=round(float(turns["total_ms"].mean() or 0.0), 3),  # type: ignore[arg-type]
            mean_llm_ms=round(float(turns["llm_ms"].mean() or 0.0), 3),  # type: ignore[arg-type]
            mean_overhead_ms=round(float(turns["overhead_ms"].mean() or 0.0), 3),  # type: ignore[arg-type]
        )
        write_outputs(
            out_dir,
            turns,
            recall,
            gates,
            report,
            {"params": params.model_dump(mode="json"), "summary": summary.model_dump(mode="json")},
        )
        service.gateway.write_records(out_dir)
        create_table_artifact(
            table=summary_frame.to_dicts(),
            key="long-dialogue-regression",
            description=f"Regression {run_id}: {'passed' if summary.passed else 'FAILED: ' + '; '.join(failed)}",
        )
        create_markdown_artifact(
            markdown=report,
            key="long-dialogue-regression-report",
            description=f"Regression report {run_id}",
        )
        logger.info(
            "run %s %s: report %s",
            run_id,
            "passed" if summary.passed else "FAILED",
            out_dir / "report.md",
        )
        return summary if summary.passed else _failed(summary)
    finally:
        with _services_lock:
            _services.pop(run_id, None)
            _stops.pop(run_id, None)
        service.close()


@task(
    name="ingest-dialogue",
    task_run_name="ingest-{conversation_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
)
def ingest_dialogue_task(
    run_id: str, spec: DialogueSpec, conversation_id: str, extract: bool
) -> dict[str, Any]:
    report = ingest(_service(run_id), [(spec, conversation_id)], extract=extract)[0]
    get_run_logger().info(
        "%s: %d turns (%d added, %d already there), %.1f turns/s",
        conversation_id,
        report.turns,
        report.added,
        report.already,
        report.turns_per_s,
    )
    return report.model_dump(mode="json")


@task(
    name="whole-dialogue-recall",
    task_run_name="recall-{conversation_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
)
def whole_dialogue_probe_task(
    run_id: str,
    spec: DialogueSpec,
    conversation_id: str,
) -> tuple[list[ProbeRow], dict[str, int]]:
    return whole_dialogue_probe(_service(run_id), spec, conversation_id, run_id)


def _ingest_mode(
    params: RegressionParams,
    run_id: str,
    specs: list[DialogueSpec],
    conversations: dict[str, str],
    out_dir: Path,
    service: DialogueService,
    graph: str,
) -> RegressionSummary | State:
    """Ingest whole dialogues, probe every QA item, gate on recall (see the module docstring)."""
    logger = get_run_logger()
    logger.info(
        "run %s: ingest mode, %d dialogue(s), %s, graph %s",
        run_id,
        len(specs),
        "with extraction" if params.extract else "no LLM",
        graph,
    )
    started = time.perf_counter()
    with ThreadPoolTaskRunner(max_workers=params.concurrency) as runner:
        reports = [
            f.result()
            for f in [
                runner.submit(
                    ingest_dialogue_task,
                    {
                        "run_id": run_id,
                        "spec": spec,
                        "conversation_id": conversations[spec.dialogue_id],
                        "extract": params.extract,
                    },
                )
                for spec in specs
            ]
        ]
        ingest_seconds = time.perf_counter() - started
        probes = [
            f.result()
            for f in [
                runner.submit(
                    whole_dialogue_probe_task,
                    {
                        "run_id": run_id,
                        "spec": spec,
                        "conversation_id": conversations[spec.dialogue_id],
                    },
                )
                for spec in specs
                if spec.qa
            ]
        ]
    repo = DialogueRepository(service.store)
    memory = {
        spec.dialogue_id: (len(spec.turns), repo.memory_count(conversations[spec.dialogue_id])[1])
        for spec in specs
    }
    probe = probe_frame([row for rows, _ in probes for row in rows])
    skipped = {
        spec.dialogue_id: reasons
        for spec, (_, reasons) in zip([s for s in specs if s.qa], probes, strict=True)
    }
    gates = evaluate_recall_gates(probe, memory, params.gates)
    ingest_table = pl.DataFrame(reports).drop("extract_outcomes") if reports else pl.DataFrame()
    report = render_ingest_report(
        run_id, graph, ingest_table, gates, probe, skipped, params.extract
    )
    failed = [
        f"{g.dialogue_id}:{g.gate}={g.value} (needs {g.threshold})" for g in gates if not g.passed
    ]
    turns = sum(len(s.turns) for s in specs)
    summary = RegressionSummary(
        run_id=run_id,
        out_dir=str(out_dir),
        passed=not failed,
        failed_gates=failed,
        dialogues=len(specs),
        turns=turns,
        committed=sum(
            sum(v for k, v in r["extract_outcomes"].items() if k == "COMMITTED") for r in reports
        ),
        rolled_back=sum(
            sum(v for k, v in r["extract_outcomes"].items() if k.startswith("ROLLED_BACK"))
            for r in reports
        ),
        timeouts=sum(r["extract_outcomes"].get("ROLLED_BACK:timeout", 0) for r in reports),
        replay_seconds=round(ingest_seconds, 3),
        turns_per_second=round(turns / ingest_seconds, 3) if ingest_seconds > 0 else 0.0,
        mean_turn_ms=round(1000.0 * ingest_seconds / turns, 3) if turns else 0.0,
        mean_llm_ms=0.0,
        mean_overhead_ms=0.0,
    )
    at_k = recall_at_k(probe)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".ingest.parquet.tmp"
    ingest_table.write_parquet(tmp)
    tmp.replace(out_dir / "ingest.parquet")
    write_outputs(
        out_dir,
        pl.DataFrame(),
        probe,
        gates,
        report,
        {
            "params": params.model_dump(mode="json"),
            "summary": summary.model_dump(mode="json"),
            "recall_at_k": at_k,
            "session_recall_at_k": session_recall_at_k(probe),
            "adversarial": adversarial_recall(probe),
            "questions": {"probed": probe.height, "skipped": skipped},
        },
    )
    (out_dir / "turns.parquet").unlink(missing_ok=True)  # no per-turn replay rows in this mode
    service.gateway.write_records(out_dir)
    table = recall_table(probe)
    create_table_artifact(
        table=table.to_dicts() if table.height else [],
        key="whole-dialogue-recall",
        description=f"Recall {run_id}: recall@10 (1-4) {at_k['10']['all']}, "
        f"{'passed' if summary.passed else 'FAILED: ' + '; '.join(failed)}",
    )
    create_markdown_artifact(
        markdown=report, key="whole-dialogue-recall-report", description=f"Recall report {run_id}"
    )
    logger.info(
        "run %s %s: recall@10 (categories 1-4) %s, recall@5 %s; report %s",
        run_id,
        "passed" if summary.passed else "FAILED",
        at_k["10"]["all"],
        at_k["5"]["all"],
        out_dir / "report.md",
    )
    return summary if summary.passed else _failed(summary)


def _failed(summary: RegressionSummary) -> State:
    """The flow run's final state when a gate failed: Failed, with the summary as its data.
    Returned rather than raised: an exception would be retried and the batch run again."""
    return Failed(
        message=f"gate(s) failed: {'; '.join(summary.failed_gates)}; report {summary.out_dir}/report.md",
        data=summary,
    )


def run_regression(params: RegressionParams) -> RegressionSummary:
    """Run the flow with the project's Prefect result storage; the summary whether or not a
    gate failed (`passed` says which). Any other failure raises."""
    with project_prefect_settings(Path(params.project_dir)):
        state = regression_flow(params, return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, RegressionSummary):
        return result
    if isinstance(result, BaseException):
        raise result
    raise RuntimeError(
        f"regression flow ended {state.type.value} without a summary: {state.message}"
    )


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.regression",
        description="Replay long dialogues through the dialogue sidecar, enforce release gates, write a report.",
    )
    parser.add_argument(
        "--project-dir", type=Path, required=True, help="project whose graph and .saga/ are used"
    )
    parser.add_argument(
        "--dialogues",
        nargs="+",
        required=True,
        metavar="PATH",
        help="*.turns.jsonl files (a sibling *.qa.jsonl enables the recall probe), LoCoMo's "
        "locomo10.json or LongMemEval's longmemeval_*.json as published, or directories of them",
    )
    parser.add_argument(
        "--mode",
        choices=("replay", "ingest"),
        default="replay",
        help="replay: each turn through the sidecar's LLM slots (default); "
        "ingest: bulk-ingest whole dialogues and measure recall on every QA item",
    )
    parser.add_argument(
        "--extract", action="store_true", help="ingest mode: also run the LLM slots on every turn"
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=None,
        help="turns per dialogue from the start (default: 20 replayed, all ingested)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="dialogues replayed at once (default 4)"
    )
    parser.add_argument(
        "--window", type=int, default=6, help="earlier turns sent as chat window (default 6)"
    )
    parser.add_argument(
        "--run-id", default=None, help="name of the run (default: timestamp + random suffix)"
    )
    parser.add_argument(
        "--conversation-prefix",
        default=None,
        help="conversation id prefix (default regression-<run_id>/; '' replays into the dialogue ids)",
    )
    parser.add_argument(
        "--shard", default=None, metavar="I/N", help="replay only every N-th dialogue starting at I"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML settings file (default <project-dir>/skald.toml)",
    )
    gates = parser.add_argument_group("gates")
    gates.add_argument(
        "--min-commit-ratio", type=float, default=0.9, help="per dialogue (default 0.9)"
    )
    gates.add_argument(
        "--max-rollbacks", type=int, default=None, help="per dialogue (default: no limit)"
    )
    gates.add_argument("--max-timeouts", type=int, default=0, help="per dialogue (default 0)")
    gates.add_argument(
        "--no-require-mutations",
        action="store_true",
        help="do not require EVOLVE/REPLACE/DELETE signals",
    )
    gates.add_argument(
        "--no-require-milestones", action="store_true", help="do not require milestones"
    )
    gates.add_argument(
        "--min-recall",
        type=float,
        default=None,
        help=f"mean recall@k of the probe (default: {INGEST_MIN_RECALL} in ingest mode, report only "
        "in replay mode)",
    )
    gates.add_argument(
        "--recall-k",
        type=int,
        default=None,
        help="k of the recall gate (default: 10 ingest, 5 replay)",
    )
    gates.add_argument(
        "--no-recall-gate",
        action="store_true",
        help="ingest mode: report recall without gating on it",
    )
    turn = parser.add_argument_group("turns")
    turn.add_argument(
        "--turn-timeout",
        type=float,
        default=None,
        help="seconds per turn before rollback (default 300)",
    )
    turn.add_argument(
        "--no-require-actions",
        action="store_true",
        help="commit gate: let turns without relation actions commit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def params_from_args(args: argparse.Namespace) -> RegressionParams:
    sidecar = SidecarOptions(
        **({"turn_timeout_s": args.turn_timeout} if args.turn_timeout is not None else {})
    )
    return RegressionParams(
        project_dir=str(args.project_dir),
        config_file=str(args.config) if args.config else None,
        dialogues=list(args.dialogues),
        mode=args.mode,
        extract=args.extract,
        turns=args.turns if args.turns is not None else (None if args.mode == "ingest" else 20),
        concurrency=args.concurrency,
        window=args.window,
        run_id=args.run_id,
        conversation_prefix=args.conversation_prefix,
        shard=args.shard,
        gates=GateConfig(
            min_commit_ratio=args.min_commit_ratio,
            max_rollbacks=args.max_rollbacks,
            max_timeouts=args.max_timeouts,
            require_relation_mutations=not args.no_require_mutations,
            require_milestones=not args.no_require_milestones,
            min_recall=None
            if args.no_recall_gate
            else (
                args.min_recall
                if args.min_recall is not None
                else (INGEST_MIN_RECALL if args.mode == "ingest" else None)
            ),
            recall_k=args.recall_k
            if args.recall_k is not None
            else (10 if args.mode == "ingest" else 5),
        ),
        sidecar=sidecar,
        turn_config=TurnConfig(require_actions=not args.no_require_actions),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    params = params_from_args(args)
    plan_dialogues(params)  # fail fast on bad files, before Prefect starts
    summary = run_regression(params)
    if params.mode == "ingest":
        data = json.loads((Path(summary.out_dir) / "summary.json").read_text())
        at_k = data["recall_at_k"]
        print(
            f"regression {summary.run_id}: {'PASSED' if summary.passed else 'FAILED'}: {summary.dialogues} "
            f"dialogue(s), {summary.turns} turns ingested ({summary.turns_per_second:.1f} turns/s), "
            f"{data['questions']['probed']} questions probed"
        )
        sessions = data.get("session_recall_at_k")
        for k in ("10", "5") if at_k["10"]["all"] is not None or not sessions else ():
            cats = ", ".join(f"cat {c} {at_k[k][c]}" for c in ("1", "2", "3", "4"))
            print(f"recall@{k} categories 1-4: {at_k[k]['all']} ({cats})")
        if sessions:
            for k in ("10", "5"):
                types = ", ".join(f"{t} {r}" for t, r in sessions[k]["by_type"].items())
                print(
                    f"session recall@{k} (LongMemEval, {sessions['questions']} questions): "
                    f"any {sessions[k]['any']}, all {sessions[k]['all']} ({types})"
                )
        adv = data["adversarial"]
        if adv["questions"] or not sessions:
            print(
                f"category 5 (adversarial, apart): {adv['questions']} questions, recall@10 {adv['recall_at_10']}"
            )
        skipped = {
            r: n for reasons in data["questions"]["skipped"].values() for r, n in reasons.items()
        }
        print(f"skipped: {sum(skipped.values())} ({skipped or 'none'})")
        print(f"report: {Path(summary.out_dir) / 'report.md'}")
        for gate in summary.failed_gates:
            print(f"regression: gate failed: {gate}", file=sys.stderr)
        return 0 if summary.passed else 1
    print(
        f"regression {summary.run_id}: {'PASSED' if summary.passed else 'FAILED'}: {summary.dialogues} dialogue(s), "
        f"{summary.committed}/{summary.turns} turns committed, {summary.rolled_back} rolled back, "
        f"{summary.timeouts} timed out; {summary.turns_per_second:.2f} turns/s; mean turn {summary.mean_turn_ms:.0f} ms "
        f"(LLM {summary.mean_llm_ms:.0f} ms, other {summary.mean_overhead_ms:.0f} ms)"
    )
    print(f"report: {Path(summary.out_dir) / 'report.md'}")
    if not summary.passed:
        for gate in summary.failed_gates:
            print(f"regression: gate failed: {gate}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "regression", sys.argv[1:])
