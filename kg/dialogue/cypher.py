"""Every Cypher statement of the dialogue memory (values are always parameters; labels and
the relationship type come from kg.vocabulary)."""

from __future__ import annotations

from kg import vocabulary as vocab

_q = vocab.quote_label
_E = _q(vocab.KG_ENTITY)
_R = _q(vocab.KG_REL)
_EV = _q(vocab.KG_REL_EVENT)
_M = _q(vocab.KG_MILESTONE)
_T = _q(vocab.KG_TURN)
_MEM = _q(vocab.KG_MEMORY)
_CONV = _q(vocab.KG_CONVERSATION)

READ_TURN = f"MATCH (t:{_T} {{key: $key}}) RETURN properties(t) AS props"

LOCK_PROBE = (
    # SET + REMOVE takes the node's write lock before owner/expiry are read (a real
    # compare-and-set under Neo4j's pessimistic locking; ArcadeDB's optimistic MVCC retries
    # the loser instead) and leaves no trace: a refused claim changes nothing.
    f"MATCH (l:{_T} {{key: $key}}) SET l.lock_probe = true REMOVE l.lock_probe "
    "RETURN l.owner AS owner, l.expires_at AS expires_at, timestamp() AS now"
)
LOCK_PEEK = (
    # A read, before any write: a claimant that finds a live lease held by another owner stops
    # here. Under ArcadeDB's optimistic MVCC a claimant's write to the lease node would conflict
    # with the holder's heartbeat, and the driver's ~1 s retry of a conflicted renewal could let a
    # short lease lapse under a live holder.
    f"MATCH (l:{_T} {{key: $key}}) RETURN l.owner AS owner, l.expires_at AS expires_at, timestamp() AS now"
)
LOCK_CREATE = (
    # The uncontended path: one statement. The uniqueness constraint on KGTurn.key makes a
    # concurrent second CREATE fail cleanly, and the loser falls back to the compare-and-set.
    f"CREATE (l:{_T}) SET l = $props, l.acquired_at = timestamp(), l.expires_at = timestamp() + $lease_ms"
)
LOCK_CREATE_READ_TURN = (
    # LOCK_CREATE and READ_TURN in one round trip: the claim and the turn's committed record,
    # read under the lock (a turn committed while we waited is not redone).
    f"CREATE (l:{_T}) SET l = $props, l.acquired_at = timestamp(), l.expires_at = timestamp() + $lease_ms "
    f"WITH count(*) AS created OPTIONAL MATCH (t:{_T} {{key: $turn}}) RETURN properties(t) AS props"
)
TURN_NODE_AUDIT = (
    # Every node of the turns' label (leases included), and how many carry a key: a node without
    # one is a write that should have been rolled back (tests/kg/test_dialogue_lease.py).
    f"MATCH (t:{_T}) RETURN count(t) AS nodes, count(t.key) AS keyed"
)
LOCK_TAKE = f"MATCH (l:{_T} {{key: $key}}) SET l.owner = $owner, l.acquired_at = $now, l.expires_at = $expires_at"
LOCK_RELEASE = (
    f"MATCH (l:{_T} {{key: $key}}) WHERE l.owner = $owner DELETE l RETURN count(*) AS released"
)
LOCK_RENEW = (
    # The heartbeat: only the holder moves its expiry, on the graph's clock (the same clock
    # every claimant compares with, whichever host it runs on).
    f"MATCH (l:{_T} {{key: $key}}) WHERE l.owner = $owner SET l.expires_at = timestamp() + $lease_ms "
    "RETURN count(l) AS renewed"
)

