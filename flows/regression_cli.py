"""The command line of `python -m flows.regression`: its parser (run, gate and turn options),
the flow parameters the arguments make, and the lines printed at the end of a run.

Figures printed come from the run's summary and, in ingest mode, its summary.json; failed
gates go to stderr, one line each. The exit status (0 all gates passed, 1 one failed) is
`flows.regression.main`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flows.regression_plan import INGEST_MIN_RECALL, RegressionParams, RegressionSummary
from tasks.dialogue.models import TurnConfig
from tasks.dialogue.pipeline import SidecarOptions
from tasks.dialogue.report import GateConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.regression",
        description="Replay long dialogues through the dialogue sidecar, enforce release gates, write a report.",
    )
    _run_arguments(parser)
    _gate_arguments(parser.add_argument_group("gates"))
    _turn_arguments(parser.add_argument_group("turns"))
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def _run_arguments(parser: argparse.ArgumentParser) -> None:
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


def _gate_arguments(gates: argparse._ArgumentGroup) -> None:
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
    gates.add_argument(
        "--evidence-audit",
        type=Path,
        default=None,
        metavar="DIR",
        help="ingest mode: also report recall against the evidence a published audit of LoCoMo's "
        "answer key cites (the errors_conv_*.json files of dial481/locomo-audit's audit/ "
        "folder); the gates keep the published evidence",
    )


def _turn_arguments(turn: argparse._ArgumentGroup) -> None:
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
        gates=_gate_config(args),
        evidence_audit=str(args.evidence_audit) if args.evidence_audit else None,
        sidecar=sidecar,
        turn_config=TurnConfig(require_actions=not args.no_require_actions),
    )


def _gate_config(args: argparse.Namespace) -> GateConfig:
    ingest = args.mode == "ingest"
    if args.no_recall_gate:
        min_recall = None
    elif args.min_recall is not None:
        min_recall = args.min_recall
    else:
        min_recall = INGEST_MIN_RECALL if ingest else None
    return GateConfig(
        min_commit_ratio=args.min_commit_ratio,
        max_rollbacks=args.max_rollbacks,
        max_timeouts=args.max_timeouts,
        require_relation_mutations=not args.no_require_mutations,
        require_milestones=not args.no_require_milestones,
        min_recall=min_recall,
        recall_k=args.recall_k if args.recall_k is not None else (10 if ingest else 5),
    )


def print_replay_summary(summary: RegressionSummary) -> None:
    print(
        f"regression {summary.run_id}: {_word(summary)}: {summary.dialogues} dialogue(s), "
        f"{summary.committed}/{summary.turns} turns committed, {summary.rolled_back} rolled back, "
        f"{summary.timeouts} timed out; {summary.turns_per_second:.2f} turns/s; mean turn {summary.mean_turn_ms:.0f} ms "
        f"(LLM {summary.mean_llm_ms:.0f} ms, other {summary.mean_overhead_ms:.0f} ms)"
    )
    print(f"report: {Path(summary.out_dir) / 'report.md'}")
    _print_failed_gates(summary)


def print_ingest_summary(summary: RegressionSummary) -> None:
    """The recall figures of summary.json: per category, per LongMemEval session, category 5
    apart, and the questions skipped by reason."""
    data = json.loads((Path(summary.out_dir) / "summary.json").read_text())
    print(
        f"regression {summary.run_id}: {_word(summary)}: {summary.dialogues} "
        f"dialogue(s), {summary.turns} turns ingested ({summary.turns_per_second:.1f} turns/s), "
        f"{data['questions']['probed']} questions probed"
    )
    at_k = data["recall_at_k"]
    sessions = data.get("session_recall_at_k")
    for k in ("10", "5") if at_k["10"]["all"] is not None or not sessions else ():
        cats = ", ".join(f"cat {c} {at_k[k][c]}" for c in ("1", "2", "3", "4"))
        print(f"recall@{k} categories 1-4: {at_k[k]['all']} ({cats})")
    if audited := data.get("evidence_audit"):
        at_k = audited["recall_at_k"]
        cats = ", ".join(f"cat {c} {at_k['10'][c]}" for c in ("1", "2", "3", "4"))
        print(
            f"against the evidence audit ({audited['disputed']} questions disputed, "
            f"{audited['recited']} re-cited): recall@10 {at_k['10']['all']} ({cats}), "
            f"recall@5 {at_k['5']['all']}"
        )
    if sessions:
        _print_session_recall(sessions)
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
    _print_failed_gates(summary)


def _print_session_recall(sessions: dict[str, Any]) -> None:
    for k in ("10", "5"):
        types = ", ".join(f"{t} {r}" for t, r in sessions[k]["by_type"].items())
        print(
            f"session recall@{k} (LongMemEval, {sessions['questions']} questions): "
            f"any {sessions[k]['any']}, all {sessions[k]['all']} ({types})"
        )


def _word(summary: RegressionSummary) -> str:
    return "PASSED" if summary.passed else "FAILED"


def _print_failed_gates(summary: RegressionSummary) -> None:
    for gate in summary.failed_gates:
        print(f"regression: gate failed: {gate}", file=sys.stderr)
