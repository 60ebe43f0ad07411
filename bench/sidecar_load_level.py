"""One level of bench/sidecar_load.py: N conversations at once against a served sidecar, each a
client thread sending consecutive turns of a shared dialogue (a memory query, then the turn's
commit), every committed turn read back afterwards; and the figures it reports (`LevelReport`,
`LoadReport`), which `--json` writes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from pydantic import BaseModel, Field

REPO_ROOT = Path(__file__).resolve().parent.parent
DIALOGUES = REPO_ROOT.parent / "shared" / "data" / "dialogues"
DIALOGUE_NAMES = ("locomo-26", "locomo-30", "locomo-41", "locomo-42")
API = "/api/kg-sidecar"
#: Earlier messages sent as the turn's `window`, as a front end shows the model its recent chat.
WINDOW = 4


class Figures(BaseModel):
    """p50 / p95 / max in milliseconds."""

    p50: float
    p95: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Figures:
        if not samples:
            return cls(p50=0.0, p95=0.0, max=0.0)
        values = np.asarray(samples, dtype=np.float64)
        return cls(
            p50=round(float(np.percentile(values, 50)), 1),
            p95=round(float(np.percentile(values, 95)), 1),
            max=round(float(values.max()), 1),
        )


def p95_ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """The central `level` interval of p95(numerator) / p95(denominator) over `resamples`
    bootstrap resamples (each sample list resampled on its own, with replacement; percentile
    interval). How far one run's ratio can move by which queries happened to be slow: a p95
    over 40 queries is about their second slowest. numpy's own, with a fixed seed so the same
    samples print the same interval (scipy.stats.bootstrap would be the one dependency more for
    these few lines)."""
    top, bottom = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    if not len(top) or not len(bottom):
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    over = np.percentile(rng.choice(top, size=(resamples, len(top))), 95, axis=1)
    under = np.percentile(rng.choice(bottom, size=(resamples, len(bottom))), 95, axis=1)
    ratios = over / np.maximum(under, 1e-9)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return (round(float(low), 2), round(float(high), 2))


class LevelReport(BaseModel):
    conversations: int = Field(description="N: conversations at once")
    turns_sent: int
    turns_committed: int
    turns_read_back: int
    seconds: float
    turns_per_s: float
    query_ms: Figures
    commit_ms: Figures
    query_samples_ms: list[float] = Field(
        default_factory=list, description="every query's round trip, in the order they ended"
    )
    commit_samples_ms: list[float] = Field(
        default_factory=list, description="every commit's round trip, in the order they ended"
    )
    query_service_ms: Figures = Field(
        description="the query's own elapsed_ms, as the server measured it"
    )
    commit_non_llm_ms: Figures = Field(
        description="the commit's trace.overhead_ms: its time with no LLM call in flight"
    )
    commit_states_ms: dict[str, float] = Field(
        default_factory=dict,
        description="mean time from entering each state to the next, over the committed turns",
    )
    errors: dict[str, int] = Field(
        default_factory=dict, description="'<operation> <status>' -> count"
    )
    finished: bool
    write_lock_held_ms_per_turn: float = Field(
        0.0,
        description="the serialised graph writes (health's graph_write_lock) held, per committed turn",
    )
    write_lock_waited_ms_per_turn: float = Field(
        0.0, description="and waited for, per committed turn"
    )
    server_cpu_s_per_turn: float = Field(
        0.0,
        description="the server process's CPU seconds (user + system, all its threads: Python, ONNX, the "
        "graph's JVM) over the level, per committed turn: a figure other jobs on the machine barely move",
    )
    machine_busy_share: float = Field(
        0.0,
        description="the share of all the machine's CPU time over the level that was not idle "
        "(/proc/stat: every process, this bench's clients and scripted LLM included)",
    )
    yielded_ms_per_turn: float = Field(
        0.0,
        description="how long the turns' background steps waited for memory queries in flight "
        "(health's yielded_to_queries), per committed turn",
    )
    yields_timed_out: int = Field(
        0, description="background steps that gave up waiting after --yield-to-queries-ms"
    )
    write_lock_busy_share: float = Field(
        0.0,
        description="the share of the level's wall time the serialised graph writes were held: "
        "near 1 they, not the CPU, are where the commits queue",
    )


class LoadReport(BaseModel):
    latency_s: float
    turns_per_conversation: int
    conversations: int = Field(
        description="conversations every level sends (the largest level's N), N at a time"
    )
    load_before: list[float]
    load_after: list[float]
    levels: list[LevelReport]
    ratios: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="'16:1' -> query_p95, commit_p95, and each one's bootstrap interval "
        "(query_p95_low / _high, commit_p95_low / _high: p95_ratio_interval)",
    )


def dialogue_turns() -> list[list[dict[str, Any]]]:
    """Each shared dialogue's turns, in order."""
    out = []
    for name in DIALOGUE_NAMES:
        raw = (DIALOGUES / f"{name}.turns.jsonl").read_text(encoding="utf-8").splitlines()
        out.append([json.loads(line) for line in raw if line.strip()])
    return out


def message(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "user",
        "name": row["speaker"],
        "content": row["text"],
        "time": row["session_time"],
    }


