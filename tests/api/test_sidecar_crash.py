"""The reduced form of `python -m bench.crash.sidecar` (issue 33): a served sidecar SIGKILLed
at two seeded moments while a client sends 16 turns (the gated path) ends byte-identical to
an uninterrupted run (graph export, read-back pages, stored injection packets); and two clean
runs under different PYTHONHASHSEEDs, in different directories, are byte-identical.

Each run is a real `python -m flows.dialogue serve` (its own process group, its embedded
graph inside) and the scripted LLM server in its own process. Nothing depends on timing: a
kill lands wherever it lands, and the result must be the same. That the first kill lands at
all does not depend on the machine's speed either: every turn waits for at least one LLM
answer, each answered after LLM_LATENCY_S, so the turns take at least TURNS x LLM_LATENCY_S,
longer than the first kill moment (without the latency, all 16 turns sometimes ended
before it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.crash.harness import kill_moments
from bench.crash.sidecar import LLMProcess, RunResult, one_run, same, turn_bodies
from tasks.dialogue.replay import load_dialogue
from tests.conftest import DIALOGUES_DIR, child_pythonpath

DIALOGUE = DIALOGUES_DIR / "locomo-26.turns.jsonl"
TURNS = 16
LLM_LATENCY_S = 0.1
KILL_MOMENTS = kill_moments(7, 2, 0.3, 2.5)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLMProcess]:
    speakers = sorted({t.speaker for t in load_dialogue(DIALOGUE).turns})
    process = LLMProcess(
        tmp_path_factory.mktemp("crash-llm"),
        speakers,
        {**os.environ, "PYTHONPATH": child_pythonpath()},
        latency_s=LLM_LATENCY_S,
    )
    yield process
    process.close()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("crash-sidecar")


@pytest.fixture(scope="module")
def clean(llm: LLMProcess, work: Path) -> RunResult:
    """The uninterrupted run, under PYTHONHASHSEED=1."""
    return one_run(
        "clean-hashseed-1",
        work,
        llm,
        turn_bodies(DIALOGUE, TURNS, require_actions=True),
        hash_seed="1",
    )


@pytest.mark.skipif(
    os.environ.get("NEO4J_URI") is not None, reason="each run needs its own embedded graph"
)
def test_two_clean_runs_under_different_hash_seeds_are_byte_identical(
    llm: LLMProcess, work: Path, clean: RunResult
) -> None:
    twin = one_run(
        "clean-hashseed-2",
        work,
        llm,
        turn_bodies(DIALOGUE, TURNS, require_actions=True),
        hash_seed="2",
    )
    assert same(clean, twin) == [], (clean, twin)
    assert '"recalled_turns"' in clean.files["packets"].read_text(
        encoding="utf-8"
    )  # packets that do recall


@pytest.mark.skipif(
    os.environ.get("NEO4J_URI") is not None, reason="each run needs its own embedded graph"
)
def test_a_sidecar_killed_at_seeded_moments_ends_identical_to_an_uninterrupted_one(
    llm: LLMProcess, work: Path, clean: RunResult
) -> None:
    bodies = turn_bodies(DIALOGUE, TURNS, require_actions=True)
    killed = one_run("killed", work, llm, bodies, hash_seed="random", moments=KILL_MOMENTS)
    assert KILL_MOMENTS[0] < TURNS * LLM_LATENCY_S
    assert killed.kills >= 1
    assert same(clean, killed) == [], (
        f"differs after {killed.kills} kills: see {work / killed.name}"
    )
