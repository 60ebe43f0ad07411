"""bench.recall_chat's rewordings: what a chat's user would type for a LoCoMo question."""

from __future__ import annotations

from bench.recall_chat import ROLE_PLAY_ACTIONS, WAYS, typo

NAMES = ["Caroline", "Melanie"]


def test_a_typo_swaps_two_letters_in_the_middle_of_the_longest_word() -> None:
    assert typo("What did Melanie research?") == "What did Melanie resaerch?"
    assert typo("What did Caroline research?") == "What did Carloine research?"  # the first
    assert typo("Where did she go?") == "Where did she go?"  # no word of five letters to spoil
    assert WAYS["name typo"]("When did Melanie paint a sunrise?", NAMES) == (
        "When did Mealnie paint a sunrise?"
    )


def test_a_question_about_one_speaker_is_asked_by_the_other_to_them() -> None:
    second_person = WAYS["second person"]
    assert second_person("What did Caroline research?", NAMES) == "Caroline: What did you research?"
    assert second_person("What is Melanie's hobby?", NAMES) == "Melanie: What is your hobby?"
    assert second_person("What does Melanie like?", NAMES) == "Melanie: What do you like?"
    # Look-alikes: a question naming both speakers, or neither, is asked as it is.
    assert second_person("When did Caroline meet Melanie?", NAMES) == (
        "When did Caroline meet Melanie?"
    )
    assert second_person("Which city hosts the parade?", NAMES) == "Which city hosts the parade?"


def test_a_greeting_speaks_to_the_speaker_the_question_names() -> None:
    assert WAYS["greeting"]("What did Melanie paint?", NAMES) == (
        "Hey Melanie! What did Melanie paint?"
    )
    assert WAYS["greeting"]("Which city?", NAMES) == "Hey Caroline! Which city?"


def test_a_role_play_action_is_picked_by_the_questions_crc32() -> None:
    role_play = WAYS["role-play action"]
    asked = role_play("What did Caroline research?", NAMES)
    assert asked == "*brushes a strand of hair behind my ear* What did Caroline research?"
    # Another question may draw another action; the set is the bench's.
    actions = {role_play(f"Question {i}?", NAMES).split("* ")[0] + "*" for i in range(40)}
    assert actions == set(ROLE_PLAY_ACTIONS)
