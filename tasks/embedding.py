"""Embedding stage: vectors for scenes and queries, stored as .npy content."""

from __future__ import annotations

from core.content import ContentRef
from core.runtime import runtime
from tasks.policy import cached_task


@cached_task("embed_texts")
def embed_texts(name: str, texts: tuple[str, ...], model: str) -> ContentRef:
    """Embed texts; the result is an (n, d) float32 array in the content store."""
    rt = runtime()
    vectors = rt.gateway.embed(list(texts))
    return rt.content.put_array("embeddings", name, vectors)
