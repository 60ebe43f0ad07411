"""`python -m bench.crash.regression`: a regression batch killed at seeded random moments and
resumed must end exactly where an uninterrupted batch ends.

Two runs of `python -m flows.regression ... --turns 20 --run-id crash-bench` over the shared
dialogues, each in a project directory (and so an embedded graph) of its own, against ONE
scripted OpenAI-compatible server running in a process of its own that counts every request:

1. the reference: uninterrupted;
2. the crashed one: its whole process group (the flow, its embedded ArcadeDB, Prefect's
   temporary API server) SIGKILLed at `--kills` seeded random moments, each time started
   again with the same command (the same `--run-id`: the batch resumes from its per-dialogue
   journal, and a turn whose commit landed just before the kill comes back as the sidecar's
   idempotent replay), then left to finish.

Compared: `gates.parquet` and `recall.parquet` byte for byte; `turns.parquet` row for row
after dropping the columns that measure wall time (`TIMING_COLUMNS`); `report.md` line for
line after blanking the same timings, the throughput line and the graph's port. Prints the
kills that landed, whether the outputs are identical, and the LLM calls the crashes cost
beyond the reference's. Exit status 1 when anything differs (the differing files are named),
or when the final exit codes differ.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from bench.crash.harness import GroupRun, KillSeries, differing, run_with_kills, tree_digest
from bench.served import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
DIALOGUES = REPO_ROOT.parent / "shared" / "data" / "dialogues"
SPEAKERS = [
    "Caroline",
    "Melanie",
    "Jon",
    "Gina",
    "John",
    "Maria",
    "Joanna",
    "Nate",
]  # every shared dialogue's
RUN_ID = "crash-bench"
#: turns.parquet columns that measure wall time: they differ between any two runs.
TIMING_COLUMNS = (
    "started_at",
    "wall_ms",
    "total_ms",
    "llm_ms",
    "overhead_ms",
    "retriever_ms",
    "injector_ms",
    "actor_ms",
    "extractor_ms",
    "judge_ms",
    "historian_ms",
    "commit_ms",
    "state_elapsed_ms",
)
#: report.md table columns that are timings.
REPORT_TIMING_COLUMNS = ("p50_turn_ms", "p95_turn_ms", "mean_overhead_ms")
BYTE_FOR_BYTE = ("gates.parquet", "recall.parquet")


# --------------------------------------------------------------------------- the scripted model
def serve_llm() -> None:
    """The scripted server playing the dialogue script, until SIGTERM (run in its own process)."""
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    with ScriptedLLM() as llm:
        DialogueScript(SPEAKERS).install(llm)
        print(llm.base_url, flush=True)
        stop.wait()


class LLMProcess:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from bench.crash.regression import serve_llm; serve_llm()"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            self.stop()
            raise RuntimeError("the scripted LLM server did not start")

    def requests(self) -> int:
        with urllib.request.urlopen(f"{self.base_url}/scripted/stats", timeout=10) as reply:
            return int(json.loads(reply.read())["requests"])

    def stop(self) -> None:
        stop_process(self.proc, grace_s=10)


# --------------------------------------------------------------------------- comparing outputs
def turns_digest(path: Path) -> str:
    """SHA-256 of turns.parquet's rows without the wall-time columns (as NDJSON, column order kept)."""
    frame = pl.read_parquet(path)
    frame = frame.drop([c for c in TIMING_COLUMNS if c in frame.columns])
    buffer = io.BytesIO()
    frame.write_ndjson(buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def normalise_report(text: str) -> str:
    """report.md without what measures time or names the graph's port."""
    out: list[str] = []
    blank: list[int] = []
    for line in text.splitlines():
        if line.startswith("- replayed "):
            line = re.sub(r"in [0-9.]+ s \([0-9.]+ turns/s\)", "in _ s (_ turns/s)", line)
        elif line.startswith("- graph: "):
            line = re.sub(r":\d+/", ":_/", line)
        elif line.startswith("| "):  # a table's header or row (its |---| line passes as it is)
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if any(c in REPORT_TIMING_COLUMNS for c in cells):
                blank = [i for i, c in enumerate(cells) if c in REPORT_TIMING_COLUMNS]
            elif blank:
                cells = ["_" if i in blank else c for i, c in enumerate(cells)]
            line = "| " + " | ".join(cells) + " |"
        elif not line.startswith("|"):
            blank = []  # the table ended
        out.append(line)
    return "\n".join(out) + "\n"


def output_digests(out_dir: Path) -> dict[str, str]:
    digests = tree_digest(out_dir, BYTE_FOR_BYTE)
    if (out_dir / "turns.parquet").exists():
        digests["turns.parquet (without wall-time columns)"] = turns_digest(
            out_dir / "turns.parquet"
        )
    if (out_dir / "report.md").exists():
        text = normalise_report((out_dir / "report.md").read_text(encoding="utf-8"))
        digests["report.md (timings blanked)"] = hashlib.sha256(text.encode()).hexdigest()
    return digests


# --------------------------------------------------------------------------- the bench
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash.regression",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="names the sequence of kill moments (default 1)"
    )
    parser.add_argument("--kills", type=int, default=3, help="kills to attempt (default 3)")
    parser.add_argument(
        "--low",
        type=float,
        default=None,
        help="earliest kill, seconds after a start (default: 40%% of the reference run's time)",
    )
    parser.add_argument(
        "--high",
        type=float,
        default=None,
        help="latest kill, seconds after a start (default: 90%% of the reference run's time)",
    )
    parser.add_argument("--turns", type=int, default=20, help="turns per dialogue (default 20)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="dialogues at once (default 1: turns of several dialogues interleave in the shared "
        "recall index in thread order, which approximate search can see)",
    )
    parser.add_argument(
        "--dialogues",
        nargs="+",
        type=Path,
        default=[DIALOGUES],
        metavar="PATH",
        help=f"dialogue files or directories (default {DIALOGUES})",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where both projects go (default: a temp dir, removed at the end unless --keep)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    return parser


def _command(project: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flows.regression",
        "--project-dir",
        str(project),
        "--dialogues",
        *[str(d) for d in args.dialogues],
        "--turns",
        str(args.turns),
        "--concurrency",
        str(args.concurrency),
        "--run-id",
        RUN_ID,
    ]


def _reference(
    reference: Path, args: argparse.Namespace, env: dict[str, str], work: Path, llm: LLMProcess
) -> tuple[int, int, float]:
    """The uninterrupted run (printed): its exit, its LLM calls, its seconds."""
    before = llm.requests()
    started = time.monotonic()
    reference_exit = (
        GroupRun(_command(reference, args), REPO_ROOT, env, work / "reference.log")
        .start()
        .wait(timeout=1800)
    )
    reference_s = time.monotonic() - started
    reference_calls = llm.requests() - before
    print(
        f"reference: exit {reference_exit}, {reference_calls} LLM calls ({reference_s:.0f} s; log {work / 'reference.log'})"
    )
    return reference_exit, reference_calls, reference_s


def _crashed(
    crashed: Path,
    args: argparse.Namespace,
    env: dict[str, str],
    work: Path,
    llm: LLMProcess,
    reference_s: float,
) -> tuple[KillSeries, int]:
    """The run killed at seeded moments and resumed (printed): the kills, its LLM calls."""
    # Start-up (Prefect's API, the JVM) takes a share of a run that depends on the machine's
    # load: by default the kills fall in the later part of the reference's own time.
    low = args.low if args.low is not None else round(0.4 * reference_s, 1)
    high = max(low, args.high if args.high is not None else round(0.9 * reference_s, 1))
    before = llm.requests()
    series = run_with_kills(
        _command(crashed, args),
        cwd=REPO_ROOT,
        env=env,
        log=work / "crashed.log",
        seed=args.seed,
        kills=args.kills,
        low_s=low,
        high_s=high,
    )
    crashed_calls = llm.requests() - before
    moments = ", ".join(
        f"{k.delay_s:.1f}s{'' if k.killed else ' (finished first)'}" for k in series.kills
    )
    print(
        f"crashed: seed {args.seed}, kill window {low:g}-{high:g} s, kills landed {series.landed}/{args.kills} at {moments}; final exit "
        f"{series.final_exit}, {crashed_calls} LLM calls (log {work / 'crashed.log'})"
    )
    return series, crashed_calls


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kills < 1 or (
        args.low is not None and args.high is not None and not 0 < args.low <= args.high
    ):
        print(
            "bench.crash.regression: error: need --kills >= 1 and 0 < --low <= --high",
            file=sys.stderr,
        )
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="skald-crash-regression-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEO4J_", "OPENAI_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
    )
    env.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    llm = LLMProcess(env)
    try:
        env.update(
            OPENAI_BASE_URL=llm.base_url,
            SKALD_EMBEDDING_BASE_URL=llm.base_url,
            OPENAI_API_KEY="scripted",
        )
        reference, crashed = work / "reference", work / "crashed"
        for project in (reference, crashed):
            shutil.rmtree(project, ignore_errors=True)
            project.mkdir(parents=True)

        reference_exit, reference_calls, reference_s = _reference(reference, args, env, work, llm)
        series, crashed_calls = _crashed(crashed, args, env, work, llm, reference_s)
    finally:
        llm.stop()

    a = output_digests(reference / ".saga" / "regression" / RUN_ID)
    b = output_digests(crashed / ".saga" / "regression" / RUN_ID)
    diff = differing(a, b)
    identical = not diff and bool(a) and series.final_exit == reference_exit
    for name, digest in a.items():
        print(
            f"  {name}: {digest[:16]}{'' if b.get(name) == digest else '  DIFFERS: ' + b.get(name, 'missing')[:16]}"
        )
    extra = (crashed_calls - reference_calls) / reference_calls * 100.0 if reference_calls else 0.0
    print(
        f"kills landed: {series.landed}; identical: {'yes' if identical else 'no'}; "
        f"extra LLM calls: {crashed_calls - reference_calls} ({extra:+.1f}%)"
    )
    if diff:
        print(f"differing: {', '.join(diff)}", file=sys.stderr)
    if series.final_exit != reference_exit:
        print(f"final exit {series.final_exit} != reference {reference_exit}", file=sys.stderr)
    if args.work_dir is None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work dir kept: {work}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
