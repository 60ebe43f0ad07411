"""Bulk ingest of a recorded chat history (the shared JSONL turn format) into turn memory.

Without extraction every turn becomes a KGMemory row: batches of `batch_size` turns, one
embedding call and one write transaction per batch, the writes overlapping the embedding.
Resumable and exactly-once: a run first asks which of its keys are remembered already
(indexed lookups) and embeds only the others, and each write transaction checks again
before it appends (a key is unique, and a row and its position are written in one
transaction), so a kill at any point followed by the same command leaves every turn
exactly once.

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
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from pydantic import BaseModel, Field

from core.errors import GraphUnavailableError
from kg.dialogue import DialogueRepository, MemoryRow, turn_key
from tasks.dialogue.models import ChatMessage, TurnCommitRequest, TurnState
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.replay import DialogueSpec, DialogueTurnRow, turn_requests
from tasks.dialogue.retriever import memory_row, row_texts

#: Turns per embedding call and write transaction. The embedder sorts one call's texts by
#: token count so that texts of similar length share an ONNX batch (less padding): over 256 turns
#: that encodes ~15% faster than over 64 (measured on the shared dialogues, 2 cores).
BATCH_SIZE = 256
#: Keys per lookup when a run starts (one indexed lookup each).
KEY_PAGE = 2000
#: Batches queued for embedding ahead of the one being written (bounds memory; while a cold
#: graph starts, these are what gets embedded meanwhile).
EMBED_AHEAD = 3

#: Called with (conversation_id, turns just handled).
Progress = Callable[[str, int], None]


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
        )
        update: dict[str, object] = {}
        if turn.image_caption:
            update["extra"] = f"[shares a photo: {turn.image_caption}]"
        if turn.session is not None:
            update["group"] = f"session {turn.session}"
        rows.append(row.model_copy(update=update) if update else row)
    return rows


def _remembered_keys(service: DialogueService, keys: list[str]) -> set[str]:
    """Which of `keys` the graph remembers already (starting the graph if it is not up)."""
    repo = DialogueRepository(service.store)
    present: set[str] = set()
    for start in range(0, len(keys), KEY_PAGE):
        present |= repo.remembered_keys(keys[start : start + KEY_PAGE])
    return present


def remember_rows(
    service: DialogueService,
    conversation_id: str,
    rows: list[MemoryRow],
    *,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
) -> tuple[int, int]:
    """(added, already) after remembering `rows` in batches, embedding only what is missing.

    The calling thread does all graph work, in order (the embedded graph's JVM starts in it:
    one started from a worker thread kept the CLI from exiting, observed): it looks up which
    keys are remembered already, then writes the batches, while one worker thread embeds the
    next ones. When the graph still has to be connected or started (a cold JVM takes
    seconds), the first batches are queued for embedding before the lookup, whole: those
    that have started when the lookup answers are embedded whole (on a resumed run a few
    turns are embedded for nothing, instead of every run waiting for the graph), the others
    only their missing turns. Each write transaction checks the keys again, so the result
    is exactly once either way, and batches are written in order, so positions follow the
    transcript."""
    gateway = service.gateway
    batches = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    # What each row embeds, with the speakers of the rows up to it: as if committed one by one.
    embedded = dict(zip((r.key for r in rows), row_texts(rows), strict=True))
    present: set[str] | None = None
    model = gateway.embedding_fingerprint()

    def embed(batch: list[MemoryRow]) -> list[MemoryRow]:
        if not batch:
            return batch
        vectors = gateway.embed([embedded[r.key] for r in batch], purpose="dialogue.ingest")
        values = np.round(np.asarray(vectors, dtype=np.float64), 7).tolist()
        return [
            r.model_copy(update={"embedding": v, "embedded_by": model})
            for r, v in zip(batch, values, strict=True)
        ]

    def missing(batch: list[MemoryRow]) -> list[MemoryRow]:
        return batch if present is None else [r for r in batch if r.key not in present]

    if service.store_connected:
        present = _remembered_keys(
            service, [r.key for r in rows]
        )  # milliseconds on a connected graph
    added = 0
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
    try:
        ahead: deque[Future[list[MemoryRow]]] = deque(
            worker.submit(embed, missing(b)) for b in batches[:EMBED_AHEAD]
        )
        if present is None:
            present = _remembered_keys(service, [r.key for r in rows])  # starts the graph meanwhile
            for i in range(len(ahead)):
                if ahead[i].cancel():  # not started yet: embed only what is missing
                    ahead[i] = worker.submit(embed, missing(batches[i]))
        for index, batch in enumerate(batches):
            done = ahead.popleft().result()
            if index + EMBED_AHEAD < len(batches):
                ahead.append(worker.submit(embed, missing(batches[index + EMBED_AHEAD])))
            if done:
                with service.write_guard():
                    added += DialogueRepository(service.store).remember(conversation_id, done)
            if progress is not None:
                progress(conversation_id, len(batch))
    finally:
        worker.shutdown(wait=True, cancel_futures=True)
    return added, len(rows) - added


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
            outcomes = _extract_conversation(service, spec, conversation_id, progress)
            added, already = remember_rows(service, conversation_id, rows, batch_size=batch_size)
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
            turns_per_s=round(len(rows) / seconds, 1) if seconds > 0 else 0.0,
        )

    if not extract or concurrency <= 1 or len(dialogues) <= 1:
        return [one(item) for item in dialogues]
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ingest") as pool:
        return list(pool.map(one, dialogues))
