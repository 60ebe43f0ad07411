"""The seams between the pipeline's stages and the services they call: typing.Protocols.

A stage (tasks/) names what it needs by these types, never by the concrete class, so a unit
test can hand it a small fake (tests/) and a run hands it the real services
(tasks/runtime.py, the composition root). Protocols and not base classes: the real classes
(core.llm.LLMGateway behind tasks.runtime.Runtime, core.content.ContentStore) satisfy them
structurally and do not import this module.

- `LanguageModel`: structured answers, text, embeddings, and the fingerprint of what decides
  an answer besides the prompt (endpoint, models, temperature, sampling) per tier. Cached
  stages put the fingerprint into their cache key (tasks/policy.py), so a change of model
  makes a new key and the same model on a re-run finds the old answer.
- `Content`: the content store's reads and writes that stages use (core/content.py).

The graph's ports (reader and writer) are kg's, in kg/ports.py: core knows nothing of the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel

from core.content import ContentRef

M = TypeVar("M", bound=BaseModel)
Message = dict[str, Any]


class LanguageModel(Protocol):
    """The LLM as the stages see it: what core.llm.LLMGateway does, plus cache fingerprints."""

    def structured(
        self,
        tier: str,
        messages: Sequence[Message],
        output_model: type[M],
        *,
        purpose: str = "",
        max_tokens: int | None = None,
    ) -> M:
        """One validated `output_model` answer from the tier's models."""
        ...

    def text(
        self,
        tier: str,
        messages: Sequence[Message],
        *,
        purpose: str = "",
        max_tokens: int | None = None,
        anti_repetition: bool = False,
        sample: int = 0,
    ) -> str:
        """The reply text (never empty); `anti_repetition` adds the tier's anti-repetition
        sampling; `sample` > 0 asks the same prompt for another answer than sample 0 gets (the
        same prompt and sample get the same answer from a seeded model)."""
        ...

    def embed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        """float32 array of shape (len(texts), dim)."""
        ...

    def sends_anti_repetition_first(self, tier: str) -> bool:
        """Whether the tier's prose gets anti-repetition sampling on the first try."""
        ...

    def model_fingerprint(self, tier: str) -> str:
        """What decides the tier's answers besides the prompt; equal settings give equal strings."""
        ...

    def embedding_fingerprint(self) -> str:
        """What decides an embedding besides the text: the endpoint and the model."""
        ...


class Content(Protocol):
    """The content store's reads and writes (core.content.ContentStore)."""

    def put_text(self, content_type: str, name: str, text: str) -> ContentRef: ...

    def put_json(self, content_type: str, name: str, data: Any) -> ContentRef: ...

    def put_array(self, content_type: str, name: str, array: np.ndarray) -> ContentRef: ...

    def get_text(self, ref: ContentRef) -> str: ...

    def get_text_at(self, path: str, sha256: str | None) -> str | None: ...

    def get_model(self, ref: ContentRef, model_cls: type[M]) -> M: ...

    def get_array(self, ref: ContentRef) -> np.ndarray: ...