TURN_STATS = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id "
    "RETURN count(t) AS turns, max(t.seq) AS max_seq"
)
COMMIT_OPEN = (
    # A commit's first statement, its reads folded in: the fence (our lease deleted by owner;
    # `released` 0 means it was taken over, and the caller aborts before anything is written),
    # the turn's idempotency record, the conversation's turn counter, whether the turn's memory
    # row exists already (a turn remembered before, then committed).
    f"OPTIONAL MATCH (l:{_T} {{key: $lock_key}}) WHERE l.owner = $owner DELETE l "
    f"WITH count(l) AS released OPTIONAL MATCH (t:{_T} {{key: $key}}) "
    f"OPTIONAL MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) "
    f"OPTIONAL MATCH (m:{_MEM} {{key: $key}}) "
    "RETURN released, properties(t) AS props, c.turn_seq AS turn_seq, m IS NOT NULL AS remembered"
)
TURN_AND_MEMORY_SEQ_NEXT = (
    # The turn's seq and, when it appends `$memory_count` memory rows, their positions (the
    # last one is returned), from the conversation's counters in one statement.
    f"MERGE (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "SET c.turn_seq = coalesce(c.turn_seq, $floor) + 1, c.memory_seq = CASE WHEN $memory_count = 0 "
    "THEN c.memory_seq ELSE coalesce(c.memory_seq, 0) + $memory_count END "
    "RETURN c.turn_seq AS seq, c.memory_seq AS memory_last"
)
CONVERSATION_HEAD = (
    f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "RETURN c.memory_seq AS memory_seq, c.turn_seq AS turn_seq, c.vectors_epoch AS vectors_epoch"
)
MEMORY_CLAIM = (
    f"MERGE (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "SET c.memory_seq = coalesce(c.memory_seq, 0) + $count RETURN c.memory_seq AS last"
)
MEMORY_KEYS_PRESENT = f"UNWIND $keys AS key MATCH (m:{_MEM} {{key: key}}) RETURN m.key AS key"
MEMORY_CREATE = f"UNWIND $rows AS row CREATE (m:{_MEM}) SET m = row"
MEMORY_MARK_COMMITTED = (
    f"MATCH (m:{_MEM} {{key: $key}}) SET m.committed = true, m.extra = $extra, m.facts = $facts"
)
MEMORY_AT = f"MATCH (m:{_MEM} {{position_key: $position_key}}) RETURN m.key AS key, m.text AS text"
MEMORY_SET_VECTORS = (
    # Re-embedding (kg.dialogue.memory.replace_vectors_tx): a row gets the new vector only when
    # its text is still the one embedded (an edit or a swipe may have replaced it meanwhile)
    # and it is not already from the model that made the new vector.
    f"UNWIND $rows AS row MATCH (m:{_MEM} {{key: row.key}}) "
    "WHERE m.conversation_id = $conversation_id AND m.text = row.text "
    "AND coalesce(m.embedded_by, '') <> $embedded_by "
    "SET m.embedding = row.embedding, m.embedded_by = $embedded_by RETURN count(m) AS changed"
)
VECTORS_EPOCH_BUMP = (
    # Readers cache a conversation's vectors (tasks.dialogue.retriever): a new epoch tells them
    # to read its rows again.
    f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "SET c.vectors_epoch = coalesce(c.vectors_epoch, 0) + 1 RETURN c.vectors_epoch AS epoch"
)
CONVERSATION_IDS = (
    f"MATCH (c:{_CONV}) RETURN c.conversation_id AS conversation_id ORDER BY c.conversation_id"
)
CONVERSATION_PAGE = (
    f"MATCH (c:{_CONV}) RETURN c.conversation_id AS conversation_id, c.memory_seq AS memory_seq "
    "ORDER BY c.conversation_id SKIP $offset LIMIT $limit"
)
CONVERSATION_TOTAL = f"MATCH (c:{_CONV}) RETURN count(c) AS n"
MEMORY_ROWS = (
    f"UNWIND $position_keys AS pk MATCH (m:{_MEM} {{position_key: pk}}) "
    "RETURN properties(m) AS props ORDER BY m.seq"
)
MEMORY_COUNT = f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id RETURN count(m) AS n, count(DISTINCT m.key) AS keys"
ENTITIES = (
    f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.last_seq DESC, e.entity_id LIMIT $limit"
)
SNAPSHOT = (
    # What the retriever reads for a turn, in one round trip (a statement costs more in driver
    # and server overhead than these index lookups do): the memory head and vector epoch, the
    # row at the reader's position (is its cache current?), the rows at the next positions,
    # then the entities (as ENTITIES reads them), the active relations with their ends' names,
    # and the recent milestones (as RECENT_MILESTONES). Each part is collected before the next
    # MATCH, so the parts never multiply; an empty part is an empty list (OPTIONAL MATCH, nulls
    # are not collected). The lists' order is restored by the caller (kg.dialogue.snapshot).
    f"OPTIONAL MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) "
    "WITH c.memory_seq AS memory_seq, c.vectors_epoch AS vectors_epoch "
    f"OPTIONAL MATCH (at:{_MEM} {{position_key: $at_key}}) "
    "WITH memory_seq, vectors_epoch, at.key AS at_key, at.text AS at_text "
    "UNWIND (CASE WHEN size($position_keys) = 0 THEN [null] ELSE $position_keys END) AS pk "
    f"OPTIONAL MATCH (m:{_MEM} {{position_key: pk}}) "
    "WITH memory_seq, vectors_epoch, at_key, at_text, collect(properties(m)) AS rows "
    f"OPTIONAL MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "WITH memory_seq, vectors_epoch, at_key, at_text, rows, e "
    "ORDER BY e.last_seq DESC, e.entity_id LIMIT $entity_limit "
    "WITH memory_seq, vectors_epoch, at_key, at_text, rows, collect(properties(e)) AS entities "
    f"OPTIONAL MATCH (a:{_E})-[r:{_R}]->(b:{_E}) "
    "WHERE r.conversation_id = $conversation_id AND r.status = $active "
    "WITH memory_seq, vectors_epoch, at_key, at_text, rows, entities, a, r, b "
    "ORDER BY r.weight DESC, r.rel_id LIMIT $relation_limit "
    "WITH memory_seq, vectors_epoch, at_key, at_text, rows, entities, collect(CASE WHEN r IS NULL THEN null ELSE "
    "{source_id: a.entity_id, source_name: a.name, target_id: b.entity_id, target_name: b.name, "
    "props: properties(r)} END) AS relations "
    f"OPTIONAL MATCH (ms:{_M}) WHERE ms.conversation_id = $conversation_id "
    "WITH memory_seq, vectors_epoch, at_key, at_text, rows, entities, relations, ms "
    "ORDER BY ms.seq DESC, ms.milestone_id DESC LIMIT $milestone_limit "
    "RETURN memory_seq, vectors_epoch, at_key, at_text, rows, entities, relations, "
    "collect(properties(ms)) AS milestones"
)
ALL_RELATIONS = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id "
    "RETURN a.entity_id AS source_id, a.name AS source_name, b.entity_id AS target_id, b.name AS target_name, "
    "properties(r) AS props ORDER BY r.rel_id"
)
RECENT_MILESTONES = (
    f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id "
    "RETURN properties(m) AS props ORDER BY m.seq DESC, m.milestone_id DESC LIMIT $limit"
)
ALL_EVENTS = (
    f"MATCH (e:{_EV}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.seq, e.event_id"
)
ALL_TURNS = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id "
    "RETURN t.key AS key, t.turn_id AS turn_id, t.seq AS seq, t.payload_hash AS payload_hash ORDER BY t.seq"
)

