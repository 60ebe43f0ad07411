"""Validation stage: consistency of a chapter delta against the story so far, and the
revision decision.

Checks (spec 001 section 5.3, plus what SAGA leaves as stubs); each has a crafted true case
and a look-alike that must not fire in tests/tasks/test_validation_checks.py:
- dead characters acting: a character the extraction saw present and acting (not only
  mentioned, mourned or remembered) whose status, as of the previous chapter, is dead,
  unless this chapter brings them back to life;
- contradictory traits: a character given both traits of a configured antonym pair, within
  this chapter or against the traits the graph has accumulated for them;
- duplicated scenes: two scenes of the chapter, or a scene and an earlier chapter's
  scene, that are near-identical (embedding cosine);
- relationship evolution: a relationship that turns into its opposite (FRIEND_OF ->
  ENEMY_OF, ...) against the latest known state of the pair, from whatever chapter;
- two places at once: a character located in two places within one scene that neither
  contain each other nor are where the character travels.

Checks of the text against its plan, with no model (a small model's editor scores word salad
1.00 on every axis), in tests/tasks/test_validation_checks.py with their look-alikes too:
- plan adherence: each scene names its planned characters (once is enough: a character
  named and then called "she" follows the plan) and its planned setting (one of the
  setting's distinctive words);
- run-on sentences: mean and longest sentence in words. Published fiction averages 12-20
  words a sentence; Flesch (The Art of Readable Writing, 1949) rates an average of 17 words
  "standard", 25 "difficult" and 29 or more "very difficult" (scientific prose), so a mean
  above 30 (`prose.max_mean_sentence_words`) is not fiction. The American Press Institute's
  study (1993) found readers understood under 10% of 43-word sentences; literary fiction
  still has longer ones (the opening sentence of A Tale of Two Cities has 119 words), so only
  a sentence over 100 words (`prose.max_sentence_words`) is flagged, and one long
  grammatical sentence among ordinary ones does not move the mean;
- an outline, not prose: two or more numbered or bulleted lines holding over 30% of the
  scene's words (`prose.max_list_share`; a small model answers a scene prompt with "1. The
  story begins with [A]. A character stands at [X] ..."), and a template's slots left
  unfilled ("[A]", "[Name]"; not "[sic]" nor a footnote's "[1]"). A note of three items a
  character reads holds a few of a scene's 450 words.

The checks read the graph only "as of chapter N-1", so their result does not depend on
whether this chapter's delta is in the graph yet, and the stage is cached under the history
of the graph it reads: a resumed run gets the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import numpy as np
from prefect import get_run_logger
from pydantic import BaseModel

from core.content import ContentRef, ContentStore
from core.errors import InvalidInputError
from core.grounding import KnownNames, SourceText, distinctive_tokens, mentions
from core.prose import (
    ProseMetrics,
    assistant_talk,
    listed,
    measure,
    placeholders,
    sentence_lengths,
    words_of,
)
from core.settings import ProseThresholds
from kg import vocabulary as vocab
from kg.models import ChapterDelta
from kg.retrieval import consistency_facts
from prompts.knowledge.models import SceneExtraction
from prompts.narrative.models import SceneDetail
from prompts.validation.models import QualityScores
from tasks.assembly import SCENE_BREAK
from tasks.policy import graph_read_task
from tasks.services import Services

DUPLICATE_SCENE_COSINE = 0.97
DUPLICATE_SCENE_TRIGRAM_OVERLAP = 0.5


class Problem(BaseModel):
    kind: Literal[
        "dead_character_acting",
        "contradictory_traits",
        "duplicate_scene",
        "relationship_flip",
        "two_places_at_once",
    ]
    severity: Literal["error", "warning"]
    message: str
    entities: list[str] = []
    chapters: list[int] = []


class SceneCheck(BaseModel):
    """One scene's text against its plan and the run-on thresholds (no model involved)."""

    scene: int
    missing_characters: list[str] = []
    setting: str = ""
    setting_named: bool | None = None  # None: the plan names no setting
    mean_sentence_words: float = 0.0
    max_sentence_words: int = 0
    list_share: float = 0.0  # of its words in list lines: an outline, not prose
    placeholders: list[str] = []  # template slots left unfilled: "[A]", "[Name]"
    # Sentences that talk to the requester about the text ("Here's a revised version"):
    assistant_talk: list[str] = []
    problems: list[str] = []


