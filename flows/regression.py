"""`python -m flows.regression`: replay long dialogues through the sidecar and gate a release.

    python -m flows.regression --project-dir DIR --dialogues PATH... [--turns 20] [--concurrency 4]

Each dialogue file (JSONL turn format, ../shared/data/dialogues) is replayed turn by turn
into its own fresh conversation (`regression-<run_id>/<dialogue id>` unless
`--conversation-prefix` says otherwise); dialogues run in parallel, one Prefect task run per
dialogue on a thread pool of `--concurrency` workers. Inside a dialogue the turns call the
plain pipeline (tasks.dialogue.pipeline) directly: a Prefect flow run per turn would cost
~1 s of orchestration against ~0.1 s of the turn's own non-LLM work.

After the replay, a recall probe asks each QA question (sibling `<id>.qa.jsonl`) whose
evidence lies within the replayed turns, and the release gates are evaluated per dialogue.
Outputs: `<project>/.saga/regression/<run_id>/` (turns.parquet, recall.parquet,
gates.parquet, report.md, summary.json, llm-calls-*.parquet), a Prefect table artifact and a
Markdown artifact. Exit status 0 when every gate passes, 1 when one fails.

A big batch spreads over workers with `--shard I/N` (each replays every N-th dialogue;
give them one `--run-id` and they write side by side under `<run_id>/shard-I-of-N/`), most
simply as N flow runs of the deployment (`python -m deployments.regression submit --shards N`)
that the workers of one work pool pick up in parallel.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field, field_validator

from core.cli import project_prefect_settings, run_main, setup_logging
from core.errors import InvalidInputError
from core.settings import load_settings
from tasks.dialogue.models import TurnConfig
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tasks.dialogue.replay import (
    DialogueSpec,
    RecallRow,
    TurnRow,
    dialogue_files,
    load_dialogue,
    recall_probe,
    replay,
)
from tasks.dialogue.report import (
    GateConfig,
    RunInfo,
    dialogue_summary,
    evaluate_gates,
    recall_frame,
    render_report,
    turns_frame,
    write_outputs,
)

MAX_CONCURRENCY = 64
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class RegressionParams(BaseModel):
    """Everything a regression run depends on (the flow's parameters)."""

    project_dir: str = "."
    config_file: str | None = None
    dialogues: list[str] = Field(min_length=1, description="*.turns.jsonl files or directories of them")
    turns: int = Field(20, ge=1, description="turns replayed per dialogue (from the start)")
    concurrency: int = Field(4, ge=1, le=MAX_CONCURRENCY, description="dialogues replayed at once")
    window: int = Field(6, ge=0, le=50, description="earlier turns sent with each turn as chat window")
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


# Tasks get plain parameters; the service they share is looked up by run id (one per run).
_services: dict[str, DialogueService] = {}
_services_lock = threading.Lock()


def _service(run_id: str) -> DialogueService:
    with _services_lock:
        return _services[run_id]


@task(name="replay-dialogue", task_run_name="replay-{conversation_id}", cache_policy=NO_CACHE,
      persist_result=False)
def replay_dialogue_task(run_id: str, spec: DialogueSpec, conversation_id: str, window: int,
                         turn_config: TurnConfig) -> _DialogueOutcome:
    rows = replay(_service(run_id), spec, conversation_id, run_id, window=window, config=turn_config)
    committed = sum(r.committed for r in rows)
    get_run_logger().info("%s: %d/%d turns committed", conversation_id, committed, len(rows))
    return _DialogueOutcome(rows=rows)


@task(name="recall-probe", task_run_name="recall-{conversation_id}", cache_policy=NO_CACHE,
      persist_result=False)
def recall_probe_task(run_id: str, spec: DialogueSpec, conversation_id: str, k: int,
                      committed_refs: list[str]) -> list[RecallRow]:
    return recall_probe(_service(run_id), spec, conversation_id, run_id, k=k, committed_refs=set(committed_refs))


def plan_dialogues(params: RegressionParams) -> list[DialogueSpec]:
    specs = [load_dialogue(path, params.turns) for path in dialogue_files([Path(p) for p in params.dialogues])]
    if params.shard:
        index, count = (int(x) for x in params.shard.split("/"))
        specs = specs[index::count]
        if not specs:
            raise InvalidInputError(f"shard {params.shard} has no dialogues ({len(specs)} in total)")
    # The same dialogue given twice replays twice, into two conversations.
    seen: dict[str, int] = {}
    unique = []
    for spec in specs:
        seen[spec.dialogue_id] = seen.get(spec.dialogue_id, 0) + 1
        if seen[spec.dialogue_id] > 1:
            spec = spec.model_copy(update={"dialogue_id": f"{spec.dialogue_id}-{seen[spec.dialogue_id]}"})
        unique.append(spec)
    return unique


@flow(name="long-dialogue-regression", log_prints=True)
def regression_flow(params: RegressionParams) -> RegressionSummary:
    logger = get_run_logger()
    settings = load_settings(params.project_dir, params.config_file)
    run_id = params.run_id or f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    prefix = params.conversation_prefix if params.conversation_prefix is not None else f"regression-{run_id}/"
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
        logger.info("run %s: %d dialogue(s) x %d turns, concurrency %d, graph %s",
                    run_id, len(specs), params.turns, params.concurrency, graph)
        started = time.perf_counter()
        # A runner of our own, so `concurrency` holds in deployments too (not only via with_options).
        with ThreadPoolTaskRunner(max_workers=params.concurrency) as runner:
            futures = [
                runner.submit(replay_dialogue_task, {
                    "run_id": run_id, "spec": spec, "conversation_id": conversations[spec.dialogue_id],
                    "window": params.window, "turn_config": params.turn_config,
                })
                for spec in specs
            ]
            rows = [row for future in futures for row in future.result().rows]
            replay_seconds = time.perf_counter() - started
            committed_refs = {
                spec.dialogue_id: [r.dia_id for r in rows if r.dialogue_id == spec.dialogue_id and r.committed and r.dia_id]
                for spec in specs
            }
            probes = [
                runner.submit(recall_probe_task, {
                    "run_id": run_id, "spec": spec, "conversation_id": conversations[spec.dialogue_id],
                    "k": params.gates.recall_k, "committed_refs": committed_refs[spec.dialogue_id],
                })
                for spec in specs
                if spec.qa
            ]
            recall_rows = [row for future in probes for row in future.result()]

        turns = turns_frame(rows)
        recall = recall_frame(recall_rows)
        gates = evaluate_gates(turns, recall, params.gates)
        summary_frame = dialogue_summary(turns)
        info = RunInfo(
            run_id=run_id, dialogues=[s.dialogue_id for s in specs], turns_per_dialogue=params.turns,
            concurrency=params.concurrency, replay_seconds=round(replay_seconds, 3), turns_total=len(rows),
            turns_per_second=round(len(rows) / replay_seconds, 3) if replay_seconds > 0 else 0.0, graph=graph,
        )
        report = render_report(info, summary_frame, gates, recall, turns, params.gates)
        failed = [f"{g.dialogue_id}:{g.gate}={g.value} (needs {g.threshold})" for g in gates if not g.passed]
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
        write_outputs(out_dir, turns, recall, gates, report,
                      {"params": params.model_dump(mode="json"), "summary": summary.model_dump(mode="json")})
        service.gateway.write_records(out_dir)
        create_table_artifact(
            table=summary_frame.to_dicts(),
            key="long-dialogue-regression",
            description=f"Regression {run_id}: {'passed' if summary.passed else 'FAILED: ' + '; '.join(failed)}",
        )
        create_markdown_artifact(markdown=report, key="long-dialogue-regression-report",
                                 description=f"Regression report {run_id}")
        logger.info("run %s %s: report %s", run_id, "passed" if summary.passed else "FAILED", out_dir / "report.md")
        return summary
    finally:
        with _services_lock:
            _services.pop(run_id, None)
        service.close()


def run_regression(params: RegressionParams) -> RegressionSummary:
    """Run the flow with the project's Prefect result storage."""
    with project_prefect_settings(Path(params.project_dir)):
        return regression_flow(params)


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.regression",
        description="Replay long dialogues through the dialogue sidecar, enforce release gates, write a report.",
    )
    parser.add_argument("--project-dir", type=Path, required=True, help="project whose graph and .saga/ are used")
    parser.add_argument("--dialogues", nargs="+", required=True, metavar="PATH",
                        help="*.turns.jsonl files (or directories of them); a sibling *.qa.jsonl enables the recall probe")
    parser.add_argument("--turns", type=int, default=20, help="turns replayed per dialogue (default 20)")
    parser.add_argument("--concurrency", type=int, default=4, help="dialogues replayed at once (default 4)")
    parser.add_argument("--window", type=int, default=6, help="earlier turns sent as chat window (default 6)")
    parser.add_argument("--run-id", default=None, help="name of the run (default: timestamp + random suffix)")
    parser.add_argument("--conversation-prefix", default=None,
                        help="conversation id prefix (default regression-<run_id>/; '' replays into the dialogue ids)")
    parser.add_argument("--shard", default=None, metavar="I/N", help="replay only every N-th dialogue starting at I")
    parser.add_argument("--config", type=Path, default=None, help="TOML settings file (default <project-dir>/skald.toml)")
    gates = parser.add_argument_group("gates")
    gates.add_argument("--min-commit-ratio", type=float, default=0.9, help="per dialogue (default 0.9)")
    gates.add_argument("--max-rollbacks", type=int, default=None, help="per dialogue (default: no limit)")
    gates.add_argument("--max-timeouts", type=int, default=0, help="per dialogue (default 0)")
    gates.add_argument("--no-require-mutations", action="store_true", help="do not require EVOLVE/REPLACE/DELETE signals")
    gates.add_argument("--no-require-milestones", action="store_true", help="do not require milestones")
    gates.add_argument("--min-recall", type=float, default=None, help="mean recall@k of the probe (default: report only)")
    gates.add_argument("--recall-k", type=int, default=5, help="k of the recall probe (default 5)")
    turn = parser.add_argument_group("turns")
    turn.add_argument("--turn-timeout", type=float, default=None, help="seconds per turn before rollback (default 300)")
    turn.add_argument("--no-require-actions", action="store_true",
                      help="commit gate: let turns without relation actions commit")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def params_from_args(args: argparse.Namespace) -> RegressionParams:
    sidecar = SidecarOptions(**({"turn_timeout_s": args.turn_timeout} if args.turn_timeout is not None else {}))
    return RegressionParams(
        project_dir=str(args.project_dir),
        config_file=str(args.config) if args.config else None,
        dialogues=list(args.dialogues),
        turns=args.turns,
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
            min_recall=args.min_recall,
            recall_k=args.recall_k,
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
