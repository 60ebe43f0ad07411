"""Every Cypher statement of the project.

Values are always parameters. Labels and relationship types cannot be, so the builders
below take them only from the fixed vocabulary (`vocab.quote_label` refuses anything
else) and cache the resulting text. Every construct here was checked against ArcadeDB
26.10's Bolt server and is standard Neo4j 5 Cypher.

ArcadeDB notes that shaped these statements: `UNWIND ... MATCH ()-[r:T {key: k}]->()`
does not use the relationship index (seconds for a few hundred keys) while
`MATCH ()-[r:T]->() WHERE r.key IN $keys` does, so relationship lookups by key are
set-based or anchored on indexed endpoints. Likewise a node matched by a property of another
node must go through `WITH x.prop AS v MATCH (n:L) WHERE n.id = v` to use the index.
"""

from __future__ import annotations

from functools import cache

from kg import vocabulary as vocab

q = vocab.quote_label

# --- Schema --------------------------------------------------------------------------------


def unique_constraint(name: str, label: str, *props: str) -> str:
    target = ", ".join(f"n.{p}" for p in props)
    target = f"({target})" if len(props) > 1 else target
    return f"CREATE CONSTRAINT {name} IF NOT EXISTS FOR (n:{q(label)}) REQUIRE {target} IS UNIQUE"


def node_index(name: str, label: str, prop: str) -> str:
    return f"CREATE INDEX {name} IF NOT EXISTS FOR (n:{q(label)}) ON (n.{prop})"


def rel_index(name: str, rel_type: str, prop: str) -> str:
    return f"CREATE INDEX {name} IF NOT EXISTS FOR ()-[r:{q(rel_type)}]-() ON (r.{prop})"


SHOW_INDEXES = "SHOW INDEXES YIELD name, type RETURN name, type"
SERVER_COMPONENTS = (
    "CALL dbms.components() YIELD name, versions, edition RETURN name, versions, edition"
)

READ_SCHEMA_META = (
    "MATCH (m:SchemaMeta {id: $id}) RETURN m.version AS version, m.applied AS applied"
)
WRITE_SCHEMA_META = "MERGE (m:SchemaMeta {id: $id}) SET m.version = $version, m.applied = $applied"

# --- Reads used while planning a commit ------------------------------------------------------

READ_CHANGESETS = (
    "MATCH (c:ChangeSet) RETURN c.chapter AS chapter, c.seq AS seq, c.delta_hash AS delta_hash, "
    "c.amendments_sha AS amendments_sha ORDER BY c.seq"
)
# One change-set by its chapter key or its number (both indexed), and how many there are:
# the newest is found without a scan (kg.commit.history).
_CHANGESET_SCALARS = (
    "RETURN c.chapter AS chapter, c.seq AS seq, c.delta_hash AS delta_hash, c.chain_sha AS chain_sha, "
    "c.amendments_sha AS amendments_sha"
)
CHANGESET_BY_CHAPTER = f"MATCH (c:ChangeSet {{chapter: $chapter}}) {_CHANGESET_SCALARS}"
CHANGESET_BY_SEQ = f"MATCH (c:ChangeSet {{seq: $seq}}) {_CHANGESET_SCALARS}"
COUNT_CHANGESETS = "MATCH (c:ChangeSet) RETURN count(c) AS count"
#: What `kg.store.committed_chapters` lists: the scalars, not the change-sets' undo records.
READ_CHANGESET_INFOS = (
    "MATCH (c:ChangeSet) RETURN c.chapter AS chapter, c.seq AS seq, c.delta_hash AS delta_hash, "
    "c.created_node_count AS created_nodes, c.created_rel_count AS created_relationships, "
    "c.updated_node_count AS updated_nodes, c.updated_rel_count AS updated_relationships ORDER BY c.seq"
)
# Amendments (kg.commit.amendments): later writes recorded on the newest change-set.
READ_NEWEST_CHANGESET = (
    "MATCH (c:ChangeSet) RETURN c.chapter AS chapter, c.amendments_json AS amendments_json, "
    "c.amendments_sha AS amendments_sha ORDER BY c.seq DESC LIMIT 1"
)
#: Healing and QA ran after this change-set was committed (the novel flow's maintenance).
MARK_MAINTAINED = (
    "MATCH (c:ChangeSet {chapter: $chapter}) SET c.maintained = true RETURN c.chapter AS chapter"
)
READ_MAINTAINED = "MATCH (c:ChangeSet {chapter: $chapter}) RETURN c.maintained AS maintained"
AMEND_CHANGESET = "MATCH (c:ChangeSet {chapter: $chapter}) SET c.amendments_json = $amendments, c.amendments_sha = $sha"
READ_CHANGESET_PROPS = (
    "MATCH (c:ChangeSet) WHERE c.chapter IN $chapters RETURN properties(c) AS props"
)
READ_NAMES = (
    "MATCH (k:EntityName) WHERE k.key IN $keys "
    "RETURN k.key AS key, k.entity_id AS entity_id, k.kind AS kind, k.label AS label"
)


