"""Tests of the scripted dialogue "model" (tests/support/dialogue_script.py): the actions,
facts and milestones it answers with."""

from __future__ import annotations

from prompts.dialogue.models import TurnExtraction
from tests.support.dialogue_script import DialogueScript, dialogue_turns, participants
from tests.support.scripted_llm import ScriptedRequest


def _request(text: str, schema: str) -> ScriptedRequest:
    return ScriptedRequest(
        path="/v1/chat/completions",
        body={},
        messages=[{"role": "user", "content": text}],
        schema_name=schema,
        response_format="json_schema",
    )


def test_script_extractor_proposes_actions_between_the_participants() -> None:
    script = DialogueScript(["Caroline", "Melanie"])
    prompt = (
        "Earlier messages, for context only:\nMelanie: Hi Caroline!\n\n"
        "NEW messages:\nCaroline: Hey Mel! Good to see you!\n\nRelation actions: ..."
    )
    out = TurnExtraction.model_validate(script.extractor(_request(prompt, "TurnExtraction")))
    assert [e.name for e in out.entities] == ["Caroline"]
    assert out.actions[0].action == "EVOLVE" and out.actions[0].target == "Melanie"
    assert (
        out.actions[0].weight_delta == 0.1 and out.actions[0].quote == "Hey Mel! Good to see you!"
    )
    assert out.facts == ["Caroline said: Hey Mel! Good to see you!"]
    # With nobody else in sight, the script relates the speaker to no one.
    alone = TurnExtraction.model_validate(
        script.extractor(
            _request("NEW messages:\nCaroline: Hey Mel! Good to see you!\n", "TurnExtraction")
        )
    )
    assert alone.actions == [] and [e.name for e in alone.entities] == ["Caroline"]


def test_script_without_actions_proposes_none() -> None:
    script = DialogueScript(["Caroline", "Melanie"], mutations="none")
    out = TurnExtraction.model_validate(
        script.extractor(_request("NEW messages:\nCaroline: hi\n", "TurnExtraction"))
    )
    assert out.actions == [] and out.entities


def test_script_milestones_appear_in_the_first_twenty_turns_of_each_dialogue() -> None:
    for dialogue in ("locomo-26", "locomo-30"):
        script = DialogueScript(participants(dialogue))
        found = 0
        for row in dialogue_turns(dialogue, 20):
            report = script.historian(
                _request(f"NEW messages:\n{row['speaker']}: {row['text']}\n", "HistorianReport")
            )
            found += len(report["milestones"])
        assert found >= 2, dialogue
