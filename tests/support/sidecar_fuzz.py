"""Generated-input tests of the sidecar's HTTP API, from the OpenAPI document it serves.

    python -m tests.support.sidecar_fuzz [--max-examples N] [--seed S] [--workers W] [--out DIR]

starts the scripted OpenAI-compatible server (tests/support/scripted_llm.py, playing the dialogue
script), the graph (NEO4J_URI when set, else an embedded ArcadeDB in a temporary project),
and the sidecar's app (api.create_app, with a bearer token) under uvicorn on a free loopback
port; then runs schemathesis' command line against it:

    st run http://127.0.0.1:PORT/openapi.json --checks all --max-response-time 120 --seed S --max-examples N -H "Authorization: ..."

Every phase runs: the coverage phase (boundary and invalid values of every keyword of the
document, deterministic), fuzzing (hypothesis, positive and negative data) and the stateful
phase along the document's links (commit -> rewind / replace / commit again / read-back).
With `--checks all`, a response fails when it is a server error, has a status the operation
does not document, breaks its documented schema or headers, accepts a request the schema
forbids, or refuses one the schema allows (outside the statuses schemathesis reads as "not a
rejection": 401, 403, 404, 409, 429, 5xx), among others. The per-check counts come from
schemathesis' JSON report. `make fuzz` runs this with many examples; the suite runs it small
(tests/api/test_sidecar_fuzz.py). The response-time limit is the request timeout's (120 s): speed is
measured by the benches, and a test holds no timing margin.

The seed is fixed, so a run is repeatable given the same server answers; schemathesis and
hypothesis are what generate (this module only serves and counts).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

TOKEN = "fuzz-token-0123456789abcdef"
#: schemathesis' configuration: its defaults, with the documented 413 (see the file).
CONFIG_FILE = Path(__file__).resolve().parents[1] / "schemathesis.toml"
#: The CI-sized run's seed. Any seed's run must hold the contract; the CI test also wants both
#: sides of it exercised, 409 included, which a seed's random walk gives or not: 20261124's
#: stopped sending a conflicting commit when conversation/forget was added, 20261129's when
#: the conversations list was. With the 16 operations (conversation/rename and /copy added,
#: whose refusal of an id that holds memory is a 409 too) seeds 1, 2 and 3 give 409s (9, 8 and
#: 31 of them at 20 examples).
DEFAULT_SEED = 1
#: Seconds a request may take: past it a request is a hang (also the response-time check's limit).
REQUEST_TIMEOUT_S = 120
SPEAKERS = ["Caroline", "Melanie"]


@dataclass
class FuzzReport:
    """What one schemathesis run found."""

    exit_code: int
    output: str
    generated: int = 0
    requests: int = 0
    checks: dict[str, Counter[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    #: Requests by how schemathesis generated them: positive (schema-valid) or negative.
    modes: Counter[str] = field(default_factory=Counter)
    #: Schema-valid requests answered with something else than 2xx, by "status error_kind".
    positive_refusals: Counter[str] = field(default_factory=Counter)
    #: Schema-valid requests refused with the documented 413 (the body over MAX_BODY_BYTES).
    documented_rejections: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.failures

    def summary(self) -> dict[str, Any]:
        """What a caller asserts on (tests/api/test_sidecar_fuzz.py), as JSON."""
        return {
            "exit_code": self.exit_code,
            "ok": self.ok,
            "generated": self.generated,
            "requests": self.requests,
            "checks": {name: dict(counts) for name, counts in self.checks.items()},
            "failures": self.failures,
            "statuses": dict(self.statuses),
            "modes": dict(self.modes),
            "positive_refusals": dict(self.positive_refusals),
            "documented_rejections": self.documented_rejections,
            "output": self.output,
        }

    def table(self) -> str:
        lines = [f"{'check':32} {'passed':>8} {'failed':>8}"]
        for name in sorted(self.checks):
            counts = self.checks[name]
            lines.append(f"{name:32} {counts['passed']:>8} {counts['failed']:>8}")
        lines.append(
            f"test cases generated: {self.generated}; HTTP requests sent: {self.requests} "
            f"({dict(sorted(self.modes.items()))}); statuses: {dict(sorted(self.statuses.items()))}"
        )
        lines.append(
            f"schema-valid requests refused with the documented 413 (body over the size limit): "
            f"{len(self.documented_rejections)}"
        )
        lines.append(
            "schema-valid requests not answered 2xx, by status and error_kind (each a documented "
            f"answer): {dict(sorted(self.positive_refusals.items()))}"
        )
        return "\n".join(lines)


@contextmanager
def served_sidecar(settings: Any, *, token: str = TOKEN, lock_wait_s: float = 5.0) -> Iterator[str]:
    """The sidecar (a real uvicorn server in a thread) over `settings`; yields its base URL."""
    import uvicorn

    from api import SidecarSecurity, create_app
    from core.graph_server import free_port
    from tasks.dialogue.pipeline import DialogueService, SidecarOptions

    service = DialogueService(settings, options=SidecarOptions(lock_wait_s=lock_wait_s))
    try:
        _ = service.store.endpoint  # connect (and migrate) before serving
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(service, SidecarSecurity(token)),
                host="127.0.0.1",
                port=port,
                log_level="warning",
            )
        )
        thread = threading.Thread(target=server.run, name="sidecar-fuzz-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + 600
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the sidecar did not start")
            time.sleep(0.05)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=30)
    finally:
        service.close()


def _st() -> list[str]:
    found = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if found is None:
        raise RuntimeError("schemathesis' `st` is not installed (pip install -e '.[dev]')")
    return [found]


def run_schemathesis(
    base_url: str,
    *,
    max_examples: int,
    seed: int = DEFAULT_SEED,
    workers: int = 1,
    token: str = TOKEN,
    report_dir: Path,
    extra: list[str] | None = None,
    timeout_s: float | None = None,
) -> FuzzReport:
    """`st run` against the served document; the report with per-check counts."""
    report_dir.mkdir(parents=True, exist_ok=True)
    ndjson = report_dir / "events.ndjson"
    command = [
        *_st(),
        "--config-file",
        str(CONFIG_FILE),
        "run",
        f"{base_url}/openapi.json",
        "--checks",
        "all",
        # `all` includes the response-time check, 10 s by default: a loaded machine answered
        # a turn retry in 10.1 s. How fast the sidecar answers is the benches' business
        # (bench/sidecar_load.py), so its limit here is the request timeout's: only a hang
        # fails it. (The command line cannot exclude this one check.)
        "--max-response-time",
        str(REQUEST_TIMEOUT_S),
        "--seed",
        str(seed),
        "--max-examples",
        str(max_examples),
        "--workers",
        str(workers),
        "--header",
        f"Authorization: Bearer {token}",
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(ndjson),
        "--no-color",
        *(extra or []),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=report_dir
    )
    report = FuzzReport(exit_code=done.returncode, output=done.stdout + done.stderr)
    if ndjson.exists():
        _count(report, ndjson)
    return report


def _count(report: FuzzReport, ndjson: Path) -> None:
    """Per-check passed/failed counts, requests and statuses from schemathesis' event log."""
    for line in ndjson.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        for kind, body in event.items():
            if kind == "ScenarioFinished":
                _count_recorder(report, body.get("recorder") or {})