@cache
def read_nodes(label: str) -> str:
    return f"MATCH (n:{q(label)}) WHERE n.id IN $ids RETURN n.id AS id, properties(n) AS props"


@cache
def lock_nodes(label: str) -> str:
    """Read nodes for update: the throw-away write takes each node's write lock first.

    Neo4j reads are read-committed, so a plain read, then a write computed from it, could
    lose a concurrent update; writing first makes the read current and holds the lock to
    the end of the transaction (the idiom in Neo4j's "Concurrent data access" docs).
    ArcadeDB's optimistic version check covers the same case on commit.
    """
    return (
        f"MATCH (n:{q(label)}) WHERE n.id IN $ids SET n._kg_lock = true REMOVE n._kg_lock "
        "RETURN n.id AS id, properties(n) AS props"
    )


@cache
def row_lock_node(label: str) -> str:
    return f"MATCH (n:{q(label)} {{id: $id}}) SET n._kg_lock = true REMOVE n._kg_lock RETURN n.id AS id, properties(n) AS props"


@cache
def read_rels_by_key(types: tuple[str, ...]) -> str:
    """One statement for several types: per type `$k<i>` holds that type's keys."""
    parts = [
        f"MATCH ()-[r:{q(t)}]->() WHERE r.key IN $k{i} RETURN r.key AS key, properties(r) AS props"
        for i, t in enumerate(types)
    ]
    return " UNION ALL ".join(parts)


# --- Batched writes (UNWIND) --------------------------------------------------------------


@cache
def create_nodes(labels: tuple[str, ...]) -> str:
    return f"UNWIND $rows AS row CREATE (n:{':'.join(q(x) for x in labels)}) SET n = row.props"


@cache
def update_nodes(label: str) -> str:
    """Apply a property diff: `row.changes` holds changed values, null for removed keys."""
    return f"UNWIND $rows AS row MATCH (n:{q(label)} {{id: row.id}}) SET n += row.changes"


@cache
def restore_nodes(label: str) -> str:
    """Replace all properties (rollback): keys absent from `row.props` are removed."""
    return f"UNWIND $rows AS row MATCH (n:{q(label)} {{id: row.id}}) SET n = row.props"


@cache
def delete_nodes(label: str) -> str:
    return f"MATCH (n:{q(label)}) WHERE n.id IN $ids DETACH DELETE n"


@cache
def create_rels(rel_type: str, src_label: str, tgt_label: str) -> str:
    return (
        f"UNWIND $rows AS row MATCH (a:{q(src_label)} {{id: row.src}}) MATCH (b:{q(tgt_label)} {{id: row.tgt}}) "
        f"CREATE (a)-[r:{q(rel_type)}]->(b) SET r = row.props"
    )


@cache
def update_rels(rel_type: str, src_label: str, tgt_label: str) -> str:
    return (
        f"UNWIND $rows AS row MATCH (a:{q(src_label)} {{id: row.src}})-[r:{q(rel_type)}]->"
        f"(b:{q(tgt_label)} {{id: row.tgt}}) WHERE r.key = row.key SET r = row.props"
    )