class Level:
    """N conversations at once; each client thread runs one conversation's turns in order.

    With `scripts` > N the level runs conversations 0 .. scripts-1 in waves of N (the next
    wave starts when the last one has ended), so every level of a run can send the same
    conversations' turns: one conversation's p95 is then measured on the same queries as
    sixteen's, not on whichever conversation came first (conversation 0's messages are among
    the longest, and a query's time grows with its message)."""

    def __init__(
        self,
        base: str,
        n: int,
        turns: int,
        dialogues: list[list[dict[str, Any]]],
        deadline: float,
        *,
        scripts: int = 0,
    ) -> None:
        self.base, self.n, self.turns, self.deadline = base, n, turns, deadline
        self.scripts = max(n, scripts)
        self.dialogues = dialogues
        self.lock = threading.Lock()
        self.query_ms: list[float] = []
        self.commit_ms: list[float] = []
        self.query_service_ms: list[float] = []
        self.commit_non_llm_ms: list[float] = []
        self.states_ms: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.committed: dict[str, dict[str, str]] = {}  # conversation -> turn id -> text sent
        self.start = threading.Barrier(n)  # each wave's conversations start together

    def conversation_id(self, i: int) -> str:
        return f"load-{self.n}-{i}"

    def script(self, i: int) -> list[dict[str, Any]]:
        """Conversation i: `turns` consecutive turns of one dialogue, starting where the others
        of its level on the same dialogue do not."""
        dialogue = self.dialogues[i % len(self.dialogues)]
        start = (i // len(self.dialogues)) * self.turns % max(1, len(dialogue) - self.turns)
        return dialogue[start : start + self.turns]

    def _post(
        self, client: httpx.Client, operation: str, path: str, body: dict[str, Any]
    ) -> tuple[float, dict[str, Any] | None]:
        started = time.perf_counter()
        try:
            response = client.post(f"{self.base}{API}{path}", json=body)
        except httpx.HTTPError as exc:
            with self.lock:
                self.errors[f"{operation} {type(exc).__name__}"] += 1
            return 0.0, None
        elapsed = (time.perf_counter() - started) * 1000.0
        if response.status_code != 200:
            with self.lock:
                self.errors[f"{operation} {response.status_code}"] += 1
            return elapsed, None
        return elapsed, response.json()

    def run_conversation(self, i: int) -> None:
        conversation = self.conversation_id(i)
        rows = self.script(i)
        config = {"require_actions": False}
        with httpx.Client(timeout=120) as client:
            self.start.wait()
            for number, row in enumerate(rows, start=1):
                if time.monotonic() > self.deadline:
                    return
                window = [message(r) for r in rows[max(0, number - 1 - WINDOW) : number - 1]]
                messages = [message(row)]
                query = {
                    "conversation_id": conversation,
                    "messages": messages,
                    "window": window,
                    "config": config,
                }
                query_ms, answer = self._post(client, "query", "/memory/query", query)
                if answer is not None:
                    with self.lock:
                        self.query_ms.append(query_ms)
                        self.query_service_ms.append(float(answer.get("elapsed_ms") or 0.0))
                commit_ms, result = self._post(
                    client, "commit", "/turn/commit", {**query, "turn_id": number}
                )
                if result is None:
                    continue
                if not result.get("committed"):
                    with self.lock:
                        self.errors[f"commit 200-not-committed ({result.get('error_kind')})"] += 1
                    continue
                with self.lock:
                    self.commit_ms.append(commit_ms)
                    self.record_trace(result.get("trace") or {})
                    self.committed.setdefault(conversation, {})[str(number)] = (
                        f"{row['speaker']}: {row['text']}"
                    )

    def record_trace(self, trace: dict[str, Any]) -> None:
        """The turn's non-LLM time and the time spent in each state (under self.lock)."""
        self.commit_non_llm_ms.append(float(trace.get("overhead_ms", 0.0)))
        states = trace.get("states", [])
        for state, following in zip(states, states[1:], strict=False):
            self.states_ms.setdefault(state["state"], []).append(
                following["elapsed_ms"] - state["elapsed_ms"]
            )

    def read_back(self, client: httpx.Client) -> int:
        """Turns whose remembered text is the one sent, read through the paged API."""
        matched = 0
        for conversation, sent in self.committed.items():
            offset, held = 0, {}
            while True:
                response = client.get(
                    f"{self.base}{API}/conversations/{conversation}/turns",
                    params={"offset": offset, "limit": 200},
                )
                if response.status_code != 200:
                    self.errors[f"read-back {response.status_code}"] += 1
                    break
                page = response.json()
                held.update({item["turn_id"]: item for item in page["items"]})
                offset += len(page["items"])
                if not page["items"] or offset >= page["page"]["total"]:
                    break
            matched += sum(
                1
                for turn_id, text in sent.items()
                if turn_id in held and held[turn_id]["committed"] and held[turn_id]["text"] == text
            )
        return matched

    def run(self, client: httpx.Client) -> LevelReport:
        started = time.monotonic()
        for first in range(0, self.scripts, self.n):
            wave = range(first, min(first + self.n, self.scripts))
            self.start = threading.Barrier(len(wave))
            threads = [
                threading.Thread(target=self.run_conversation, args=(i,), name=f"conversation-{i}")
                for i in wave
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        seconds = time.monotonic() - started
        committed = sum(len(turns) for turns in self.committed.values())
        read_back = self.read_back(client)
        return LevelReport(
            conversations=self.n,
            turns_sent=self.scripts * self.turns,
            turns_committed=committed,
            turns_read_back=read_back,
            seconds=round(seconds, 1),
            turns_per_s=round(committed / seconds, 2),
            query_ms=Figures.of(self.query_ms),
            commit_ms=Figures.of(self.commit_ms),
            query_samples_ms=[round(ms, 2) for ms in self.query_ms],
            commit_samples_ms=[round(ms, 2) for ms in self.commit_ms],
            query_service_ms=Figures.of(self.query_service_ms),
            commit_non_llm_ms=Figures.of(self.commit_non_llm_ms),
            commit_states_ms={
                state: round(float(np.mean(values)), 1) for state, values in self.states_ms.items()
            },
            errors=dict(sorted(self.errors.items())),
            finished=time.monotonic() <= self.deadline,
        )
