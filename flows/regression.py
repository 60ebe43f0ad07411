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
start) goes on where a killed run stopped, without sending a finished turn again. The LLM call
log (`llm-calls-<gateway run id>.parquet`, one file per process) is saved as each dialogue ends
and when the run fails, so a killed run keeps the calls of its finished dialogues. A graph
failure (its serving process exited, say) is not counted as a rolled-back turn: the
dialogue's task fails with it, and Prefect retries the task (`GRAPH_RETRIES`), which
reconnects (serving an embedded graph itself when its owner is gone) and resumes from the
journal; an ingest's retry skips the turns already stored. A failed gate ends the flow run
Failed (after the report is written).

A big batch spreads over workers with `--shard I/N` (each replays every N-th dialogue;
give them one `--run-id` and they write side by side under `<run_id>/shard-I-of-N/`), most
simply as N flow runs of the deployment (`python -m deployments.regression submit --shards N`)
that the workers of one work pool pick up in parallel.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import polars as pl
from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.task_runners import ThreadPoolTaskRunner

from core.cli import project_prefect_settings, run_main, setup_logging
from core.phases import PhaseTimer
from core.settings import load_settings
from flows.regression_cli import (
    build_parser,
    params_from_args,
    print_ingest_summary,
    print_replay_summary,
)
from flows.regression_ingest import ingest_mode
from flows.regression_plan import (
    INGEST_MIN_RECALL,
    MAX_CONCURRENCY,
    RegressionParams,
    RegressionRun,
    RegressionSummary,
    failed_gates,
    outcome,
    plan_dialogues,
    plan_run,
    publish,
    turns_per_dialogue,
    verdict,
)
from flows.regression_tasks import (
    GRAPH_RETRIES,
    GRAPH_RETRY_DELAY_S,
    recall_probe_task,
    replay_dialogue_task,
    saving_calls,
    serving,
    stop_on_interrupt,
)
from tasks.dialogue.evidence_audit import read_audit
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.replay import RecallRow, TurnRow
from tasks.dialogue.report import (
    RunInfo,
    dialogue_summary,
    evaluate_gates,
    recall_frame,
    render_report,
    turns_frame,
    write_outputs,
)

__all__ = [
    "GRAPH_RETRIES",
    "GRAPH_RETRY_DELAY_S",
    "INGEST_MIN_RECALL",
    "MAX_CONCURRENCY",
    "RegressionParams",
    "RegressionSummary",
    "build_parser",
    "main",
    "plan_dialogues",
    "regression_flow",
    "run_regression",
]


@flow(name="long-dialogue-regression", log_prints=True)
def regression_flow(params: RegressionParams) -> RegressionSummary | State:
    """The summary when every gate passes; otherwise a Failed state carrying it (the run ends
    Failed in Prefect, its report written all the same). `run_regression` unwraps both."""
    settings = load_settings(params.project_dir, params.config_file)
    run = plan_run(params, settings)
    # The run writes its own call log (into its folder), not the sidecar's.
    service = DialogueService(settings, options=params.sidecar, call_log=False)
    with serving(run.run_id, service):
        try:
            graph = service.store.endpoint.label  # connect (and migrate) once, before the clock
            if params.mode == "ingest":
                return ingest_mode(params, run, service, graph)
            return replay_mode(params, run, service, graph)
        finally:
            # At the end, and when the run fails: what its calls cost, the failed ones too.
            service.gateway.save_records(run.out_dir)


