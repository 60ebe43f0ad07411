"""`python -m bench.crash.sidecar`: does a served sidecar survive SIGKILLs exactly? (issue 33)

Starts the scripted LLM server (tests/support/scripted_llm.py with the dialogue script of
tests/support/dialogue_script.py) as a process of its own, which counts every request, and a
real `python -m flows.dialogue serve` as the leader of its own process group. A client sends
the turns of a shared dialogue (locomo-26 by default) in order, each as the front end would,
and retries a turn that was not acknowledged (connection lost, 409 while the conversation is
locked, 503) with the same ids until it is. Meanwhile the harness SIGKILLs the server's whole
process group (its embedded graph included) at seeded random moments after each start
(bench.crash.harness: GroupRun, kill_moments) and starts it again.

At the end it compares, byte for byte, with an uninterrupted run of the same turns: the graph
export (`python -m kg export`), the read-back pages (GET .../conversations/{id}/entities,
relations, milestones, turns) and the injection packets stored with the committed turns. It
does so for the gated path (`require_actions: true`, the default) and for
`require_actions: false`. Besides, per mode:

- two clean runs under PYTHONHASHSEED=1 and =2 in different directories must be identical
  (the first is the reference the kill runs are compared with);
- a graceful restart (SIGTERM) halfway through must change nothing.

Per seed it prints the kills that landed, whether everything is identical, the LLM requests
beyond the uninterrupted run's (extra %), and the longest time the conversation refused a
turn after a kill (409s from a restarted server; goal < 10 s; the server runs with
`--lock-wait 0`, so a locked conversation answers at once and the client's retries measure
the refusal). The default is 160 turns: with 40, a run often ended before its later kill
moments came (2026-11-28, a 2-core machine: 2 kills of 12 landed per mode with 40 turns; 8 of
12 with 160, 7 of them while a turn held the lease, in about 4 minutes a mode). Exits 1 on any
difference. Loopback only; minutes of load: a benchmark, not part of the suite.
"""

from __future__ import annotations

import argparse
import hashlib
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.crash.harness import GroupRun, kill_moments
from bench.served import serve_command, stop_process, wait_healthy

REPO_ROOT = Path(__file__).resolve().parents[2]
DIALOGUES = REPO_ROOT.parent / "shared" / "data" / "dialogues"
CONVERSATION = "crash/sidecar"
#: require_actions per mode.
MODES = {"gated": True, "open": False}
READBACK_PAGES = ("entities", "relations", "milestones", "turns")
PAGE_LIMIT = 500
#: A restarted sidecar's log line when it takes over the lease a killed one left behind.
TAKEOVER = re.compile(r"took over the expired lock of [^%\s]")
#: Seconds a client waits between attempts of an unacknowledged turn.
RETRY_PAUSE_S = 0.1


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the LLM server
def serve_llm(port_file: Path, speakers: list[str], latency_s: float = 0.0) -> int:
    """The scripted LLM server, in this process until killed; its URL goes to `port_file`;
    each request answered after `latency_s`."""
    sys.path.insert(0, str(REPO_ROOT))
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    with ScriptedLLM(latency_s=latency_s) as llm:
        DialogueScript(speakers).install(llm)
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(llm.base_url, encoding="utf-8")
        tmp.replace(port_file)
        threading.Event().wait()
    return 0


class LLMProcess:
    """The scripted LLM server as a child process (not in the sidecar's process group).
    `latency_s`: each request answered after that long (a floor under a run's duration, so a
    kill moment earlier than turns x latency lands whatever the machine's speed)."""

    def __init__(
        self, work: Path, speakers: list[str], env: dict[str, str], latency_s: float = 0.0
    ) -> None:
        self.port_file = work / "llm.url"
        self.log = (work / "llm.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.crash.sidecar",
                "--serve-llm",
                str(self.port_file),
                "--llm-latency",
                str(latency_s),
                *speakers,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"crash.sidecar: the scripted LLM server did not start (see {work / 'llm.log'})"
                )
            time.sleep(0.05)
        self.base_url = self.port_file.read_text(encoding="utf-8").strip()

    def requests(self) -> int:
        stats_url = self.base_url.rstrip("/").removesuffix("/v1") + "/scripted/stats"
        return int(httpx.get(stats_url, timeout=30).json()["requests"])

    def close(self) -> None:
        stop_process(self.proc, grace_s=30)
        self.log.close()