@cache
def delete_rels(rel_type: str) -> str:
    return f"MATCH ()-[r:{q(rel_type)}]->() WHERE r.key IN $keys DELETE r"


# MERGE, not CREATE: lookup nodes are derived data, so a drifted graph must not fail a commit.
CREATE_NAMES = (
    "UNWIND $rows AS row MERGE (k:EntityName {entity_id: row.entity_id, key: row.key}) SET k = row"
)
DELETE_NAMES = (
    "UNWIND $rows AS row MATCH (k:EntityName {entity_id: row.entity_id, key: row.key}) DELETE k"
)
DELETE_NAMES_OF = "MATCH (k:EntityName) WHERE k.entity_id IN $ids DELETE k"
CREATE_CHANGESET = "CREATE (c:ChangeSet) SET c = $props"
DELETE_CHANGESET = "MATCH (c:ChangeSet {chapter: $chapter}) DELETE c"

# --- One statement per row: the naive path the benchmark compares against ------------------

ROW_READ_NAME = "MATCH (k:EntityName {key: $key}) RETURN k.key AS key, k.entity_id AS entity_id, k.kind AS kind, k.label AS label"


@cache
def row_read_node(label: str) -> str:
    return f"MATCH (n:{q(label)} {{id: $id}}) RETURN n.id AS id, properties(n) AS props"


@cache
def row_read_rel(rel_type: str) -> str:
    return f"MATCH ()-[r:{q(rel_type)}]->() WHERE r.key = $key RETURN r.key AS key, properties(r) AS props"


@cache
def row_create_node(labels: tuple[str, ...]) -> str:
    return f"CREATE (n:{':'.join(q(x) for x in labels)}) SET n = $props"


@cache
def row_update_node(label: str) -> str:
    return f"MATCH (n:{q(label)} {{id: $id}}) SET n += $changes"


@cache
def row_create_rel(rel_type: str, src_label: str, tgt_label: str) -> str:
    return (
        f"MATCH (a:{q(src_label)} {{id: $src}}) MATCH (b:{q(tgt_label)} {{id: $tgt}}) "
        f"CREATE (a)-[r:{q(rel_type)}]->(b) SET r = $props"
    )


@cache
def row_update_rel(rel_type: str, src_label: str, tgt_label: str) -> str:
    return (
        f"MATCH (a:{q(src_label)} {{id: $src}})-[r:{q(rel_type)}]->(b:{q(tgt_label)} {{id: $tgt}}) "
        f"WHERE r.key = $key SET r = $props"
    )


ROW_CREATE_NAME = (
    "MERGE (k:EntityName {entity_id: $props.entity_id, key: $props.key}) SET k = $props"
)
ROW_DELETE_NAME = "MATCH (k:EntityName {entity_id: $entity_id, key: $key}) DELETE k"

# --- Whole-graph operations (stats, export, import, wipe) ---------------------------------

COUNT_LABELS = "MATCH (n) UNWIND labels(n) AS label RETURN label, count(*) AS count"
COUNT_NODES = "MATCH (n) RETURN count(n) AS count"
COUNT_REL_TYPES = "MATCH ()-[r]->() RETURN type(r) AS type, count(*) AS count"
# The schema meta node is migration state, not graph content: exports leave it out.
EXPORT_NODES = "MATCH (n) WHERE NOT n:SchemaMeta RETURN elementId(n) AS eid, labels(n) AS labels, properties(n) AS props"
EXPORT_RELS = "MATCH (a)-[r]->(b) RETURN elementId(a) AS src, elementId(b) AS tgt, type(r) AS type, properties(r) AS props"
COUNT_NON_META_NODES = "MATCH (n) WHERE NOT n:SchemaMeta RETURN count(n) AS count"
WIPE_BATCH = "MATCH (n) WHERE NOT n:SchemaMeta WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS deleted"


@cache
def import_nodes(labels: tuple[str, ...]) -> str:
    return (
        f"UNWIND $rows AS row CREATE (n:{':'.join(q(x) for x in labels)}) SET n = row.props "
        "RETURN row.ref AS ref, elementId(n) AS eid"
    )


