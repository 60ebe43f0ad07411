"""What every healing write shares: who writes (HEALER) and the full property map it sets."""

from __future__ import annotations

from typing import Any

from kg.models import Entity
from kg.records import add_revision, entity_props

HEALER = "heal_graph"


def node_props(before: dict[str, Any], entity: Entity, chapter: int) -> dict[str, Any]:
    """Full property map: entity_props, any property other code put on the node, and a
    revision entry tagged with the latest chapter (so "as of" an earlier chapter, views
    show the entity as it was before healing touched it)."""
    props = entity_props(entity)
    managed = set(props) | {"raw_label", "first_chapter", "last_chapter"}
    props.update({k: v for k, v in before.items() if k not in managed})
    return add_revision(before, props, chapter)
