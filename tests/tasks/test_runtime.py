"""What goes into the embedding stages' cache keys: the model that makes the vectors; and what a
run's runtime leaves when it closes: the log of its model calls."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from core import embedder
from core.settings import load_settings
from tasks.runtime import Runtime
from tests.support.scripted_llm import ScriptedLLM


def test_the_in_process_model_is_named_by_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SKALD_EMBEDDING_BASE_URL", raising=False)
    runtime = Runtime(load_settings(project_dir=tmp_path))
    before = runtime.embedding_fingerprint()
    assert embedder.MODEL_SHA256[:16] in before
    # Another build of the model under the same name is another key: old vectors are not reused.
    monkeypatch.setattr(embedder, "MODEL_SHA256", "0" * 64)
    assert runtime.embedding_fingerprint() != before


def test_an_endpoints_model_is_named_by_its_url_and_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKALD_EMBEDDING_BASE_URL", "http://127.0.0.1:9/v1")
    fingerprint = Runtime(load_settings(project_dir=tmp_path)).embedding_fingerprint()
    assert fingerprint.startswith("http://127.0.0.1:9/v1|")
    # The look-alike: the local model's hash says nothing about an endpoint's vectors.
    assert embedder.MODEL_SHA256[:16] not in fingerprint


def test_a_runs_calls_are_logged_when_its_runtime_closes(tmp_path: Path) -> None:
    """A scheduled healing or QA run makes its own runtime and closes it: its model calls
    (enrichments) used to be dropped, since only the novel flow wrote the log."""
    with ScriptedLLM() as llm:
        llm.on(respond="A central figure of Eastport.")
        settings = load_settings(project_dir=tmp_path).model_copy(
            update={"openai_base_url": llm.base_url}
        )
        asked = Runtime(settings)
        asked.text("small", [{"role": "user", "content": "Who is Mary?"}], purpose="enrich")
        asked.close()
        idle = Runtime(settings)
        idle.close()
    log = tmp_path / ".saga" / "runs" / f"llm_calls_{asked.run_id}.parquet"
    calls = pl.read_parquet(log)
    assert calls["purpose"].to_list() == ["enrich"] and calls["outcome"].to_list() == ["ok"]
    # The look-alike: a run that asked no model leaves no empty log.
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name]