class RevisionDecision(BaseModel):
    revise: bool
    reasons: list[str] = []


def contradictory_traits(
    delta: ChapterDelta,
    antonyms: list[tuple[str, str]],
    accumulated: dict[str, list[str]] | None = None,
) -> list[Problem]:
    """A character given both traits of an antonym pair: within this chapter, or this
    chapter against the traits the graph has accumulated for them (`accumulated`:
    normalized name -> traits as of the previous chapter)."""
    accumulated = accumulated or {}
    problems = []
    for entity in delta.entities:
        traits = {t.strip().lower() for t in entity.traits}
        before = {t.strip().lower() for t in accumulated.get(vocab.normalize_name(entity.name), [])}
        for left, right in antonyms:
            if left in traits and right in traits:
                problems.append(
                    Problem(
                        kind="contradictory_traits",
                        severity="warning",
                        message=f"{entity.name} is both {left} and {right} in chapter {delta.chapter}",
                        entities=[entity.name],
                        chapters=[delta.chapter],
                    )
                )
                continue
            for now, was in ((left, right), (right, left)):
                if now in traits and was in before and now not in before:
                    problems.append(
                        Problem(
                            kind="contradictory_traits",
                            severity="warning",
                            message=f"{entity.name} is {now} in chapter {delta.chapter} but the story "
                            f"so far made them {was}",
                            entities=[entity.name],
                            chapters=[delta.chapter],
                        )
                    )
    return problems


def duplicate_scenes(
    delta: ChapterDelta,
    earlier: list[tuple[int, int, list[float]]],
    text_of: Callable[[int, int], str | None] | None = None,
) -> list[Problem]:
    """Near-identical scenes within the chapter or against earlier chapters' scenes.

    An embedding match is confirmed on the words when both texts are at hand (`text_of`:
    (chapter, scene index) -> text or None): a model that is no embedding model (the embedded
    default pools a 135M chat model) puts unrelated scenes above any cosine threshold, and
    two scenes that really repeat share most of their word trigrams.
    """
    scenes = [s for s in delta.scenes if s.embedding]
    if not scenes:
        return []

    def same_words(a: tuple[int, int], b: tuple[int, int]) -> bool:
        first, second = (text_of(*a), text_of(*b)) if text_of is not None else (None, None)
        if first is None or second is None:
            return True  # nothing to confirm with: the embedding decides
        return trigram_overlap(first, second) >= DUPLICATE_SCENE_TRIGRAM_OVERLAP

    mine = _unit(np.array([s.embedding for s in scenes], dtype=np.float32))
    problems = []
    sims = mine @ mine.T
    for i in range(len(scenes)):
        for j in range(i + 1, len(scenes)):
            if sims[i, j] >= DUPLICATE_SCENE_COSINE and same_words(
                (delta.chapter, scenes[i].index), (delta.chapter, scenes[j].index)
            ):
                problems.append(
                    Problem(
                        kind="duplicate_scene",
                        severity="error",
                        message=f"chapter {delta.chapter} scenes {scenes[i].index} and {scenes[j].index} "
                        f"are near-duplicates (cosine {sims[i, j]:.2f})",
                        chapters=[delta.chapter],
                    )
                )
    if earlier:
        theirs = _unit(np.array([e[2] for e in earlier], dtype=np.float32))
        cross = mine @ theirs.T
        for i, j in zip(*np.nonzero(cross >= DUPLICATE_SCENE_COSINE), strict=True):
            chapter, index = earlier[j][0], earlier[j][1]
            if not same_words((delta.chapter, scenes[i].index), (chapter, index)):
                continue
            problems.append(
                Problem(
                    kind="duplicate_scene",
                    severity="error",
                    message=f"chapter {delta.chapter} scene {scenes[i].index} repeats chapter {chapter} "
                    f"scene {index} (cosine {cross[i, j]:.2f})",
                    chapters=[chapter, delta.chapter],
                )
            )
    return problems


