"""The stages' seams (issue 30): a stage runs over small fakes of its ports, and its cache key
holds the model fingerprint of its tier but not the identity of the services it was handed.

The fakes are the ports' Protocols (core/ports.py, kg/ports.py) written for one test each: a
language model that answers from a table, a graph reader with a fixed history. The content
store is the real one on a temporary directory (it is a directory, nothing to fake).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prefect.logging import disable_run_logger
from pydantic import BaseModel

from core.content import ContentStore
from core.errors import ContentIntegrityError, InvalidInputError, LLMBadOutputError
from core.ports import Content, LanguageModel
from core.settings import Candidate, Settings, load_settings
from kg.models import ChangeSetInfo, ChapterDelta
from kg.ports import GraphReader, GraphWriter
from prompts.initialization.models import ChapterOutline
from prompts.knowledge.models import ChapterSummary
from prompts.narrative.models import SceneDetail
from tasks.embedding import embed_texts
from tasks.export import chapter_markdown, chapter_path, export_manuscript, restore_chapter_file
from tasks.planning import PlanRequest, plan_scenes
from tasks.policy import SERVICES
from tasks.retrieval import retrieve_context
from tasks.runtime import Runtime
from tasks.services import Services
from tasks.steering import written_chapters
from tasks.summarization import summarize_chapter
from tasks.validation import validate_consistency
from tests.conftest import REPO_ROOT, child_pythonpath


class TableModel:
    """A LanguageModel whose structured answers come from a table by output model; it records
    every call (tier, purpose, the user message)."""

    def __init__(
        self, answers: dict[type[BaseModel], BaseModel], fingerprint: str = "fake-model"
    ) -> None:
        self.answers = answers
        self.fingerprint = fingerprint
        self.calls: list[tuple[str, str, str]] = []

    def structured(
        self,
        tier: str,
        messages: Sequence[dict[str, Any]],
        output_model: type[Any],
        *,
        purpose: str = "",
        max_tokens: int | None = None,
    ) -> Any:
        self.calls.append((tier, purpose, messages[-1]["content"]))
        return self.answers[output_model]

    def text(
        self,
        tier: str,
        messages: Sequence[dict[str, Any]],
        *,
        purpose: str = "",
        max_tokens: int | None = None,
        anti_repetition: bool = False,
        sample: int = 0,
    ) -> str:
        raise AssertionError("this test's stage asks for no prose")

    def embed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        return np.ones((len(texts), 3), dtype=np.float32)

    def sends_anti_repetition_first(self, tier: str) -> bool:
        return False

    def model_fingerprint(self, tier: str) -> str:
        return f"{self.fingerprint}|{tier}"

    def embedding_fingerprint(self) -> str:
        return f"{self.fingerprint}|embedding"


class FixedHistory:
    """A GraphReader with fixed committed change-sets (only what written_chapters reads)."""

    def __init__(self, chapters: Sequence[int]) -> None:
        self.infos = [
            ChangeSetInfo(
                chapter=c,
                seq=i,
                delta_hash=f"h{c}",
                created_nodes=0,
                created_relationships=0,
                updated_nodes=0,
                updated_relationships=0,
            )
            for i, c in enumerate(chapters)
        ]

    def committed_chapters(self) -> list[ChangeSetInfo]:
        return list(self.infos)


class History:
    """A GraphReader with one history fingerprint (only what a graph-reading stage's key reads)."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.asked: list[int] = []

    def history_fingerprint(self, chapter: int) -> str:
        self.asked.append(chapter)
        return self.fingerprint


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return load_settings(tmp_path, openai_base_url="http://127.0.0.1:9/v1", **overrides)


def _with_model(settings: Settings, tier: str, model: str) -> Settings:
    tiers = {
        **settings.tiers,
        tier: settings.tier(tier).model_copy(update={"models": [Candidate(model=model)]}),
    }
    return settings.model_copy(update={"tiers": tiers})


def test_the_protocols_hold_for_the_real_services_and_the_fakes(tmp_path: Path) -> None:
    rt = Runtime(_settings(tmp_path))
    checks: list[tuple[object, type]] = [
        (rt, LanguageModel),
        (TableModel({}), LanguageModel),
        (ContentStore(tmp_path / "c"), Content),
    ]
    for obj, port in checks:  # every method of the port, by name (Protocols are structural)
        missing = [
            m for m in dir(port) if not m.startswith("_") and not callable(getattr(obj, m, None))
        ]
        assert missing == [], f"{type(obj).__name__} lacks {missing} of {port.__name__}"
    from kg.store import GraphStore

    for port in (GraphReader, GraphWriter):
        assert [m for m in dir(port) if not m.startswith("_") and not hasattr(GraphStore, m)] == []


def test_a_stage_runs_over_a_fake_language_model_and_stores_its_answer(tmp_path: Path) -> None:
    content = ContentStore(tmp_path / "content")
    chapter = content.put_text(
        "drafts", "chapter_001/iter_1", "Amara climbed the lighthouse stairs at dusk."
    )
    answer = ChapterSummary(summary="Amara climbs to the lamp room.", key_events=["the climb"])
    llm = TableModel({ChapterSummary: answer})
    services = Services(settings=_settings(tmp_path), llm=llm, content=content)
    with disable_run_logger():
        summary = summarize_chapter.fn(services, 1, "The Stairs", chapter)
    assert summary == answer
    assert [(tier, purpose) for tier, purpose, _ in llm.calls] == [("small", "summarize_chapter")]
    # The stage read the text through the content port.
    assert "Amara climbed the lighthouse stairs" in llm.calls[0][2]


def test_a_deleted_chapter_file_is_written_from_its_stored_text_and_never_from_a_changed_one(
    tmp_path: Path,
) -> None:
    content = ContentStore(tmp_path / "content")
    text = content.put_text("chapters", "chapter_002/final", "Amara lit the lamp.\n\nThe sea rose.")
    services = Services(settings=_settings(tmp_path), llm=TableModel({}), content=content)
    path = chapter_path(services.settings.project_dir, 2)
    assert restore_chapter_file(services, 2, "The Lamp", text) == str(path)
    assert path.read_text() == chapter_markdown(
        2, "The Lamp", "Amara lit the lamp.\n\nThe sea rose."
    )
    # The look-alike: the stored text changed since it was written; no file is made from it.
    path.unlink()
    (tmp_path / "content" / text.path).write_text("Amara lit the lamp.\n\nThe sea fell.")
    with pytest.raises(ContentIntegrityError):
        restore_chapter_file(services, 2, "The Lamp", text)
    assert not path.exists()


def test_a_chapter_file_the_writer_saved_with_a_byte_order_mark_keeps_its_heading(
    tmp_path: Path,
) -> None:
    services = Services(
        settings=_settings(tmp_path), llm=TableModel({}), content=ContentStore(tmp_path / "c")
    )
    for number, title in ((1, "Harbor"), (2, "Night")):
        path = chapter_path(services.settings.project_dir, number)
        path.parent.mkdir(parents=True, exist_ok=True)
        marked = b"\xef\xbb\xbf" if number == 1 else b""
        path.write_bytes(marked + chapter_markdown(number, title, "Ilse waited.").encode())
    with disable_run_logger():
        manuscript = Path(export_manuscript.fn(services, "The Salt Road", 2)).read_text()
    assert "\ufeff" not in manuscript
    assert manuscript.splitlines()[2] == "## Chapter 1: Harbor", manuscript


def test_a_chapter_summary_lists_each_event_once(tmp_path: Path) -> None:
    content = ContentStore(tmp_path / "content")
    chapter = content.put_text("drafts", "chapter_001/iter_1", "Amara climbed the stairs.")
    answer = ChapterSummary(
        summary="Amara climbs.", key_events=["1. The climb.", "the climb", "2. The lamp is lit."]
    )
    services = Services(
        settings=_settings(tmp_path), llm=TableModel({ChapterSummary: answer}), content=content
    )
    with disable_run_logger():
        summary = summarize_chapter.fn(services, 1, "The Stairs", chapter)
    assert summary.key_events == ["The climb.", "The lamp is lit."]


class HeadingsOnly(TableModel):
    """A narrative model that answers every scene with headings only (no prose once cleaned)."""

    def __init__(self) -> None:
        super().__init__({})
        self.samples: list[int] = []

    def text(self, tier: str, messages: Sequence[dict[str, Any]], **kw: Any) -> str:
        self.samples.append(kw["sample"])
        return "## Chapter 1: The Stairs\n\n### Scene 1"


def test_a_scene_never_drafted_with_prose_fails_in_one_line_after_every_attempt(
    tmp_path: Path,
) -> None:
    from core.settings import ProseThresholds
    from tasks.drafting import SceneBrief, draft_scene

    content = ContentStore(tmp_path / "content")
    context = content.put_text("contexts", "chapter_001/scene_01", "")
    brief = SceneBrief(
        title="The Drowned Letter",
        genre="mystery",
        chapter_number=1,
        chapter_title="The Stairs",
        plan=(SceneDetail(title="Scene 1", pov="Amara", setting="the stairs"),),
        scene_number=1,
        target_words=300,
    )
    llm = HeadingsOnly()
    services = Services(settings=_settings(tmp_path), llm=llm, content=content)
    with (
        disable_run_logger(),
        pytest.raises(LLMBadOutputError, match="no prose for chapter 1 scene 1 in 3 drafts"),
    ):
        draft_scene.fn(services, brief, context, 1, ProseThresholds(max_draft_attempts=3))
    assert llm.samples == [0, 1, 2]  # each attempt another sample, not the same answer again


def test_a_stage_reads_the_graph_through_a_fake_reader(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    (settings.project_dir / "chapters").mkdir(parents=True)
    (settings.project_dir / "chapters" / "chapter_004.md").write_text("# 4\n", encoding="utf-8")
    (settings.project_dir / "chapters" / "chapter_notes.md").write_text(
        "not a chapter\n", encoding="utf-8"
    )
    services = Services(
        settings=settings,
        llm=TableModel({}),
        content=ContentStore(tmp_path / "content"),
        graph_reader=FixedHistory([0, 1, 2]),
    )
    # Chapter 0 (initialization) is no written chapter; a file named like one is not either.
    assert written_chapters(services) == [1, 2, 4]
    without_graph = Services(
        settings=settings, llm=TableModel({}), content=ContentStore(tmp_path / "content")
    )
    with pytest.raises(RuntimeError, match="no graph reader"):
        written_chapters(without_graph)


def _key(task: Any, services: Services, **inputs: Any) -> str:
    """The task's cache key as Prefect computes it for a run of it with these inputs."""
    context = SimpleNamespace(task=task)  # what TaskSource reads of the run context
    key = task.cache_policy.compute_key(
        task_ctx=context, inputs={SERVICES: services, **inputs}, flow_parameters={}
    )
    assert key
    return key


PLAN = PlanRequest(
    title="The Salt Road",
    genre="mystery",
    scene_count=3,
    character_names=("Amara Vell",),
    chapter=ChapterOutline(number=1, title="The Letter", summary="Amara finds the letter."),
    iteration=1,
)
PLAN_INPUTS = {"request": PLAN}


def test_the_cache_key_holds_the_tiers_model_and_not_the_services_identity(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    first, second = Runtime(settings), Runtime(_settings(tmp_path))
    one = Services(settings=first.settings, llm=first, content=first.content)
    two = Services(settings=second.settings, llm=second, content=second.content)
    assert one is not two and one.llm is not two.llm
    assert _key(plan_scenes, one, **PLAN_INPUTS) == _key(plan_scenes, two, **PLAN_INPUTS)

    other_large = Runtime(_with_model(settings, "large", "another-model"))
    moved = Services(settings=other_large.settings, llm=other_large, content=other_large.content)
    assert _key(plan_scenes, moved, **PLAN_INPUTS) != _key(plan_scenes, one, **PLAN_INPUTS)

    # The look-alike: another tier's model is no part of this stage's answer, nor of its key.
    other_small = Runtime(_with_model(settings, "small", "another-model"))
    unmoved = Services(settings=other_small.settings, llm=other_small, content=other_small.content)
    assert _key(plan_scenes, unmoved, **PLAN_INPUTS) == _key(plan_scenes, one, **PLAN_INPUTS)
    # The inputs still count.
    again = PLAN.model_copy(update={"iteration": 2})
    assert _key(plan_scenes, one, request=again) != _key(plan_scenes, one, **PLAN_INPUTS)


def test_a_graph_reading_stage_is_keyed_by_the_history_it_reads(tmp_path: Path) -> None:
    settings, content = _settings(tmp_path), ContentStore(tmp_path / "content")
    scene = SceneDetail(
        title="The Stairs",
        pov="Amara Vell",
        setting="The lighthouse",
        characters=["Amara Vell"],
        beats=["She climbs."],
    )

    def key(fingerprint: str) -> tuple[str, History]:
        reader = History(fingerprint)
        services = Services(
            settings=settings, llm=TableModel({}), content=content, graph_reader=reader
        )
        return _key(
            retrieve_context, services, chapter_number=3, scene=scene, guidance=(), fixed_tokens=100
        ), reader

    first, reader = key("graph before chapter 3")
    again, _ = key("graph before chapter 3")
    other, _ = key("graph before chapter 3, healed")
    assert reader.asked == [3]  # the graph as of the chapter before the stage's own
    assert first == again  # another services object on the same graph: the same key
    assert other != first


def test_the_embedding_key_holds_the_embedding_model(tmp_path: Path) -> None:
    # An endpoint's model is named by its setting (the in-process model by its weights:
    # tests/tasks/test_runtime.py).
    endpoint = {"embedding_base_url": "http://127.0.0.1:9/v1"}
    settings = _settings(tmp_path).model_copy(update=endpoint)
    base = Runtime(settings)
    other = Runtime(settings.model_copy(update={"embedding_model": "another-embedder"}))
    again = Runtime(_settings(tmp_path).model_copy(update=endpoint))

    def key(rt: Runtime) -> str:
        return _key(
            embed_texts,
            Services(settings=rt.settings, llm=rt, content=rt.content),
            name="q",
            texts=("a",),
        )

    assert key(base) == key(again)
    assert key(base) != key(other)


KEY_IN_CHILD = """
import sys
from types import SimpleNamespace
from core.settings import load_settings
from tasks.planning import PlanRequest, plan_scenes
from tasks.runtime import Runtime
from tasks.services import Services
rt = Runtime(load_settings(sys.argv[1], openai_base_url="http://127.0.0.1:9/v1"))
request = PlanRequest.model_validate_json(sys.argv[2])
services = Services(settings=rt.settings, llm=rt, content=rt.content)
inputs = {"services": services, "request": request}
context = SimpleNamespace(task=plan_scenes)
print(plan_scenes.cache_policy.compute_key(task_ctx=context, inputs=inputs, flow_parameters={}))
"""


def test_the_cache_key_is_the_same_in_another_process_and_hash_seed(tmp_path: Path) -> None:
    here = _key(
        plan_scenes,
        Services(
            settings=(rt := Runtime(_settings(tmp_path))).settings, llm=rt, content=rt.content
        ),
        **PLAN_INPUTS,
    )
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "PYTHONHASHSEED": "12345"}
    child = subprocess.run(
        [sys.executable, "-c", KEY_IN_CHILD, str(tmp_path), PLAN.model_dump_json()],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        check=True,
    )
    assert child.stdout.strip().splitlines()[-1] == here


def test_validation_refuses_a_delta_of_another_chapter_before_reading_the_graph(
    tmp_path: Path,
) -> None:
    content = ContentStore(tmp_path / "content")
    delta = content.put_json(
        "deltas", "chapter_004/iter_1", ChapterDelta(chapter=4, title="The Harbor")
    )
    reader = History("graph before chapter 4")
    services = Services(
        settings=_settings(tmp_path), llm=TableModel({}), content=content, graph_reader=reader
    )
    with pytest.raises(InvalidInputError, match="is chapter 4's, not chapter 3's"):
        validate_consistency.fn(services, 3, delta)
    assert reader.asked == []  # refused before any read of the graph
