"""Bulk ingest of a recorded chat history (the shared JSONL turn format) into turn memory.

Without extraction every turn becomes a KGMemory row (tasks.dialogue.remember: batches, one
embedding call and one write transaction each, the writes overlapping the embedding; resumable
and exactly-once, so a kill at any point followed by the same command leaves every turn
exactly once).

With extraction (`extract=True`) each turn runs the sidecar's full turn pipeline (the LLM
slots, the commit gate, the graph facts) in order, which remembers the turn as well; turns
the pipeline could not finish (an LLM outage, say) are remembered without facts afterwards,
so memory still holds every turn. A turn the graph failed under (its serving process exited,
say) is not such a turn: the ingest fails with GraphUnavailableError, and the same ingest
again (Prefect's retry in `flows.regression`) commits it with its facts; the turns committed
before it are idempotent hits, and one rolled back before it (the graph keeps nothing of such a
turn) runs again. Conversations run concurrently, at most `concurrency` at a time; the
turns of one conversation stay in order.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, Field

from core.errors import GraphUnavailableError
from kg.dialogue import MemoryRow, turn_key
from tasks.dialogue.models import ChatMessage, TurnCommitRequest, TurnState
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.remember import BATCH_SIZE, Progress, remember_rows, remembered_keys
from tasks.dialogue.replay import DialogueSpec, DialogueTurnRow, turn_requests
from tasks.dialogue.retriever import memory_row, session_group


class IngestReport(BaseModel):
    dialogue_id: str
    conversation_id: str
    turns: int
    added: int = Field(description="turns remembered by this run")
    already: int = Field(description="turns found remembered already (a resumed or repeated run)")
    extract_outcomes: dict[str, int] = Field(
        default_factory=dict, description="turn state -> count, with extraction"
    )
    seconds: float
    turns_per_s: float


def _row_message(row: DialogueTurnRow) -> ChatMessage:
    return ChatMessage(
        role="user",
        name=row.speaker,
        content=row.text,
        message_id=row.dia_id,
        time=row.session_time,
    )


def memory_rows(spec: DialogueSpec, conversation_id: str) -> list[MemoryRow]:
    """One memory row per recorded turn (no embedding yet). The image caption is indexed
    lexically (`extra`), not embedded: measured, embedding it lowered dense recall."""
    rows = []
    for turn in spec.turns:
        row = memory_row(
            conversation_id,
            turn_key(conversation_id, str(turn.turn_id)),
            str(turn.turn_id),
            list(turn.messages) or [_row_message(turn)],
            said_now=False,
        )
        update: dict[str, object] = {}
        if turn.image_caption:
            update["extra"] = f"[shares a photo: {turn.image_caption}]"
        if turn.session is not None:
            update["group"] = session_group(turn.session)
        rows.append(row.model_copy(update=update) if update else row)
    return rows


def _extract_conversation(
    service: DialogueService, spec: DialogueSpec, conversation_id: str, progress: Progress | None
) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    requests: list[TurnCommitRequest] = turn_requests(spec, conversation_id)
    for request in requests:
        result = service.commit(request)
        if result.state == TurnState.ROLLED_BACK and result.error_kind == "graph":
            # As in a replay (tasks.dialogue.replay): the graph failed, not the turn. Failing
            # here lets the caller's retry commit this turn again (see the module docstring)
            # instead of remembering it without its facts.
            raise GraphUnavailableError(
                f"dialogue {spec.dialogue_id} turn {request.turn}: the graph failed, not the turn: {result.reason}"
            )
        label = (
            result.state.value
            if result.code != "ROLLED_BACK"
            else f"ROLLED_BACK:{result.error_kind}"
        )
        outcomes[label] = outcomes.get(label, 0) + 1
        if progress is not None:
            progress(conversation_id, 1)
    return outcomes


def ingest(
    service: DialogueService,
    dialogues: list[tuple[DialogueSpec, str]],
    *,
    extract: bool = False,
    batch_size: int = BATCH_SIZE,
    concurrency: int = 2,
    progress: Progress | None = None,
) -> list[IngestReport]:
    """Ingest each (dialogue, conversation id); see the module docstring."""

    def one(item: tuple[DialogueSpec, str]) -> IngestReport:
        spec, conversation_id = item
        started = time.perf_counter()
        outcomes: dict[str, int] = {}
        rows = memory_rows(spec, conversation_id)
        if extract:
            # The pipeline remembers each turn it runs, so the pass after it finds them all:
            # what this run added is what memory did not hold before it.
            held = remembered_keys(service, [r.key for r in rows])
            outcomes = _extract_conversation(service, spec, conversation_id, progress)
            remember_rows(service, conversation_id, rows, batch_size=batch_size)
            added, already = len(rows) - len(held), len(held)
        else:
            added, already = remember_rows(
                service, conversation_id, rows, batch_size=batch_size, progress=progress
            )
        seconds = time.perf_counter() - started
        return IngestReport(
            dialogue_id=spec.dialogue_id,
            conversation_id=conversation_id,
            turns=len(rows),
            added=added,
            already=already,
            extract_outcomes=outcomes,
            seconds=round(seconds, 3),
            turns_per_s=round(len(rows) / seconds, 3) if seconds > 0 else 0.0,
        )

    if not extract or concurrency <= 1 or len(dialogues) <= 1:
        return [one(item) for item in dialogues]
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ingest") as pool:
        return list(pool.map(one, dialogues))
