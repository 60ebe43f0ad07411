"""QA stages: run the graph checks (kg/qa.py) and publish the findings.

Findings go to a Parquet report under `<project>/.saga/qa/qa-<time>.parquet` (one row per
finding; an empty report still has the columns, so "nothing found" is a file too), a
Prefect table artifact and a Markdown summary artifact.

The summary's two-column count table is two f-string lines on purpose: the rows themselves
go through Prefect's table artifact, and a table library (tabulate) would pad the columns
and so change the Markdown artifact operators already read.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, ConfigDict, Field

from kg.qa import CHECKS, Finding, run_checks
from tasks.policy import graph_task
from tasks.runtime import runtime

REPORT_SCHEMA = pa.schema(
    [
        ("run_at", pa.string()),
        ("check", pa.string()),
        ("severity", pa.string()),
        ("message", pa.string()),
        ("entity_ids", pa.list_(pa.string())),
        ("entity_names", pa.list_(pa.string())),
        ("chapters", pa.list_(pa.int64())),
    ]
)


class QAReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project_dir: str
    run_at: str
    findings: list[Finding] = Field(default_factory=list)
    report_path: str = ""
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        found = Counter(f.check for f in self.findings)
        return {check: found.get(check, 0) for check in CHECKS}

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")


@graph_task("check_quality")
def run_qa_checks() -> list[Finding]:
    rt = runtime()
    findings = run_checks(rt.graph, rt.settings.healing)
    log = get_run_logger()
    for finding in findings:
        (log.error if finding.severity == "error" else log.warning)("qa %s: %s", finding.check, finding.message)
    log.info("qa: %d finding(s)", len(findings))
    return findings


def write_qa_report(findings: list[Finding], run_at: str, saga_dir: Path) -> Path:
    """Parquet, written atomically (temp file + rename)."""
    directory = saga_dir / "qa"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(run_at).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"qa-{stamp}.parquet"
    rows = [{"run_at": run_at, **f.model_dump()} for f in findings]
    table = pa.Table.from_pylist(rows, schema=REPORT_SCHEMA)
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial)
    partial.replace(path)
    return path


def publish_qa_artifacts(report: QAReport) -> None:
    rows = [
        {"check": f.check, "severity": f.severity, "message": f.message, "entities": ", ".join(f.entity_names),
         "entity_ids": ", ".join(f.entity_ids), "chapters": ", ".join(map(str, f.chapters))}
        for f in report.findings
    ]
    if rows:
        create_table_artifact(key="graph-qa-findings", table=rows,
                              description=f"Graph QA findings ({len(rows)}), report {report.report_path}")
    lines = [
        "# Graph QA", "", f"- project: `{report.project_dir}`", f"- run at: {report.run_at} ({report.seconds:.1f}s)",
        f"- report: `{report.report_path}`", f"- findings: {len(report.findings)} ({report.errors} errors)", "",
        "| check | findings |", "|---|---|",
    ]
    lines += [f"| {check} | {n} |" for check, n in report.counts().items()]
    if report.findings:
        lines += ["", "## Findings", ""]
        lines += [f"- **{f.severity}** `{f.check}`: {f.message} (chapters {', '.join(map(str, f.chapters)) or '-'})"
                  for f in report.findings[:200]]
    create_markdown_artifact(key="graph-qa-summary", markdown="\n".join(lines), description="Graph QA summary")
