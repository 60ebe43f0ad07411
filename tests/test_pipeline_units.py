"""Pure pipeline logic: extraction merge/normalization, consistency checks, act ranges.

The consistency checks' true cases and look-alikes live in tests/test_validation_checks.py."""

from __future__ import annotations

from kg.models import ChapterDelta, Entity, SceneDelta
from prompts.knowledge.models import SceneExtraction
from tasks.consolidation import merge_extractions
from tasks.initialization import act_ranges
from tasks.validation import contradictory_traits, duplicate_scenes


def _extraction(entities: list[dict], relationships: list[dict] | None = None, statuses: list[dict] | None = None) -> SceneExtraction:
    return SceneExtraction.model_validate({"entities": entities, "relationships": relationships or [],
                                           "status_changes": statuses or []})


def test_merge_keeps_one_entity_per_name_with_every_scene_as_source() -> None:
    scene1 = _extraction([{"name": "Mara Quill", "kind": "Character", "description": "keeper", "traits": ["brave"]}],
                         [{"source": "Mara Quill", "target": "Tobias", "type": "is friends with"},
                          {"source": "Mara Quill", "target": "Mara Quill", "type": "LOVES"}])
    scene2 = _extraction([{"name": "mara quill", "kind": "Character", "description": "the lighthouse keeper",
                           "traits": ["Brave", "stubborn"]},
                          {"name": "The Guild", "kind": "Organization"}],
                         [{"source": "Mara Quill", "target": "Tobias", "type": "FRIEND_OF"},
                          {"source": "Mara Quill", "target": "Tobias", "type": "owes money to"}])
    entities, rels, _ = merge_extractions(3, [scene1, scene2])
    mara = next(e for e in entities if e.name == "Mara Quill")
    assert [s.scene for s in mara.sources] == [1, 2]
    assert mara.traits == ["brave", "stubborn"]
    assert mara.description == "the lighthouse keeper."  # a finished sentence
    assert next(e for e in entities if e.name == "The Guild").label == "Faction"
    # "is friends with" and FRIEND_OF are one relationship; the self-loop is dropped;
    # an unknown type is kept as RELATES_TO with its raw text.
    assert sorted((r.type, r.raw_type) for r in rels) == [("FRIEND_OF", "is friends with"), ("RELATES_TO", "owes money to")]


def test_contradictory_traits_and_clean_case() -> None:
    delta = ChapterDelta(chapter=2, entities=[Entity(label="Character", name="Tobias", traits=["Brave", "cowardly"]),
                                              Entity(label="Character", name="Mara", traits=["brave"])])
    found = contradictory_traits(delta, [("brave", "cowardly")])
    assert [p.entities for p in found] == [["Tobias"]]


def test_duplicate_scenes_within_and_across_chapters() -> None:
    delta = ChapterDelta(chapter=4, scenes=[SceneDelta(index=1, embedding=[1.0, 0.0, 0.0]),
                                            SceneDelta(index=2, embedding=[0.999, 0.01, 0.0]),
                                            SceneDelta(index=3, embedding=[0.0, 0.0, 1.0])])
    problems = duplicate_scenes(delta, earlier=[(2, 1, [0.0, 0.0, 1.0]), (2, 2, [0.0, 1.0, 0.0])])
    messages = sorted(p.message for p in problems)
    assert len(problems) == 2
    assert "scene 3 repeats chapter 2 scene 1" in messages[0] and "scenes 1 and 2" in messages[1]


def test_act_ranges_cover_every_chapter_once() -> None:
    assert act_ranges(7, 3) == [(1, 1, 3), (2, 4, 5), (3, 6, 7)]
    assert act_ranges(2, 3) == [(1, 1, 1), (2, 2, 2)]


def test_chapter_heading_numbers_a_title_once() -> None:
    from tasks.export import chapter_heading

    assert chapter_heading(1, "Chapter 1: Chapter 1: The Rising Tide") == "Chapter 1: The Rising Tide"
    assert chapter_heading(3, "chapter III - The Ford") == "Chapter 3: The Ford"
    assert chapter_heading(2, "The Chapter 7 Problem") == "Chapter 2: The Chapter 7 Problem"
    assert chapter_heading(4, "Chapter 4") == "Chapter 4"
    assert chapter_heading(5, "Chapterhouse") == "Chapter 5: Chapterhouse"