def replay_mode(
    params: RegressionParams, run: RegressionRun, service: DialogueService, graph: str
) -> RegressionSummary | State:
    """Replay every dialogue turn by turn, probe recall, gate, report (the module docstring)."""
    get_run_logger().info(
        "run %s: %d dialogue(s) x %d turns, concurrency %d, graph %s (resume a killed run with "
        "--run-id %s)",
        run.run_id,
        len(run.specs),
        turns_per_dialogue(params),
        params.concurrency,
        graph,
        run.run_id,
    )
    phases = PhaseTimer()
    # A runner of our own, so `concurrency` holds in deployments too (not only via with_options).
    with (
        ThreadPoolTaskRunner(max_workers=params.concurrency) as runner,
        stop_on_interrupt(run.run_id),
    ):
        with phases.phase("replay") as replaying:
            rows = _replay(runner, params, run, service)
        recall_rows = _probe_recall(runner, params, run, rows)
    turns = turns_frame(rows)
    recall = recall_frame(recall_rows)
    gates = evaluate_gates(turns, recall, params.gates)
    summary_frame = dialogue_summary(turns)
    info = RunInfo(
        run_id=run.run_id,
        dialogues=[s.dialogue_id for s in run.specs],
        turns_per_dialogue=turns_per_dialogue(params) or 0,
        concurrency=params.concurrency,
        replay_seconds=round(replaying.seconds, 3),
        turns_total=len(rows),
        turns_per_second=round(len(rows) / replaying.seconds, 3) if replaying.seconds > 0 else 0.0,
        graph=graph,
    )
    report = render_report(info, summary_frame, gates, recall, turns, params.gates)
    summary = _replay_summary(run, rows, turns, info, failed_gates(gates))
    write_outputs(
        run.out_dir,
        turns,
        recall,
        gates,
        report,
        {"params": params.model_dump(mode="json"), "summary": summary.model_dump(mode="json")},
    )
    publish(
        "long-dialogue-regression",
        summary_frame.to_dicts(),
        f"Regression {run.run_id}: {verdict(summary)}",
        report,
        run.run_id,
        "Regression",
    )
    get_run_logger().info(
        "run %s %s: report %s",
        run.run_id,
        "passed" if summary.passed else "FAILED",
        run.out_dir / "report.md",
    )
    return outcome(summary)


def _replay(
    runner: ThreadPoolTaskRunner,
    params: RegressionParams,
    run: RegressionRun,
    service: DialogueService,
) -> list[TurnRow]:
    """Every dialogue replayed into its conversation, journaled under the run's directory (the
    run's LLM call log saved as each one ends)."""
    futures = [
        runner.submit(
            replay_dialogue_task,
            {
                "run_id": run.run_id,
                "spec": spec,
                "conversation_id": run.conversation(spec),
                "window": params.window,
                "turn_config": params.turn_config,
                "journal": str(run.out_dir / "journal" / f"{spec.dialogue_id}.jsonl"),
            },
        )
        for spec in run.specs
    ]
    return [row for outcome in saving_calls(futures, service, run.out_dir) for row in outcome.rows]


def _probe_recall(
    runner: ThreadPoolTaskRunner,
    params: RegressionParams,
    run: RegressionRun,
    rows: list[TurnRow],
) -> list[RecallRow]:
    """Every question whose evidence was replayed, asked: every replayed turn is remembered
    (committed or blocked by the gate)."""
    futures = [
        runner.submit(
            recall_probe_task,
            {
                "run_id": run.run_id,
                "spec": spec,
                "conversation_id": run.conversation(spec),
                "k": params.gates.recall_k,
                "committed_refs": [
                    r.dia_id for r in rows if r.dialogue_id == spec.dialogue_id and r.dia_id
                ],
            },
        )
        for spec in run.specs
        if spec.qa
    ]
    return [row for future in futures for row in future.result()]


def _replay_summary(
    run: RegressionRun,
    rows: list[TurnRow],
    turns: pl.DataFrame,
    info: RunInfo,
    failed: list[str],
) -> RegressionSummary:
    """The replay's figures: turns by outcome, throughput, mean turn time and its parts."""
    return run.summary(
        failed,
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    params = params_from_args(args)
    plan_dialogues(params)  # fail fast on bad files, before Prefect starts
    if params.evidence_audit:
        read_audit(Path(params.evidence_audit))
    summary = run_regression(params)
    if params.mode == "ingest":
        print_ingest_summary(summary)
    else:
        print_replay_summary(summary)
    return 0 if summary.passed else 1


if __name__ == "__main__":
    run_main(main, "regression", sys.argv[1:])