@cache
def import_rels(rel_type: str) -> str:
    return (
        "UNWIND $rows AS row MATCH (a) WHERE elementId(a) = row.src MATCH (b) WHERE elementId(b) = row.tgt "
        f"CREATE (a)-[r:{q(rel_type)}]->(b) SET r = row.props"
    )


@cache
def import_merge_rels(rel_type: str) -> str:
    return (
        "UNWIND $rows AS row MATCH (a) WHERE elementId(a) = row.src MATCH (b) WHERE elementId(b) = row.tgt "
        f"MERGE (a)-[r:{q(rel_type)} {{key: row.props.key}}]->(b) SET r = row.props"
    )


# `WITH k.entity_id AS eid MATCH (n:Entity) WHERE n.id = eid`, not `MATCH (n:Entity {id:
# k.entity_id})`: ArcadeDB scans all entities for the latter (20 ms vs 1.5 ms on 1,300).
RESOLVE_NAMES = (
    "MATCH (k:EntityName) WHERE k.key IN $keys WITH k, k.entity_id AS eid MATCH (n:Entity) WHERE n.id = eid "
    "RETURN k.key AS key, k.kind AS kind, k.label AS label, properties(n) AS props"
)
READ_ENTITIES_WITH_LABEL = (
    "MATCH (n:Entity) WHERE n.label = $label RETURN properties(n) AS props ORDER BY n.id"
)

FIND_ENTITIES_BY_KEY = (
    "MATCH (k:EntityName) WHERE k.key IN $keys WITH k, k.entity_id AS eid MATCH (n:Entity) WHERE n.id = eid "
    "RETURN k.kind AS kind, properties(n) AS props"
)


@cache
def import_merge_keyed(labels: tuple[str, ...], keys: tuple[str, ...]) -> str:
    """MERGE on the unique key properties with every label in the pattern, then set everything.

    All labels go into the MERGE pattern: ArcadeDB cannot add a label to a node that has a
    uniquely indexed property (`SET n:Label` fails with a duplicate key), so labels are
    never changed after creation.
    """
    pattern = ", ".join(f"{k}: row.props.{k}" for k in keys)
    return (
        f"UNWIND $rows AS row MERGE (n:{':'.join(q(x) for x in labels)} {{{pattern}}}) SET n = row.props "
        "RETURN row.ref AS ref, elementId(n) AS eid"
    )


# --- Retrieval -----------------------------------------------------------------------------

#: Story relationship types only: structural edges (MENTIONS, APPEARS_IN) are not "relationships".
_ENTITY_RELS = "|".join(q(t) for t in vocab.ENTITY_REL_TYPES)

# The other end comes back as an id only: its properties (with their revision history) are
# fetched once per distinct entity, not once per relationship.
ENTITY_RELS_AS_OF = (
    f"MATCH (e:Entity)-[r:{_ENTITY_RELS}]-(o:Entity) WHERE e.id IN $ids AND r.chapter <= $as_of "
    "RETURN e.id AS id, type(r) AS type, startNode(r) = e AS outgoing, properties(r) AS props, o.id AS other"
)
# The story mirror (kg.mirror): every story relationship and scene once, then only what a
# change-set names, by key or id (indexed).
MIRROR_ALL_EDGES = (
    f"MATCH (a:Entity)-[r:{_ENTITY_RELS}]->(b:Entity) "
    "RETURN type(r) AS type, a.id AS src, b.id AS tgt, properties(r) AS props, elementId(r) AS eid"
)
MIRROR_ALL_SCENES = "MATCH (s:Scene) RETURN properties(s) AS props"
MIRROR_SCENES_BY_ID = "MATCH (s:Scene) WHERE s.id IN $ids RETURN properties(s) AS props"


@cache
def mirror_edges_by_key(rel_type: str) -> str:
    return (
        f"MATCH (a:Entity)-[r:{q(rel_type)}]->(b:Entity) WHERE r.key IN $keys "
        "RETURN a.id AS src, b.id AS tgt, properties(r) AS props"
    )


