"""Graph facts as a recall signal, end to end: the real graph, the scripted model over real HTTP.

The tiny local model's facts cannot show this, so the scripted extractor draws the facts a
capable one would: the turn where Nate shows his new dog says "Meet Max, the newest member of
the family!", and the extractor ties the entity Max (also "the puppy") to it through a
relation, quoting it. A question about the puppy, a word that turn never uses, must then reach
that turn through the graph (the `linked` signal), and a question that names no known entity
must not get the signal.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.settings import Settings, load_settings
from prompts.dialogue.models import TurnExtraction
from tasks.dialogue.models import ChatMessage, TurnCommitRequest
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tests.support.dialogue_script import DialogueScript, new_lines
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest

TURNS = [
    ("Nate", "Meet Max, the newest member of the family! He chewed my slippers already."),
    ("Joanna", "Oh he is adorable, what a fluffy face!"),
    ("Nate", "I won a gaming tournament last week, so the timing was perfect."),
    ("Joanna", "I finished my screenplay draft and printed it yesterday."),
    ("Nate", "We should all adopt better sleeping habits, honestly."),
    ("Joanna", "Agreed, I stay up far too late writing."),
]


class _FactScript(DialogueScript):
    def extractor(self, request: ScriptedRequest) -> dict[str, Any]:
        proposal = super().extractor(request)
        if any("newest member of the family" in content for _, content in new_lines(request)):
            quote = "Meet Max, the newest member of the family!"
            proposal["entities"].append(
                {"name": "Max", "kind": "Character", "aliases": ["the puppy"], "quote": quote}
            )
            proposal["actions"].append(
                {
                    "action": "EVOLVE",
                    "source": "Nate",
                    "target": "Max",
                    "type": "OWNS",
                    "from_type": None,
                    "weight_delta": 0.3,
                    "weight": 0.9,
                    "reason": "Nate got a dog",
                    "quote": quote,
                }
            )
            proposal["facts"].append("Nate adopted a dog named Max")
        return TurnExtraction.model_validate(proposal).model_dump()


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        _FactScript(["Nate", "Joanna"]).install(llm)
        yield llm


@pytest.fixture()
def service(graph_settings: Settings, server: ScriptedLLM) -> Iterator[DialogueService]:
    settings = load_settings(
        graph_settings.project_dir,
        openai_base_url=server.base_url,
        embedding_base_url=server.base_url,
    )
    svc = DialogueService(settings, options=SidecarOptions(lock_wait_s=2.0))
    yield svc
    svc.close()


def _commit_all(service: DialogueService, conversation_id: str) -> None:
    for i, (speaker, text) in enumerate(TURNS, start=1):
        message = ChatMessage(
            role="user" if speaker == "Nate" else "assistant",
            name=speaker,
            content=text,
            message_id=f"D1:{i}",
            time="7:49 pm on 20 May, 2022",
        )
        result = service.commit(
            TurnCommitRequest(conversation_id=conversation_id, turn_id=i, messages=[message])
        )
        assert result.committed, result.reason


def test_a_question_about_an_entity_reaches_the_turn_its_facts_came_from(
    service: DialogueService,
) -> None:
    conversation_id = f"test-facts-{uuid.uuid4().hex[:8]}"
    _commit_all(service, conversation_id)
    hits = service.recall(conversation_id, "When did Nate get the puppy?", 3)
    linked = [h for h in hits if "linked" in h.signals]
    assert linked and linked[0].source_refs == ["D1:1"]
    assert hits[0].source_refs == ["D1:1"], [(h.source_refs, h.signals) for h in hits]
    # The link is the only signal the graph's facts add, on that turn alone, and it counts:
    # under the learned fusion (core.recall.LEARNED_FUSION) the turn's own words already rank it
    # first in these six turns (measured: 6.04 without the link's 4.50 against 5.12 for the
    # next), so the link widens its lead rather than making it.
    assert not {"graph", "time", "event_time", "when"} & set(hits[0].signals)
    assert hits[0].signals["linked"] > 0 and all("linked" not in h.signals for h in hits[1:])
    assert hits[0].score - hits[1].score > hits[0].signals["linked"] / 2
    # Look-alike: a question that names no entity the graph knows links no turn.
    hits = service.recall(conversation_id, "Who stays up too late?", 3)
    assert all("linked" not in h.signals for h in hits)
