"""Anti-repetition sampling: the request fields a tier's settings add to a prose call."""

from __future__ import annotations

from typing import Any

from core.settings import LLAMA_CPP_ANTI_REPETITION, AntiRepetition


def anti_repetition_kwargs(settings: AntiRepetition, *, embedded: bool) -> dict[str, Any]:
    """The request fields for a tier's anti-repetition sampling: the OpenAI-standard
    penalties as keyword arguments, server-specific fields in `extra_body` (the openai
    client merges it into the JSON body). llama.cpp's own fields go only to the embedded
    llama-server unless the settings name them: OpenAI-style endpoints reject unknown fields."""
    kwargs: dict[str, Any] = {}
    if settings.frequency_penalty is not None:
        kwargs["frequency_penalty"] = settings.frequency_penalty
    if settings.presence_penalty is not None:
        kwargs["presence_penalty"] = settings.presence_penalty
    extra = settings.server_fields
    if extra is None and embedded:
        extra = LLAMA_CPP_ANTI_REPETITION
    if extra:
        kwargs["extra_body"] = dict(extra)
    return kwargs


def first_draft_anti_repetition(settings: AntiRepetition, *, embedded: bool) -> bool:
    """Whether a first draft already gets anti-repetition sampling (unset: on the embedded model)."""
    return embedded if settings.first_draft is None else settings.first_draft
