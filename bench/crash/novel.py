"""Crash equivalence of the novel pipeline: a run killed and resumed writes the same bytes as
the run that was never interrupted, and two runs under different hash seeds in different
directories write the same bytes too.

    python -m bench.crash.novel [--chapters 4] [--scenes 2] [--seeds 3] [--kills 4]
                                [--qa-every 2] [--work-dir DIR] [--no-hash-seeds]

The scripted server of tests/support/long_story.py runs in its own process (bench/long_book.py's
ScriptedServer); its answers depend only on the request body, and it counts every request
(GET /scripted/stats). Every novel run is `python -m flows.novel` started as the leader of its
own process group (bench/crash/harness.py), with its own embedded graph under the project.

1. The uninterrupted run (PYTHONHASHSEED=1), in its own directory.
2. Unless --no-hash-seeds: the same run under PYTHONHASHSEED=2 in a directory of another name
   and depth; the SHA-256 of its graph export and of each chapter are printed next to the
   first run's, and every compared file must be byte-identical.
3. For each seed: a fresh project whose run is SIGKILLed (the whole process group) at `--kills`
   seeded moments, restarted after each, then resumed to its end; its files must be
   byte-identical to the uninterrupted run's. The LLM calls it spent beyond the uninterrupted
   run's are the price of the crashes (the server is shared: each run's share is read from its
   request count before and after).

Compared: chapters/*.md, the story bible (characters/, outline/, world/), exports/ (the
manuscript and the codex), .saga/quality/*.json, the QA reports and state (.saga/qa/), the steering state (.saga/steering.json,
.saga/bible/), the records of a finished initialization and of each written chapter, every artifact of the content store (.saga/content: plans, contexts, drafts,
extractions, deltas) and a `python -m kg export` of the graph.
Exits 1 when anything differs or a run fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.crash.harness import (
    GroupRun,
    KillRecord,
    KillSeries,
    differing,
    run_with_kills,
    tree_digest,
)

REPO = Path(__file__).resolve().parents[2]
#: What a finished run leaves that must not depend on how it got there.
COMPARED = (
    "chapters/*.md",
    "characters/**/*",
    "outline/**/*",
    "world/**/*",
    "exports/*",
    ".saga/quality/*.json",
    ".saga/qa/*.parquet",
    ".saga/qa/state.json",
    ".saga/steering.json",
    ".saga/initialized.json",
    ".saga/written/*.json",
    ".saga/bible/*.json",
    ".saga/content/**/*",
)
GRAPH_EXPORT = "kg export"


@dataclass(frozen=True)
class Book:
    """What every run of one comparison writes: the same command, the same settings."""

    chapters: int = 4
    scenes: int = 2
    qa_every: int = 2
    timeout_s: float = 1800.0
    acts: int = 2
    #: A running Prefect API every run reports to (the test suite's, shared by its runs); None:
    #: each run starts Prefect's temporary server of its own, as a user's run does.
    prefect_api_url: str | None = None

    def cmd(self, project: Path) -> list[str]:
        from tests.support.long_story import PREMISE

        return [
            sys.executable,
            "-m",
            "flows.novel",
            "--project-dir",
            str(project),
            "--premise",
            PREMISE,
            "--chapters",
            str(self.chapters),
            "--scenes-per-chapter",
            str(self.scenes),
            "--acts",
            str(self.acts),
        ]


@dataclass
class RunResult:
    project: Path
    digest: dict[str, str]
    requests: int  # scripted-server requests this run (all its starts) made
    wall_s: float
    exit_code: int | None


def novel_env(base_url: str, prefect_home: Path, hash_seed: int, book: Book) -> dict[str, str]:
    """The environment of a run: the scripted server for chat and embeddings, the embedded graph
    under the project (no NEO4J_URI), a Prefect home of its own (and the book's Prefect API, if
    it names one), this checkout first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SKALD_", "NEO4J_", "OPENAI_", "PREFECT_"))
    }
    env.update(
        {
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "scripted",
            "SKALD_EMBEDDING_BASE_URL": base_url,
            "SKALD_LIMITS__QA_EVERY": str(book.qa_every),
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": os.environ.get(
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"
            ),
            "PYTHONHASHSEED": str(hash_seed),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
            ),
        }
    )
    if book.prefect_api_url is not None:
        env["PREFECT_API_URL"] = book.prefect_api_url
    return env


