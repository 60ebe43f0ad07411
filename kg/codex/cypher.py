"""The codex's reads of the novel graph (values are parameters; labels and types come from
kg.vocabulary). Each is one statement over one label or relationship type, filtered on an
indexed property where there is one (`Entity.first_chapter`, `Scene.chapter`), capped by
`$limit`, and returns only the properties the page shows: never an embedding, never a
scene's text. The page holds the whole world as of a chapter, so these read it whole; a
chapter's codex costs what the page's size demands and nothing per entity or per chapter
(no statement runs once per row). The story relationships and the scenes, the bulk of a
long book, come from the story mirror (kg.mirror), which follows the change-sets. The sidecar's codex reads through kg.dialogue's
repository (its statements are in kg/dialogue/cypher.py)."""

from __future__ import annotations

from kg import vocabulary as vocab

q = vocab.quote_label
_STORY = "|".join(q(t) for t in vocab.ENTITY_REL_TYPES)

# Every chapter, filtered on `as_of` by the reader: ArcadeDB answers a range filter on the
# indexed `number` together with ORDER BY on it in ~7x the time of either alone (26 ms against
# 4 ms for 60 chapters, measured), and a book's chapters are few.
CHAPTERS = (
    f"MATCH (c:{q(vocab.CHAPTER)}) "
    "RETURN c.number AS number, c.title AS title, c.summary AS summary, c.key_events AS key_events "
    "ORDER BY c.number LIMIT $limit"
)
LATEST_CHAPTER = f"MATCH (c:{q(vocab.CHAPTER)}) RETURN max(c.number) AS latest"
ENTITIES = (
    f"MATCH (n:{q(vocab.ENTITY)}) WHERE n.first_chapter IS NULL OR n.first_chapter <= $as_of "
    "RETURN properties(n) AS props ORDER BY n.id LIMIT $limit"
)
APPEARANCES = (
    f"MATCH (e:{q(vocab.ENTITY)})-[r:{q(vocab.APPEARS_IN)}]->(c:{q(vocab.CHAPTER)}) WHERE r.chapter <= $as_of "
    "RETURN e.id AS id, r.chapter AS chapter LIMIT $limit"
)
MENTIONS = (
    f"MATCH (c:{q(vocab.CHAPTER)})-[r:{q(vocab.MENTIONS)}]->(e:{q(vocab.ENTITY)}) WHERE r.chapter <= $as_of "
    "RETURN e.id AS id, r.chapter AS chapter LIMIT $limit"
)

# --- The sidecar's codex: one conversation (every filter is on an indexed conversation_id) ----

_E, _R, _EV, _M = (
    q(x) for x in (vocab.KG_ENTITY, vocab.KG_REL, vocab.KG_REL_EVENT, vocab.KG_MILESTONE)
)
DIALOGUE_HEAD = (
    f"MATCH (c:{q(vocab.KG_CONVERSATION)} {{conversation_id: $conversation_id}}) "
    "RETURN c.memory_seq AS memory_seq, c.turn_seq AS turn_seq"
)
DIALOGUE_ENTITIES = (
    f"MATCH (e:{_E}) WHERE e.conversation_id = $conversation_id "
    "RETURN e.entity_id AS entity_id, e.name AS name, e.kind AS kind, e.aliases AS aliases, "
    "e.bio_summary AS bio_summary, e.bio_traits AS bio_traits, e.first_turn AS first_turn, "
    "e.first_seq AS first_seq, e.last_turn AS last_turn, e.last_seq AS last_seq, e.mentions AS mentions "
    "ORDER BY e.first_seq, e.entity_id LIMIT $limit"
)
DIALOGUE_RELATIONS = (
    f"MATCH (a:{_E})-[r:{_R}]->(b:{_E}) WHERE r.conversation_id = $conversation_id "
    "RETURN a.entity_id AS source, b.entity_id AS target, r.rel_id AS rel_id, r.type AS type, "
    "r.raw_type AS raw_type, r.weight AS weight, r.status AS status, r.since_turn AS since_turn, "
    "r.since_seq AS since_seq, r.ended_turn AS ended_turn, r.ended_seq AS ended_seq "
    "ORDER BY r.since_seq, r.rel_id LIMIT $limit"
)
DIALOGUE_EVENTS = (
    f"MATCH (e:{_EV}) WHERE e.conversation_id = $conversation_id "
    "RETURN e.rel_id AS rel_id, e.turn_id AS turn_id, e.seq AS seq, e.action AS action, e.from_type AS from_type, "
    "e.to_type AS to_type, e.weight_before AS weight_before, e.weight_after AS weight_after, e.reason AS reason, "
    "e.quote AS quote, e.source_id AS source, e.target_id AS target "
    "ORDER BY e.seq, e.index LIMIT $limit"
)
DIALOGUE_MILESTONES = (
    f"MATCH (m:{_M}) WHERE m.conversation_id = $conversation_id "
    "RETURN m.milestone_id AS milestone_id, m.turn_id AS turn_id, m.seq AS seq, m.text AS text, "
    "m.importance AS importance, m.entity_ids AS entity_ids, m.quote AS quote "
    "ORDER BY m.seq, m.milestone_id LIMIT $limit"
)
