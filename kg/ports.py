"""The graph as the pipeline's stages see it: a reader and a writer (typing.Protocols).

A stage that only reads the graph asks for a `GraphReader`; one that writes asks for a
`GraphWriter`. `kg.store.GraphStore` satisfies both structurally (it does not import this
module), and a run wires the one store into both (tasks/runtime.py, the composition root). A
unit test may hand a stage a small fake of just the methods it calls (tests/).

The methods are GraphStore's that stages call, with its contracts (see kg/store.py):
`execute_read` / `execute_write` run a transaction function of kg's, so the Cypher stays in kg.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from neo4j import ManagedTransaction

from kg.models import ChangeSetInfo, ChapterDelta, CommitResult, Entity, RollbackResult

P = ParamSpec("P")
T = TypeVar("T")


class GraphReader(Protocol):
    """Reads of the story graph: the chapters' change-sets and history, entities."""

    def execute_read(
        self,
        work: Callable[Concatenate[ManagedTransaction, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    def read(self, query: str, **params: Any) -> list[dict[str, Any]]: ...

    def committed_chapters(self) -> list[ChangeSetInfo]: ...

    def history_head(self) -> tuple[int, str]: ...

    def history_at(self, seq: int) -> str | None: ...

    def history_fingerprint(self, chapter: int) -> str: ...

    def latest_chapter(self) -> int: ...

    def committed_hash(self, chapter: int) -> str | None: ...

    def maintained(self, chapter: int) -> bool: ...

    def entities_with_label(self, label: str) -> list[Entity]: ...


class GraphWriter(Protocol):
    """Writes to the story graph: chapter commits and rollbacks, summaries, maintenance marks,
    and kg's own write transactions (healing)."""

    def execute_write(
        self,
        work: Callable[Concatenate[ManagedTransaction, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T: ...

    def commit_chapter(self, delta: ChapterDelta, *, replace: bool = False) -> CommitResult: ...

    def rollback_chapter(self, chapter: int, *, cascade: bool = False) -> RollbackResult: ...

    def set_chapter_summary(
        self, chapter: int, summary: str, key_events: list[str] | tuple[str, ...] = ()
    ) -> None: ...

    def mark_maintained(self, chapter: int) -> bool: ...
