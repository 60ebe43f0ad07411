"""The project's exception hierarchy.

Every error a user can meet carries a one-line message that says what went wrong and
what to do; entry points print that line and exit non-zero (see core.cli).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails


class SkaldError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message} ({hint})")


class ConfigError(SkaldError):
    """A setting is malformed or missing."""

    exit_code = 2


class InvalidInputError(SkaldError):
    """A command-line argument or request is invalid."""

    exit_code = 2


class ContentIntegrityError(SkaldError):
    """A stored artifact does not match its recorded size or SHA-256."""


class GraphUnavailableError(SkaldError):
    """The graph database cannot be reached."""


class GraphOwnerGoneError(GraphUnavailableError):
    """The process that served the embedded graph exited while this one was using it."""


class GraphWriteError(SkaldError):
    """A graph transaction failed; nothing from it was kept."""


class LLMError(SkaldError):
    """Base for LLM gateway failures."""


class LLMUnavailableError(LLMError):
    """Every candidate endpoint failed with transient errors until attempts ran out."""


class LLMFatalError(LLMError):
    """A failure that retrying cannot fix (auth, unknown model, context too long)."""


class LLMBadOutputError(LLMError):
    """The model kept returning output that does not validate against the schema."""


class ExportError(SkaldError):
    """A book file (EPUB, DOCX) could not be made from the manuscript."""


class EmbeddedServiceError(SkaldError):
    """An embedded default service (graph or LLM) failed to start."""


def error_location(error: ErrorDetails, root: str) -> str:
    """A validation error's place as a dotted path (`characters.0.name`), or `root` when the
    error is about the whole value: how every one-line message of a pydantic error names it."""
    return ".".join(str(part) for part in error["loc"]) or root


def first_error(exc: ValidationError, root: str) -> tuple[str, str]:
    """The first of a validation error's problems as (dotted place, message)."""
    first = exc.errors()[0]
    return error_location(first, root), str(first["msg"])
