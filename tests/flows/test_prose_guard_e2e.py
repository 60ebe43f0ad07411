"""End to end: the degeneration guard and the scene prompt, as a user runs
`python -m flows.novel`, against the scripted OpenAI-compatible server over real HTTP and
the real graph server.

- a looping first draft is drafted again with the anti-repetition penalties in the request
  and accepted once clean, a draft with no prose (only a heading) is drafted again; the run
  summary carries per-chapter prose metrics;
- the scene prompt carries the chapter's other scenes, the logline and themes, the present
  characters' motivation and voice, the previous chapter's ending and the style guide;
- a scene that never comes clean flags its chapter in the quality table and the exit summary;
- `limits.extraction_concurrency` bounds (and really widens) the per-scene extraction fan-out.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from tasks.context import estimate_tokens
from tests.support.novel_runs import novel, run_env, wipe_graph
from tests.support.novel_script import script_novel, scripted_draft, scripted_extraction
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest

LOOP = "The message is a message that will be sent to all future generations. " * 25
SCENE = re.compile(r"Chapter (\d+), scene (\d+) of")


def draft_requests(llm: ScriptedLLM, chapter: int, scene: int) -> list[ScriptedRequest]:
    found = []
    for request in llm.requests:
        where = SCENE.search(request.text)
        if (
            "Write the scene" in request.text
            and where
            and (int(where[1]), int(where[2])) == (chapter, scene)
        ):
            found.append(request)
    return found


class InFlight:
    """Counts extraction requests the server is answering at once. With `wait_for`, the
    first request holds until that many are in flight (or 60 s pass, and the test fails):
    a deterministic check that the fan-out really runs that wide, with no timing margin."""

    def __init__(self, wait_for: int = 1) -> None:
        self.wait_for, self.now, self.peak = wait_for, 0, 0
        self.lock = threading.Lock()
        self.wide_enough = threading.Event()

    def __call__(
        self, answer: Callable[[ScriptedRequest], dict]
    ) -> Callable[[ScriptedRequest], dict]:
        def respond(request: ScriptedRequest) -> dict:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
                if self.now >= self.wait_for:
                    self.wide_enough.set()
            try:
                self.wide_enough.wait(timeout=60)
                return answer(request)
            finally:
                with self.lock:
                    self.now -= 1

        return respond


def summary_of(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        script_novel(server)
        yield server


def test_looping_draft_is_redrafted_with_penalties_and_the_prompt_has_what_a_novelist_needs(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    headings_only = ["## Chapter 1: The Letter\n\n### Scene 3"]  # cleaned to nothing: no prose

    def loops_until_penalized(request: ScriptedRequest) -> str:
        where = SCENE.search(request.text)
        if where and (where[1], where[2]) == ("1", "1") and "frequency_penalty" not in request.body:
            return LOOP
        if where and (where[1], where[2]) == ("1", "3") and headings_only:
            return headings_only.pop()
        return scripted_draft(request)

    llm.on(schema=None, contains="Write the scene", respond=loops_until_penalized)
    extraction = InFlight(wait_for=2)
    llm.on(schema="SceneExtraction", respond=extraction(scripted_extraction))
    wipe_graph(graph_settings)
    project = tmp_path / "book"
    env = run_env(
        llm,
        graph_settings,
        prefect_home,
        SKALD_LIMITS__EXTRACTION_CONCURRENCY="2",
        SKALD_TIERS__NARRATIVE__ANTI_REPETITION__SERVER_FIELDS='{"repeat_penalty": 1.15, "dry_multiplier": 0.8}',
    )
    result = novel(
        project,
        env,
        "--premise",
        "A keeper finds a letter.",
        "--chapters",
        "2",
        "--scenes-per-chapter",
        "3",
        "--acts",
        "2",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert extraction.peak == 2  # limits.extraction_concurrency: three scenes, two at a time

    # Chapter 1 scene 1: the plain first draft looped; the redraft carried the penalties.
    first, second = draft_requests(llm, 1, 1)
    assert "frequency_penalty" not in first.body and "repeat_penalty" not in first.body
    assert (second.body["frequency_penalty"], second.body["presence_penalty"]) == (0.3, 0.3)
    assert (second.body["repeat_penalty"], second.body["dry_multiplier"]) == (1.15, 0.8)
    assert len(draft_requests(llm, 1, 2)) == 1  # a clean first draft is kept
    # A draft with no prose (only a heading and the title) is drafted again, not fatal.
    assert len(draft_requests(llm, 1, 3)) == 2 and not headings_only
    chapter_one = (project / "chapters/chapter_001.md").read_text()
    assert "future generations" not in chapter_one and "Mara Quill met Tobias Venn" in chapter_one

    summary = summary_of(result.stdout)
    assert summary["flagged_chapters"] == []
    assert [c["chapter"] for c in summary["chapter_quality"]] == [1, 2]
    for chapter in summary["chapter_quality"]:
        assert chapter["distinct_trigrams"] >= 0.8 and chapter["max_sentence_repeats"] <= 3, chapter
    rows = json.loads((project / ".saga/quality/chapter_001.json").read_text())
    assert [(r["part"], r["drafts"], r["clean"]) for r in rows] == [
        ("scene 1", 2, True),
        ("scene 2", 1, True),
        ("scene 3", 2, True),
        ("chapter", 5, True),
    ]

    # The first scene of chapter 2: what a novelist needs, within the narrative tier's budget.
    (prompt,) = draft_requests(llm, 2, 1)
    text = prompt.text
    for planned in ("1. Scene 1", "2. Scene 2", "3. Scene 3"):
        assert planned in text
    assert "<- THIS SCENE" in text.split("2. Scene 2")[0]
    assert "Logline: A keeper chases a ghost's letter." in text and "Themes: grief" in text
    assert "motivation: learn the truth" in text and "voice: Clipped, salty sentences." in text
    assert (
        "motivation: protect Mara" in text and "voice: Slow and gentle, full of tide lore." in text
    )
    ending = chapter_one.strip()[-120:]
    assert "The previous chapter ended:" in text and ending in text
    assert "third person, past tense" in text and "Show through action and dialogue" in text
    narrative = graph_settings.tier("narrative")
    prompt_tokens = sum(estimate_tokens(m["content"]) + 8 for m in prompt.messages)
    assert prompt_tokens + narrative.max_tokens <= narrative.context_window


def test_scene_that_never_comes_clean_flags_the_chapter_in_the_exit_summary(
    llm: ScriptedLLM, graph_settings: Settings, prefect_home: Path, tmp_path: Path
) -> None:
    def scene_two_always_loops(request: ScriptedRequest) -> str:
        where = SCENE.search(request.text)
        return LOOP if where and where[2] == "2" else scripted_draft(request)

    llm.on(schema=None, contains="Write the scene", respond=scene_two_always_loops)
    extraction = InFlight()
    llm.on(schema="SceneExtraction", respond=extraction(scripted_extraction))
    wipe_graph(graph_settings)
    project = tmp_path / "book"
    env = run_env(
        llm,
        graph_settings,
        prefect_home,
        SKALD_LIMITS__MAX_ITERATIONS="1",
        SKALD_PROSE__MAX_DRAFT_ATTEMPTS="2",
        SKALD_LIMITS__EXTRACTION_CONCURRENCY="1",
    )
    result = novel(
        project,
        env,
        "--premise",
        "A keeper finds a letter.",
        "--chapters",
        "1",
        "--scenes-per-chapter",
        "2",
        "--acts",
        "1",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert extraction.peak == 1  # limits.extraction_concurrency 1: one scene at a time

    first, second = draft_requests(llm, 1, 2)
    assert "frequency_penalty" not in first.body and second.body["frequency_penalty"] == 0.3
    summary = summary_of(result.stdout)
    assert summary["flagged_chapters"] == [1]
    (chapter,) = summary["chapter_quality"]
    assert any("scene 2 never passed the degeneration guard" in flag for flag in chapter["flags"])
    assert chapter["max_sentence_repeats"] > 3
    assert "FLAGGED chapter 1" in result.stderr
    rows = {
        r["part"]: r for r in json.loads((project / ".saga/quality/chapter_001.json").read_text())
    }
    assert (rows["scene 1"]["clean"], rows["scene 2"]["clean"], rows["scene 2"]["drafts"]) == (
        True,
        False,
        2,
    )
    assert rows["chapter"]["clean"] is False and "scene 2" in rows["chapter"]["failures"]
