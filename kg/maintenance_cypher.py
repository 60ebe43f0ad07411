"""Cypher of graph maintenance: healing (duplicate merging, graduation, enrichment) and QA.

Same rules as kg/cypher.py: values are always parameters; labels and relationship types
come from the vocabulary or from the constants below. Every statement here was run
against ArcadeDB 26.10's Bolt server (tests/kg/test_maintenance.py,
tests/deployments/test_maintenance_deploy.py) and is standard Neo4j 5 Cypher.
Node/relationship writes that the commit layer also does (update an entity,
create relationships, rebuild EntityName lookups) reuse its builders in kg/cypher.py so both
paths write the same layout.
"""

from __future__ import annotations

from kg import vocabulary as vocab

q = vocab.quote_label

#: Audit node written once per merge. Not in kg.vocabulary (owned elsewhere), so labels
#: built here use this constant directly instead of `quote_label`.
MERGE_AUDIT = vocab.MERGE_AUDIT

#: Story relationship types (structural MENTIONS/APPEARS_IN/HAS_SCENE excluded).
STORY_RELS = "|".join(q(t) for t in vocab.ENTITY_REL_TYPES)

# --- Schema owned by maintenance (idempotent, applied by kg.healing.ensure_schema) ---------

SCHEMA: tuple[str, ...] = (
    f"CREATE CONSTRAINT kg_mergeaudit_id IF NOT EXISTS FOR (n:{MERGE_AUDIT}) REQUIRE n.id IS UNIQUE",
    f"CREATE INDEX kg_mergeaudit_survivor IF NOT EXISTS FOR (n:{MERGE_AUDIT}) ON (n.survivor_id)",
)

# --- Healing: the snapshot candidate detection works on ------------------------------------

ALL_ENTITIES = "MATCH (e:Entity) RETURN properties(e) AS props"
STORY_EDGES = (
    f"MATCH (a:Entity)-[r:{STORY_RELS}]->(b:Entity) "
    "RETURN a.id AS src, b.id AS tgt, type(r) AS type, r.chapter AS chapter"
)
SCENES = (
    "MATCH (s:Scene) RETURN s.id AS id, s.chapter AS chapter, s.index AS scene, "
    "s.characters AS characters, s.location AS location"
)
CHAPTER_NUMBERS = "MATCH (c:Chapter) RETURN c.number AS number"
PROVISIONAL_IDS = "MATCH (e:Entity) WHERE e.is_provisional = true RETURN e.id AS id ORDER BY id"

# --- Healing: one merge, inside one write transaction ---------------------------------------

#: Read entities for update: the throw-away write takes each node's write lock first, so a
#: read-modify-write cannot lose a concurrent commit on Neo4j (reads are read-committed);
#: ArcadeDB's optimistic version check covers the same case at commit.
LOCK_ENTITIES = (
    "MATCH (n:Entity) WHERE n.id IN $ids SET n._kg_heal_lock = true REMOVE n._kg_heal_lock "
    "RETURN n.id AS id, properties(n) AS props, labels(n) AS labels"
)
#: Replace entities' whole property maps (computed in Python from the locked read).
REPLACE_ENTITIES = "UNWIND $rows AS row MATCH (n:Entity {id: row.id}) SET n = row.props"
#: Every relationship of the given entities, both directions, structural ones included.
RELS_OF = (
    "MATCH (e:Entity)-[r]-(o) WHERE e.id IN $ids "
    "RETURN e.id AS id, type(r) AS type, startNode(r) = e AS outgoing, properties(r) AS props, "
    "o.id AS other, labels(o) AS other_labels"
)
CREATE_MERGE_AUDIT = f"CREATE (a:{MERGE_AUDIT}) SET a = $props"
#: In story order (the chapter a merge ran after), then by the content-derived id: no clock.
MERGE_AUDITS = f"MATCH (a:{MERGE_AUDIT}) RETURN properties(a) AS props ORDER BY a.chapter, a.id"

# --- Healing: graduation and enrichment inputs ----------------------------------------------


# --- QA ---------------------------------------------------------------------------------------

QA_ENTITY_INDEX = (
    "MATCH (e:Entity) RETURN e.id AS id, e.name AS name, e.label AS label, e.name_key AS name_key, "
    "e.alias_keys AS alias_keys, e.first_chapter AS first_chapter, e.is_provisional AS provisional"
)
#: Every story relationship between two entities, with what the checks show of its ends.
QA_STORY_RELS = (
    f"MATCH (a:Entity)-[r:{STORY_RELS}]->(b:Entity) "
    "RETURN type(r) AS type, r.chapter AS chapter, r.key AS key, a.id AS src_id, a.name AS src_name, "
    "a.first_chapter AS src_first, b.id AS tgt_id, b.name AS tgt_name, b.first_chapter AS tgt_first"
)
#: Entities a set of chapters touched (first seen or last seen in one of them): indexed.
TOUCHED_IN_CHAPTERS = (
    "MATCH (e:Entity) WHERE e.last_chapter IN $chapters RETURN e.id AS id "
    "UNION MATCH (e:Entity) WHERE e.first_chapter IN $chapters RETURN e.id AS id"
)
CHAPTERS_OF = "MATCH (c:Chapter) WHERE c.number IN $numbers RETURN c.number AS number"
QA_TRAIT_EDGES = (
    "MATCH (e:Entity)-[r:HAS_TRAIT]->(t:Entity) "
    "RETURN e.id AS id, e.name AS name, t.name AS trait, r.chapter AS chapter"
)
#: EntityName lookups whose entity node is gone (resolution would follow them to nothing).
QA_STALE_NAMES = (
    "MATCH (k:EntityName) OPTIONAL MATCH (e:Entity {id: k.entity_id}) WITH k, e WHERE e IS NULL "
    "RETURN k.entity_id AS entity_id, k.key AS key ORDER BY entity_id, key"
)
#: Story relationships whose endpoint is not a complete entity, or that lack key/chapter.
QA_BROKEN_RELS = (
    f"MATCH (a)-[r:{STORY_RELS}]->(b) "
    "WHERE NOT a:Entity OR NOT b:Entity OR a.id IS NULL OR b.id IS NULL OR a.name IS NULL "
    "OR b.name IS NULL OR a.label IS NULL OR b.label IS NULL OR r.key IS NULL OR r.chapter IS NULL "
    "RETURN a.id AS src_id, a.name AS src_name, labels(a) AS src_labels, b.id AS tgt_id, "
    "b.name AS tgt_name, labels(b) AS tgt_labels, type(r) AS type, r.chapter AS chapter, r.key AS key"
)
QA_PROVISIONAL = (
    "MATCH (e:Entity) RETURN count(e) AS total, "
    "sum(CASE WHEN e.is_provisional THEN 1 ELSE 0 END) AS provisional"
)
QA_PROVISIONAL_LIST = (
    "MATCH (e:Entity) WHERE e.is_provisional "
    "RETURN e.id AS id, e.name AS name, e.first_chapter AS first_chapter "
    "ORDER BY e.first_chapter, e.id LIMIT $limit"
)
