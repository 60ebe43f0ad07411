"""The story knowledge graph: one implementation on the official neo4j driver that runs
unchanged on the embedded ArcadeDB Bolt server and on Neo4j 5.x.

- `kg.store.GraphStore`: connection, migrations, atomic chapter commits with exact rollback,
  stats, export/import.
- `kg.models`: pydantic models at the boundary (ChapterDelta, Entity, Relationship, ...).
- `kg.retrieval`: read queries "as of chapter N" for drafting and validation.
- `kg.vocabulary`: the fixed labels and relationship types, and normalisation into them.
- `kg.cypher`: every Cypher statement (values are always parameters).
- `python -m kg`: migrate, stats, export, import, rollback.
"""
