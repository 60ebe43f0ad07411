"""Turns remembered in bulk as memory rows, as text (no LLM slot, so no facts): what
`flows.dialogue ingest` writes of a transcript (tasks.dialogue.ingest) and what a front end's
`POST conversation/import` writes of a chat's history (`import_turns`, under the conversation's
lock, from DialogueService.import_turns).

Batches of `batch_size` turns, one embedding call and one write transaction per batch, the
writes overlapping the embedding. Resumable and exactly-once: a run first asks which of its
keys are remembered already (indexed lookups) and embeds only the others, and each write
transaction checks again before it appends (a key is unique, and a row and its position are
written in one transaction), so a kill at any point followed by the same call leaves every
turn exactly once. Each row is embedded as a commit embeds its turn (`row_texts`: without the
names of the speakers memory holds by then), so the rows are the same however the turns came.

The writer is any object with the service's `gateway`, `store`, `store_connected` and
`write_guard()` (`RowWriter`): the DialogueService, which itself calls `import_turns`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from core.llm import LLMGateway
from kg.dialogue import DialogueRepository, MemoryRow, turn_key
from kg.store import GraphStore
from tasks.dialogue.models import ImportTurn
from tasks.dialogue.retriever import memory_row, row_texts, session_group


class RowWriter(Protocol):
    """What remembering rows needs of the sidecar's service (DialogueService has it)."""

    @property
    def gateway(self) -> LLMGateway: ...

    @property
    def store(self) -> GraphStore: ...

    @property
    def store_connected(self) -> bool: ...

    def write_guard(self) -> AbstractContextManager[Any]: ...


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


def remembered_keys(service: RowWriter, keys: list[str]) -> set[str]:
    """Which of `keys` the graph remembers already (starting the graph if it is not up)."""
    repo = DialogueRepository(service.store)
    present: set[str] = set()
    for start in range(0, len(keys), KEY_PAGE):
        present |= repo.remembered_keys(keys[start : start + KEY_PAGE])
    return present


def remember_rows(
    service: RowWriter,
    conversation_id: str,
    rows: list[MemoryRow],
    *,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
    known: set[str] | None = None,
    held: set[str] | None = None,
) -> tuple[int, int]:
    """(added, already) after remembering `rows` in batches, embedding only what is missing.
    `known`: the speakers of the turns memory holds before `rows` (none: `rows` start the
    conversation), which each row embeds without, as a commit would (`row_texts`). `held`: the
    keys of `rows` the caller has just looked up as remembered (none: they are looked up here).

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
    embedded = dict(zip((r.key for r in rows), row_texts(rows, set(known or ())), strict=True))
    present: set[str] | None = held
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

    if present is None and service.store_connected:
        present = remembered_keys(
            service, [r.key for r in rows]
        )  # milliseconds on a connected graph
    added = 0
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
    try:
        ahead: deque[Future[list[MemoryRow]]] = deque(
            worker.submit(embed, missing(b)) for b in batches[:EMBED_AHEAD]
        )
        if present is None:
            present = remembered_keys(service, [r.key for r in rows])  # starts the graph meanwhile
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


def import_turns(
    service: RowWriter,
    conversation_id: str,
    turns: list[ImportTurn],
    speakers: frozenset[str],
) -> tuple[list[str], list[str]]:
    """(added, already): the turn ids of `turns` remembered now as text, in the order given,
    and those memory held already (or given twice), left as they were. `speakers`: those of the
    turns memory holds (`remembered_speakers`). The caller holds the conversation's lock, so no
    turn of it is committed meanwhile; each write transaction checks the keys again all the
    same (a `flows.dialogue ingest` of the chat's file does not take the lock)."""
    keys = [turn_key(conversation_id, str(turn.turn_id)) for turn in turns]
    rows: dict[str, MemoryRow] = {}
    for key, turn in zip(keys, turns, strict=True):
        if key not in rows:
            row = memory_row(
                conversation_id, key, str(turn.turn_id), list(turn.messages), said_now=False
            )
            if turn.session is not None:
                row = row.model_copy(update={"group": session_group(turn.session)})
            rows[key] = row
    held = remembered_keys(service, list(rows))
    fresh = [row for key, row in rows.items() if key not in held]
    remember_rows(service, conversation_id, fresh, known=set(speakers), held=set())
    to_add = {row.key for row in fresh}
    added: list[str] = []
    already: list[str] = []
    for key, turn in zip(keys, turns, strict=True):
        (added if key in to_add else already).append(str(turn.turn_id))
        to_add.discard(key)
    return added, already