UPSERT_ENTITIES = (
    f"UNWIND $rows AS row MERGE (e:{_E} {{conversation_id: row.conversation_id, entity_id: row.entity_id}}) "
    "ON CREATE SET e.name = row.name, e.name_key = row.name_key, e.kind = row.kind, e.aliases = [], "
    "e.first_turn = row.turn_id, e.first_seq = row.seq, e.mentions = 0, e.bio_summary = '', e.bio_traits = [] "
    "SET e.last_turn = row.turn_id, e.last_seq = row.seq, e.mentions = e.mentions + 1, "
    "e.aliases = e.aliases + [a IN row.aliases WHERE NOT a IN e.aliases]"
)
FIND_ACTIVE_RELATIONS = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}})-[r:{_R}]->"
    f"(b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) "
    "WHERE r.status = $active AND ($type IS NULL OR r.type = $type) "
    "RETURN r.rel_id AS rel_id, r.type AS type, r.weight AS weight ORDER BY r.rel_id"
)
SET_RELATION_WEIGHT = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}})-[r:{_R}]->"
    f"(b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) WHERE r.rel_id = $rel_id "
    "SET r.weight = $weight, r.updated_turn = $turn_id, r.updated_seq = $seq"
)
END_RELATION = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}})-[r:{_R}]->"
    f"(b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) WHERE r.rel_id = $rel_id "
    "SET r.status = $ended, r.ended_turn = $turn_id, r.ended_seq = $seq, r.updated_turn = $turn_id, "
    "r.updated_seq = $seq"
)
CREATE_RELATION = (
    f"MATCH (a:{_E} {{conversation_id: $conversation_id, entity_id: $source_id}}) "
    f"MATCH (b:{_E} {{conversation_id: $conversation_id, entity_id: $target_id}}) "
    f"CREATE (a)-[r:{_R}]->(b) SET r = $props"
)
CREATE_EVENTS = f"UNWIND $rows AS row CREATE (e:{_EV}) SET e = row"
PATCH_BIOS = (
    # The rows in order; a row sees what the rows before it wrote (two patches to one entity
    # in one turn: the second builds on the first; tests/tasks/dialogue/test_dialogue_sidecar.py
    # checks it).
    f"UNWIND $rows AS row MATCH (e:{_E} {{conversation_id: $conversation_id, entity_id: row.entity_id}}) "
    "SET e.bio_summary = CASE WHEN row.summary IS NULL THEN e.bio_summary ELSE row.summary END, "
    "e.bio_traits = [t IN coalesce(e.bio_traits, []) WHERE NOT t IN row.remove] "
    "+ [t IN row.add WHERE NOT t IN coalesce(e.bio_traits, [])], "
    "e.bio_updated_turn = $turn_id RETURN count(e) AS patched"
)
CREATE_MILESTONES = f"UNWIND $rows AS row CREATE (m:{_M}) SET m = row"
CREATE_TURN_RECORDS = (
    # A commit's last statement: the turn record, then its relation events, milestones and
    # memory row (each UNWIND may be empty; `WITH count(*)` carries one row past it).
    f"CREATE (t:{_T}) SET t = $props WITH count(*) AS turns "
    f"UNWIND $events AS row CREATE (e:{_EV}) SET e = row WITH count(*) AS events "
    f"UNWIND $milestones AS row CREATE (m:{_M}) SET m = row WITH count(*) AS milestones "
    f"UNWIND $memory AS row CREATE (r:{_MEM}) SET r = row RETURN count(*) AS memory"
)

