"""The story knowledge graph: one implementation on the official neo4j driver that runs
unchanged on the embedded ArcadeDB Bolt server and on Neo4j 5.x.

- `kg.store.GraphStore`: connection, migrations, atomic chapter commits with exact rollback,
  stats, export/import.
- `kg.commit`: the chapter commit and rollback transactions (ids, batched statements, the
  planner, the transaction functions).
- `kg.models`: pydantic models at the boundary (ChapterDelta, Entity, Relationship, ...).
- `kg.records`: domain models <-> graph property maps and JSON, revisions "as of" a chapter.
- `kg.retrieval`: read queries "as of chapter N" for drafting and validation.
- `kg.healing`: duplicate detection and merging, graduation, enrichment (one concern a module).
- `kg.qa`: read-only checks of the whole story graph.
- `kg.dialogue`: the dialogue sidecar's memory (lease, turn commit, episodic memory, rewind).
- `kg.vocabulary`: the fixed labels and relationship types, and normalisation into them.
- `kg.cypher`, `kg.maintenance_cypher`, `kg.dialogue.cypher`: the Cypher statements (values
  are always parameters); `kg.dialect` renders what depends on the server.
- `python -m kg`: migrate, stats, export, import, rollback.
"""
