"""What goes into the embedding stages' cache keys: the model that makes the vectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import embedder
from core.settings import load_settings
from tasks.runtime import Runtime


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
