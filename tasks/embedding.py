"""Embedding stage: vectors for scenes and queries, stored as .npy content.

Embeddings are optional (spec 001 section 7): `embed_scenes_or_none` turns a failure
into a warning so the chapter goes on without vector search.
"""

from __future__ import annotations

from prefect import get_run_logger

from core.content import ContentRef
from core.errors import LLMError
from tasks.policy import embedding_task
from tasks.services import Services


# No task-level retries: the gateway has retried already, and embeddings are optional.
@embedding_task("embed_texts", retries=0)
def embed_texts(services: Services, name: str, texts: tuple[str, ...]) -> ContentRef:
    """Embed texts; the result is an (n, d) float32 array in the content store. The
    embedding model's fingerprint is in the cache key (tasks/policy.py)."""
    vectors = services.llm.embed(list(texts))
    return services.content.put_array("embeddings", name, vectors)


def embed_scenes_or_none(
    services: Services, name: str, texts: tuple[str, ...]
) -> ContentRef | None:
    try:
        return embed_texts(services, name, texts)
    except LLMError as exc:
        get_run_logger().warning(
            "embeddings failed, continuing without vectors for %s: %s", name, exc
        )
        return None
