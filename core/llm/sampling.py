"""What a chat request adds for sampling: the anti-repetition fields a tier's settings add to a
prose call, and the seed that makes a seeded server answer the same request the same way.

Why a seed on every request: without one, a sampling server (the embedded llama-server among
them: its default seed is random) answers the same prompt differently on every run, so the
same book differed from run to run and a run killed and resumed redrafted the step it was in
with another answer than the uninterrupted run got. The seed is derived from the request
itself (`request_seed`), not drawn or counted: the same request gets the same seed in any
process, under any hash seed and in any thread order, and a request asked again after a
connection error (which got no answer) keeps it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
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


#: The largest seed sent: OpenAI's `seed` is a signed integer and llama.cpp's a uint32 whose
#: all-ones value means "random".
MAX_SEED = 2**31 - 1


def request_seed(base: int, body: Mapping[str, Any], *, sample: int, bad_answers: int) -> int:
    """The `seed` of one chat request: a hash of the settings' base seed, the request body (its
    model, messages and sampling fields), which of several answers to the same request the
    caller asks for (`sample`: a draft asked again for another take passes 1, 2, ...) and how
    many bad answers this request already got (a question asked again as it was must not be
    answered as before)."""
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    digest = hashlib.blake2b(
        f"{base}|{sample}|{bad_answers}|{text}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big") & MAX_SEED
