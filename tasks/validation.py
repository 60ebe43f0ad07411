"""Validation stage: consistency of a chapter delta against the story so far.

Checks (spec 001 section 5.3, plus what SAGA leaves as stubs):
- dead characters acting: a character present in this chapter whose status, as of the
  previous chapter, is dead (unless this chapter brings them back);
- contradictory traits: a character given both traits of a configured antonym pair;
- duplicated scenes: two scenes of the chapter, or a scene and an earlier chapter's
  scene, that are near-identical (embedding cosine);
- relationship evolution: a relationship that flips to its opposite (FRIEND_OF ->
  ENEMY_OF, ...) with no intervening chapter.

The checks read the graph only "as of chapter N-1", so their result does not depend on
whether this chapter's delta is in the graph yet: a resumed run gets the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np
from prefect import get_run_logger
from pydantic import BaseModel

from core.content import ContentRef
from core.runtime import runtime
from kg import vocabulary as vocab
from kg.models import ChapterDelta
from kg.retrieval import consistency_facts
from prompts.validation.models import QualityScores
from tasks.policy import graph_task

DUPLICATE_SCENE_COSINE = 0.97
OPPOSITE_RELATIONS: tuple[tuple[str, str], ...] = (
    ("FRIEND_OF", "ENEMY_OF"),
    ("ALLY_OF", "ENEMY_OF"),
    ("LOVES", "HATES"),
)


class Problem(BaseModel):
    kind: Literal["dead_character_acting", "contradictory_traits", "duplicate_scene", "relationship_flip"]
    severity: Literal["error", "warning"]
    message: str
    entities: list[str] = []
    chapters: list[int] = []


def revision_needed(scores: QualityScores, problems: Iterable[Problem], threshold: float) -> bool:
    """Revise when the editor's mean score is below the threshold or a check found an error."""
    return scores.mean < threshold or any(p.severity == "error" for p in problems)


def contradictory_traits(delta: ChapterDelta, antonyms: list[tuple[str, str]]) -> list[Problem]:
    problems = []
    for entity in delta.entities:
        traits = {t.strip().lower() for t in entity.traits}
        for left, right in antonyms:
            if left in traits and right in traits:
                problems.append(Problem(kind="contradictory_traits", severity="warning",
                                        message=f"{entity.name} is both {left} and {right} in chapter {delta.chapter}",
                                        entities=[entity.name], chapters=[delta.chapter]))
    return problems


def duplicate_scenes(delta: ChapterDelta, earlier: list[tuple[int, int, list[float]]]) -> list[Problem]:
    """Near-identical scenes within the chapter or against earlier chapters' scenes."""
    scenes = [s for s in delta.scenes if s.embedding]
    if not scenes:
        return []
    mine = _unit(np.array([s.embedding for s in scenes], dtype=np.float32))
    problems = []
    sims = mine @ mine.T
    for i in range(len(scenes)):
        for j in range(i + 1, len(scenes)):
            if sims[i, j] >= DUPLICATE_SCENE_COSINE:
                problems.append(Problem(kind="duplicate_scene", severity="error",
                                        message=f"chapter {delta.chapter} scenes {scenes[i].index} and {scenes[j].index} "
                                        f"are near-duplicates (cosine {sims[i, j]:.2f})", chapters=[delta.chapter]))
    if earlier:
        theirs = _unit(np.array([e[2] for e in earlier], dtype=np.float32))
        cross = mine @ theirs.T
        for i, j in zip(*np.nonzero(cross >= DUPLICATE_SCENE_COSINE), strict=True):
            chapter, index = earlier[j][0], earlier[j][1]
            problems.append(Problem(kind="duplicate_scene", severity="error",
                                    message=f"chapter {delta.chapter} scene {scenes[i].index} repeats chapter {chapter} "
                                    f"scene {index} (cosine {cross[i, j]:.2f})", chapters=[chapter, delta.chapter]))
    return problems


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def dead_characters_acting(delta: ChapterDelta, statuses: dict[str, tuple[str, int]]) -> list[Problem]:
    """`statuses`: normalized name -> (status, since chapter) as of the previous chapter."""
    revived = {vocab.normalize_name(s.entity) for s in delta.status_changes if s.status != "dead"}
    present: dict[str, str] = {}
    for entity in delta.entities:
        if entity.label == "Character":
            present[vocab.normalize_name(entity.name)] = entity.name
    for scene in delta.scenes:
        for name in scene.characters:
            present.setdefault(vocab.normalize_name(name), name)
    problems = []
    for key, name in present.items():
        status = statuses.get(key)
        if status and status[0] == "dead" and key not in revived:
            problems.append(Problem(kind="dead_character_acting", severity="error",
                                    message=f"{name} appears in chapter {delta.chapter} but died in chapter {status[1]}",
                                    entities=[name], chapters=[status[1], delta.chapter]))
    return problems


def relationship_flips(delta: ChapterDelta, previous: dict[tuple[str, str], tuple[str, int]]) -> list[Problem]:
    """`previous`: (source key, target key) -> (type, chapter) of the latest earlier relationship."""
    opposite = {a: b for a, b in OPPOSITE_RELATIONS} | {b: a for a, b in OPPOSITE_RELATIONS}
    problems = []
    for rel in delta.relationships:
        pair = (vocab.normalize_name(rel.source), vocab.normalize_name(rel.target))
        before = previous.get(pair) or previous.get((pair[1], pair[0]))
        if before and opposite.get(before[0]) == rel.type and before[1] == delta.chapter - 1:
            problems.append(Problem(kind="relationship_flip", severity="warning",
                                    message=f"{rel.source} and {rel.target} go from {before[0]} in chapter {before[1]} "
                                    f"to {rel.type} in chapter {delta.chapter} with no transition",
                                    entities=[rel.source, rel.target], chapters=[before[1], delta.chapter]))
    return problems


@graph_task("validate_consistency")
def validate_consistency(delta_ref: ContentRef) -> list[Problem]:
    rt = runtime()
    delta = rt.content.get_model(delta_ref, ChapterDelta)
    as_of = delta.chapter - 1
    names = sorted({e.name for e in delta.entities} | {c for s in delta.scenes for c in s.characters})
    facts = consistency_facts(rt.graph, names, as_of_chapter=as_of)
    problems = [
        *dead_characters_acting(delta, facts.statuses),
        *contradictory_traits(delta, rt.settings.healing.antonym_pairs),
        *duplicate_scenes(delta, facts.scene_embeddings),
        *relationship_flips(delta, facts.relationships),
    ]
    for problem in problems:
        get_run_logger().warning("chapter %d: %s", delta.chapter, problem.message)
    return problems