def trigram_overlap(first: str, second: str) -> float:
    """Shared word trigrams / the trigrams of the shorter text (containment, so a scene
    repeated inside a longer one still counts)."""
    a, b = (set(zip(w, w[1:], w[2:], strict=False)) for w in (words_of(first), words_of(second)))
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def present_characters(extractions: Sequence[SceneExtraction]) -> dict[str, tuple[str, list[int]]]:
    """Characters the extraction saw on the scene and acting (not only mentioned or
    remembered): normalized name -> (name, scene numbers)."""
    present: dict[str, tuple[str, list[int]]] = {}
    for number, extraction in enumerate(extractions, start=1):
        for entity in extraction.entities:
            if entity.kind == "Character" and entity.presence == "present" and entity.name.strip():
                name, scenes = present.setdefault(
                    vocab.normalize_name(entity.name), (entity.name.strip(), [])
                )
                if number not in scenes:
                    scenes.append(number)
    return present


def dead_characters_acting(
    delta: ChapterDelta,
    extractions: Sequence[SceneExtraction],
    statuses: dict[str, tuple[str, int]],
) -> list[Problem]:
    """A character present and acting in this chapter who was dead as of the previous one.

    `statuses`: normalized name -> (status, since chapter) as of the previous chapter. A dead
    character who is only mentioned, mourned or remembered is fine; only a status change back
    to "alive" in this chapter (a resurrection the story tells) excuses one who acts.
    """
    revived = {vocab.normalize_name(s.entity) for s in delta.status_changes if s.status == "alive"}
    problems = []
    for key, (name, scenes) in present_characters(extractions).items():
        status = statuses.get(key)
        if status and status[0] == "dead" and key not in revived:
            where = ", ".join(str(n) for n in scenes)
            problems.append(
                Problem(
                    kind="dead_character_acting",
                    severity="error",
                    message=f"{name} acts in chapter {delta.chapter} (scene {where}) "
                    f"but died in chapter {status[1]}",
                    entities=[name],
                    chapters=[status[1], delta.chapter],
                )
            )
    return problems


def relationship_flips(
    delta: ChapterDelta, history: dict[tuple[str, str], dict[str, int]]
) -> list[Problem]:
    """A relationship that turns into its opposite with no transition.

    `history`: (source key, target key) -> {type: latest chapter} of the relationships known
    before this chapter, from ANY earlier chapter. The latest known state of the pair among
    the opposable types (friend/ally/enemy, love/hate) is what this chapter is compared with,
    so a flip is found however many chapters lie between, and a change the story already
    made earlier (FRIEND_OF, then ENEMY_OF) is not reported again.
    """
    opposite = vocab.OPPOSITES
    problems = []
    for rel in delta.relationships:
        if rel.type not in opposite:
            continue
        pair = (vocab.normalize_name(rel.source), vocab.normalize_name(rel.target))
        known = {**history.get((pair[1], pair[0]), {})}
        for kind, chapter in history.get(pair, {}).items():
            known[kind] = max(chapter, known.get(kind, chapter))
        states = [(chapter, kind) for kind, chapter in known.items() if kind in opposite]
        if not states:
            continue
        latest_chapter = max(chapter for chapter, _ in states)
        latest = {kind for chapter, kind in states if chapter == latest_chapter}
        if rel.type in latest:
            continue  # the pair already stands here (or the story recorded both at once)
        flipped = sorted(kind for kind in latest if rel.type in opposite[kind])
        if flipped:
            problems.append(
                Problem(
                    kind="relationship_flip",
                    severity="warning",
                    message=f"{rel.source} and {rel.target} go from {flipped[0]} (latest known, "
                    f"chapter {latest_chapter}) to {rel.type} in chapter {delta.chapter} "
                    f"with no transition",
                    entities=[rel.source, rel.target],
                    chapters=[latest_chapter, delta.chapter],
                )
            )
    return problems


def _inside(place: str, other: str, containers: dict[str, set[str]]) -> bool:
    """Whether `place` lies (transitively) inside `other`."""
    seen, todo = set(), [place]
    while todo:
        current = todo.pop()
        for parent in containers.get(current, ()):
            if parent == other:
                return True
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return False


