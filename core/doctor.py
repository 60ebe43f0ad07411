"""`python -m core.doctor`: check every configured component for real.

graph: a write inside a transaction that is then rolled back (and checked to be gone);
LLM: one structured call validated against a pydantic model; embeddings: one vector of
the expected dimension; Prefect: a no-op flow run. Prints a table and exits non-zero
when any component is down, with the reason in one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from core.cli import configure_prefect, one_line, run_main, setup_logging
from core.settings import Settings, load_settings


class CheckResult(BaseModel):
    component: str
    endpoint: str
    ok: bool
    latency_ms: float
    detail: str = ""


class DoctorPing(BaseModel):
    """The LLM check's output contract: small enough for the tiniest model."""

    status: str = Field(description="the word ok")
    number: int = Field(description="any whole number")


def _timed(component: str, endpoint: Callable[[], str], check: Callable[[], str]) -> CheckResult:
    started = time.perf_counter()
    where = "?"
    try:
        where = endpoint()
        detail = check()
        return CheckResult(component=component, endpoint=where, ok=True,
                           latency_ms=(time.perf_counter() - started) * 1000, detail=detail)
    except Exception as exc:  # every failure becomes one line in the table
        return CheckResult(component=component, endpoint=where, ok=False,
                           latency_ms=(time.perf_counter() - started) * 1000, detail=one_line(exc))


def check_graph(settings: Settings) -> CheckResult:
    from core.graph_server import graph_endpoint
    from kg.probe import probe_rollback
    from kg.store import GraphStore

    def endpoint() -> str:
        return graph_endpoint(settings).label

    def check() -> str:
        store = GraphStore.open(settings, migrate=False)
        try:
            return probe_rollback(store)
        finally:
            store.close()

    return _timed("graph", endpoint, check)


def check_llm(settings: Settings) -> tuple[CheckResult, CheckResult]:
    from core.llm import LLMGateway

    gateway = LLMGateway(settings, run_id="doctor")

    def llm_check() -> str:
        ping = gateway.structured(
            "small",
            [{"role": "user", "content": 'Reply with JSON: {"status": "ok", "number": 7}'}],
            DoctorPing,
            purpose="doctor",
            max_tokens=64,
        )
        record = gateway.records[-1]
        return f"model {record.model}: {ping.model_dump_json()} in {record.attempts} attempt(s)"

    def embed_check() -> str:
        vectors = gateway.embed(["The lighthouse keeper counts ships.", "A second sentence."])
        if vectors.ndim != 2 or vectors.shape[0] != 2 or vectors.shape[1] < 8:
            raise RuntimeError(f"unexpected embedding shape {vectors.shape}")
        again = gateway.embed(["x"])
        if again.shape[1] != vectors.shape[1]:
            raise RuntimeError(f"dimension changed between calls: {vectors.shape[1]} vs {again.shape[1]}")
        return f"dimension {vectors.shape[1]}"

    llm = _timed("llm", lambda: gateway.endpoint_label("small"), llm_check)
    emb = _timed("embeddings", gateway.embedding_endpoint_label, embed_check)
    return llm, emb


def check_prefect() -> CheckResult:
    def endpoint() -> str:
        from prefect.settings import PREFECT_API_URL

        return PREFECT_API_URL.value() or "ephemeral (local, no server)"

    def check() -> str:
        from prefect import flow

        @flow(name="skald-doctor", log_prints=False, persist_result=False)
        def noop() -> str:
            return "ok"

        state = noop(return_state=True)
        if not state.is_completed():
            raise RuntimeError(f"no-op flow ended {state.type.value}")
        return "no-op flow run completed"

    return _timed("prefect", endpoint, check)


def render(results: Sequence[CheckResult]) -> str:
    rows = [("component", "endpoint", "status", "latency", "detail")]
    rows += [(r.component, r.endpoint, "up" if r.ok else "DOWN", f"{r.latency_ms:.0f} ms", r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.doctor",
        description="Check the graph, LLM, embeddings and Prefect for real and print a status table.",
    )
    parser.add_argument("--project-dir", type=Path, default=Path("."), help="project directory (default: .)")
    parser.add_argument("--config", type=Path, default=None, help="TOML settings file (default: <project-dir>/skald.toml)")
    parser.add_argument("--skip", action="append", default=[], choices=["graph", "llm", "prefect"],
                        help="skip a component (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    settings = load_settings(args.project_dir, args.config)
    configure_prefect(settings.project_dir)
    results: list[CheckResult] = []
    if "graph" not in args.skip:
        results.append(check_graph(settings))
    if "llm" not in args.skip:
        results.extend(check_llm(settings))
    if "prefect" not in args.skip:
        results.append(check_prefect())
    print(render(results))
    down = [r for r in results if not r.ok]
    for r in down:
        print(f"doctor: {r.component} is down: {r.detail}", file=sys.stderr)
    return 1 if down else 0


if __name__ == "__main__":
    run_main(main, "doctor")
