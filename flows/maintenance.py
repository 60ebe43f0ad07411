"""Graph maintenance flows: healing and QA (spec 001 section 8). Orchestration only.

Three ways to run them:

    python -m flows.maintenance heal --project-dir DIR [--dry-run] [--no-enrich] [--no-embeddings]
    python -m flows.maintenance qa --project-dir DIR [--fail-on error]   (findings marked in exports/codex.html)
    python -m flows.maintenance serve --project-dir DIR [--heal-cron CRON] [--qa-cron CRON]

`serve` is the one-command local scheduler (Prefect `serve` of both deployments); for a
work pool and workers use deployments/prefect.yaml (see deployments/README.md). The
novel flow calls `heal_flow(project_dir)` and `qa_flow(project_dir)` every
`limits.qa_every` chapters, best effort.

Both stamp what they write with story time, never the wall clock (issue 33): merges,
enrichments and MergeAudit nodes carry "after chapter N, change-set S" and content-derived
ids, the QA report is `.saga/qa/qa-chNNNN-csNNNNNN.parquet` (the chapter and change-set it
checked through) with that stamp in its `story_at` column. So a novel run writes the same
graph export, codex and quality files whenever it ran and however often it was interrupted.
The wall-clock time of a run, which tells an operator when a scheduled deployment ran, goes
only to the log, the Prefect run and artifacts, and the healing run log
`.saga/healing/heal-<UTC time>.json`; none of these is compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from prefect import flow, get_run_logger

from core.cli import add_settings_options, run_main, setup_logging
from core.errors import InvalidInputError
from core.project_lock import project_writer
from core.settings import Settings, load_settings, require_project, require_project_dir
from tasks.codex import write_codex_or_log
from tasks.healing import (
    HealReport,
    enrich_entities,
    find_duplicates,
    graduate_provisional,
    merge_duplicates,
    now_iso,
    publish_heal_artifacts,
    story_moment,
    write_heal_history,
)
from tasks.qa import (
    QAReport,
    publish_qa_artifacts,
    qa_scope,
    run_qa_checks,
    save_qa_state,
    write_qa_report,
)
from tasks.runtime import Runtime, project_runtime, set_runtime

HEAL_DEPLOYMENT = "heal-graph"
QA_DEPLOYMENT = "qa-nightly"
#: Healing just before the nightly QA, so QA reports on a healed graph.
DEFAULT_HEAL_CRON = "30 2 * * *"
DEFAULT_QA_CRON = "0 3 * * *"


@flow(name="graph-healing", log_prints=True)
def heal_flow(
    project_dir: str,
    enrich: bool = True,
    use_embeddings: bool = True,
    dry_run: bool = False,
    max_enrichments: int = 20,
) -> HealReport:
    """Merge duplicates -> enrich busy entities -> graduate confident provisional ones."""
    started, run_at = time.monotonic(), now_iso()
    with project_writer(Path(project_dir), "graph-healing"), project_runtime(project_dir) as rt:
        services = rt.services()
        moment = story_moment(services)
        detection = find_duplicates(services, use_embeddings)
        report = HealReport(
            project_dir=str(rt.settings.project_dir),
            started_at=run_at,
            story_at=moment.stamp,
            dry_run=dry_run,
            detection=detection.stats,
            planned=detection.plans,
            vetoed=detection.vetoed,
        )
        if not dry_run:
            report.merges = merge_duplicates(services, detection.plans, moment)
            if enrich:
                report.enriched, report.enrichment_failures = enrich_entities(
                    services, moment, max_enrichments
                )
        report.graduated = graduate_provisional(services, dry_run)
        report.seconds = round(time.monotonic() - started, 2)
        path = write_heal_history(report, rt.settings.saga_dir)
        publish_heal_artifacts(report)
        get_run_logger().info("healing: %s (history %s)", report.counts(), path)
        return report


@flow(name="graph-qa", log_prints=True)
def qa_flow(project_dir: str, incremental: bool = False) -> QAReport:
    """Run every QA check, over the whole graph or (`incremental`, the novel flow's) over the
    chapters written since the last run plus a rotating sample; write the Parquet report and
    the Prefect artifacts."""
    started, run_at = time.monotonic(), now_iso()
    with project_writer(Path(project_dir), "graph-qa"), project_runtime(project_dir) as rt:
        services = rt.services()
        scope = qa_scope(services, incremental)
        findings = run_qa_checks(services, scope.chapters)
        path = write_qa_report(findings, scope.state, rt.settings.saga_dir)
        save_qa_state(rt.settings.saga_dir, scope.state)
        report = QAReport(
            project_dir=str(rt.settings.project_dir),
            run_at=run_at,
            story_at=scope.state.stamp,
            findings=findings,
            report_path=str(path),
            seconds=round(time.monotonic() - started, 2),
            scope=scope.describe(),
        )
        publish_qa_artifacts(report)
        write_codex_or_log(
            services, "with the QA findings"
        )  # the findings marked in exports/codex.html
        return report


def serve_deployments(
    project_dir: str, heal_cron: str = DEFAULT_HEAL_CRON, qa_cron: str = DEFAULT_QA_CRON
) -> None:
    """Register both deployments and run them on schedule in this process (Ctrl-C stops)."""
    from prefect import serve

    parameters = {"project_dir": project_dir}
    heal = heal_flow.to_deployment(
        name=HEAL_DEPLOYMENT,
        cron=heal_cron,
        parameters=parameters,
        description="Merge duplicate entities, enrich and graduate provisional ones",
    )
    qa = qa_flow.to_deployment(
        name=QA_DEPLOYMENT,
        cron=qa_cron,
        parameters=parameters,
        description="Nightly graph QA report",
    )
    # One run at a time: healing and QA of one graph should not interleave.
    serve(heal, qa, limit=1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.maintenance",
        description="Knowledge-graph maintenance: merge duplicates and graduate entities (heal), "
        "check the graph for inconsistencies (qa), or serve both on cron schedules (serve).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{heal,qa,serve}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--project-dir", type=Path, required=True, help="the novel's project directory"
    )
    add_settings_options(common)
    heal = sub.add_parser(
        "heal", parents=[common], help="merge duplicates, enrich, graduate provisional entities"
    )
    heal.add_argument(
        "--dry-run",
        action="store_true",
        help="report planned merges and graduations, write nothing",
    )
    heal.add_argument("--no-enrich", action="store_true", help="skip LLM enrichment")
    heal.add_argument(
        "--no-embeddings", action="store_true", help="match on names and relationships only"
    )
    heal.add_argument(
        "--max-enrichments", type=int, default=20, help="LLM enrichments per run (default 20)"
    )
    qa = sub.add_parser(
        "qa",
        parents=[common],
        help="run the QA checks, write the report and mark the findings in exports/codex.html",
    )
    qa.add_argument(
        "--fail-on",
        choices=("never", "error", "warning"),
        default="never",
        help="exit 1 when findings of this severity (or worse) exist (default never)",
    )
    serve = sub.add_parser(
        "serve", parents=[common], help="serve heal-graph and qa-nightly on cron schedules"
    )
    serve.add_argument(
        "--heal-cron",
        default=DEFAULT_HEAL_CRON,
        help=f"healing schedule (default {DEFAULT_HEAL_CRON!r})",
    )
    serve.add_argument(
        "--qa-cron", default=DEFAULT_QA_CRON, help=f"QA schedule (default {DEFAULT_QA_CRON!r})"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    require_project_dir(args.project_dir)
    setup_logging(args.verbose)
    settings = load_settings(args.project_dir, args.config)
    if args.command == "serve":
        from prefect.client.schemas.schedules import CronSchedule

        for option, cron in (("--heal-cron", args.heal_cron), ("--qa-cron", args.qa_cron)):
            try:
                CronSchedule(cron=cron)
            except ValueError as exc:
                raise InvalidInputError(
                    f"{option} {cron!r} is not a valid cron expression: {exc}"
                ) from None
        require_project(settings)
        serve_deployments(str(settings.project_dir), args.heal_cron, args.qa_cron)
        return 0
    if args.command == "heal" and args.max_enrichments < 0:
        raise InvalidInputError(f"--max-enrichments must be >= 0 (got {args.max_enrichments})")
    require_project(settings)
    # Held before the graph is opened (opening migrates its schema) until it is closed.
    with project_writer(settings.project_dir, f"python -m flows.maintenance {args.command}"):
        return _run_once(settings, args)


def _run_once(settings: Settings, args: argparse.Namespace) -> int:
    project = str(settings.project_dir)
    rt = set_runtime(Runtime(settings))
    try:
        rt.graph.schema_version()  # connect (bounded retries) or fail with one line before Prefect starts
        if args.command == "heal":
            heal = heal_flow(
                project,
                enrich=not args.no_enrich,
                use_embeddings=not args.no_embeddings,
                dry_run=args.dry_run,
                max_enrichments=args.max_enrichments,
            )
            print(
                json.dumps(
                    {
                        "dry_run": heal.dry_run,
                        **heal.counts(),
                        "planned_merges": len(heal.planned),
                        "seconds": heal.seconds,
                    }
                )
            )
            return 0
        qa = qa_flow(project)
        print(
            json.dumps(
                {
                    "findings": len(qa.findings),
                    "errors": qa.errors,
                    **qa.counts(),
                    "report": qa.report_path,
                }
            )
        )
        failing = {"never": set(), "error": {"error"}, "warning": {"error", "warning"}}[
            args.fail_on
        ]
        return 1 if any(f.severity in failing for f in qa.findings) else 0
    finally:
        rt.close()


if __name__ == "__main__":
    run_main(main, "maintenance", sys.argv[1:])
