"""Re-embedding a conversation's memory with the embedding model the settings name now.

Vectors of two models are not comparable. Each remembered row records the model that made its
vector (kg.dialogue `embedded_by`), and recall compares a query only with its own model's
vectors (tasks.dialogue.retriever `usable_vector`): after the model changes (settings
`embedding_base_url` / `embedding_model`, or another in-process build), the rows an older model
embedded are recalled by their words alone until this gives them the current model's vectors.

The rows are read by position, a page at a time, and each row not yet from the current model
is embedded as it was when remembered (`row_texts`: with the speakers of the rows up to it), in
batches of one embedding call and one write transaction. A write gives a row its vector only
while its text is still the one embedded (an edit or a swipe may replace it meanwhile), so a
concurrent sidecar is never overwritten. The last batch's transaction starts a new vector
epoch, which resets every reader's cached index of the conversation once. Killed anywhere, a
run again does only the rows left (resumable, each row at most once per model).
Rows remembered after the run read the head are left to the next run (or to a sidecar already
on the new model, which embeds them with it).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, Field

from kg.dialogue import DialogueRepository, VectorWrite
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.remember import BATCH_SIZE, Progress
from tasks.dialogue.retriever import row_texts

#: Rows read a page (each ~10 KB with its vector: a page bounds the memory a long conversation
#: takes, not the work). Rows per embedding call and write transaction: ingest's `BATCH_SIZE`
#: (measured there); `Progress` is called with (conversation id, rows handled since).
PAGE_ROWS = 2000


class _Stale(NamedTuple):
    """A row to re-embed: its key, its text (the write's guard) and what it embeds."""

    key: str
    text: str
    embedded: str


class ReembedReport(BaseModel):
    conversation_id: str
    rows: int = Field(description="rows remembered when the run read the head")
    stale: int = Field(description="of them, rows whose vector was not the current model's")
    reembedded: int = Field(description="rows given the current model's vector")
    embedded_by: str = Field(description="the current model (LLMGateway.embedding_fingerprint)")
    seconds: float


def reembed_conversation(
    service: DialogueService,
    conversation_id: str,
    *,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
) -> ReembedReport:
    """Give every row of the conversation that another model embedded (or none did) the
    current model's vector (see the module docstring)."""
    started = time.perf_counter()
    repo = DialogueRepository(service.store)
    model = service.gateway.embedding_fingerprint()
    head = repo.memory_head(conversation_id)
    known: set[str] = set()
    stale: list[_Stale] = []
    for first in range(1, head + 1, PAGE_ROWS):
        page = repo.memory_rows(conversation_id, first, min(head, first + PAGE_ROWS - 1))
        texts = row_texts(page, known)
        found = [
            _Stale(r.key, r.text, t)
            for r, t in zip(page, texts, strict=True)
            if r.embedded_by != model
        ]
        stale += found
        if progress is not None:
            progress(conversation_id, len(page) - len(found))
    changed = 0
    for start in range(0, len(stale), batch_size):
        batch = stale[start : start + batch_size]
        vectors = service.gateway.embed([s.embedded for s in batch], purpose="dialogue.reembed")
        values = np.round(np.asarray(vectors, dtype=np.float64), 7).tolist()
        writes = [
            VectorWrite(key=s.key, text=s.text, embedding=value)
            for s, value in zip(batch, values, strict=True)
        ]
        changed += repo.replace_vectors(
            conversation_id, writes, model, new_epoch=start + batch_size >= len(stale)
        )
        if progress is not None:
            progress(conversation_id, len(batch))
    return ReembedReport(
        conversation_id=conversation_id,
        rows=head,
        stale=len(stale),
        reembedded=changed,
        embedded_by=model,
        seconds=round(time.perf_counter() - started, 3),
    )
