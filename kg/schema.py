"""Versioned, idempotent schema migrations, recorded on a `(:SchemaMeta {id: 'schema'})` node.

Each migration is a list of `IF NOT EXISTS` statements, so re-running one (after a crash
between its statements and the meta update, or from two processes at once) is harmless.
Neo4j refuses schema changes and data writes in one transaction, so every statement runs
in its own transaction and the meta node is updated afterwards. Append new migrations;
never edit one that has shipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from kg import cypher
from kg import vocabulary as vocab

SCHEMA_META_ID = "schema"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]

    @property
    def tag(self) -> str:
        return f"{self.version}:{self.name}"


def _core_constraints() -> tuple[str, ...]:
    c = cypher.unique_constraint
    return (
        c("kg_entity_id", vocab.ENTITY, "id"),
        c("kg_chapter_id", vocab.CHAPTER, "id"),
        c("kg_chapter_number", vocab.CHAPTER, "number"),
        c("kg_scene_id", vocab.SCENE, "id"),
        c("kg_changeset_id", vocab.CHANGE_SET, "id"),
        c("kg_changeset_chapter", vocab.CHANGE_SET, "chapter"),
        c("kg_changeset_seq", vocab.CHANGE_SET, "seq"),
        c("kg_novelinfo_id", vocab.NOVEL_INFO, "id"),
        c("kg_world_id", vocab.WORLD_CONTAINER, "id"),
        c("kg_value_id", vocab.VALUE_NODE, "id"),
        c("kg_schemameta_id", vocab.SCHEMA_META, "id"),
        c("kg_entityname_entity_key", vocab.ENTITY_NAME, "entity_id", "key"),
    )


def _core_indexes() -> tuple[str, ...]:
    i = cypher.node_index
    nodes = (
        i("kg_entity_name_key", vocab.ENTITY, "name_key"),
        i("kg_entity_label", vocab.ENTITY, "label"),
        i("kg_entity_provisional", vocab.ENTITY, "is_provisional"),
        i("kg_entity_first_chapter", vocab.ENTITY, "first_chapter"),
        i("kg_entity_last_chapter", vocab.ENTITY, "last_chapter"),
        i("kg_entityname_key", vocab.ENTITY_NAME, "key"),
        i("kg_entityname_entity", vocab.ENTITY_NAME, "entity_id"),
        i("kg_scene_chapter", vocab.SCENE, "chapter"),
    )
    # Every relationship the store writes carries a `key`, found again by rollback.
    rels = tuple(
        cypher.rel_index(f"kg_rel_key_{t.lower()}", t, "key")
        for t in (*vocab.ENTITY_REL_TYPES, *vocab.STRUCTURAL_REL_TYPES)
    )
    return nodes + rels


def _dialogue_schema() -> tuple[str, ...]:
    c, i = cypher.unique_constraint, cypher.node_index
    return (
        c("kg_kgentity_conv_entity", vocab.KG_ENTITY, "conversation_id", "entity_id"),
        i("kg_kgentity_conversation", vocab.KG_ENTITY, "conversation_id"),
        i("kg_kgentity_name_key", vocab.KG_ENTITY, "name_key"),
        cypher.rel_index("kg_kgrel_rel_id", vocab.KG_REL, "rel_id"),
        cypher.rel_index("kg_kgrel_conversation", vocab.KG_REL, "conversation_id"),
        c("kg_kgrelevent_id", vocab.KG_REL_EVENT, "event_id"),
        i("kg_kgrelevent_conversation", vocab.KG_REL_EVENT, "conversation_id"),
        i("kg_kgrelevent_turn", vocab.KG_REL_EVENT, "turn_id"),
        i("kg_kgrelevent_rel", vocab.KG_REL_EVENT, "rel_id"),
        c("kg_kgmilestone_id", vocab.KG_MILESTONE, "milestone_id"),
        i("kg_kgmilestone_conversation", vocab.KG_MILESTONE, "conversation_id"),
        c("kg_kgturn_key", vocab.KG_TURN, "key"),
        i("kg_kgturn_conversation", vocab.KG_TURN, "conversation_id"),
        i("kg_kgturn_status", vocab.KG_TURN, "status"),
    )


def _turn_memory_schema() -> tuple[str, ...]:
    # Every property a per-turn read filters on is indexed: memory rows are found by key or
    # by (conversation, position) key, and counters live on one node per conversation.
    c, i = cypher.unique_constraint, cypher.node_index
    return (
        c("kg_kgmemory_key", vocab.KG_MEMORY, "key"),
        c("kg_kgmemory_position_key", vocab.KG_MEMORY, "position_key"),
        i("kg_kgmemory_conversation", vocab.KG_MEMORY, "conversation_id"),
        c("kg_kgconversation_id", vocab.KG_CONVERSATION, "conversation_id"),
        i("kg_kgturn_seq", vocab.KG_TURN, "seq"),
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "core-constraints", _core_constraints()),
    Migration(2, "core-indexes", _core_indexes()),
    Migration(3, "dialogue-memory", _dialogue_schema()),
    Migration(4, "dialogue-turn-memory", _turn_memory_schema()),
)
LATEST_VERSION = MIGRATIONS[-1].version
