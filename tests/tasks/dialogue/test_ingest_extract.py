"""Ingest with extraction: a turn the graph failed under fails the ingest (so a retry commits it
with its facts), while a turn the pipeline itself could not finish is counted and the ingest
goes on. The service is a test double of `DialogueService.commit`: what is under test is what
the ingest does with each result."""

from __future__ import annotations

import pytest

from core.errors import GraphUnavailableError
from tasks.dialogue.ingest import _extract_conversation
from tasks.dialogue.models import ErrorKind, TurnCommitRequest, TurnResult, TurnState
from tasks.dialogue.replay import load_dialogue
from tests.conftest import DIALOGUES_DIR

TURNS = 6


class FailsOneTurn:
    """Commits every turn but `failing`, which rolls back with `kind`."""

    def __init__(self, failing: int, kind: ErrorKind) -> None:
        self.failing, self.kind = failing, kind
        self.asked: list[str] = []

    def commit(self, request: TurnCommitRequest) -> TurnResult:
        self.asked.append(request.turn)
        if request.turn == str(self.failing):
            return TurnResult(
                ok=False,
                state=TurnState.ROLLED_BACK,
                code="ROLLED_BACK",
                error_kind=self.kind,
                reason=f"{self.kind} failed",
                retryable=True,
            )
        return TurnResult(ok=True, state=TurnState.COMMITTED, committed=True)


def test_a_turn_the_graph_failed_under_fails_the_ingest_at_that_turn() -> None:
    spec = load_dialogue(DIALOGUES_DIR / "locomo-30.turns.jsonl", max_turns=TURNS)
    service = FailsOneTurn(3, "graph")
    with pytest.raises(GraphUnavailableError) as failed:
        _extract_conversation(service, spec, "c", None)  # type: ignore[arg-type]
    assert "turn 3: the graph failed, not the turn: graph failed" in str(failed.value)
    assert service.asked == ["1", "2", "3"]  # nothing after it was sent


def test_a_turn_the_pipeline_could_not_finish_is_counted_and_the_ingest_goes_on() -> None:
    spec = load_dialogue(DIALOGUES_DIR / "locomo-30.turns.jsonl", max_turns=TURNS)
    service = FailsOneTurn(3, "llm")
    outcomes = _extract_conversation(service, spec, "c", None)  # type: ignore[arg-type]
    assert outcomes == {"COMMITTED": TURNS - 1, "ROLLED_BACK:llm": 1}
    assert service.asked == [str(i) for i in range(1, TURNS + 1)]
