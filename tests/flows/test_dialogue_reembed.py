"""Re-embedding a conversation's memory after the embedding model changed: the real graph, the
scripted OpenAI-compatible server for the vectors, the `reembed` CLI and its Prefect flow."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import flows.dialogue
from core.cli import run_main
from core.settings import Settings, load_settings
from flows.dialogue import main as dialogue_main
from kg.dialogue import DialogueRepository
from tasks.dialogue.ingest import memory_rows
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.reembed import reembed_conversation
from tasks.dialogue.remember import remember_rows
from tasks.dialogue.replay import load_dialogue
from tasks.dialogue.retriever import row_texts
from tests.conftest import DIALOGUES_DIR
from tests.support.cli import graph_vars
from tests.support.scripted_llm import ScriptedLLM

TURNS = 40
BATCH = 16


@pytest.fixture()
def scripted() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


def _service(graph_settings: Settings, scripted: ScriptedLLM, model: str) -> DialogueService:
    return DialogueService(
        load_settings(
            graph_settings.project_dir,
            embedding_base_url=scripted.base_url,
            embedding_model=model,
        )
    )


def _vectors_held(service: DialogueService, conversation_id: str) -> int:
    """How many of the conversation's turns `service` recalls by vector (after a recall)."""
    service.recall(conversation_id, "What did Gina open?", 5)
    pinned = service.vectors.get(service.store.endpoint.label, conversation_id).pinned()
    assert pinned.hybrid is not None and len(pinned.hybrid) == TURNS
    return int(pinned.hybrid.dense.count)


def _embedded_texts(scripted: ScriptedLLM) -> list[str]:
    return [
        text
        for r in scripted.requests
        if r.path.endswith("/embeddings")
        for text in r.body["input"]
    ]


def test_after_the_embedding_model_changed_reembed_gives_each_turn_the_new_models_vector_once(
    graph_settings: Settings,
    scripted: ScriptedLLM,
    tmp_path: Path,
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    conv = f"reembed-{uuid.uuid4().hex[:8]}"
    rows = memory_rows(load_dialogue(DIALOGUES_DIR / "locomo-30.turns.jsonl"), conv)[:TURNS]
    old = _service(graph_settings, scripted, "model-a")
    new = _service(graph_settings, scripted, "model-b")
    repo = DialogueRepository(new.store)
    try:
        assert remember_rows(old, conv, rows, batch_size=BATCH) == (TURNS, 0)
        # The same dimensions, another model: the new one compares its queries with none of
        # the old vectors (the turns are still recalled by their words)...
        with caplog.at_level(logging.WARNING, logger="tasks.dialogue.retriever"):
            assert _vectors_held(new, conv) == 0
            assert _vectors_held(new, conv) == 0  # warned once, not on every turn
            # ...while the model that made them uses them all, and warns of nothing.
            assert _vectors_held(old, conv) == TURNS
        assert new.vectors.foreign_vectors() == TURNS  # what the sidecar's health reports
        assert old.vectors.foreign_vectors() == 0
        [warning] = [r.getMessage() for r in caplog.records]
        assert f"{TURNS} remembered turns have vectors of another embedding model" in warning
        assert f"python -m flows.dialogue reembed --conversation-id {conv}" in warning

        # A run killed after its first batch: those turns are done, the epoch is not started.
        calls = 0

        def killed_after_one_batch(conversation_id: str, turns: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:  # 1: the page read (nothing current), 2: the first batch written
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            reembed_conversation(new, conv, batch_size=BATCH, progress=killed_after_one_batch)
        stored = repo.memory_rows(conv, 1, TURNS)
        fingerprint = new.gateway.embedding_fingerprint()
        assert [r.embedded_by == fingerprint for r in stored] == [True] * BATCH + [False] * (
            TURNS - BATCH
        )
        assert repo.snapshot(conv).vectors_epoch == 0

        # The CLI (the `dialogue-reembed` flow) finishes the rest, each turn embedded once, as
        # it was embedded when remembered.
        for name, value in graph_vars(graph_settings).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("SKALD_EMBEDDING_BASE_URL", scripted.base_url)
        monkeypatch.setenv("SKALD_EMBEDDING_MODEL", "model-b")
        scripted.reset()
        args = ["reembed", "--project-dir", str(tmp_path), "--conversation-id", conv]
        with pytest.raises(SystemExit) as exited:
            run_main(dialogue_main, "dialogue", [*args, "--batch-size", str(BATCH)])
        assert exited.value.code == 0
        [report] = json.loads(capsys.readouterr().out)
        assert (report["rows"], report["stale"], report["reembedded"]) == (
            TURNS,
            TURNS - BATCH,
            TURNS - BATCH,
        )
        assert report["embedded_by"] == fingerprint
        assert _embedded_texts(scripted) == row_texts(rows)[BATCH:]
        stored = repo.memory_rows(conv, 1, TURNS)
        assert all(r.embedded_by == fingerprint and r.embedding for r in stored)
        assert [r.text for r in stored] == [r.text for r in rows]  # positions and texts kept
        assert repo.snapshot(conv).vectors_epoch == 1

        # Both services' cached indexes were read at the old epoch: each reads the rows again.
        assert _vectors_held(new, conv) == TURNS
        assert _vectors_held(old, conv) == 0
        assert (new.vectors.foreign_vectors(), old.vectors.foreign_vectors()) == (0, TURNS)

        # A second run has nothing to do, and starts no epoch (no reader resets for nothing).
        scripted.reset()
        with pytest.raises(SystemExit) as exited:
            run_main(dialogue_main, "dialogue", args)
        assert exited.value.code == 0
        [report] = json.loads(capsys.readouterr().out)
        assert (report["stale"], report["reembedded"]) == (0, 0)
        assert _embedded_texts(scripted) == [] and repo.snapshot(conv).vectors_epoch == 1

        # A conversation that remembers nothing is named, not silently skipped: one line
        # before any flow runs (no flow run fails on it).
        def no_flow_run(*args: object, **kwargs: object) -> None:
            raise AssertionError("the reembed flow ran for an id memory does not hold")

        monkeypatch.setattr(flows.dialogue, "dialogue_reembed_flow", no_flow_run)
        with pytest.raises(SystemExit) as exited:
            run_main(dialogue_main, "dialogue", [*args[:3], "--conversation-id", "no-such"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.count("\n") == 1, err
        assert "no remembered turns in conversation 'no-such'" in err
    finally:
        old.close()
        new.close()