def _error_kind(response: dict[str, Any]) -> str:
    """The `error_kind` (else `code`) of a response body schemathesis recorded."""
    content = response.get("content") or {}
    raw = content.get("$base64") if isinstance(content, dict) else None
    try:
        body = (
            json.loads(base64.b64decode(raw)) if raw else json.loads(response.get("body") or "null")
        )
    except (ValueError, TypeError):
        return "?"
    if not isinstance(body, dict):
        return "?"
    return str(body.get("error_kind") or body.get("code") or "-")


def _count_recorder(report: FuzzReport, recorder: dict[str, Any]) -> None:
    cases = recorder.get("cases") or {}
    report.generated += len(cases)
    for case_id, interaction in (recorder.get("interactions") or {}).items():
        response = (interaction or {}).get("response") or {}
        if not response:
            continue
        status = str(response.get("status_code"))
        report.requests += 1
        report.statuses[status] += 1
        meta = ((cases.get(case_id) or {}).get("value") or {}).get("meta") or {}
        mode = str((meta.get("generation") or {}).get("mode", "?"))
        report.modes[mode] += 1
        if mode == "positive" and not status.startswith("2"):
            # Schema-valid, not accepted: which documented answer it got (status and error_kind).
            report.positive_refusals[f"{status} {_error_kind(response)}"] += 1
        if mode == "positive" and status == "413":
            # The documented exception: schema-valid, over the body limit JSON Schema cannot state.
            report.documented_rejections.append(
                f"{interaction['request']['method']} {interaction['request']['uri']}"
            )
    for checks in (recorder.get("checks") or {}).values():
        for check in checks or []:
            name = check.get("name", "?")
            status = str(check.get("status", "")).lower()
            counts = report.checks.setdefault(name, Counter())
            if status == "success":
                counts["passed"] += 1
            elif status == "failure":
                counts["failed"] += 1
                failure = check.get("failure_info") or {}
                report.failures.append(f"{name}: {json.dumps(failure)[:300]}")
            else:
                counts[status or "?"] += 1