# ----------------------------------------------------------------------------- the sidecar
class Sidecar:
    """`python -m flows.dialogue serve` on one project, started and killed as a process group."""

    def __init__(self, project: Path, port: int, env: dict[str, str], log: Path) -> None:
        self.project, self.port, self.env, self.log = project, port, env, log
        self.base = f"http://127.0.0.1:{port}"
        self.run: GroupRun | None = None
        self.starts = 0

    def start(self) -> None:
        cmd = serve_command(self.port, self.project, "--lock-wait", "0")
        self.run = GroupRun(cmd, REPO_ROOT, self.env, self.log).start()
        self.starts += 1
        with httpx.Client(timeout=10) as client:
            wait_healthy(client, self.base, self.run.running, self.log, "crash.sidecar", poll_s=0.1)

    def kill(self) -> bool:
        """SIGKILL the whole group; whether it was running."""
        assert self.run is not None
        running = self.run.running()
        self.run.kill_group()
        return running

    def stop(self) -> None:
        """A graceful stop (SIGTERM to the group, as a service manager sends)."""
        if self.run is None or self.run.proc is None:
            return
        try:
            os.killpg(self.run.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.run.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.run.kill_group()


# ----------------------------------------------------------------------------- one run
@dataclass
class RunResult:
    name: str
    export_sha: str = ""
    readback_sha: str = ""
    packets_sha: str = ""
    llm_requests: int = 0
    kills: int = 0
    longest_refusal_s: float = 0.0
    longest_gap_s: float = 0.0  # kill -> the next acknowledged turn (the restart included)
    takeovers: int = 0  # kills that left a turn's lease behind, taken over once it expired
    files: dict[str, Path] = field(default_factory=dict)


def turn_bodies(dialogue: Path, turns: int, require_actions: bool) -> list[dict[str, Any]]:
    from tasks.dialogue.replay import load_dialogue, turn_requests

    spec = load_dialogue(dialogue)
    spec = spec.model_copy(update={"turns": spec.turns[:turns]})
    bodies = []
    for request in turn_requests(spec, CONVERSATION):
        body = request.model_dump(mode="json", exclude_none=True)
        body["config"] = {"require_actions": require_actions}
        bodies.append(body)
    return bodies


def send_turns(
    sidecar: Sidecar,
    bodies: list[dict[str, Any]],
    *,
    moments: list[float] | None = None,
    restart_after: int | None = None,
) -> tuple[int, float, float]:
    """Send every turn until acknowledged; SIGKILL and restart the sidecar at `moments`
    (seconds after each start), or stop and restart it gracefully after turn `restart_after`.
    Returns (kills landed, longest refusal after a kill, longest kill -> acknowledgement)."""
    pending = list(moments or [])
    landed = 0
    killed_at: float | None = None
    longest_refusal = longest_gap = 0.0
    ready_at = time.monotonic()
    done = threading.Event()
    lock = threading.Lock()

    def killer() -> None:
        nonlocal landed, killed_at, ready_at
        while pending and not done.is_set():
            delay = pending.pop(0)
            if done.wait(max(0.0, ready_at + delay - time.monotonic())):
                return
            with lock:
                if sidecar.kill():
                    landed += 1
                    killed_at = time.monotonic()
            sidecar.start()
            ready_at = time.monotonic()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    url = f"{sidecar.base}/api/kg-sidecar/turn/commit"
    with httpx.Client(timeout=600) as client:
        for number, body in enumerate(bodies, start=1):
            refused_since: float | None = None
            while True:
                try:
                    response = client.post(url, json=body)
                except httpx.HTTPError:
                    time.sleep(RETRY_PAUSE_S)
                    continue
                data = response.json() if response.content else {}
                if response.status_code == 200:
                    break
                if response.status_code == 409 and data.get("code") == "IN_PROGRESS":
                    refused_since = refused_since or time.monotonic()
                elif response.status_code != 503:
                    raise SystemExit(
                        f"crash.sidecar: turn {body['turn_id']}: HTTP {response.status_code} "
                        f"{data.get('code')}: {data.get('reason')}"
                    )
                time.sleep(RETRY_PAUSE_S)
            now = time.monotonic()
            with lock:
                if refused_since is not None and killed_at is not None:
                    # From the latest kill: a refusal that began before it (the kill before,
                    # when the kills come seconds apart) is that kill's until this one lands.
                    longest_refusal = max(longest_refusal, now - max(refused_since, killed_at))
                if killed_at is not None:
                    longest_gap = max(longest_gap, now - killed_at)
                    killed_at = None
            if restart_after is not None and number == restart_after:
                sidecar.stop()
                sidecar.start()
    done.set()
    thread.join()
    return landed, longest_refusal, longest_gap


def collect(sidecar: Sidecar, out: Path, result: RunResult) -> None:
    """Export the graph, read every page back and pull the stored packets out of the export."""
    out.mkdir(parents=True, exist_ok=True)
    export = out / "graph.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kg",
            "export",
            "--out",
            str(export),
            "--project-dir",
            str(sidecar.project),
        ],
        cwd=REPO_ROOT,
        env=sidecar.env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pages: dict[str, list[Any]] = {}
    with httpx.Client(timeout=120) as client:
        for name in READBACK_PAGES:
            items: list[Any] = []
            while True:
                response = client.get(
                    f"{sidecar.base}/api/kg-sidecar/conversations/{CONVERSATION}/{name}",
                    params={"offset": len(items), "limit": PAGE_LIMIT},
                )
                response.raise_for_status()
                page = response.json()
                items += page["items"]
                if not page["items"] or len(items) >= page["page"]["total"]:
                    break
            pages[name] = items
    readback = out / "readback.json"
    readback.write_text(
        json.dumps(pages, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    graph = json.loads(export.read_text(encoding="utf-8"))
    packets = {}
    for node in graph["nodes"]:
        props = node["properties"]
        if "KGTurn" in node["labels"] and "result_json" in props:
            stored = json.loads(props["result_json"])
            packets[props["key"]] = stored.get("injection_packet")
    packets_file = out / "packets.json"
    packets_file.write_text(
        json.dumps(packets, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    result.files = {"export": export, "readback": readback, "packets": packets_file}
    result.export_sha = sha(export.read_bytes())
    result.readback_sha = sha(readback.read_bytes())
    result.packets_sha = sha(packets_file.read_bytes())


def one_run(
    name: str,
    work: Path,
    llm: LLMProcess,
    bodies: list[dict[str, Any]],
    *,
    hash_seed: str,
    moments: list[float] | None = None,
    restart_after: int | None = None,
) -> RunResult:
    from core.graph_server import free_port

    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    project = run_dir / "project"
    project.mkdir(parents=True)
    # This checkout first; a PYTHONPATH already set stays (the test session's Cypher recorder).
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": llm.base_url,
        "SKALD_EMBEDDING_BASE_URL": llm.base_url,
        "PYTHONPATH": pythonpath,
        "PYTHONHASHSEED": hash_seed,
    }
    for unset in ("OPENAI_API_KEY", "NEO4J_URI", "SKALD_SIDECAR_TOKEN"):
        env.pop(unset, None)
    sidecar = Sidecar(project, free_port(), env, run_dir / "serve.log")
    result = RunResult(name)
    before = llm.requests()
    sidecar.start()
    try:
        result.kills, result.longest_refusal_s, result.longest_gap_s = send_turns(
            sidecar, bodies, moments=moments, restart_after=restart_after
        )
        result.llm_requests = llm.requests() - before
        collect(sidecar, run_dir / "out", result)
    finally:
        sidecar.stop()
    # The log line, not the source line a warning may be shown with ("... lock of %s").
    result.takeovers = len(
        TAKEOVER.findall(sidecar.log.read_text(encoding="utf-8", errors="replace"))
    )
    return result


def same(a: RunResult, b: RunResult) -> list[str]:
    """What differs between two runs: export, readback, packets."""
    return [
        what
        for what, x, y in (
            ("export", a.export_sha, b.export_sha),
            ("readback", a.readback_sha, b.readback_sha),
            ("packets", a.packets_sha, b.packets_sha),
        )
        if x != y
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash.sidecar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dialogue",
        type=Path,
        default=DIALOGUES / "locomo-26.turns.jsonl",
        help="transcript in the shared JSONL turn format (default locomo-26)",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=160,
        help="turns sent, from the first (default 160: with 40, most kill moments came after "
        "the last turn)",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3], help="kill seeds (default 1 2 3)"
    )
    parser.add_argument("--kills", type=int, default=4, help="kill moments per seed (default 4)")
    parser.add_argument(
        "--low", type=float, default=0.5, help="earliest kill, seconds after a start (default 0.5)"
    )
    parser.add_argument(
        "--high", type=float, default=8.0, help="latest kill, seconds after a start (default 8)"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=sorted(MODES),
        default=sorted(MODES),
        help="gated: require_actions true; open: require_actions false (default both)",
    )
    parser.add_argument(
        "--max-extra", type=float, default=10.0, help="extra LLM requests allowed, %% (default 10)"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the runs here (default: a temp dir, removed)",
    )
    parser.add_argument("--serve-llm", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--llm-latency", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("speakers", nargs="*", help=argparse.SUPPRESS)
    return parser


def _mode(
    mode: str, args: argparse.Namespace, work: Path, llm: LLMProcess, failures: list[str]
) -> None:
    """One mode's runs, printed: two clean ingests under different hash seeds, a graceful
    restart, then each seed's kills; what differed from the clean ingest goes to `failures`
    as it is found (a run that raises leaves the ones before it recorded)."""
    bodies = turn_bodies(args.dialogue, args.turns, MODES[mode])
    reference = one_run(f"{mode}-clean-hashseed-1", work, llm, bodies, hash_seed="1")
    twin = one_run(f"{mode}-clean-hashseed-2", work, llm, bodies, hash_seed="2")
    differ = same(reference, twin)
    print(
        f"[{mode}] require_actions={MODES[mode]}: clean ingests under PYTHONHASHSEED=1 and =2 "
        f"(different directories): {'identical' if not differ else 'DIFFERENT: ' + ', '.join(differ)}"
    )
    for run in (reference, twin):
        print(
            f"  {run.name}: export sha256 {run.export_sha}\n"
            f"  {' ' * len(run.name)}  read-back sha256 {run.readback_sha}\n"
            f"  {' ' * len(run.name)}  packets sha256 {run.packets_sha}; {run.llm_requests} LLM requests"
        )
    if differ:
        failures.append(f"{mode}: hash seeds 1 and 2 differ in {', '.join(differ)}")
    restarted = one_run(
        f"{mode}-graceful-restart",
        work,
        llm,
        bodies,
        hash_seed="random",
        restart_after=args.turns // 2,
    )
    differ = same(reference, restarted)
    print(
        f"  graceful restart after turn {args.turns // 2}: "
        f"{'identical' if not differ else 'DIFFERENT: ' + ', '.join(differ)}"
    )
    if differ:
        failures.append(f"{mode}: a graceful restart changed {', '.join(differ)}")
    total_kills = 0
    for seed in args.seeds:
        moments = kill_moments(seed, args.kills, args.low, args.high)
        run = one_run(
            f"{mode}-kills-seed-{seed}",
            work,
            llm,
            bodies,
            hash_seed="random",
            moments=moments,
        )
        total_kills += run.kills
        differ = same(reference, run)
        extra = 100.0 * (run.llm_requests - reference.llm_requests) / max(reference.llm_requests, 1)
        print(
            f"  seed {seed}: kills landed {run.kills}/{len(moments)} ({run.takeovers} while a turn held the "
            f"lease); identical "
            f"{'yes' if not differ else 'NO (' + ', '.join(differ) + ')'}; LLM requests "
            f"{run.llm_requests} vs {reference.llm_requests} (+{extra:.1f}%); longest refusal after a "
            f"kill {run.longest_refusal_s:.1f} s (goal < 10 s); longest kill -> next acknowledged turn "
            f"{run.longest_gap_s:.1f} s (restart included)",
            flush=True,
        )
        if differ:
            failures.append(
                f"{mode} seed {seed}: {', '.join(differ)} differ (see {work / run.name})"
            )
        if extra > args.max_extra:
            failures.append(
                f"{mode} seed {seed}: {extra:.1f}% extra LLM requests (> {args.max_extra:g}%)"
            )
    print(f"  [{mode}] {total_kills} kills over {len(args.seeds)} seeds", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.serve_llm is not None:
        return serve_llm(args.serve_llm, args.speakers, args.llm_latency)
    if args.turns < 2 or args.kills < 0 or args.low <= 0 or args.high < args.low:
        parser.error("--turns must be at least 2, --kills at least 0, and 0 < --low <= --high")
    if not args.dialogue.is_file():
        parser.error(f"no dialogue file {args.dialogue}")

    sys.path.insert(0, str(REPO_ROOT))
    from tasks.dialogue.replay import load_dialogue

    speakers = sorted({t.speaker for t in load_dialogue(args.dialogue).turns})
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="skald-crash-sidecar-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    llm = LLMProcess(work, speakers, env)
    failures: list[str] = []
    try:
        print(
            f"crash.sidecar: {args.turns} turns of {args.dialogue.name}, seeds {args.seeds}, "
            f"{args.kills} kill moments each in [{args.low:g}, {args.high:g}] s after a start",
            flush=True,
        )
        for mode in args.modes:
            _mode(mode, args, work, llm, failures)
    finally:
        llm.close()
        if args.work_dir is None and not failures:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        for failure in failures:
            print(f"crash.sidecar: FAILED: {failure}", file=sys.stderr)
        if args.work_dir is None:
            print(f"crash.sidecar: runs kept in {work}", file=sys.stderr)
        return 1
    print("crash.sidecar: every run identical to the uninterrupted one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