def export_graph(project: Path, env: Mapping[str, str], log: Path) -> Path:
    """`python -m kg export` of the project's graph, next to the project."""
    out = project.parent / "graph-export.json"
    run = GroupRun(
        [sys.executable, "-m", "kg", "export", "--out", str(out), "--project-dir", str(project)],
        REPO,
        env,
        log,
    ).start()
    code = run.wait(timeout=600)
    if code != 0 or not out.exists():
        raise RuntimeError(f"kg export of {project} exited {code}; see {log}")
    return out


def digest_of(project: Path, env: Mapping[str, str], log: Path) -> dict[str, str]:
    # Hidden files are the content store's locks and the temp files of writes a kill cut short
    # (atomic writes: the real file is either whole or absent); they are no output.
    digest = {
        name: sha
        for name, sha in tree_digest(project, COMPARED).items()
        if not Path(name).name.startswith(".")
    }
    digest[GRAPH_EXPORT] = hashlib.sha256(export_graph(project, env, log).read_bytes()).hexdigest()
    return dict(sorted(digest.items()))


class Server(Protocol):
    """The scripted server as the runs use it (bench.long_book.ScriptedServer)."""

    base_url: str

    def requests(self) -> int: ...


def clean_run(server: Server, root: Path, book: Book, hash_seed: int) -> RunResult:
    """One uninterrupted run in a fresh project under `root`."""
    project = root / "book"
    env = novel_env(server.base_url, root / "prefect-home", hash_seed, book)
    log = root / "run.log"
    before, started = server.requests(), time.monotonic()
    code = GroupRun(book.cmd(project), REPO, env, log).start().wait(timeout=book.timeout_s)
    wall, requests = time.monotonic() - started, server.requests() - before
    if code != 0:
        return RunResult(project, {}, requests, wall, code)
    return RunResult(project, digest_of(project, env, log), requests, wall, code)


def killed_run(
    server: Server,
    root: Path,
    book: Book,
    hash_seed: int,
    seed: int,
    kills: int,
    low_s: float,
    high_s: float,
) -> tuple[RunResult, KillSeries]:
    """A fresh project under `root`, its run SIGKILLed `kills` times at `seed`'s moments (seconds after
    each start, bench.crash.harness), then resumed to its end."""
    project = root / "book"
    env = novel_env(server.base_url, root / "prefect-home", hash_seed, book)
    log = root / "run.log"
    before, started = server.requests(), time.monotonic()
    series = run_with_kills(
        book.cmd(project),
        cwd=REPO,
        env=env,
        log=log,
        seed=seed,
        kills=kills,
        low_s=low_s,
        high_s=high_s,
        timeout_s=book.timeout_s,
    )
    wall, requests = time.monotonic() - started, server.requests() - before
    digest = digest_of(project, env, log) if series.final_exit == 0 else {}
    return RunResult(project, digest, requests, wall, series.final_exit), series


def progress_targets(seed: int, kills: int, calls: int) -> list[tuple[int, float]]:
    """(LLM calls made, then seconds) after which each kill comes: distinct call counts in
    [1, calls), ascending, each with a jitter of up to 2 s, so the kill lands inside the work
    that follows a call (a task, a graph commit, a file write) and not at a call's edge. The
    same for the same seed."""
    rng = random.Random(seed)
    counts = sorted(rng.sample(range(1, max(calls, kills + 1)), kills)) if kills else []
    return [(count, round(rng.uniform(0.0, 2.0), 3)) for count in counts]