@contextmanager
def scripted_settings() -> Iterator[Any]:
    """Settings for a fuzz run of its own: the scripted LLM, and NEO4J_URI or an embedded graph
    in a temporary project (removed afterwards)."""
    from core.settings import load_settings
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    project = Path(tempfile.mkdtemp(prefix="skald-fuzz-"))
    try:
        with ScriptedLLM() as llm:
            DialogueScript(SPEAKERS).install(llm)
            yield load_settings(
                project, openai_base_url=llm.base_url, embedding_base_url=llm.base_url
            )
    finally:
        shutil.rmtree(project, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.sidecar_fuzz", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--max-examples",
        type=int,
        default=1000,
        help="examples per operation and phase (default 1000)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"schemathesis' seed (default {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="concurrent schemathesis workers (default 1; more need Python >= 3.11.8)",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "build" / "fuzz", help="report folder"
    )
    parser.add_argument(
        "--summary", type=Path, default=None, help="also write the counts as JSON to this file"
    )
    args = parser.parse_args(argv)
    if args.workers > 1 and sys.version_info < (3, 11, 8):
        # CPython before 3.11.8 (gh-106905): ast.parse in two threads at once can raise "AST
        # constructor recursion depth mismatch"; hypothesis parses lambdas' source to describe
        # schemathesis' filters, so two workers crashed its coverage phase (CI, Python 3.11.7).
        print(
            f"fuzz: one worker, not {args.workers}: ast.parse is not thread-safe on Python "
            f"{sys.version.split()[0]} (gh-106905, fixed in 3.11.8)",
            file=sys.stderr,
        )
        args.workers = 1
    started = time.monotonic()
    with scripted_settings() as settings, served_sidecar(settings) as url:
        report = run_schemathesis(
            url,
            max_examples=args.max_examples,
            seed=args.seed,
            workers=args.workers,
            report_dir=args.out,
        )
    if args.summary is not None:
        args.summary.write_text(json.dumps(report.summary(), indent=1), encoding="utf-8")
    print(report.output)
    print(report.table())
    for failure in report.failures[:50]:
        print("FAILED", failure)
    print(
        f"fuzz: {'passed' if report.ok else 'FAILED'} in {time.monotonic() - started:.0f}s "
        f"(seed {args.seed}, max examples {args.max_examples}, report {args.out})"
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
