"""`python -m core.doctor`: real checks, a table, non-zero exit with a reason when something is down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core.doctor import PROBE_LABEL
from core.settings import Settings
from kg import vocabulary as vocab
from tests.conftest import REPO_ROOT, prefect_api_env
from tests.support.cli import graph_vars
from tests.support.scripted_llm import ScriptedLLM


def _env(settings: Settings, llm_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKALD_", "NEO4J_", "OPENAI_"))}
    env.update(
        {
            "OPENAI_BASE_URL": llm_url,
            "SKALD_EMBEDDING_BASE_URL": llm_url,
            **graph_vars(settings),
            "SKALD_LIMITS__LLM_MAX_ATTEMPTS": "2",
            "PREFECT_HOME": str(tmp_path / "prefect"),
        }
    )
    return env


def _doctor(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.doctor", "--project-dir", str(tmp_path), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doctor_reports_every_component_up(
    graph_settings: Settings, prefect_api: str, tmp_path: Path
) -> None:
    # The Prefect check runs its no-op flow on the session's API: without PREFECT_API_URL the
    # doctor would start Prefect's temporary server first, tens of seconds on a loaded machine.
    with ScriptedLLM() as llm:
        env = {**_env(graph_settings, llm.base_url, tmp_path), **prefect_api_env()}
        result = _doctor(env, tmp_path)
        schemas = [r.schema_name for r in llm.requests if r.schema_name]
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[2:]}
    assert set(rows) == {"graph", "llm", "embeddings", "prefect"}
    assert all(" up " in row for row in rows.values()), result.stdout
    assert "gone after rollback" in rows["graph"]
    assert "dimension 64" in rows["embeddings"]
    assert prefect_api in rows["prefect"]
    assert schemas == ["DoctorPing"]  # the LLM check is a real structured call


def test_doctor_exits_non_zero_with_one_line_reason(
    graph_settings: Settings, tmp_path: Path
) -> None:
    result = _doctor(
        _env(graph_settings, "http://127.0.0.1:9/v1", tmp_path), tmp_path, "--skip", "prefect"
    )
    assert result.returncode == 1
    reasons = [line for line in result.stderr.splitlines() if line.startswith("doctor:")]
    assert [r.split()[1] for r in reasons] == ["llm", "embeddings"]
    assert all("127.0.0.1:9" in r for r in reasons)
    assert " up " in next(line for line in result.stdout.splitlines() if line.startswith("graph"))


def test_doctor_probes_a_node_type_the_graph_schema_declares() -> None:
    # The probe lives in core (which must not import kg): it must still write a declared type,
    # or ArcadeDB would create a stray one in every project the doctor checks.
    assert PROBE_LABEL == vocab.VALUE_NODE