# Just what a relationship view shows of its other end; `renamed` says the revision history
# mentions a name or label change, in which case the caller reads the full node.
READ_NAME_LABELS = (
    "MATCH (n:Entity) WHERE n.id IN $ids RETURN n.id AS id, n.name AS name, n.label AS label, "
    "n.first_chapter AS first_chapter, "
    "coalesce(n.revisions_json CONTAINS '\"name\"' OR n.revisions_json CONTAINS '\"label\"', false) AS renamed"
)
LATEST_LOCATIONS_AS_OF = (
    "MATCH (o:Entity)-[r:LOCATED_IN]->(l:Entity) WHERE o.id IN $ids AND r.chapter <= $as_of "
    "RETURN o.id AS id, l.id AS location, r.chapter AS chapter"
)
LATEST_CHAPTER = "MATCH (c:Chapter) RETURN max(c.number) AS latest"
SUMMARIES_OF = (
    "MATCH (c:Chapter) WHERE c.number IN $numbers "
    "RETURN c.number AS chapter, c.title AS title, c.summary AS summary, c.key_events AS key_events"
)
RECENT_SUMMARIES = (
    "MATCH (c:Chapter) WHERE c.number <= $as_of AND c.number >= $min_chapter "
    "RETURN c.number AS chapter, c.title AS title, c.summary AS summary, c.key_events AS key_events "
    "ORDER BY c.number DESC LIMIT $k"
)
# Vectors are listed with their content hash only (every commit stores `embedding_sha` next to
# `embedding`); the bodies are fetched by id when the process-wide cache (kg.retrieval) does
# not hold that hash yet.
SCENE_VECTORS_AS_OF = (
    "MATCH (s:Scene) WHERE s.chapter <= $as_of AND s.embedding_sha IS NOT NULL "
    "RETURN s.id AS id, s.chapter AS chapter, s.index AS scene, s.title AS title, s.summary AS summary, "
    "s.embedding_sha AS sha, s.embedded_by AS embedded_by"
)
CHAPTER_VECTORS_AS_OF = (
    "MATCH (c:Chapter) WHERE c.number <= $as_of AND c.embedding_sha IS NOT NULL "
    "RETURN c.id AS id, c.number AS chapter, null AS scene, c.title AS title, c.summary AS summary, "
    "c.embedding_sha AS sha, c.embedded_by AS embedded_by"
)
SCENE_EMBEDDINGS_BY_ID = (
    "MATCH (s:Scene) WHERE s.id IN $ids RETURN s.id AS id, s.embedding AS embedding"
)
CHAPTER_EMBEDDINGS_BY_ID = (
    "MATCH (c:Chapter) WHERE c.id IN $ids RETURN c.id AS id, c.embedding AS embedding"
)
READ_NOVEL_INFO = "MATCH (n:NovelInfo {id: $id}) RETURN properties(n) AS props"
SET_CHAPTER_SUMMARY = "MATCH (c:Chapter {id: $id}) SET c.summary = $summary, c.key_events = $key_events RETURN c.number AS number"

# Neo4j only (detected, optional): a vector index over scene embeddings.
VECTOR_INDEX_NAME = "kg_scene_embedding"


def create_scene_vector_index(dimensions: int) -> str:
    return (
        f"CREATE VECTOR INDEX {VECTOR_INDEX_NAME} IF NOT EXISTS FOR (s:Scene) ON (s.embedding) "
        f"OPTIONS {{indexConfig: {{`vector.dimensions`: {int(dimensions)}, "
        "`vector.similarity_function`: 'cosine'}}"
    )


VECTOR_INDEX_STATE = "SHOW INDEXES YIELD name, type, state WHERE name = $name RETURN type, state"
QUERY_SCENE_VECTOR_INDEX = (
    f"CALL db.index.vector.queryNodes('{VECTOR_INDEX_NAME}', $candidates, $embedding) YIELD node, score "
    "WHERE node.chapter <= $as_of "
    "AND (node.embedded_by IS NULL OR $embedded_by IS NULL OR node.embedded_by = $embedded_by) "
    "RETURN node.id AS id, node.chapter AS chapter, node.index AS scene, node.title AS title, "
    "node.summary AS summary, score ORDER BY score DESC LIMIT $k"
)
