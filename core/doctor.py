"""`python -m core.doctor`: check every configured component for real.

graph: a write inside a transaction that is then rolled back (and checked to be gone);
LLM: one structured call validated against a pydantic model; embeddings: one vector of
the expected dimension; Prefect: a no-op flow run. Prints a table and exits non-zero
when any component is down, with the reason in one line.

Why the graph check talks to the server itself (the neo4j driver on core's
`graph_endpoint`) instead of through kg's GraphStore: core is the bottom layer and must
not import kg, and `python -m core.doctor` is the documented command, so the check cannot
be handed in from above without an import by name. What it checks is the server (reachable,
credentials, transactions roll back), not the story graph, so it needs nothing of kg but
one node type the schema already has: two statements, the only Cypher outside kg/.

The table is formatted here rather than with rich/tabulate: its plain columns are what
users and tests read (`doctor` output is unchanged), and a dozen lines do it. The graph
connection is tried as often as a run tries (settings `graph_connect_attempts`, doubling
delay) in a six-line loop; tenacity would be a new dependency for that one loop.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import neo4j
from neo4j import exceptions as nx
from pydantic import BaseModel, Field

from core.cli import configure_prefect, one_line, run_main, setup_logging
from core.errors import GraphUnavailableError, GraphWriteError
from core.graph_server import GraphEndpoint, credentials_hint, graph_endpoint
from core.settings import Settings, load_settings

# A node type every Skald graph declares (kg.vocabulary.VALUE_NODE; a test pins the two
# together), so the probe does not make ArcadeDB create a type of its own.
PROBE_LABEL = "ValueNode"
_PROBE_CREATE = f"CREATE (p:{PROBE_LABEL} {{probe: $marker}}) RETURN count(p) AS n"
_PROBE_COUNT = f"MATCH (p:{PROBE_LABEL} {{probe: $marker}}) RETURN count(p) AS n"


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
        return CheckResult(
            component=component,
            endpoint=where,
            ok=True,
            latency_ms=(time.perf_counter() - started) * 1000,
            detail=detail,
        )
    except Exception as exc:  # every failure becomes one line in the table
        return CheckResult(
            component=component,
            endpoint=where,
            ok=False,
            latency_ms=(time.perf_counter() - started) * 1000,
            detail=one_line(exc),
        )


def _connect(endpoint: GraphEndpoint, attempts: int) -> neo4j.Driver:
    """A verified driver; `attempts` tries with backoff, like a run's own connection."""
    delay, last = 0.5, ""
    for attempt in range(1, attempts + 1):
        driver = neo4j.GraphDatabase.driver(
            endpoint.uri,
            auth=(endpoint.username, endpoint.password),
            connection_timeout=10.0,
            user_agent="skald-doctor",
        )
        try:
            driver.verify_connectivity()
            return driver
        except nx.AuthError as exc:
            driver.close()
            raise GraphUnavailableError(
                f"graph at {endpoint.uri} refused the credentials for user {endpoint.username!r}: {one_line(exc)}",
                hint=credentials_hint(endpoint),
            ) from exc
        except (nx.DriverError, nx.Neo4jError, OSError) as exc:
            driver.close()
            last = one_line(exc)
            if attempt < attempts:
                time.sleep(delay)
                delay = min(delay * 2, 4.0)
    raise GraphUnavailableError(
        f"graph at {endpoint.uri} is unreachable after {attempts} attempts ({last})",
        hint="start the Neo4j server, fix NEO4J_URI, or unset NEO4J_URI to use the embedded ArcadeDB",
    )


def probe_rollback(endpoint: GraphEndpoint, attempts: int) -> str:
    """Create a marker node in an explicit transaction, roll it back, and check it is gone."""
    marker = f"doctor-{uuid.uuid4().hex}"
    with (
        _connect(endpoint, attempts) as driver,
        driver.session(database=endpoint.database) as session,
    ):
        agent = driver.get_server_info().agent
        tx = session.begin_transaction()
        try:
            tx.run(_PROBE_CREATE, marker=marker).consume()
            seen = tx.run(_PROBE_COUNT, marker=marker).single(strict=True)["n"]
        finally:
            tx.rollback()
        after = session.execute_read(
            lambda t: t.run(_PROBE_COUNT, marker=marker).single(strict=True)["n"]
        )
    if seen != 1 or after != 0:
        raise GraphWriteError(
            f"transaction probe saw {seen} node(s) inside and {after} after rollback",
            hint="the graph server does not roll back transactions correctly",
        )
    return f"write visible in its transaction, gone after rollback ({agent})"


def check_graph(settings: Settings) -> CheckResult:
    return _timed(
        "graph",
        lambda: graph_endpoint(settings).label,
        lambda: probe_rollback(graph_endpoint(settings), settings.graph_connect_attempts),
    )


def check_llm(settings: Settings) -> tuple[CheckResult, CheckResult]:
    from core.llm import LLMGateway  # openai, polars, pyarrow: only when the LLM is checked

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
            raise RuntimeError(
                f"dimension changed between calls: {vectors.shape[1]} vs {again.shape[1]}"
            )
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
    rows += [
        (r.component, r.endpoint, "up" if r.ok else "DOWN", f"{r.latency_ms:.0f} ms", r.detail)
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.doctor",
        description="Check the graph, LLM, embeddings and Prefect for real and print a status table.",
    )
    parser.add_argument(
        "--project-dir", type=Path, default=Path("."), help="project directory (default: .)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML settings file (default: <project-dir>/skald.toml)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["graph", "llm", "prefect"],
        help="skip a component (repeatable)",
    )
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