def killed_by_progress(
    server: Server, root: Path, book: Book, hash_seed: int, seed: int, kills: int, calls: int
) -> tuple[RunResult, KillSeries]:
    """A fresh project under `root`, its run SIGKILLed (the whole process group) once the series
    has made each of `progress_targets` LLM calls (counted by the scripted server) and the jitter
    has passed, restarted after each kill, then resumed to its end. On a loaded machine a start
    spends a long while starting up (the JVM, Prefect's server); moments counted in calls land in
    the work whatever that takes, where moments in seconds would mostly land in the start-up."""
    project = root / "book"
    env = novel_env(server.base_url, root / "prefect-home", hash_seed, book)
    log = root / "run.log"
    before, started = server.requests(), time.monotonic()
    series = KillSeries(seed=seed)
    for attempt, (count, jitter) in enumerate(progress_targets(seed, kills, calls), start=1):
        run = GroupRun(book.cmd(project), REPO, env, log).start()
        begun = time.monotonic()
        while run.running() and server.requests() - before < count:
            time.sleep(0.05)
        deadline = time.monotonic() + jitter
        while run.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        if run.running():
            run.kill_group()
            series.kills.append(KillRecord(attempt, round(time.monotonic() - begun, 1), True, None))
            continue
        series.kills.append(
            KillRecord(attempt, round(time.monotonic() - begun, 1), False, run.wait())
        )
        break
    else:
        series.final_exit = (
            GroupRun(book.cmd(project), REPO, env, log).start().wait(timeout=book.timeout_s)
        )
    if series.final_exit is None and series.kills and not series.kills[-1].killed:
        series.final_exit = series.kills[-1].exit_code
    wall, requests = time.monotonic() - started, server.requests() - before
    digest = digest_of(project, env, log) if series.final_exit == 0 else {}
    return RunResult(project, digest, requests, wall, series.final_exit), series