DELETE_CONVERSATION_RELS = (
    f"MATCH ()-[r:{_R}]->() WHERE r.conversation_id = $conversation_id DELETE r"
)
DELETE_CONVERSATION_NODES: tuple[str, ...] = tuple(
    f"MATCH (n:{label}) WHERE n.conversation_id = $conversation_id DETACH DELETE n"
    for label in (_EV, _M, _T, _MEM, _CONV, _E)
)
DELETE_CONVERSATION_LOCK = f"MATCH (l:{_T} {{key: $key}}) DELETE l"
CONVERSATION_CONTENTS = (
    # What forgetting a conversation removes, counted before it goes: each count is taken
    # before the next MATCH, so the parts never multiply.
    f"OPTIONAL MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) WITH count(c) AS heads "
    f"OPTIONAL MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id AND t.status = $committed "
    "WITH heads, count(t) AS turns "
    f"OPTIONAL MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id "
    "WITH heads, turns, count(m) AS memory "
    f"OPTIONAL MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "WITH heads, turns, memory, count(e) AS entities "
    f"OPTIONAL MATCH ()-[r:{_R}]->() WHERE r.conversation_id = $conversation_id "
    "WITH heads, turns, memory, entities, count(r) AS relations "
    f"OPTIONAL MATCH (ms:{_M}) WHERE ms.conversation_id = $conversation_id "
    "RETURN heads, turns, memory, entities, relations, count(ms) AS milestones"
)

# Rename (the chat was renamed) and copy (the chat was branched): the records re-keyed in place
# or copied, the facts rebuilt from the turns' stored writes under the new id
# (kg.dialogue.rename).
RENAME_TURN_ROWS = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id "
    "RETURN t.key AS key, t.turn_id AS turn_id, t.seq AS seq, t.status AS status, "
    "t.write_json AS write_json, properties(t) AS props ORDER BY t.seq, t.key"
)
RENAME_TURN_RECORDS = (
    f"UNWIND $rows AS row MATCH (t:{_T} {{key: row.old_key}}) "
    "SET t.key = row.key, t.conversation_id = $new_id, t.write_json = row.write_json, "
    "t.payload_conversation_id = coalesce(t.payload_conversation_id, $old_id)"
)
RENAME_MEMORY_ROWS = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id "
    "RETURN m.key AS key, m.turn_id AS turn_id, m.seq AS seq, properties(m) AS props ORDER BY m.seq"
)
RENAME_MEMORY = (
    f"UNWIND $rows AS row MATCH (m:{_MEM} {{key: row.old_key}}) "
    "SET m.key = row.key, m.position_key = row.position_key, m.conversation_id = $new_id"
)
COPY_TURN_RECORDS = f"UNWIND $rows AS row CREATE (t:{_T}) SET t = row.props"
COPY_MEMORY = f"UNWIND $rows AS row CREATE (m:{_MEM}) SET m = row.props"
HEAD_PROPS = f"MATCH (c:{_CONV} {{conversation_id: $old_id}}) RETURN properties(c) AS props"
CREATE_HEAD = f"CREATE (c:{_CONV}) SET c = $props"
RENAME_HEAD = f"MATCH (c:{_CONV} {{conversation_id: $old_id}}) SET c.conversation_id = $new_id"

