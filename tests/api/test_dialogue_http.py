"""The sidecar's HTTP adapter and command line: status mapping, malformed input, OpenAPI, and a
real `python -m flows.dialogue serve` process on a free port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from fastapi.testclient import TestClient

from api import COMMIT_PATH, HEALTH_PATH, RETRY_PATH
from core.cli import run_main
from core.graph_server import free_port
from core.settings import Settings
from flows.dialogue import main
from kg.dialogue import DialogueRepository
from tasks.dialogue.pipeline import DialogueService
from tests.conftest import REPO_ROOT
from tests.support.cli import graph_vars
from tests.support.dialogue_script import participants
from tests.support.scripted_llm import ScriptedLLM


@pytest.fixture(scope="module")
def sidecar_speakers() -> list[str]:
    return participants("locomo-26")


def _body(
    conv: str, turn: int = 1, content: str = "Hey Mel! I went to a support group yesterday."
) -> dict[str, Any]:
    return {
        "conversation_id": conv,
        "turn_id": turn,
        "messages": [{"role": "user", "name": "Caroline", "content": content}],
        "window": [
            {"role": "assistant", "name": "Melanie", "content": "Hi Caroline, how have you been?"}
        ],
    }


def _conv() -> str:
    return f"test-http-{uuid.uuid4().hex[:8]}"


def test_commit_then_replay_over_http(client: TestClient) -> None:
    conv = _conv()
    first = client.post(COMMIT_PATH, json=_body(conv))
    assert first.status_code == 200, first.text
    data = first.json()
    assert data["state"] == "COMMITTED" and data["committed"] and data["code"] is None
    assert data["injection_packet"]["token_budget"] == 1024
    assert [s["state"] for s in data["trace"]["states"]][-1] == "COMMITTED"
    again = client.post(RETRY_PATH, json=_body(conv))
    assert again.status_code == 200 and again.json()["idempotent_hit"] is True


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"turn_id": 1, "messages": [{"role": "user", "content": "x"}]}', "conversation_id"),
        (b'{"conversation_id": "c", "messages": [{"role": "user", "content": "x"}]}', "turn_id"),
        (
            b'{"conversation_id": 5, "turn_id": 1, "messages": [{"role": "user", "content": "x"}]}',
            "conversation_id",
        ),
        (
            b'{"conversation_id": "c", "turn_id": {"a": 1}, "messages": [{"role": "user", "content": "x"}]}',
            "turn_id",
        ),
        (b'{"conversation_id": "c", "turn_id": 1, "messages": "x"}', "messages"),
        (
            b'{"conversation_id": "c", "turn_id": 1, "messages": [{"role": "user", "content": "\xff\xfe"}]}',
            "UTF-8",
        ),
        (b"not json", "JSON"),
        (b"", "JSON"),
    ],
)
def test_malformed_requests_get_invalid_request(
    client: TestClient, body: bytes, fragment: str
) -> None:
    response = client.post(COMMIT_PATH, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    data = response.json()
    assert data["code"] == "INVALID_REQUEST" and data["committed"] is False
    assert fragment in data["reason"] and "\n" not in data["reason"]


def test_a_one_megabyte_message_is_refused_before_it_is_read(
    client: TestClient, scripted: ScriptedLLM
) -> None:
    calls = scripted.request_count
    big = _body(_conv(), content="x" * (1024 * 1024))
    response = client.post(COMMIT_PATH, json=big)
    assert response.status_code == 413
    assert response.json()["code"] == "INVALID_REQUEST" and "limit" in response.json()["reason"]
    # Over the per-message limit but inside the body limit: a plain 400.
    medium = client.post(COMMIT_PATH, json=_body(_conv(), content="x" * 100_000))
    assert medium.status_code == 400 and "content" in medium.json()["reason"]
    assert scripted.request_count == calls


def test_conflict_busy_gate_and_retryable_rollback_statuses(
    client: TestClient, service: DialogueService, scripted: ScriptedLLM
) -> None:
    conv = _conv()
    assert client.post(COMMIT_PATH, json=_body(conv)).status_code == 200
    conflict = client.post(COMMIT_PATH, json=_body(conv, content="something else"))
    assert conflict.status_code == 409 and conflict.json()["error_kind"] == "conflict"
    assert conflict.json()["code"] == "INVALID_REQUEST" and "retry-after" not in conflict.headers

    repo = DialogueRepository(service.store)
    busy_conv = _conv()
    assert repo.claim_lock(busy_conv, "other-sidecar", lease_s=30).acquired
    busy = client.post(COMMIT_PATH, json=_body(busy_conv))
    assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
    assert busy.json()["code"] == "IN_PROGRESS"
    repo.delete_conversation(busy_conv)

    scripted.on(
        schema="TurnExtraction",
        times=1,
        respond={"entities": [], "actions": [], "bio_patches": [], "facts": []},
    )
    gated = client.post(COMMIT_PATH, json=_body(_conv()))
    assert gated.status_code == 200
    assert (gated.json()["state"], gated.json()["committed"], gated.json()["retryable"]) == (
        "ROLLED_BACK",
        False,
        False,
    )

    scripted.on(
        schema="HistorianReport", fault="http_500", times=service.settings.limits.llm_max_attempts
    )
    failing = client.post(COMMIT_PATH, json=_body(_conv()))
    assert failing.status_code == 503 and failing.headers["retry-after"] == "1"
    assert failing.json()["retryable"] is True and failing.json()["code"] == "ROLLED_BACK"


def test_openapi_describes_both_endpoints_and_the_request(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in (COMMIT_PATH, RETRY_PATH):
        op = spec["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/TurnCommitRequest"
        )
        assert set(op["responses"]) == {"200", "400", "401", "403", "409", "413", "500", "503"}
    request = spec["components"]["schemas"]["TurnCommitRequest"]
    assert {"conversation_id", "turn_id", "messages"} <= set(request["required"])
    assert (
        "ChatMessage" in spec["components"]["schemas"]
        and "TurnResult" in spec["components"]["schemas"]
    )
    health = client.get(HEALTH_PATH).json()
    assert health["status"] == "ok" and health["turns_without_usable_vectors"] == 0


def _env(graph_settings: Settings, scripted: ScriptedLLM) -> dict[str, str]:
    return {
        **os.environ,
        **graph_vars(graph_settings),
        "OPENAI_BASE_URL": scripted.base_url,
        "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
    }


def test_serve_runs_a_real_http_server(
    graph_settings: Settings, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.dialogue",
            "serve",
            "--port",
            str(port),
            "--project-dir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env=_env(graph_settings, scripted),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600  # a hang, not a slow start: a loaded machine took 141 s
        while True:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            try:
                if httpx.get(base + HEALTH_PATH, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.3)
        response = httpx.post(base + COMMIT_PATH, json=_body(_conv()), timeout=60)
        assert response.status_code == 200 and response.json()["committed"], response.text
        bad = httpx.post(
            base + COMMIT_PATH, content=b"\xff\xfe", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400 and bad.json()["code"] == "INVALID_REQUEST"
        assert COMMIT_PATH in httpx.get(base + "/openapi.json").json()["paths"]
        # Stopped as a service manager stops it, the server leaves its turn's model calls on
        # disk (they used to be written only past --max-call-records, 20,000).
        proc.terminate()
        # Ended by SIGTERM itself after a clean stop (a service manager's clean stop).
        assert proc.wait(timeout=60) == -signal.SIGTERM
        logs = list((tmp_path / ".saga" / "runs" / "sidecar").glob("llm-calls-*.parquet"))
        calls = pl.concat([pl.read_parquet(p) for p in logs]) if logs else None
        assert calls is not None and (calls["outcome"] == "ok").all(), proc.communicate()[0][-3000:]
        assert calls.filter(pl.col("tier") != "embedding").height >= 3, calls  # the LLM slots
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cli_commit_and_help(
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = _env(graph_settings, scripted)
    request = tmp_path / "turn.json"
    request.write_text(json.dumps(_body(_conv())))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.dialogue",
            "commit",
            "--request",
            str(request),
            "--project-dir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "COMMITTED"
    # What the turn's model calls cost is on disk, as for a server's turns.
    logs = list((tmp_path / ".saga" / "runs" / "sidecar").glob("llm-calls-*.parquet"))
    assert logs and pl.concat([pl.read_parquet(p) for p in logs]).height >= 3

    # The rest in-process (each interpreter start costs seconds here): same entry point.
    for name in (
        "NEO4J_URI",
        "NEO4J_USERNAME",
        "NEO4J_PASSWORD",
        "NEO4J_DATABASE",
        "OPENAI_BASE_URL",
        "SKALD_EMBEDDING_BASE_URL",
    ):
        monkeypatch.setenv(name, env[name])

    def run(*args: str) -> int:
        with pytest.raises(SystemExit) as exited:
            run_main(main, "dialogue", list(args))
        return int(exited.value.code or 0)

    request.write_bytes(b'{"conversation_id": "c", "turn_id": [1], "messages": []}')
    assert run("commit", "--request", str(request), "--project-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "INVALID_REQUEST" in err and "turn_id" in err
    assert (
        run("commit", "--request", str(tmp_path / "nope.json"), "--project-dir", str(tmp_path)) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dialogue: error: cannot read request file")
    for command in ([], ["serve"], ["commit"], ["openapi"]):
        assert run(*command, "--help") == 0
    capsys.readouterr()
    out = tmp_path / "openapi.json"
    assert run("openapi", "--project-dir", str(tmp_path), "--out", str(out)) == 0
    assert COMMIT_PATH in json.loads(out.read_text())["paths"]