def print_hashes(label: str, digest: Mapping[str, str]) -> None:
    shown = {k: v for k, v in digest.items() if k == GRAPH_EXPORT or k.startswith("chapters/")}
    print(f"  {label}:")
    for name, sha in shown.items():
        print(f"    {sha}  {name}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash.novel",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument(
        "--chapters", type=int, default=4, help="chapters of the scripted novel (default 4)"
    )
    parser.add_argument("--scenes", type=int, default=2, help="scenes per chapter (default 2)")
    parser.add_argument("--acts", type=int, default=2, help="acts of the outline (default 2)")
    parser.add_argument(
        "--story-scenes",
        type=int,
        default=None,
        help="scenes the scripted story plans per chapter (default --scenes; fewer: the plan repeats "
        "its last scene, so scenes of the same text tie in retrieval)",
    )
    parser.add_argument(
        "--qa-every",
        type=int,
        default=2,
        help="healing and QA every N chapters (default 2, so a 4-chapter book heals and checks "
        "twice inside the run and between kills; the pipeline's own default is 5)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="killed-and-resumed runs, seeds 1..N (default 3; 0: none)",
    )
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs per seed (default 4)")
    parser.add_argument(
        "--kill-by",
        choices=("calls", "time"),
        default="calls",
        help="when the kills come: after a seeded number of LLM calls of the series plus up to 2 s "
        "(default: lands in the work however slow the start-up is), or at seeded seconds after "
        "each start (--low, --high)",
    )
    parser.add_argument(
        "--low",
        type=float,
        default=None,
        help="earliest kill moment after a start, seconds (default: 10%% of the clean run's wall time)",
    )
    parser.add_argument(
        "--high",
        type=float,
        default=None,
        help="latest kill moment after a start, seconds (default: 60%% of the clean run's wall time)",
    )
    parser.add_argument(
        "--no-hash-seeds",
        action="store_true",
        help="skip the second clean run under another PYTHONHASHSEED in another directory",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds one start may take (default 1800)"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the projects here (default: a temporary directory, removed when all is identical)",
    )
    return parser


def _kill_window(args: argparse.Namespace, base: RunResult) -> tuple[float, float]:
    """The seconds after a start the kills fall in (by time), and the kill moments printed."""
    low = args.low if args.low is not None else max(2.0, 0.1 * base.wall_s)
    high = args.high if args.high is not None else max(low + 1.0, 0.6 * base.wall_s)
    if args.seeds and args.kill_by == "time":
        print(
            f"kill moments: {args.kills} per seed, uniform in [{low:.1f}, {high:.1f}] s after each start"
        )
    elif args.seeds:
        print(
            f"kill moments: {args.kills} per seed, each once the series has made a seeded number of LLM calls "
            f"(of the uninterrupted run's {base.requests}) and up to 2 s more"
        )
    return low, high


def _seed(
    seed: int,
    args: argparse.Namespace,
    server: Server,
    work: Path,
    book: Book,
    base: RunResult,
    low: float,
    high: float,
) -> tuple[bool, int]:
    """One seed's series of kills and its resumed run (printed): whether it wrote the
    uninterrupted run's bytes, and how many kills landed."""
    # Each series under a hash seed of its own: a resumed run must not depend on it either.
    if args.kill_by == "time":
        result, series = killed_run(
            server, work / f"seed-{seed}", book, 100 + seed, seed, args.kills, low, high
        )
    else:
        result, series = killed_by_progress(
            server, work / f"seed-{seed}", book, 100 + seed, seed, args.kills, base.requests
        )
    log, requests = work / f"seed-{seed}" / "run.log", result.requests
    extra = 100.0 * (requests - base.requests) / max(base.requests, 1)
    if series.final_exit != 0:
        print(
            f"seed {seed}: kills landed {series.landed}/{args.kills}; the resumed run FAILED "
            f"(exit {series.final_exit}); see {log}"
        )
        return False, series.landed
    diff = differing(base.digest, result.digest)
    targets = dict(enumerate(progress_targets(seed, args.kills, base.requests), start=1))
    moments = ", ".join(
        (f"after {targets[k.attempt][0]} calls, " if args.kill_by == "calls" else "")
        + f"{k.delay_s:.1f}s into its start"
        + ("" if k.killed else " (finished first)")
        for k in series.kills
    )
    print(
        f"seed {seed}: kills landed {series.landed}/{args.kills} ({moments}); identical "
        f"{'yes' if not diff else 'NO'}"
        + (f" (differ: {', '.join(diff)})" if diff else "")
        + f"; LLM calls {requests}, {requests - base.requests:+d} beyond the uninterrupted run's "
        f"({extra:+.1f}%)"
    )
    return not diff, series.landed


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (
        args.chapters < 1
        or args.scenes < 1
        or args.seeds < 0
        or args.kills < 0
        or args.qa_every < 1
    ):
        parser.error("--chapters, --scenes and --qa-every must be >= 1; --seeds and --kills >= 0")

    from bench.long_book import ScriptedServer

    book = Book(args.chapters, args.scenes, args.qa_every, args.timeout, args.acts)
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="skald-crash-novel-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    server = ScriptedServer(args.chapters, args.story_scenes or args.scenes)
    ok = True
    try:
        print(
            f"== crash equivalence, novel: {args.chapters} chapters x {args.scenes} scenes, healing + QA every "
            f"{args.qa_every}; scripted server {server.base_url}; work dir {work} =="
        )
        base = clean_run(server, work / "clean-1", book, hash_seed=1)
        if base.exit_code != 0:
            ok = False
            print(
                f"the uninterrupted run failed (exit {base.exit_code}); see {work / 'clean-1' / 'run.log'}"
            )
            return 1
        print(
            f"uninterrupted run (PYTHONHASHSEED=1): {base.requests} LLM calls, {base.wall_s:.0f} s wall, "
            f"{len(base.digest)} files compared"
        )
        if not args.no_hash_seeds:
            # Another name and another depth: no absolute path may reach what is compared.
            other = clean_run(server, work / "elsewhere" / "clean-2", book, hash_seed=2)
            if other.exit_code != 0:
                ok = False
                print(
                    f"the run under PYTHONHASHSEED=2 failed (exit {other.exit_code}); "
                    f"see {work / 'elsewhere' / 'clean-2' / 'run.log'}"
                )
                return 1
            diff = differing(base.digest, other.digest)
            print(
                f"hash seeds 1 and 2, two directories: identical {'yes' if not diff else 'NO'}"
                + (f" (differ: {', '.join(diff)})" if diff else "")
                + f"; LLM calls {other.requests}"
            )
            print_hashes("PYTHONHASHSEED=1", base.digest)
            print_hashes("PYTHONHASHSEED=2", other.digest)
            ok &= not diff
        low, high = _kill_window(args, base)
        total_kills = 0
        for seed in range(1, args.seeds + 1):
            seed_ok, landed = _seed(seed, args, server, work, book, base, low, high)
            total_kills += landed
            ok &= seed_ok
        if args.seeds:
            print(f"kills landed in all: {total_kills}")
        print(
            "result: "
            + (
                "every run wrote the same bytes"
                if ok
                else "DIFFERENCES (projects kept in " + str(work) + ")"
            )
        )
        return 0 if ok else 1
    finally:
        server.close()
        if ok and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