def two_places_at_once(
    chapter: int, extractions: Sequence[SceneExtraction], known_containers: dict[str, set[str]]
) -> list[Problem]:
    """A character LOCATED_IN two places within one scene that neither contain each other
    (PART_OF, from the graph or this chapter's extraction) nor are a place the character
    TRAVELS_TO during the scene."""
    containers = {key: set(parents) for key, parents in known_containers.items()}
    for extraction in extractions:
        for rel in extraction.relationships:
            if vocab.normalize_rel_type(rel.type)[0] == "PART_OF":
                containers.setdefault(vocab.normalize_name(rel.source), set()).add(
                    vocab.normalize_name(rel.target)
                )
    problems = []
    for number, extraction in enumerate(extractions, start=1):
        located: dict[str, dict[str, str]] = {}
        travels: dict[str, set[str]] = {}
        names: dict[str, str] = {}
        for rel in extraction.relationships:
            kind = vocab.normalize_rel_type(rel.type)[0]
            who, where = vocab.normalize_name(rel.source), vocab.normalize_name(rel.target)
            if not who or not where:
                continue
            names.setdefault(who, rel.source.strip())
            if kind == "LOCATED_IN":
                located.setdefault(who, {})[where] = rel.target.strip()
            elif kind == "TRAVELS_TO":
                travels.setdefault(who, set()).add(where)
        for who, places in located.items():
            fixed = [p for p in places if p not in travels.get(who, set())]
            for i, a in enumerate(fixed):
                clash = next(
                    (
                        b
                        for b in fixed[i + 1 :]
                        if not _inside(a, b, containers) and not _inside(b, a, containers)
                    ),
                    None,
                )
                if clash is not None:
                    problems.append(
                        Problem(
                            kind="two_places_at_once",
                            severity="warning",
                            message=f"{names[who]} is in both {places[a]} and {places[clash]} in "
                            f"chapter {chapter} scene {number}",
                            entities=[names[who], places[a], places[clash]],
                            chapters=[chapter],
                        )
                    )
                    break
    return problems


