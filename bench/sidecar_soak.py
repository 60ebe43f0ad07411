"""`python -m bench.sidecar_soak`: does a long-running sidecar stay flat? (issue 15)

Starts a real `python -m flows.dialogue serve` on loopback (its own embedded graph in a temp
project, the scripted OpenAI-compatible server with no added latency, call records capped
with `--max-call-records`), then sends N turns (default 2,000) over C conversations (default
20) through HTTP from a few client threads, each conversation's turns in order. It compares
the first window of turns (default 200) with the last:

- resident memory of the server process (VmRSS from /proc) after turn `window` and after the
  last turn (goal: ratio <= 1.2);
- p95 of the turns' non-LLM time (`trace.overhead_ms` of each response: the turn's wall time
  minus the time an LLM call was in flight) over the first and last window (goal: <= 1.2).

Bounded in count and time (`--max-seconds`); loopback only. Linux (reads /proc). It is a
benchmark, not part of the suite: minutes of load on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DIALOGUES = REPO_ROOT.parent / "shared" / "data" / "dialogues"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


def lines() -> list[tuple[str, str]]:
    rows = []
    for name in ("locomo-26", "locomo-30"):
        for raw in (DIALOGUES / f"{name}.turns.jsonl").read_text(encoding="utf-8").splitlines():
            if raw.strip():
                row = json.loads(raw)
                rows.append((row["speaker"], row["text"]))
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sidecar_soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--turns", type=int, default=2000, help="turns in all (default 2000)")
    parser.add_argument("--conversations", type=int, default=20, help="conversations (default 20)")
    parser.add_argument(
        "--window", type=int, default=200, help="turns compared at start and end (default 200)"
    )
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--max-call-records",
        type=int,
        default=2000,
        help="the server's in-memory cap (default 2000)",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=1800, help="give up after this long (default 1800)"
    )
    return parser


class Soak:
    """The turns sent from `--clients` threads, each conversation's turns in order, and what
    each answer measured (the turn's non-LLM time, the server's RSS at the window's end)."""

    def __init__(
        self,
        args: argparse.Namespace,
        corpus: list[tuple[str, str]],
        base: str,
        server_pid: int,
        started_at: float,
    ) -> None:
        self.args, self.corpus, self.base = args, corpus, base
        self.server_pid, self.started_at = server_pid, started_at
        self.per_conversation = args.turns // args.conversations
        self.done = 0
        self.overheads: list[tuple[int, float]] = []
        self.rss_at_window: list[float] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def run_conversations(self, ids: list[int]) -> None:
        args = self.args
        with httpx.Client(timeout=120) as session:
            for turn in range(1, self.per_conversation + 1):
                for conv in ids:
                    if time.monotonic() - self.started_at > args.max_seconds:
                        return
                    speaker, text = self.corpus[(conv * 97 + turn) % len(self.corpus)]
                    body = {
                        "conversation_id": f"soak-{conv}",
                        "turn_id": turn,
                        "messages": [{"role": "user", "name": speaker, "content": text}],
                        "config": {"require_actions": False},
                    }
                    response = session.post(f"{self.base}/api/kg-sidecar/turn/commit", json=body)
                    self.record(response.status_code, response.json())

    def record(self, status: int, data: dict[str, Any]) -> None:
        with self.lock:
            self.done += 1
            n = self.done
            if status != 200 or not data.get("trace"):
                self.failures.append(f"{status} {data.get('reason')}")
            else:
                self.overheads.append((n, float(data["trace"]["overhead_ms"])))
            if n == self.args.window:
                self.rss_at_window.append(rss_mb(self.server_pid))
            if n % 200 == 0:
                print(
                    f"  {n} turns, {time.monotonic() - self.started_at:.0f} s, "
                    f"server RSS {rss_mb(self.server_pid):.0f} MB",
                    flush=True,
                )

    def run(self) -> float:
        """Every client thread to its end; the server's RSS then."""
        args = self.args
        groups = [list(range(i, args.conversations, args.clients)) for i in range(args.clients)]
        threads = [threading.Thread(target=self.run_conversations, args=(g,)) for g in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return rss_mb(self.server_pid)


def _soak(args: argparse.Namespace, started_at: float) -> tuple[Soak, float]:
    """The served sidecar against its scripted LLM, soaked: the soak and the RSS at its end."""
    from bench.served import start_sidecar, wait_healthy
    from core.graph_server import free_port
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    corpus = lines()
    speakers = sorted({s for s, _ in corpus})
    project = Path(tempfile.mkdtemp(prefix="skald-soak-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with ScriptedLLM() as llm:
        DialogueScript(speakers).install(llm)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": llm.base_url,
            "SKALD_EMBEDDING_BASE_URL": llm.base_url,
        }
        for name in ("OPENAI_API_KEY", "NEO4J_URI", "SKALD_SIDECAR_TOKEN"):
            env.pop(name, None)
        server = start_sidecar(
            port,
            project,
            env,
            project / "serve.log",
            "--max-call-records",
            str(args.max_call_records),
        )
        try:
            with httpx.Client(timeout=120) as client:
                wait_healthy(
                    client, base, lambda: server.poll() is None, project / "serve.log", "soak"
                )
                soak = Soak(args, corpus, base, server.pid, started_at)
                rss_end = soak.run()
        finally:
            server.terminate()
            server.wait(timeout=60)
            shutil.rmtree(project, ignore_errors=True)
    return soak, rss_end


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.turns < 2 * args.window:
        parser.error("--turns must be at least twice --window")
    sys.path.insert(0, str(REPO_ROOT))
    started_at = time.monotonic()
    soak, rss_end = _soak(args, started_at)
    done, overheads, rss_at_window, failures = (
        soak.done,
        soak.overheads,
        soak.rss_at_window,
        soak.failures,
    )
    if done < args.turns - args.turns % args.conversations:
        print(
            f"soak: stopped after {done} turns (--max-seconds {args.max_seconds:g})",
            file=sys.stderr,
        )
        return 1
    overheads.sort()
    first = np.array([o for n, o in overheads if n <= args.window])
    last = np.array([o for n, o in overheads if n > done - args.window])
    p95_first, p95_last = float(np.percentile(first, 95)), float(np.percentile(last, 95))
    print(
        f"sidecar soak: {done} turns over {args.conversations} conversations through HTTP in "
        f"{time.monotonic() - started_at:.0f} s, {len(failures)} failed requests"
    )
    print(
        f"  server RSS after turn {args.window}: {rss_at_window[0]:.0f} MB; after turn {done}: {rss_end:.0f} MB; "
        f"ratio {rss_end / rss_at_window[0]:.2f} (goal <= 1.2)"
    )
    print(
        f"  p95 non-LLM time per turn: first {args.window} {p95_first:.0f} ms, last {args.window} "
        f"{p95_last:.0f} ms; ratio {p95_last / p95_first:.2f} (goal <= 1.2)"
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