# Rewind (edits, swipes): remove a turn and every later one exactly, by rebuilding the
# conversation's facts from the stored writes of the turns that stay.
LOCK_HELD = f"MATCH (l:{_T} {{key: $key}}) WHERE l.owner = $owner RETURN count(l) AS held"
MEMORY_SEQ_OF = (
    f"MATCH (m:{_MEM} {{key: $key}}) RETURN m.seq AS seq, m.conversation_id AS conversation_id"
)
MEMORY_TEXT_OF = f"MATCH (m:{_MEM} {{key: $key}}) RETURN m.text AS text"
MEMORY_KEYS_FROM = f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.seq >= $seq RETURN m.key AS key"
DELETE_MEMORY_FROM = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.seq >= $seq DELETE m"
)
COMMITTED_TURN_WRITES = (
    f"MATCH (t:{_T}) WHERE t.conversation_id = $conversation_id AND t.status = $committed "
    "RETURN t.key AS key, t.turn_id AS turn_id, t.seq AS seq, t.write_json AS write_json ORDER BY t.seq"
)
DELETE_TURNS = f"UNWIND $keys AS key MATCH (t:{_T} {{key: key}}) DELETE t"
DELETE_CONVERSATION_FACTS: tuple[str, ...] = tuple(
    f"MATCH (n:{label}) WHERE n.conversation_id = $conversation_id DETACH DELETE n"
    for label in (_EV, _M, _E)
)
SET_HEADS = f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) SET c.memory_seq = $memory_seq, c.turn_seq = $turn_seq"
SET_MEMORY_HEAD_ONLY = f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) SET c.memory_seq = $memory_seq REMOVE c.turn_seq"
DELETE_CONVERSATION_HEAD = f"MATCH (c:{_CONV} {{conversation_id: $conversation_id}}) DELETE c"

# Read-back (paged, stable order).
ENTITY_PAGE = (
    f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.first_seq, e.entity_id SKIP $offset LIMIT $limit"
)
ENTITY_TOTAL = f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id RETURN count(e) AS n"
RELATION_PAGE = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id "
    "RETURN a.entity_id AS source_id, a.name AS source_name, b.entity_id AS target_id, b.name AS target_name, "
    "properties(r) AS props ORDER BY r.since_seq, r.rel_id SKIP $offset LIMIT $limit"
)
RELATION_TOTAL = (
    f"MATCH ()-[r:{_R}]->() WHERE r.conversation_id = $conversation_id RETURN count(r) AS n"
)
RELATION_EVENTS = (
    f"MATCH (e:{_EV}) WHERE e.conversation_id = $conversation_id AND e.rel_id IN $rel_ids "
    "RETURN properties(e) AS props ORDER BY e.seq, e.index"
)
MILESTONE_PAGE = (
    f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id "
    "RETURN properties(m) AS props ORDER BY m.seq, m.milestone_id SKIP $offset LIMIT $limit"
)
MILESTONE_TOTAL = f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id RETURN count(m) AS n"
MEMORY_PAGE_ROWS = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.seq > $offset AND m.seq <= $until "
    "RETURN m.key AS key, m.turn_id AS turn_id, m.seq AS seq, m.speaker AS speaker, m.text AS text, "
    "m.`when` AS said_when, m.committed AS committed, m.facts AS facts ORDER BY m.seq"
)

# The lorebook's read (kg.dialogue.lore): the whole conversation at once, in a stable order.
LORE_ENTITIES = (
    f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "RETURN properties(e) AS props ORDER BY e.first_seq, e.entity_id"
)
LORE_RELATIONS = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id "
    "RETURN a.entity_id AS source_id, a.name AS source_name, b.entity_id AS target_id, b.name AS target_name, "
    "properties(r) AS props ORDER BY r.since_seq, r.rel_id"
)
LORE_MILESTONES = (
    f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id "
    "RETURN properties(m) AS props ORDER BY m.seq, m.milestone_id"
)
LORE_STATED_FACTS = (
    f"MATCH (m:{_MEM}) WHERE m.conversation_id = $conversation_id AND m.committed = true "
    "RETURN m.seq AS seq, m.turn_id AS turn_id, m.speaker AS speaker, m.facts AS facts ORDER BY m.seq"
)
