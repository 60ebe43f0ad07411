"""A deterministic scripted "model" for the dialogue sidecar (its own tests:
tests/tasks/dialogue/test_dialogue_scripted.py).

`DialogueScript` answers the sidecar's three structured slots (extractor, judge, historian)
from the prompt text alone, so any process (a test, a subprocess, the throughput
benchmark) gets the same answers for the same turn: relation actions between the speaker
and the other participant (EVOLVE always; REPLACE and DELETE on some turns), a bio patch,
one fact, and a milestone on some turns. Weights therefore depend only on the sequence of
turns, which is what the cross-process test compares.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel

from prompts.dialogue.models import HistorianReport, JudgeVerdict, TurnExtraction
from tasks.dialogue.models import ChatMessage, TurnCommitRequest
from tasks.dialogue.replay import load_dialogue, turn_requests
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest

#: The shared dialogues (/work/shared/data/dialogues: beside the checkout).
DIALOGUES = Path(__file__).resolve().parents[3] / "shared" / "data" / "dialogues"
_NEW = re.compile(r"NEW messages:\n(.*?)(?:\n\n|\Z)", re.DOTALL)
_LINE = re.compile(r"^([^:\n]{1,80}): (.*)$")


def _capped(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each list cut to its field's max_length, as a model held to the schema
    answers however many messages a turn has."""
    out = dict(data)
    for name, info in model.model_fields.items():
        limit = next(
            (m.max_length for m in info.metadata if isinstance(m, annotated_types.MaxLen)), None
        )
        if limit is not None and isinstance(out.get(name), list):
            out[name] = out[name][:limit]
    return out


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def new_lines(request: ScriptedRequest) -> list[tuple[str, str]]:
    """(speaker, content) of the NEW messages section of an extractor/historian prompt."""
    match = _NEW.search(request.text)
    if not match:
        return []
    out = []
    for line in match.group(1).splitlines():
        parsed = _LINE.match(line.strip())
        if parsed:
            out.append((parsed.group(1).strip(), parsed.group(2).strip()))
    return out


class DialogueScript:
    """Responders for one set of participants; `install(server)` adds the rules."""

    def __init__(
        self,
        participants: Sequence[str],
        *,
        mutations: Literal["mixed", "evolve", "none"] = "mixed",
        milestone_every: int = 3,
    ) -> None:
        self.participants = list(participants)
        self.mutations = mutations
        self.milestone_every = milestone_every

    def _other(self, speaker: str, request: ScriptedRequest) -> str | None:
        """The participant the speaker is talking to: one the prompt shows (in the earlier
        messages or the known entities). A careful model relates only people it can see."""
        others = [p for p in self.participants if p != speaker and p in request.text]
        return others[0] if others else None

    def extractor(self, request: ScriptedRequest) -> dict[str, Any]:
        entities: list[dict[str, Any]] = []
        actions: list[dict[str, Any]] = []
        patches: list[dict[str, Any]] = []
        facts: list[str] = []
        for speaker, content in new_lines(request):
            other = self._other(speaker, request)
            # The evidence a careful model gives: the speaker's own words.
            quote = content[:160]
            entities.append(
                {
                    "name": speaker,
                    "kind": "Character",
                    "aliases": [],
                    "quote": f"{speaker}: {quote}",
                }
            )
            facts.append(f"{speaker} said: {content[:120]}")
            if other is None or self.mutations == "none":
                continue
            h = _digest(content)
            actions.append(
                {
                    "action": "EVOLVE",
                    "source": speaker,
                    "target": other,
                    "type": "FRIEND_OF",
                    "from_type": None,
                    "weight_delta": 0.1 if "!" in content else 0.05,
                    "weight": 0.5,
                    "reason": "they keep talking",
                    "quote": quote,
                }
            )
            if self.mutations == "evolve":
                pass
            elif h % 5 == 0:
                actions.append(
                    {
                        "action": "REPLACE",
                        "source": speaker,
                        "target": other,
                        "type": "TRUSTS",
                        "from_type": "DISTRUSTS",
                        "weight_delta": 0.0,
                        "weight": 0.6,
                        "reason": "opened up",
                        "quote": quote,
                    }
                )
            elif h % 5 == 1:
                actions.append(
                    {
                        "action": "DELETE",
                        "source": speaker,
                        "target": other,
                        "type": "TRUSTS",
                        "from_type": None,
                        "weight_delta": 0.0,
                        "weight": 0.5,
                        "reason": "a doubt",
                        "quote": quote,
                    }
                )
            patches.append(
                {
                    "entity": speaker,
                    "summary": f"{speaker} recently said: {content[:80]}",
                    "traits_add": ["enthusiastic"] if "!" in content else [],
                    "traits_remove": [],
                    "quote": quote,
                }
            )
        return TurnExtraction.model_validate(
            _capped(
                TurnExtraction,
                {"entities": entities, "actions": actions, "bio_patches": patches, "facts": facts},
            )
        ).model_dump()

    def judge(self, request: ScriptedRequest) -> dict[str, Any]:
        return JudgeVerdict().model_dump()

    def historian(self, request: ScriptedRequest) -> dict[str, Any]:
        events, milestones = [], []
        for speaker, content in new_lines(request):
            events.append(f"{speaker}: {content[:100]}")
            if self.milestone_every and _digest(content) % self.milestone_every == 0:
                milestones.append(
                    {
                        "text": f"{speaker} shared: {content[:100]}",
                        "entities": [speaker],
                        "importance": 0.7,
                        "quote": content[:160],
                    }
                )
        return HistorianReport.model_validate(
            _capped(HistorianReport, {"events": events, "milestones": milestones})
        ).model_dump()

    def install(self, server: ScriptedLLM) -> ScriptedLLM:
        server.on(schema="TurnExtraction", respond=self.extractor)
        server.on(schema="JudgeVerdict", respond=self.judge)
        server.on(schema="HistorianReport", respond=self.historian)
        return server


def dialogue_turns(dialogue_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    path = DIALOGUES / f"{dialogue_id}.turns.jsonl"
    rows = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    return rows[:limit] if limit else rows


def participants(dialogue_id: str) -> list[str]:
    return list(dict.fromkeys(row["speaker"] for row in dialogue_turns(dialogue_id, 50)))


def dialogue_requests(
    dialogue_id: str, conversation_id: str, turns: int
) -> list[TurnCommitRequest]:
    """The dialogue's first turns as commit requests. The first one gets the context a chat
    front end sends (the other participant's greeting in its window), so a relation between
    the two participants is grounded from the first turn on, as in a real chat."""
    requests = turn_requests(
        load_dialogue(DIALOGUES / f"{dialogue_id}.turns.jsonl", turns), conversation_id
    )
    first, *others = participants(dialogue_id)
    if others and not requests[0].window:
        greeting = ChatMessage(role="assistant", name=others[0], content=f"Hi {first}!")
        requests[0] = requests[0].model_copy(update={"window": [greeting]})
    return requests


def greeted_turn(
    conversation_id: str, turn_id: int, speaker: str, content: str, other: str
) -> dict[str, Any]:
    """A one-message commit request said at 1:`turn_id` pm on 8 May 2023, with the other
    participant's greeting in its window (so the scripted extractor grounds a relation between
    the two and the commit gate lets it through)."""
    return {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "messages": [
            {
                "role": "user",
                "name": speaker,
                "content": content,
                "time": f"1:{turn_id:02d} pm on 8 May, 2023",
            }
        ],
        "window": [{"role": "user", "name": other, "content": f"Hi {speaker}, how are you?"}],
    }
