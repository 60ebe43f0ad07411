"""Release gates and the report of a long-dialogue regression run (spec 000 s7, spec 002 s8).

Gates are evaluated per dialogue (a batch passes only when every dialogue passes): commit
ratio, rollbacks, timeouts, relation mutation signals (applied EVOLVE/REPLACE/DELETE),
milestones, and optionally recall@k from the recall probe. Outputs under
`<project>/.saga/regression/<run_id>/`: turns.parquet (one row per turn: state timeline,
per-slot latency, tokens, actions), recall.parquet, gates.parquet, report.md, summary.json.

report.md's tables are written by `_md_table` (five lines) on purpose: polars' Markdown
formatting (pl.Config tbl_formatting) and tabulate both pad columns and format numbers
their own way, which would change the report the regression runs have written so far.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, Field

from tasks.dialogue.evidence_audit import EvidenceAudit
from tasks.dialogue.replay import ProbeRow, RecallRow, TurnRow

QA_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


class GateConfig(BaseModel):
    """Thresholds of the release gates (CLI flags of `flows.regression`)."""

    min_commit_ratio: float = Field(
        0.9, ge=0.0, description="committed turns / replayed turns, per dialogue"
    )
    max_rollbacks: int | None = Field(
        None, ge=0, description="rolled-back turns per dialogue (None: no limit)"
    )
    max_timeouts: int = Field(0, ge=0, description="timed-out turns per dialogue")
    require_relation_mutations: bool = Field(
        True, description="at least one applied EVOLVE/REPLACE/DELETE"
    )
    require_milestones: bool = Field(True, description="at least one milestone")
    min_recall: float | None = Field(
        None, ge=0.0, le=1.0, description="mean recall@k of the probe (None: report only)"
    )
    recall_k: int = Field(5, ge=1, le=50)


class GateResult(BaseModel):
    dialogue_id: str
    gate: str
    value: float
    threshold: str
    passed: bool


def evaluate_gates(
    turns: pl.DataFrame, recall: pl.DataFrame, config: GateConfig
) -> list[GateResult]:
    results: list[GateResult] = []
    for dialogue_id in sorted(turns["dialogue_id"].unique().to_list()):
        d = turns.filter(pl.col("dialogue_id") == dialogue_id)
        n = d.height
        committed = int(d["committed"].sum())
        rollbacks = int((d["state"] == "ROLLED_BACK").sum())
        timeouts = int(d["timed_out"].sum())
        mutations = int(
            d["actions_evolve"].sum() + d["actions_replace"].sum() + d["actions_delete"].sum()
        )
        milestones = int(d["milestones"].sum())
        ratio = committed / n if n else 0.0

        def add(
            gate: str, value: float, threshold: str, passed: bool, dialogue: str = dialogue_id
        ) -> None:
            results.append(
                GateResult(
                    dialogue_id=dialogue,
                    gate=gate,
                    value=round(value, 4),
                    threshold=threshold,
                    passed=passed,
                )
            )

        add(
            "commit_ratio", ratio, f">= {config.min_commit_ratio}", ratio >= config.min_commit_ratio
        )
        if config.max_rollbacks is not None:
            add(
                "rollbacks",
                rollbacks,
                f"<= {config.max_rollbacks}",
                rollbacks <= config.max_rollbacks,
            )
        add("timeouts", timeouts, f"<= {config.max_timeouts}", timeouts <= config.max_timeouts)
        if config.require_relation_mutations:
            add("relation_mutations", mutations, "> 0", mutations > 0)
        if config.require_milestones:
            add("milestones", milestones, "> 0", milestones > 0)
        if config.min_recall is not None:
            # Category 5 (adversarial: the answer is not in the dialogue) is never averaged in.
            probe = (
                recall.filter((pl.col("dialogue_id") == dialogue_id) & (pl.col("category") != 5))
                if recall.height
                else recall
            )
            mean = float(probe["recall"].mean()) if probe.height else 0.0  # type: ignore[arg-type]
            add(
                f"recall@{config.recall_k}",
                mean,
                f">= {config.min_recall}",
                probe.height > 0 and mean >= config.min_recall,
            )
    return results


#: turns.parquet columns that may be null in every row of a run: typed all the same, so the
#: shards of a batch read together (`pl.read_parquet("<run_id>/shard-*/turns.parquet")`).
NULLABLE_TURN_COLUMNS = {
    "dia_id": pl.String,
    "session": pl.Int64,
    "code": pl.String,
    "error_kind": pl.String,
    "reason": pl.String,
}


def turns_frame(rows: Sequence[TurnRow]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame(schema={"dialogue_id": pl.String, "committed": pl.Boolean})
    return pl.DataFrame([r.model_dump() for r in rows], schema_overrides=NULLABLE_TURN_COLUMNS)


def _rows_frame(rows: Sequence[BaseModel], empty_schema: Mapping[str, Any]) -> pl.DataFrame:
    """The rows as a frame; with no rows, an empty frame with the columns the summaries read."""
    if rows:
        return pl.DataFrame([r.model_dump() for r in rows])
    return pl.DataFrame(schema=dict(empty_schema))


def recall_frame(rows: Sequence[RecallRow]) -> pl.DataFrame:
    return _rows_frame(
        rows,
        {"dialogue_id": pl.String, "category": pl.Int64, "recall": pl.Float64, "hit": pl.Boolean},
    )


def dialogue_summary(turns: pl.DataFrame) -> pl.DataFrame:
    """One row per dialogue: what the Prefect table artifact and the report show."""
    return (
        turns.group_by("dialogue_id")
        .agg(
            pl.len().alias("turns"),
            pl.col("committed").sum().alias("committed"),
            (pl.col("state") == "ROLLED_BACK").sum().alias("rolled_back"),
            pl.col("idempotent_hit").sum().alias("idempotent_hits"),
            pl.col("timed_out").sum().alias("timeouts"),
            pl.col("actions_evolve").sum().alias("evolve"),
            pl.col("actions_replace").sum().alias("replace"),
            pl.col("actions_delete").sum().alias("delete"),
            pl.col("milestones").sum().alias("milestones"),
            pl.col("total_ms").quantile(0.5, "linear").round(1).alias("p50_turn_ms"),
            pl.col("total_ms").quantile(0.95, "linear").round(1).alias("p95_turn_ms"),
            pl.col("overhead_ms").mean().round(1).alias("mean_overhead_ms"),
            (pl.col("prompt_tokens") + pl.col("completion_tokens")).sum().alias("tokens"),
        )
        .sort("dialogue_id")
    )


def recall_summary(recall: pl.DataFrame) -> pl.DataFrame:
    if not recall.height:
        return pl.DataFrame()
    return (
        recall.group_by("dialogue_id", "category")
        .agg(
            pl.len().alias("questions"),
            pl.col("recall").mean().round(3).alias("recall_at_k"),
            pl.col("hit").mean().round(3).alias("hit_rate"),
        )
        .with_columns(
            pl.col("category")
            .replace_strict(QA_CATEGORIES, default="other", return_dtype=pl.String)
            .alias("category_name")
        )
        .sort("dialogue_id", "category")
    )


def _md_table(frame: pl.DataFrame) -> str:
    if not frame.height:
        return "_none_\n"
    header = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
    body = "".join(
        "| " + " | ".join("" if v is None else str(v) for v in row) + " |\n"
        for row in frame.iter_rows()
    )
    return header + body


class RunInfo(BaseModel):
    run_id: str
    dialogues: list[str]
    turns_per_dialogue: int
    concurrency: int
    replay_seconds: float
    turns_total: int
    turns_per_second: float
    graph: str


def render_report(
    info: RunInfo,
    summary: pl.DataFrame,
    gates: list[GateResult],
    recall: pl.DataFrame,
    turns: pl.DataFrame,
    config: GateConfig,
) -> str:
    passed = all(g.passed for g in gates)
    lines = [
        f"# Long-dialogue regression `{info.run_id}`: {'PASSED' if passed else 'FAILED'}",
        "",
        f"- dialogues: {', '.join(info.dialogues)} ({info.turns_per_dialogue} turns each, concurrency {info.concurrency})",
        f"- replayed {info.turns_total} turns in {info.replay_seconds:.1f} s ({info.turns_per_second:.2f} turns/s)",
        f"- graph: {info.graph}",
        "",
        "## Gates",
        "",
        _md_table(pl.DataFrame([g.model_dump() for g in gates]) if gates else pl.DataFrame()),
        "## Dialogues",
        "",
        _md_table(summary),
        f"## Recall probe (recall@{config.recall_k} per QA category)",
        "",
        _md_table(recall_summary(recall)),
    ]
    failures = turns.filter(pl.col("state") == "ROLLED_BACK") if turns.height else turns
    if failures.height:
        reasons = (
            failures.group_by("reason")
            .agg(pl.len().alias("turns"))
            .sort("turns", descending=True)
            .head(10)
        )
        lines += ["## Rollback reasons", "", _md_table(reasons)]
    lines += [
        "## Files",
        "",
        "- `turns.parquet`: one row per turn (state timeline, per-slot latency, tokens, actions)",
        "- `recall.parquet`: one row per probed question",
        "- `gates.parquet`, `summary.json`, `llm-calls-*.parquet` (every model call)",
        "",
    ]
    return "\n".join(lines)


def write_outputs(
    out_dir: Path,
    turns: pl.DataFrame,
    recall: pl.DataFrame,
    gates: list[GateResult],
    report: str,
    summary_json: dict[str, object],
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # Temp file + rename: a crashed run never leaves a half-written Parquet behind.
    for name, frame in (
        ("turns.parquet", turns),
        ("recall.parquet", recall),
        (
            "gates.parquet",
            pl.DataFrame([g.model_dump() for g in gates]) if gates else pl.DataFrame(),
        ),
    ):
        tmp = out_dir / f".{name}.tmp"
        frame.write_parquet(tmp)
        tmp.replace(out_dir / name)
    for name, text in (
        ("report.md", report),
        ("summary.json", json.dumps(summary_json, indent=2, default=str) + "\n"),
    ):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out_dir / name)


# --- ingest mode: recall measured on whole dialogues ------------------------------------------

#: Categories averaged into "all": 5 is adversarial (the answer is not in the dialogue).
RECALL_CATEGORIES = (1, 2, 3, 4)
RECALL_KS = (5, 10)


def probe_frame(rows: Sequence[ProbeRow]) -> pl.DataFrame:
    return _rows_frame(
        rows,
        {
            "dialogue_id": pl.String,
            "category": pl.Int64,
            "recall_at_5": pl.Float64,
            "recall_at_10": pl.Float64,
        },
    )


def recall_at_k(probe: pl.DataFrame) -> dict[str, dict[str, float | None]]:
    """{"5": {"all": r, "1": r, ..., "4": r}, "10": {...}}: "all" averages categories 1-4 only."""
    out: dict[str, dict[str, float | None]] = {}
    main = probe.filter(pl.col("category").is_in(RECALL_CATEGORIES)) if probe.height else probe
    for k in RECALL_KS:
        column = f"recall_at_{k}"
        values: dict[str, float | None] = {
            "all": round(float(main[column].mean()), 4) if main.height else None
        }  # type: ignore[arg-type]
        for category in RECALL_CATEGORIES:
            part = main.filter(pl.col("category") == category) if main.height else main
            values[str(category)] = round(float(part[column].mean()), 4) if part.height else None  # type: ignore[arg-type]
        out[str(k)] = values
    return out


#: `_audited`'s columns when no question was probed.
_AUDITED_SCHEMA = {
    "category": pl.Int64,
    "recall_at_5": pl.Float64,
    "recall_at_10": pl.Float64,
    "audit_error": pl.String,
    "audited_evidence": pl.List(pl.String),
}


def _audited(probe: pl.DataFrame) -> pl.DataFrame:
    """The questions an evidence audit scored (`ProbeRow.audited_recall_at_*` set), with those
    figures as their `recall_at_*`: empty when the run had no audit."""
    if "audited_recall_at_10" not in probe.columns:  # no question probed
        return pl.DataFrame(schema=_AUDITED_SCHEMA)
    return probe.filter(pl.col("audited_recall_at_10").is_not_null()).with_columns(
        *(pl.col(f"audited_recall_at_{k}").alias(f"recall_at_{k}") for k in RECALL_KS)
    )


def audited_recall(probe: pl.DataFrame, audit: EvidenceAudit) -> dict[str, object]:
    """Recall@k as `recall_at_k` gives it, against the evidence `audit` cites where it
    re-cites a question (tasks.dialogue.evidence_audit), and how many questions it disputes
    and re-cites. Only the questions scored by turns count (not LongMemEval's)."""
    audited = _audited(probe)
    main = audited.filter(pl.col("category").is_in(RECALL_CATEGORIES))
    return {
        "folder": audit.folder,
        "disputed": main.filter(pl.col("audit_error").is_not_null()).height,
        "recited": main.filter(pl.col("audited_evidence").is_not_null()).height,
        "recall_at_k": recall_at_k(audited),
    }


def adversarial_recall(probe: pl.DataFrame) -> dict[str, float | int | None]:
    """Category 5 apart: how often the retriever still returns the turns the question leans on."""
    part = probe.filter(pl.col("category") == 5) if probe.height else probe
    return {
        "questions": part.height,
        **{
            f"recall_at_{k}": round(float(part[f"recall_at_{k}"].mean()), 4)
            if part.height
            else None  # type: ignore[arg-type]
            for k in RECALL_KS
        },
    }


def session_scored(probe: pl.DataFrame) -> pl.DataFrame:
    """The rows scored at session level (LongMemEval), empty when the run had none."""
    if not probe.height or "session_recall_any_at_10" not in probe.columns:
        return probe.clear()
    return probe.filter(pl.col("session_recall_any_at_10").is_not_null())


def session_recall_at_k(probe: pl.DataFrame) -> dict[str, object] | None:
    """LongMemEval's session recall: {"questions": n, "5": {"any": r, "all": r, "by_type":
    {question type: recall_any}}, "10": {...}}, or None when no question was session-scored."""
    part = session_scored(probe)
    if not part.height:
        return None
    out: dict[str, object] = {"questions": part.height}
    for k in RECALL_KS:
        by_type = (
            part.group_by("question_type")
            .agg(pl.col(f"session_recall_any_at_{k}").mean())
            .sort("question_type")
        )
        out[str(k)] = {
            "any": round(float(part[f"session_recall_any_at_{k}"].mean()), 4),  # type: ignore[arg-type]
            "all": round(float(part[f"session_recall_all_at_{k}"].mean()), 4),  # type: ignore[arg-type]
            "by_type": {str(t): round(float(r), 4) for t, r in by_type.iter_rows()},
        }
    return out


def session_recall_table(probe: pl.DataFrame) -> pl.DataFrame:
    """Per question type and over all: questions, recall_any@5/@10, recall_all@5/@10."""
    part = session_scored(probe)
    if not part.height:
        return pl.DataFrame()
    aggs = [pl.len().alias("questions")] + [
        pl.col(f"session_recall_{kind}_at_{k}").mean().round(3).alias(f"recall_{kind}@{k}")
        for k in RECALL_KS
        for kind in ("any", "all")
    ]
    per = part.group_by("question_type").agg(*aggs).sort("question_type")
    overall = part.select(*aggs).with_columns(pl.lit("(all)").alias("question_type"))
    return pl.concat([per, overall.select(per.columns)])


def recall_table(probe: pl.DataFrame) -> pl.DataFrame:
    """Per dialogue and category (1-4, then 5 apart) plus each dialogue's and the run's 1-4 average.
    Session-scored questions (LongMemEval) have their own table (`session_recall_table`)."""
    if probe.height and "session_recall_any_at_10" in probe.columns:
        probe = probe.filter(pl.col("session_recall_any_at_10").is_null())
    if not probe.height:
        return pl.DataFrame()
    named = probe.with_columns(
        pl.col("category")
        .replace_strict(QA_CATEGORIES, default="other", return_dtype=pl.String)
        .alias("name")
    )
    aggs = [
        pl.len().alias("questions"),
        pl.col("recall_at_5").mean().round(3).alias("recall@5"),
        pl.col("recall_at_10").mean().round(3).alias("recall@10"),
    ]
    per = (
        named.group_by("dialogue_id", "category", "name")
        .agg(*aggs)
        .with_columns(pl.col("category").cast(pl.String))
    )
    main = named.filter(pl.col("category").is_in(RECALL_CATEGORIES))
    totals = (
        main.group_by("dialogue_id")
        .agg(*aggs)
        .with_columns(pl.lit("1-4").alias("category"), pl.lit("all but adversarial").alias("name"))
    )
    overall = main.select(*aggs).with_columns(
        pl.lit("(all)").alias("dialogue_id"),
        pl.lit("1-4").alias("category"),
        pl.lit("all but adversarial").alias("name"),
    )
    columns = ["dialogue_id", "category", "name", "questions", "recall@5", "recall@10"]
    return pl.concat(
        [
            per.select(columns).sort("dialogue_id", "category"),
            totals.select(columns).sort("dialogue_id"),
            overall.select(columns),
        ]
    )


def evaluate_recall_gates(
    probe: pl.DataFrame,
    memory: dict[str, tuple[int, int]],
    config: GateConfig,
) -> list[GateResult]:
    """Per dialogue: every turn remembered exactly once. Over the whole run: recall@k over
    categories 1-4, pooled over every question (the figure `summary.json` holds as "all"); a
    per-dialogue floor would let a short dialogue's handful of questions decide the release."""
    results: list[GateResult] = []
    for dialogue_id, (turns, remembered) in sorted(memory.items()):
        results.append(
            GateResult(
                dialogue_id=dialogue_id,
                gate="turns_remembered",
                value=remembered,
                threshold=f"== {turns}",
                passed=remembered == turns,
            )
        )
    if config.min_recall is None:
        return results
    k = config.recall_k if config.recall_k in RECALL_KS else 10
    part = probe.filter(pl.col("category").is_in(RECALL_CATEGORIES)) if probe.height else probe
    sessions = session_scored(probe)
    # A LoCoMo-style run gates on turn recall over categories 1-4, a LongMemEval run on session
    # recall_any@k (the authors' headline), a run holding both on each.
    if part.height or not sessions.height:
        mean = float(part[f"recall_at_{k}"].mean()) if part.height else 0.0  # type: ignore[arg-type]
        results.append(
            GateResult(
                dialogue_id="(all)",
                gate=f"recall@{config.recall_k} (categories 1-4)",
                value=round(mean, 4),
                threshold=f">= {config.min_recall}",
                passed=part.height > 0 and mean >= config.min_recall,
            )
        )
    if sessions.height:
        mean = float(sessions[f"session_recall_any_at_{k}"].mean())  # type: ignore[arg-type]
        results.append(
            GateResult(
                dialogue_id="(all)",
                gate=f"session recall_any@{k} (LongMemEval)",
                value=round(mean, 4),
                threshold=f">= {config.min_recall}",
                passed=mean >= config.min_recall,
            )
        )
    return results


def render_ingest_report(
    run_id: str,
    graph: str,
    ingest: pl.DataFrame,
    gates: list[GateResult],
    probe: pl.DataFrame,
    skipped: dict[str, dict[str, int]],
    extract: bool,
    audit: EvidenceAudit | None = None,
) -> str:
    passed = all(g.passed for g in gates)
    # A run of LongMemEval questions only has no LoCoMo figures to show as None.
    only_sessions = probe.height > 0 and session_scored(probe).height == probe.height
    at_k = recall_at_k(probe)
    lines = [
        f"# Whole-dialogue recall `{run_id}`: {'PASSED' if passed else 'FAILED'}",
        "",
        f"- mode: ingest{' with extraction (LLM slots)' if extract else ' (no LLM)'}; every turn of every dialogue",
        f"- graph: {graph}",
        *(
            []
            if only_sessions
            else [
                f"- recall@10 over categories 1-4: {at_k['10']['all']}; recall@5: {at_k['5']['all']}"
            ]
        ),
        *(
            [
                f"- session recall_any@10 (LongMemEval): {sessions['10']['any']}; "  # type: ignore[index]
                f"recall_any@5: {sessions['5']['any']} over {sessions['questions']} questions"
            ]  # type: ignore[index]
            if (sessions := session_recall_at_k(probe))
            else []
        ),
        *([_audited_line(audited_recall(probe, audit))] if audit is not None else []),
        "",
        "## Gates",
        "",
        _md_table(pl.DataFrame([g.model_dump() for g in gates]) if gates else pl.DataFrame()),
        "## Ingest",
        "",
        _md_table(ingest),
        *(
            []
            if only_sessions
            else [
                "## Recall per category (k counts turns; category 5, adversarial, is never averaged in)",
                "",
                _md_table(recall_table(probe)),
            ]
        ),
        *(
            [
                "## Session recall per question type (LongMemEval: k counts distinct sessions)",
                "",
                _md_table(session_recall_table(probe)),
            ]
            if session_scored(probe).height
            else []
        ),
        "## Skipped questions",
        "",
        _md_table(
            pl.DataFrame(
                [
                    {"dialogue_id": d, "reason": r, "questions": n}
                    for d, reasons in sorted(skipped.items())
                    for r, n in sorted(reasons.items())
                ]
            )
            if any(skipped.values())
            else pl.DataFrame()
        ),
        "## Files",
        "",
        "- `recall.parquet`: one row per probed question (evidence, the 10 turns retrieved, recall@5/@10)",
        "- `ingest.parquet`, `gates.parquet`, `summary.json` (`recall_at_k`), `llm-calls-*.parquet`",
        "",
    ]
    return "\n".join(lines)


def _audited_line(audited: dict[str, Any]) -> str:
    at_k = audited["recall_at_k"]
    categories = ", ".join(f"{QA_CATEGORIES[c]} {at_k['10'][str(c)]}" for c in RECALL_CATEGORIES)
    return (
        f"- against the evidence audit in `{audited['folder']}` ({audited['disputed']} questions "
        f"of categories 1-4 disputed, {audited['recited']} re-cited): recall@10 "
        f"{at_k['10']['all']} ({categories}); recall@5: {at_k['5']['all']} (the gates use the "
        "published evidence)"
    )


def recall_headline(probe: pl.DataFrame) -> str:
    """The run's recall in a line: LoCoMo's turn recall over categories 1-4 (and against an
    evidence audit, when the run had one) and LongMemEval's session recall, each when the run
    has questions scored that way."""
    parts = []
    at_k = recall_at_k(probe)
    if at_k["10"]["all"] is not None:
        parts.append(f"recall@10 (categories 1-4) {at_k['10']['all']}, recall@5 {at_k['5']['all']}")
    audited = recall_at_k(_audited(probe))
    if audited["10"]["all"] is not None:
        parts.append(f"against the evidence audit recall@10 {audited['10']['all']}")
    sessions = session_recall_at_k(probe)
    if sessions is not None:
        ten, five = sessions["10"], sessions["5"]
        assert isinstance(ten, dict) and isinstance(five, dict)
        parts.append(f"session recall@10 (LongMemEval) {ten['any']}, recall@5 {five['any']}")
    return "; ".join(parts) or "no question probed"
