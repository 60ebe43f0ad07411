"""QA stages: run the graph checks (kg/qa.py) and publish the findings.

Two scopes: the whole graph (the nightly deployment, `python -m flows.maintenance qa`), or,
run by the novel flow every `qa_every` chapters, the chapters written since the last QA run
plus a rotating sample of `SAMPLE_CHAPTERS` earlier ones, so a long book is checked chapter by
chapter at a cost that does not grow with it and every chapter is checked again in turn.
`.saga/qa/state.json` says how far QA got, and on which history (kg.commit.history): when the
graph was rolled back or rewritten below that point, the next QA checks the whole graph.

Findings go to a Parquet report under `<project>/.saga/qa/qa-chNNNN-csNNNNNN.parquet` (one
row per finding; an empty report still has the columns, so "nothing found" is a file too), a
Prefect table artifact and a Markdown summary artifact. The report is named and stamped by
story time, the chapter and change-set it checked through (`story_at`: "after chapter 4,
change-set 12"), never the wall clock (issue 33): one file per run, the same bytes whenever
the run happened, and a run repeated at the same point (a resume after a crash) rewrites
its file. The wall-clock `run_at` of a run (when did the nightly deployment run) is in the
log and the Prefect artifacts only.

The summary's two-column count table is two f-string lines on purpose: the rows themselves
go through Prefect's table artifact, and a table library (tabulate) would pad the columns
and so change the Markdown artifact operators already read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, ConfigDict, Field

from core.content import atomic_write
from kg.qa import CHECKS, Finding, run_checks
from tasks.policy import graph_task
from tasks.services import Services

REPORT_SCHEMA = pa.schema(
    [
        ("story_at", pa.string()),
        ("check", pa.string()),
        ("severity", pa.string()),
        ("message", pa.string()),
        ("entity_ids", pa.list_(pa.string())),
        ("entity_names", pa.list_(pa.string())),
        ("chapters", pa.list_(pa.int64())),
    ]
)


#: Earlier chapters an incremental QA run checks again, in turn.
SAMPLE_CHAPTERS = 5
STATE_FILE = "state.json"


class QAState(BaseModel):
    """How far QA got: chapters 1..through were checked on the history through change-set `seq`."""

    through: int = 0
    seq: int = 0
    fingerprint: str = ""
    sample_next: int = 1

    @property
    def stamp(self) -> str:
        """Story time of the QA run that leaves this state (the report's `story_at`)."""
        return f"after chapter {self.through}, change-set {self.seq}"

    @property
    def report_name(self) -> str:
        return f"qa-ch{self.through:04d}-cs{self.seq:06d}.parquet"


class QAScope(BaseModel):
    chapters: list[int] | None = Field(None, description="None: the whole graph")
    state: QAState

    def describe(self) -> str:
        if self.chapters is None:
            return "the whole graph"
        if not self.chapters:
            return "nothing new"
        return "chapters " + ", ".join(_ranges(self.chapters))


class QAReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project_dir: str
    run_at: str = Field(description="wall clock, for the log and artifacts only")
    story_at: str = ""
    findings: list[Finding] = Field(default_factory=list)
    report_path: str = ""
    seconds: float = 0.0
    scope: str = "the whole graph"

    def counts(self) -> dict[str, int]:
        found = Counter(f.check for f in self.findings)
        return {check: found.get(check, 0) for check in CHECKS}

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")


def _ranges(numbers: list[int]) -> list[str]:
    out: list[str] = []
    for n in sorted(numbers):
        if out and n == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return out


def load_qa_state(saga_dir: Path) -> QAState | None:
    path = saga_dir / "qa" / STATE_FILE
    try:
        return QAState.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # none yet, or unreadable: the whole graph is checked


@graph_task("qa_scope")
def qa_scope(services: Services, incremental: bool) -> QAScope:
    """What this QA run checks (see the module docstring), and the state it leaves."""
    graph = services.graph_reader
    seq, fingerprint = graph.history_head()
    latest = graph.latest_chapter()
    done = QAState(through=latest, seq=seq, fingerprint=fingerprint)
    state = load_qa_state(services.settings.saga_dir) if incremental else None
    if state is None or state.through > latest or graph.history_at(state.seq) != state.fingerprint:
        return QAScope(chapters=None, state=done)  # first run, or the history changed below it
    new = list(range(state.through + 1, latest + 1))
    sample: list[int] = []
    if state.through:
        first = state.sample_next if 1 <= state.sample_next <= state.through else 1
        sample = [
            (first - 1 + i) % state.through + 1 for i in range(min(SAMPLE_CHAPTERS, state.through))
        ]
        done.sample_next = sample[-1] % state.through + 1
    return QAScope(chapters=sorted(set(new) | set(sample)), state=done)


def save_qa_state(saga_dir: Path, state: QAState) -> None:
    atomic_write(
        saga_dir / "qa" / STATE_FILE, (state.model_dump_json(indent=2) + "\n").encode("utf-8")
    )


@graph_task("check_quality")
def run_qa_checks(services: Services, chapters: list[int] | None = None) -> list[Finding]:
    """The checks over the whole graph, or over what `chapters` wrote (kg.qa)."""
    findings = run_checks(services.graph_reader, services.settings.healing, chapters=chapters)
    log = get_run_logger()
    for finding in findings:
        (log.error if finding.severity == "error" else log.warning)(
            "qa %s: %s", finding.check, finding.message
        )
    log.info("qa: %d finding(s)", len(findings))
    return findings


def write_qa_report(findings: list[Finding], state: QAState, saga_dir: Path) -> Path:
    """Parquet named and stamped by the story point `state` leaves (see the module docstring),
    written atomically (temp file + rename)."""
    directory = saga_dir / "qa"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / state.report_name
    rows = [{"story_at": state.stamp, **f.model_dump()} for f in findings]
    table = pa.Table.from_pylist(rows, schema=REPORT_SCHEMA)
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial)
    partial.replace(path)
    return path


def publish_qa_artifacts(report: QAReport) -> None:
    rows = [
        {
            "check": f.check,
            "severity": f.severity,
            "message": f.message,
            "entities": ", ".join(f.entity_names),
            "entity_ids": ", ".join(f.entity_ids),
            "chapters": ", ".join(map(str, f.chapters)),
        }
        for f in report.findings
    ]
    if rows:
        create_table_artifact(
            key="graph-qa-findings",
            table=rows,
            description=f"Graph QA findings ({len(rows)}), report {report.report_path}",
        )
    lines = [
        "# Graph QA",
        "",
        f"- project: `{report.project_dir}`",
        f"- run at: {report.run_at} ({report.seconds:.1f}s), {report.story_at}",
        f"- checked: {report.scope}",
        f"- report: `{report.report_path}`",
        f"- findings: {len(report.findings)} ({report.errors} errors)",
        "",
        "| check | findings |",
        "|---|---|",
    ]
    lines += [f"| {check} | {n} |" for check, n in report.counts().items()]
    if report.findings:
        lines += ["", "## Findings", ""]
        lines += [
            f"- **{f.severity}** `{f.check}`: {f.message} (chapters {', '.join(map(str, f.chapters)) or '-'})"
            for f in report.findings[:200]
        ]
    create_markdown_artifact(
        key="graph-qa-summary", markdown="\n".join(lines), description="Graph QA summary"
    )
