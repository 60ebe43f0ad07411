"""Ids of the nodes a chapter commit creates, and the content hash stored next to an embedding."""

from __future__ import annotations

import hashlib

NOVEL_INFO_ID = "novel"


def embedding_sha(vector: list[float]) -> str:
    """Content hash of an embedding (exact float repr), stored next to it."""
    text = ",".join(repr(float(x)) for x in vector)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


def chapter_id(chapter: int) -> str:
    return f"chapter:{chapter}"


def scene_id(chapter: int, index: int) -> str:
    return f"scene:{chapter}:{index}"


def changeset_id(chapter: int) -> str:
    return f"changeset:{chapter}"
