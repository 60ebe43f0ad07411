"""Graph-layer errors: specific cases of the project's GraphWriteError, one line each."""

from __future__ import annotations

from core.errors import GraphReadError, GraphWriteError


class ChapterConflictError(GraphWriteError):
    """A different delta is already committed for the chapter."""


class ChapterNotCommittedError(GraphWriteError):
    """Rollback was asked for a chapter that has no change-set in the graph."""


class RollbackOrderError(GraphWriteError):
    """Rolling back a chapter would skip chapters committed after it."""


class ImportRefusedError(GraphWriteError):
    """An import file is malformed, uses labels outside the vocabulary, or targets a non-empty graph."""


class GraphQueryError(GraphReadError):
    """A graph read failed (bad data or a server-side error)."""
