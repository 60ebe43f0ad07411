"""The keys the dialogue memory is addressed by: turn, lease, entity, memory position, payload digest."""

from __future__ import annotations

import hashlib

from kg import vocabulary as vocab

LOCK_PREFIX = "lock\x1f"


def turn_key(conversation_id: str, turn_id: str) -> str:
    return f"{conversation_id}:{turn_id}"


def lock_key(conversation_id: str) -> str:
    return f"{LOCK_PREFIX}{conversation_id}"


def dialogue_entity_id(name: str) -> str:
    """One node per name within a conversation, whatever kind a model calls it."""
    return vocab.entity_id("entity", name)


def position_key(conversation_id: str, seq: int) -> str:
    return f"{conversation_id}\x1f{seq}"


def payload_digest(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
