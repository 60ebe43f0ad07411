"""The consistency checks, the revision decision and the editor's score scale.

Every detector has its crafted true case AND a look-alike that must not fire. The
graph-backed test at the end checks that what the checks read (accumulated traits, the
latest relationship state from any chapter, PART_OF containment) comes from the graph.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.prose import measure
from core.settings import ProseThresholds
from kg import retrieval
from kg.models import ChapterDelta, Entity, EntitySource, Relationship, SceneDelta, StatusChange
from kg.store import GraphStore
from prompts.knowledge.models import SceneExtraction
from prompts.narrative.models import SceneDetail
from prompts.validation.models import QualityScores
from tasks.validation import (
    Problem,
    check_scenes,
    contradictory_traits,
    dead_characters_acting,
    decide_revision,
    degeneration_flags,
    duplicate_scenes,
    relationship_flips,
    two_places_at_once,
)
from tests.support.prose_samples import CLEAN_PROSE, LOOP


def scene(entities: list[dict], relationships: list[dict] | None = None) -> SceneExtraction:
    return SceneExtraction.model_validate(
        {"entities": entities, "relationships": relationships or [], "status_changes": []}
    )


def character(name: str, presence: str = "present", traits: list[str] | None = None) -> dict:
    return {"name": name, "kind": "Character", "presence": presence, "traits": traits or []}


GOOD = QualityScores(
    coherence=0.8, prose_quality=0.8, plot_advancement=0.8, pacing=0.8, tone_consistency=0.8
)


# --- dead characters acting ------------------------------------------------------------------


def test_dead_character_acting_is_found() -> None:
    delta = ChapterDelta(chapter=5)
    extractions = [scene([character("Mara")]), scene([character("Elsa"), character("Mara")])]
    problems = dead_characters_acting(
        delta, extractions, {"elsa": ("dead", 3), "mara": ("alive", 0)}
    )
    assert [(p.kind, p.entities, p.chapters, p.severity) for p in problems] == [
        ("dead_character_acting", ["Elsa"], [3, 5], "error")
    ]
    assert "scene 2" in problems[0].message


def test_dead_character_mourned_or_remembered_is_not_flagged() -> None:
    delta = ChapterDelta(chapter=5, entities=[Entity(label="Character", name="Elsa")])
    extractions = [scene([character("Mara"), character("Elsa", presence="mentioned")])]
    assert dead_characters_acting(delta, extractions, {"elsa": ("dead", 3)}) == []


def test_only_a_return_to_life_excuses_a_dead_character_acting() -> None:
    extractions = [scene([character("Elsa")])]
    statuses = {"elsa": ("dead", 3)}
    injured = ChapterDelta(
        chapter=5, status_changes=[StatusChange(entity="Elsa", status="injured")]
    )
    assert [p.entities for p in dead_characters_acting(injured, extractions, statuses)] == [
        ["Elsa"]
    ]
    revived = ChapterDelta(chapter=5, status_changes=[StatusChange(entity="Elsa", status="alive")])
    assert dead_characters_acting(revived, extractions, statuses) == []


# --- traits against what the graph has accumulated -------------------------------------------


ANTONYMS = [("brave", "cowardly"), ("kind", "cruel")]


def test_trait_contradicting_accumulated_traits_is_found() -> None:
    delta = ChapterDelta(
        chapter=4, entities=[Entity(label="Character", name="Tobias", traits=["Cowardly", "tall"])]
    )
    found = contradictory_traits(delta, ANTONYMS, {"tobias": ["brave", "stubborn"]})
    assert [(p.kind, p.entities) for p in found] == [("contradictory_traits", ["Tobias"])]
    assert "cowardly" in found[0].message and "brave" in found[0].message


def test_trait_contradiction_within_the_chapter_is_found() -> None:
    delta = ChapterDelta(
        chapter=2, entities=[Entity(label="Character", name="Tobias", traits=["brave", "cowardly"])]
    )
    assert [p.entities for p in contradictory_traits(delta, ANTONYMS, {})] == [["Tobias"]]


def test_consistent_or_other_characters_traits_are_not_flagged() -> None:
    delta = ChapterDelta(
        chapter=4,
        entities=[
            Entity(label="Character", name="Tobias", traits=["brave", "kind"]),  # same as before
            Entity(label="Character", name="Mara", traits=["cowardly"]),  # someone else was brave
        ],
    )
    assert contradictory_traits(delta, ANTONYMS, {"tobias": ["brave"], "elsa": ["brave"]}) == []


# --- relationship changes against the latest known state ------------------------------------


def enemies(chapter: int) -> ChapterDelta:
    return ChapterDelta(
        chapter=chapter,
        relationships=[Relationship(source="Mara", target="Tobias", type="ENEMY_OF")],
    )


def test_flip_against_a_state_from_many_chapters_ago_is_found() -> None:
    # FRIEND_OF was set in chapter 1 and nothing changed it since: chapter 6 is still a flip.
    found = relationship_flips(enemies(6), {("mara", "tobias"): {"FRIEND_OF": 1, "LOCATED_IN": 5}})
    assert [(p.kind, p.chapters) for p in found] == [("relationship_flip", [1, 6])]
    assert relationship_flips(
        enemies(6), {("tobias", "mara"): {"FRIEND_OF": 2}}
    )  # either direction


def test_change_the_story_already_made_is_not_a_flip() -> None:
    # Friends in chapter 1, enemies since chapter 3: enemies again in chapter 6 is no news.
    assert (
        relationship_flips(enemies(6), {("mara", "tobias"): {"FRIEND_OF": 1, "ENEMY_OF": 3}}) == []
    )
    # Unrelated pair, and a pair with no opposable history.
    assert relationship_flips(enemies(6), {("mara", "elsa"): {"FRIEND_OF": 1}}) == []
    assert relationship_flips(enemies(6), {("mara", "tobias"): {"FAMILY_OF": 1}}) == []


# --- a character in two places at once -------------------------------------------------------


def located(who: str, where: str, kind: str = "LOCATED_IN") -> dict:
    return {"source": who, "target": where, "type": kind}


def test_character_in_two_places_in_one_scene_is_found() -> None:
    extractions = [
        scene(
            [character("Mara")],
            [located("Mara", "the lighthouse"), located("Mara", "Kirkwall harbour")],
        )
    ]
    found = two_places_at_once(3, extractions, {})
    assert [(p.kind, p.entities) for p in found] == [
        ("two_places_at_once", ["Mara", "the lighthouse", "Kirkwall harbour"])
    ]
    assert "scene 1" in found[0].message


def test_nested_places_travel_and_different_scenes_are_not_two_places() -> None:
    nested_in_scene = scene(
        [character("Mara")],
        [
            located("Mara", "the lamp room"),
            located("Mara", "the lighthouse"),
            located("the lamp room", "the lighthouse", "PART_OF"),
        ],
    )
    nested_in_graph = scene(
        [character("Mara")], [located("Mara", "the gallery"), located("Mara", "the lighthouse")]
    )
    travels = scene(
        [character("Mara")],
        [
            located("Mara", "the cottage"),
            located("Mara", "the lighthouse"),
            located("Mara", "the lighthouse", "went to"),
        ],
    )
    two_people = scene(
        [character("Mara"), character("Tobias")],
        [located("Mara", "the lighthouse"), located("Tobias", "Kirkwall harbour")],
    )
    scene_one, scene_two = (
        scene([], [located("Mara", "the lighthouse")]),
        scene([], [located("Mara", "Kirkwall")]),
    )
    graph_containers = {"gallery": {"lighthouse"}}  # normalized names (no leading article)
    for extractions in (
        [nested_in_scene],
        [nested_in_graph],
        [travels],
        [two_people],
        [scene_one, scene_two],
    ):
        assert two_places_at_once(3, extractions, graph_containers) == []


# --- the revision decision and the editor's scale ---------------------------------------------


def test_revision_decision_combines_editor_metrics_and_findings() -> None:
    thresholds = ProseThresholds()
    clean, looping = measure(CLEAN_PROSE, 150, thresholds), measure(LOOP, 150, thresholds)
    assert clean.clean and not looping.clean
    assert decide_revision(GOOD, [], [clean], clean, 0.5).revise is False
    # The editor's praise does not save a looping scene.
    decision = decide_revision(
        GOOD, [], [clean, looping], measure(CLEAN_PROSE + " " + LOOP, 300, thresholds), 0.5
    )
    assert decision.revise and any("scene 2 prose" in r for r in decision.reasons)
    error = Problem(kind="dead_character_acting", severity="error", message="Elsa acts")
    warning = Problem(kind="relationship_flip", severity="warning", message="flip")
    assert decide_revision(GOOD, [error], [clean], clean, 0.5).reasons == ["consistency: Elsa acts"]
    assert decide_revision(GOOD, [warning], [clean], clean, 0.5).revise is False
    low = GOOD.model_copy(update={"coherence": 0.1, "pacing": 0.1, "prose_quality": 0.1})
    assert decide_revision(low, [], [clean], clean, 0.5).revise


def test_chapter_looping_across_clean_scenes_is_flagged() -> None:
    thresholds = ProseThresholds(max_sentence_repeats=3)
    line = "The bell rang twice over the black water. "
    middle = CLEAN_PROSE.index(". ", 350) + 2  # cut at a sentence boundary
    parts = [CLEAN_PROSE[:middle] + line * 3, CLEAN_PROSE[middle:] + " " + line * 3]
    scenes = [measure(p, 80, thresholds) for p in parts]
    chapter = measure(" ".join(parts), 160, thresholds)
    assert all(m.clean for m in scenes) and chapter.max_sentence_repeats == 6
    assert (
        degeneration_flags(scenes, chapter)
        and decide_revision(GOOD, [], scenes, chapter, 0.5).revise
    )
    assert (
        degeneration_flags(
            [measure(CLEAN_PROSE, 150, thresholds)], measure(CLEAN_PROSE, 150, thresholds)
        )
        == []
    )


# --- the text against its plan, and run-on sentences -----------------------------------------

PLAN = SceneDetail(
    title="The letter",
    pov="Mara Quill",
    setting="the lamp room of Gull Rock lighthouse",
    characters=["Mara Quill", "Tobias Venn"],
    beats=["Mara reads the letter"],
)
CAST = ("Mara Quill", "Tobias Venn")
THRESHOLDS = ProseThresholds()
# The tiny model's word salad: few full stops, sentences of 40-90 words, nobody from the plan.
WORD_SALAD = (
    "98 reads more options than they want or need while using any other web platform such as the browser "
    "which would just render an empty page that would actually work so well and please note that any "
    "changes you make may have unintended consequences upon website functionality across different "
    "browsers and operating systems if not implemented properly because the character has been removed "
    "but remains active again once anything else within your script starts running after setting up "
    "scripts above them at speed without taking time off based code because of issues being encountered. "
) * 3


def test_scene_written_to_plan_passes() -> None:
    # Tobias is named once and is "he" after that; Mara only by her first name: both follow the plan.
    text = CLEAN_PROSE + " Tobias Venn knocked at the lamp-room door. He waited, then he left."
    [check] = check_scenes([text], [PLAN], CAST, THRESHOLDS)
    assert check.problems == [] and check.missing_characters == [] and check.setting_named is True
    assert 12 <= check.mean_sentence_words <= 20


def test_scene_that_leaves_its_plan_is_found() -> None:
    elsewhere = SceneDetail(
        title="x",
        pov="Mara Quill",
        setting="the Kirkwall ferry terminal",
        characters=["Mara Quill", "Ilse Marrow"],
        beats=[],
    )
    [check] = check_scenes([CLEAN_PROSE], [elsewhere], CAST, THRESHOLDS)
    assert check.missing_characters == ["Ilse Marrow"]
    assert any("planned character Ilse Marrow" in p for p in check.problems)
    assert check.setting_named is True  # "Kirkwall" is named (in passing), which is enough
    [check] = check_scenes(
        [CLEAN_PROSE],
        [elsewhere.model_copy(update={"setting": "the Bergen fish market"})],
        CAST,
        THRESHOLDS,
    )
    assert check.setting_named is False and any(
        "not set where planned" in p for p in check.problems
    )


def test_word_salad_runs_on_and_a_long_grammatical_sentence_does_not() -> None:
    [salad] = check_scenes([WORD_SALAD], [PLAN], CAST, THRESHOLDS)
    assert salad.mean_sentence_words > THRESHOLDS.max_mean_sentence_words
    assert any("run-on sentences" in p for p in salad.problems)
    assert salad.missing_characters == ["Mara Quill", "Tobias Venn"]
    long_sentence = (
        "When the storm finally broke over Gull Rock, Mara Quill stood in the lamp room with the letter in one "
        "hand and the brass winding key in the other, listening to the shutters bang and the sea boom in the "
        "caves below, and she understood, for the first time in ten years, that her sister had never meant to "
        "leave the island at all."
    )
    assert 60 <= len(long_sentence.split()) <= THRESHOLDS.max_sentence_words
    [check] = check_scenes(
        [CLEAN_PROSE + " " + long_sentence + " Tobias Venn came at dawn."], [PLAN], CAST, THRESHOLDS
    )
    assert check.problems == [] and check.max_sentence_words >= 60


#: A small model's answer to a scene prompt (as `make run` got it from SmolLM2): notes about a
#: story, numbered, with the template's slots.
OUTLINE = (
    "Mara Quill keeps the lamp of Gull Rock.\n\n"
    "1. The story begins with [A]. A character stands at [X]; a detail is added or removed "
    "based on context data unless otherwise indicated for reference purposes.\n"
    "   * The first entry is not mentioned but another description can provide more details.\n"
    "**2.** To avoid multiple mentions of a single passage, each new sentence creates separate "
    "ideas which need individual presentation, as Tobias Venn would say.\n"
    "3. In addition to the previous scenes, add a second paragraph with more examples."
)


def test_a_scene_written_as_an_outline_with_its_slots_is_not_prose() -> None:
    [check] = check_scenes([OUTLINE], [PLAN], CAST, THRESHOLDS)
    assert check.list_share > 0.8
    assert any("written as a list, not prose (4 numbered or bulleted" in p for p in check.problems)
    assert check.placeholders == ["[A]", "[X]"]
    assert any("template slots left unfilled: [A], [X]" in p for p in check.problems)
    perfect = QualityScores(
        coherence=1.0, prose_quality=1.0, plot_advancement=1.0, pacing=1.0, tone_consistency=1.0
    )
    metrics = measure(OUTLINE, 60, THRESHOLDS)
    decision = decide_revision(perfect, [], [metrics], metrics, 0.5, [check])
    assert any("scene 1 is written as a list" in r for r in decision.reasons)


def test_a_note_a_character_reads_dialogue_dashes_and_asides_in_brackets_are_prose() -> None:
    note = (
        CLEAN_PROSE
        + "\n\nTobias Venn had pinned the list to the door:\n1. Oil\n2. Wicks\n3. Bread\n\n"
        + "\u2014 You forgot the matches, Mara said.\n\u2014 I never forget, Tobias said.\n\n"
        + "* * *\n\n"
        + 'The letter read "their [sic] lamp" and cited the keeper\'s log [1], and the ledger '
        + "[by then damp] was no help."
    )
    [check] = check_scenes([note], [PLAN], CAST, THRESHOLDS)
    assert 0 < check.list_share < THRESHOLDS.max_list_share
    assert check.placeholders == []
    assert not any("list" in p or "slots" in p for p in check.problems), check.problems
    # One numbered paragraph of prose is not an outline either.
    [single] = check_scenes(["1. " + CLEAN_PROSE], [PLAN], CAST, THRESHOLDS)
    assert single.list_share == 1.0 and not any("list" in p for p in single.problems)


#: The opening of chapter 1 as `make run` got it from SmolLM2 (135M): the model talks to
#: whoever asked about "this paragraph" instead of telling the scene.
ASSISTANT_TALK = (
    "I will give you one possible way to make this paragraph more impactful while still "
    "conveying your message without overwhelming readers by too many details. Here\u2019s an "
    "alternative version\u2014the original text needs refinement for clarity before giving "
    "feedback on your revised paragraphs from here! Mara Quill climbed the lamp room stairs "
    "while Tobias Venn waited below. I hope this helps!"
)


def test_a_scene_that_talks_to_its_requester_about_the_text_is_revised() -> None:
    [check] = check_scenes([CLEAN_PROSE + "\n\n" + ASSISTANT_TALK], [PLAN], CAST, THRESHOLDS)
    assert [t[:28] for t in check.assistant_talk] == [
        "I will give you one possible",
        "Here\u2019s an alternative versio",
        "I hope this helps!",
    ]
    assert any("talks to its reader about the text" in p for p in check.problems)
    perfect = QualityScores(
        coherence=1.0, prose_quality=1.0, plot_advancement=1.0, pacing=1.0, tone_consistency=1.0
    )
    metrics = measure(ASSISTANT_TALK, 60, THRESHOLDS)
    decision = decide_revision(perfect, [], [metrics], metrics, 0.5, [check])
    assert decision.revise and any("talks to its reader" in r for r in decision.reasons)


def test_characters_and_a_narrator_may_say_what_an_assistant_says() -> None:
    """Dialogue (in quotes or after a dash) may say anything; a narrator's paragraph, draft,
    text or "version of events" is part of the story."""
    story = (
        CLEAN_PROSE
        + '\n\n"Let me know if you need anything," Tobias Venn said. "I hope this helps."\n'
        + "\u2014 Here\u2019s a revised version of the plan, Mara said.\n"
        + "Of course, the lamp had gone out again. She read the paragraph in the letter twice, "
        + "and Tobias handed her the draft, and she tore it up. Here is the chapel where her "
        + "sister prayed; here's the version of events the harbour master told. You never "
        + "answered my text, she thought. Feel free to use the boat, the note said."
    )
    [check] = check_scenes([story], [PLAN], CAST, THRESHOLDS)
    assert check.assistant_talk == [] and check.problems == []


def test_a_scene_off_plan_is_revised_even_when_the_editor_loves_it() -> None:
    [check] = check_scenes([WORD_SALAD], [PLAN], CAST, THRESHOLDS)
    perfect = QualityScores(
        coherence=1.0, prose_quality=1.0, plot_advancement=1.0, pacing=1.0, tone_consistency=1.0
    )
    metrics = measure(WORD_SALAD, 100, THRESHOLDS)
    decision = decide_revision(perfect, [], [metrics], metrics, 0.5, [check])
    assert decision.revise and any(
        "scene 1 does not name its planned characters" in r for r in decision.reasons
    )


def test_scores_use_one_scale_and_ambiguous_values_are_rejected() -> None:
    scores = QualityScores(
        coherence=0.8, prose_quality=1.0, plot_advancement=0, pacing=0.35, tone_consistency=0.5
    )
    assert scores.prose_quality == 1.0 and scores.plot_advancement == 0.0
    for bad in (8, 1, 10, 85, 7.5, -0.1, True):
        with pytest.raises(ValidationError):
            QualityScores(
                coherence=bad,
                prose_quality=0.5,
                plot_advancement=0.5,
                pacing=0.5,
                tone_consistency=0.5,
            )
    # The JSON a model sends: "1" is ambiguous (perfect on 0-1, poor on 0-10), "1.0" is not.
    with pytest.raises(ValidationError, match="ambiguous"):
        QualityScores.model_validate_json(
            '{"coherence": 1, "prose_quality": 0.5, "plot_advancement": 0.5, '
            '"pacing": 0.5, "tone_consistency": 0.5}'
        )
    assert (
        QualityScores.model_validate_json(
            '{"coherence": 1.0, "prose_quality": 0.5, "plot_advancement": 0.5, '
            '"pacing": 0.5, "tone_consistency": 0.5}'
        ).coherence
        == 1.0
    )


# --- what the checks read from the graph ------------------------------------------------------


def test_consistency_facts_carry_accumulated_traits_latest_states_and_containment(
    store: GraphStore,
) -> None:
    outline = EntitySource(type="outline", chapter=0)
    store.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                Entity(label="Character", name="Mara", traits=["brave"], sources=[outline]),
                Entity(label="Character", name="Tobias", sources=[outline]),
                Entity(label="Location", name="Gull Rock lighthouse", sources=[outline]),
                Entity(label="Location", name="the lamp room", sources=[outline]),
            ],
            relationships=[
                Relationship(source="the lamp room", target="Gull Rock lighthouse", type="PART_OF")
            ],
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=1,
            relationships=[Relationship(source="Mara", target="Tobias", type="FRIEND_OF")],
            scenes=[
                SceneDelta(index=1, text_ref="scenes/chapter_001/scene_01.txt", text_sha="ab" * 32)
            ],
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=2,
            entities=[Entity(label="Character", name="Mara", traits=["stubborn"])],
            relationships=[Relationship(source="Mara", target="Tobias", type="KNOWS")],
        )
    )
    facts = retrieval.consistency_facts(store, ["Mara", "Tobias", "the lamp room"], as_of_chapter=3)
    assert set(facts.traits["mara"]) == {"brave", "stubborn"}
    assert facts.relationship_types[("mara", "tobias")]["FRIEND_OF"] == 1
    assert facts.containers["lamp room"] == {"gull rock lighthouse"}
    assert facts.scene_texts == {(1, 1): ("scenes/chapter_001/scene_01.txt", "ab" * 32)}
    # Chapter 4 makes them enemies and calls Mara cowardly: both are found against the graph.
    delta = ChapterDelta(
        chapter=4,
        entities=[Entity(label="Character", name="Mara", traits=["cowardly"])],
        relationships=[Relationship(source="Tobias", target="Mara", type="ENEMY_OF")],
    )
    assert [p.kind for p in relationship_flips(delta, facts.relationship_types)] == [
        "relationship_flip"
    ]
    assert [p.kind for p in contradictory_traits(delta, ANTONYMS, facts.traits)] == [
        "contradictory_traits"
    ]


# --- duplicate scenes: an embedding match confirmed on the words ------------------------------


def test_duplicate_scene_needs_the_words_to_repeat_too() -> None:
    # A chat model's pooled states put any two scenes above the cosine threshold.
    delta = ChapterDelta(
        chapter=2,
        scenes=[
            SceneDelta(index=1, embedding=[1.0, 0.0]),
            SceneDelta(index=2, embedding=[0.999, 0.02]),
        ],
    )
    earlier = [(1, 1, [1.0, 0.01])]
    other = "Tobias rowed out past the reef at dawn, cursing the fog and the broken oarlock. " * 2
    distinct = {
        (2, 1): CLEAN_PROSE,
        (2, 2): other,
        (1, 1): "The ferry bell rang across an empty harbour.",
    }
    assert duplicate_scenes(delta, earlier, lambda c, s: distinct.get((c, s))) == []
    repeated = {
        (2, 1): CLEAN_PROSE,
        (2, 2): "Mara sighed. " + CLEAN_PROSE,
        (1, 1): CLEAN_PROSE[:300],
    }
    found = duplicate_scenes(delta, earlier, lambda c, s: repeated.get((c, s)))
    assert sorted(p.chapters for p in found) == [[1, 2], [1, 2], [2]]
    # Without texts the embedding alone decides, as before.
    assert len(duplicate_scenes(delta, earlier)) == 3