def check_scene(
    number: int, text: str, plan: SceneDetail, cast: KnownNames, thresholds: ProseThresholds
) -> SceneCheck:
    """Does the scene name its planned characters and setting, are its sentences sentences,
    and is it prose (not a list of notes about the story, not a template with its slots, not
    an assistant's talk about the text)?"""
    source = SourceText(text)
    planned = list(dict.fromkeys(c.strip() for c in plan.characters if c.strip()))
    missing = [name for name in planned if not mentions(source, name, cast)]
    setting = plan.setting.strip()
    setting_named = None
    if distinctive_tokens(setting):
        setting_named = mentions(source, setting, cast) or any(
            source.has_phrase(t) for t in distinctive_tokens(setting)
        )
    lengths = sentence_lengths(text)
    mean = round(sum(lengths) / len(lengths), 1) if lengths else 0.0
    longest = max(lengths, default=0)
    problems = []
    if missing:
        problems.append(
            f"does not name its planned character{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        )
    if setting_named is False:
        problems.append(f"is not set where planned ({setting[:80]})")
    if mean > thresholds.max_mean_sentence_words:
        problems.append(
            f"run-on sentences: mean {mean:.0f} words (at most {thresholds.max_mean_sentence_words:.0f})"
        )
    if longest > thresholds.max_sentence_words:
        problems.append(
            f"run-on sentence of {longest} words (at most {thresholds.max_sentence_words})"
        )
    list_lines, share = listed(text)
    if list_lines >= 2 and share > thresholds.max_list_share:
        problems.append(
            f"is written as a list, not prose ({list_lines} numbered or bulleted lines hold "
            f"{share:.0%} of its words; at most {thresholds.max_list_share:.0%})"
        )
    slots = placeholders(text)
    if slots:
        problems.append(f"holds template slots left unfilled: {', '.join(slots[:5])}")
    talk = assistant_talk(text)
    if talk:
        problems.append(
            f"talks to its reader about the text instead of telling the story ({len(talk)} "
            f"sentence{'s' if len(talk) > 1 else ''}): {talk[0][:80]!r}"
        )
    return SceneCheck(
        scene=number,
        missing_characters=missing,
        setting=setting,
        setting_named=setting_named,
        mean_sentence_words=mean,
        max_sentence_words=longest,
        list_share=share,
        placeholders=slots,
        assistant_talk=talk,
        problems=problems,
    )


def check_scenes(
    texts: Sequence[str],
    plan: Sequence[SceneDetail],
    cast: Sequence[str],
    thresholds: ProseThresholds,
) -> list[SceneCheck]:
    known = KnownNames([name] for name in cast)
    return [
        check_scene(number, text, detail, known, thresholds)
        for number, (text, detail) in enumerate(zip(texts, plan, strict=True), start=1)
    ]


def measure_chapter(
    texts: Sequence[str], target_words: int, thresholds: ProseThresholds
) -> ProseMetrics:
    """The whole chapter against the guard (a sentence may loop across scenes)."""
    return measure(SCENE_BREAK.join(texts), target_words * len(texts), thresholds)


def decide_revision(
    scores: QualityScores,
    problems: Iterable[Problem],
    scene_metrics: Sequence[ProseMetrics],
    chapter_metrics: ProseMetrics,
    threshold: float,
    scene_checks: Sequence[SceneCheck] = (),
) -> RevisionDecision:
    """Revise when the editor's mean is below the threshold, a consistency check found an
    error, the deterministic prose metrics fail (a looping chapter is rewritten whatever
    the editor said: a small model's editor scores loops as fine), or a scene leaves its
    plan or runs its sentences on."""
    reasons = []
    if scores.mean < threshold:
        reasons.append(f"editor mean score {scores.mean:.2f} < {threshold:.2f}")
    errors = [p for p in problems if p.severity == "error"]
    reasons += [f"consistency: {p.message}" for p in errors]
    for number, metrics in enumerate(scene_metrics, start=1):
        if not metrics.clean:
            reasons.append(f"scene {number} prose: " + "; ".join(metrics.failures))
    if chapter_metrics.failures and all(m.clean for m in scene_metrics):
        reasons.append("chapter prose: " + "; ".join(chapter_metrics.failures))
    reasons += [f"scene {c.scene} " + "; ".join(c.problems) for c in scene_checks if c.problems]
    return RevisionDecision(revise=bool(reasons), reasons=reasons)


def degeneration_flags(
    scene_metrics: Sequence[ProseMetrics], chapter_metrics: ProseMetrics
) -> list[str]:
    """Why a finished chapter is flagged: a scene that never came clean, or a chapter that
    loops across its scenes. Empty when the chapter passes the guard."""
    flags = [
        f"scene {number} never passed the degeneration guard: " + "; ".join(metrics.failures)
        for number, metrics in enumerate(scene_metrics, start=1)
        if not metrics.clean
    ]
    # Length is judged per scene; the chapter adds what only shows across scenes.
    looping = [f for f in chapter_metrics.failures if "target" not in f]
    if looping:
        flags.append("chapter text fails the degeneration guard: " + "; ".join(looping))
    return flags


def quality_rows(
    scene_metrics: Sequence[ProseMetrics],
    attempts: Sequence[int],
    chapter_metrics: ProseMetrics,
    scores: QualityScores,
    flags: Sequence[str],
    scene_checks: Sequence[SceneCheck] = (),
    facts: Sequence[tuple[int, int]] = (),
) -> list[dict[str, object]]:
    """The chapter's quality table: one row per scene and one for the chapter. `facts`: per
    scene, (extracted facts kept, dropped) by grounding."""

    def row(name: str, metrics: ProseMetrics, drafts: int | str) -> dict[str, object]:
        return {
            "part": name,
            "words": metrics.words,
            "target_words": metrics.target_words,
            "distinct_bigrams": metrics.distinct_bigrams,
            "distinct_trigrams": metrics.distinct_trigrams,
            "max_sentence_repeats": metrics.max_sentence_repeats,
            "compression_ratio": metrics.compression_ratio,
            "drafts": drafts,
            "clean": metrics.clean,
            "failures": "; ".join(metrics.failures),
        }

    rows = [
        row(f"scene {n}", m, a)
        for n, (m, a) in enumerate(zip(scene_metrics, attempts, strict=True), start=1)
    ]
    for scene_row, check in zip(rows, scene_checks, strict=False):
        scene_row.update(
            {
                "mean_sentence_words": check.mean_sentence_words,
                "max_sentence_words": check.max_sentence_words,
                "list_share": check.list_share,
                "missing_characters": ", ".join(check.missing_characters),
                "setting_named": "" if check.setting_named is None else check.setting_named,
                "plan_problems": "; ".join(check.problems),
            }
        )
    for scene_row, (kept, dropped) in zip(rows, facts, strict=False):
        scene_row.update({"facts_kept": kept, "facts_dropped": dropped})
    chapter = row("chapter", chapter_metrics, sum(attempts))
    chapter.update({"clean": not flags, "failures": "; ".join(flags)})
    if scene_checks:
        chapter.update(
            {
                "mean_sentence_words": round(
                    sum(c.mean_sentence_words for c in scene_checks) / len(scene_checks), 1
                ),
                "max_sentence_words": max(c.max_sentence_words for c in scene_checks),
                "plan_problems": sum(len(c.problems) for c in scene_checks),
            }
        )
    if facts:
        chapter.update(
            {"facts_kept": sum(k for k, _ in facts), "facts_dropped": sum(d for _, d in facts)}
        )
    chapter.update(
        {
            "editor_mean": round(scores.mean, 3),
            **{k: round(v, 2) for k, v in scores.model_dump(exclude={"feedback"}).items()},
        }
    )
    table = [*rows, chapter]
    columns = list(dict.fromkeys(key for r in table for key in r))
    return [{key: r.get(key, "") for key in columns} for r in table]


def scene_text_reader(
    content: ContentStore,
    delta: ChapterDelta,
    earlier: dict[tuple[int, int], tuple[str, str | None]],
) -> Callable[[int, int], str | None]:
    """(chapter, scene) -> text, for this chapter's scenes and the graph's earlier ones."""
    where = dict(earlier) | {
        (delta.chapter, s.index): (s.text_ref, s.text_sha) for s in delta.scenes if s.text_ref
    }

    def text_of(chapter: int, scene: int) -> str | None:
        found = where.get((chapter, scene))
        return content.get_text_at(*found) if found else None

    return text_of


@graph_read_task("validate_consistency", chapter="chapter")
def validate_consistency(
    services: Services,
    chapter: int,
    delta_ref: ContentRef,
    extraction_refs: tuple[ContentRef, ...] = (),
) -> list[Problem]:
    """The consistency problems of chapter `chapter`'s delta against the graph as of the
    chapter before. Cached under that graph's history (tasks.policy.graph_read_task): a
    replayed chapter gets the answer it got the first time, so its revision decision
    replays too."""
    delta = services.content.get_model(delta_ref, ChapterDelta)
    if delta.chapter != chapter:
        raise InvalidInputError(
            f"the delta {delta_ref.path} is chapter {delta.chapter}'s, not chapter {chapter}'s"
        )
    extractions = [services.content.get_model(ref, SceneExtraction) for ref in extraction_refs]
    as_of = chapter - 1
    names = sorted(
        {e.name for e in delta.entities}
        | {c for s in delta.scenes for c in s.characters}
        | {n for n, _ in present_characters(extractions).values()}
    )
    facts = consistency_facts(
        services.graph_reader,
        names,
        as_of_chapter=as_of,
        embedded_by=services.llm.embedding_fingerprint(),
    )
    problems = [
        *dead_characters_acting(delta, extractions, facts.statuses),
        *contradictory_traits(delta, services.settings.healing.antonym_pairs, facts.traits),
        *duplicate_scenes(
            delta,
            facts.scene_embeddings,
            scene_text_reader(services.content, delta, facts.scene_texts),
        ),
        *relationship_flips(delta, facts.relationship_types),
        *two_places_at_once(delta.chapter, extractions, facts.containers),
    ]
    for problem in problems:
        get_run_logger().warning("chapter %d: %s", delta.chapter, problem.message)
    return problems
