"""The ingest mode of a regression run (`flows.regression --mode ingest`): whole dialogues
bulk-ingested (no LLM unless `--extract`), then every QA item with evidence asked of the hybrid
retriever, and the run gated on memory (every turn remembered exactly once) and recall.

Writes ingest.parquet, recall.parquet, gates.parquet, report.md, summary.json and the LLM call
records under the run's directory (no turns.parquet: there are no per-turn replay rows), and
the `whole-dialogue-recall` table and `whole-dialogue-recall-report` Markdown artifacts.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import get_run_logger
from prefect.client.schemas.objects import State
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict

from core.phases import PhaseTimer
from flows.regression_plan import (
    RegressionParams,
    RegressionRun,
    RegressionSummary,
    failed_gates,
    outcome,
    publish,
    verdict,
)
from flows.regression_tasks import ingest_dialogue_task, saving_calls, whole_dialogue_probe_task
from kg.dialogue import DialogueRepository
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.replay import ProbeRow
from tasks.dialogue.report import (
    GateResult,
    adversarial_recall,
    audited_recall,
    evaluate_recall_gates,
    probe_frame,
    recall_at_k,
    recall_headline,
    recall_table,
    render_ingest_report,
    session_recall_at_k,
    write_outputs,
)


class IngestResults(BaseModel):
    """What the mode measured: each dialogue's ingest report, the probe, the gates."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    reports: list[dict[str, Any]]
    probe: pl.DataFrame
    skipped: dict[str, dict[str, int]]  # dialogue id -> reason -> questions
    gates: list[GateResult]
    seconds: float  # the ingest phase's wall time


def ingest_mode(
    params: RegressionParams, run: RegressionRun, service: DialogueService, graph: str
) -> RegressionSummary | State:
    """Ingest whole dialogues, probe every QA item, gate on recall (see the module docstring)."""
    get_run_logger().info(
        "run %s: ingest mode, %d dialogue(s), %s, graph %s",
        run.run_id,
        len(run.specs),
        "with extraction" if params.extract else "no LLM",
        graph,
    )
    results = _ingest_and_probe(params, run, service)
    ingest_table = (
        pl.DataFrame(results.reports).drop("extract_outcomes")
        if results.reports
        else pl.DataFrame()
    )
    report = render_ingest_report(
        run.run_id,
        graph,
        ingest_table,
        results.gates,
        results.probe,
        results.skipped,
        params.extract,
        run.audit,
    )
    summary = _summary(run, results)
    _write(params, run, results, ingest_table, report, summary)
    _publish(run, results, report, summary)
    return outcome(summary)


def _ingest_and_probe(
    params: RegressionParams, run: RegressionRun, service: DialogueService
) -> IngestResults:
    phases = PhaseTimer()
    with ThreadPoolTaskRunner(max_workers=params.concurrency) as runner:
        with phases.phase("ingest") as ingesting:
            reports = saving_calls(
                [
                    runner.submit(
                        ingest_dialogue_task,
                        {
                            "run_id": run.run_id,
                            "spec": spec,
                            "conversation_id": run.conversation(spec),
                            "extract": params.extract,
                        },
                    )
                    for spec in run.specs
                ],
                service,
                run.out_dir,
            )
        probes = _probe(runner, run)
    repo = DialogueRepository(service.store)
    memory = {
        spec.dialogue_id: (len(spec.turns), repo.memory_count(run.conversation(spec))[1])
        for spec in run.specs
    }
    probe = probe_frame([row for rows, _ in probes for row in rows])
    return IngestResults(
        reports=reports,
        probe=probe,
        skipped={
            spec.dialogue_id: reasons
            for spec, (_, reasons) in zip([s for s in run.specs if s.qa], probes, strict=True)
        },
        gates=evaluate_recall_gates(probe, memory, params.gates),
        seconds=ingesting.seconds,
    )


def _probe(
    runner: ThreadPoolTaskRunner, run: RegressionRun
) -> list[tuple[list[ProbeRow], dict[str, int]]]:
    """Every QA item of each dialogue that has any, asked once its dialogue is ingested."""
    futures = [
        runner.submit(
            whole_dialogue_probe_task,
            {
                "run_id": run.run_id,
                "spec": spec,
                "conversation_id": run.conversation(spec),
                "audit": run.audit,
            },
        )
        for spec in run.specs
        if spec.qa
    ]
    return [future.result() for future in futures]


def _summary(run: RegressionRun, results: IngestResults) -> RegressionSummary:
    failed = failed_gates(results.gates)
    turns = sum(len(s.turns) for s in run.specs)
    seconds = results.seconds
    return run.summary(
        failed,
        turns=turns,
        committed=sum(
            sum(v for k, v in r["extract_outcomes"].items() if k == "COMMITTED")
            for r in results.reports
        ),
        rolled_back=sum(
            sum(v for k, v in r["extract_outcomes"].items() if k.startswith("ROLLED_BACK"))
            for r in results.reports
        ),
        timeouts=sum(r["extract_outcomes"].get("ROLLED_BACK:timeout", 0) for r in results.reports),
        replay_seconds=round(seconds, 3),
        turns_per_second=round(turns / seconds, 3) if seconds > 0 else 0.0,
        mean_turn_ms=round(1000.0 * seconds / turns, 3) if turns else 0.0,
        mean_llm_ms=0.0,
        mean_overhead_ms=0.0,
    )


def _write(
    params: RegressionParams,
    run: RegressionRun,
    results: IngestResults,
    ingest_table: pl.DataFrame,
    report: str,
    summary: RegressionSummary,
) -> None:
    out_dir = run.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".ingest.parquet.tmp"
    ingest_table.write_parquet(tmp)
    tmp.replace(out_dir / "ingest.parquet")
    probe = results.probe
    write_outputs(
        out_dir,
        pl.DataFrame(),
        probe,
        results.gates,
        report,
        {
            "params": params.model_dump(mode="json"),
            "summary": summary.model_dump(mode="json"),
            "recall_at_k": recall_at_k(probe),
            "session_recall_at_k": session_recall_at_k(probe),
            "adversarial": adversarial_recall(probe),
            "questions": {"probed": probe.height, "skipped": results.skipped},
            **({"evidence_audit": audited_recall(probe, run.audit)} if run.audit else {}),
        },
    )
    (out_dir / "turns.parquet").unlink(missing_ok=True)  # no per-turn replay rows in this mode


def _publish(
    run: RegressionRun, results: IngestResults, report: str, summary: RegressionSummary
) -> None:
    table = recall_table(results.probe)
    headline = recall_headline(results.probe)
    publish(
        "whole-dialogue-recall",
        table.to_dicts() if table.height else [],
        f"Recall {run.run_id}: {headline}, {verdict(summary)}",
        report,
        run.run_id,
        "Recall",
    )
    get_run_logger().info(
        "run %s %s: %s; report %s",
        run.run_id,
        "passed" if summary.passed else "FAILED",
        headline,
        run.out_dir / "report.md",
    )
