"""Where Skald's Cypher depends on the server: the one place that chooses, and the renderer
of every statement only a Neo4j server receives.

One statement text serves both servers wherever possible (kg/cypher.py). Where the
dialects truly differ, `ServerInfo` (the server a `GraphStore` connected to) decides:

- `locks_reads`: a commit reads its pre-state *for update* (`cypher.lock_nodes`: a
  throw-away SET/REMOVE takes each node's write lock), because Neo4j reads are
  read-committed. ArcadeDB's optimistic commit-time version check covers the same race, so
  it gets the plain read (`cypher.read_nodes`).
- `may_have_vector_index`: Neo4j 5.11+ gets a vector index over scene embeddings
  (`cypher.create_scene_vector_index`, `VECTOR_INDEX_STATE`, `QUERY_SCENE_VECTOR_INDEX`);
  ArcadeDB's Bolt server has none, so retrieval ranks the stored embeddings with numpy.

The test suite runs against the embedded ArcadeDB, so the statements above that only Neo4j
receives never reach a server there. `neo4j_only_statements` renders each of them from the
same builders, for every label and relationship type of the vocabulary a builder takes,
so CI can lint them with Neo4j's own front end (tools/cypher-lint) next to the statements
the suite recorded. A new Neo4j-only path (a full-text index, say) adds its builder here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kg import cypher
from kg import vocabulary as vocab

#: The embedding sizes the vector index is rendered for: all-MiniLM-L6-v2 (384) and the
#: local SmolLM2 embeddings (576). The size is an integer literal, so any other is alike.
RENDERED_VECTOR_DIMENSIONS: tuple[int, ...] = (384, 576)

_PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class ServerInfo:
    agent: str
    address: str

    @property
    def is_arcadedb(self) -> bool:
        return "arcadedb" in self.agent.lower()

    @property
    def is_neo4j(self) -> bool:
        return self.agent.startswith("Neo4j/") and not self.is_arcadedb

    @property
    def locks_reads(self) -> bool:
        """Read a commit's pre-state for update (every server but ArcadeDB; see the module doc)."""
        return not self.is_arcadedb

    @property
    def may_have_vector_index(self) -> bool:
        # Neo4j 5.11+ (and every 202x calendar release) has vector indexes; ArcadeDB has not.
        if not self.is_neo4j:
            return False
        try:
            major, minor = (int(x) for x in self.agent.split("/", 1)[1].split(".")[:2])
        except ValueError:
            return False
        return major > 5 or (major == 5 and minor >= 11)


@dataclass(frozen=True)
class RenderedStatement:
    """A statement only a Neo4j server receives, and the code path that sends it."""

    text: str
    path: str

    @property
    def parameters(self) -> tuple[str, ...]:
        """The `$name` parameters the text uses (its call site passes exactly these)."""
        return tuple(sorted(set(_PARAMETER.findall(self.text))))


def neo4j_only_statements() -> list[RenderedStatement]:
    """Every statement kg/ sends only when `ServerInfo` says Neo4j, rendered from its builder."""
    rendered: list[RenderedStatement] = []
    for label in sorted(vocab.ALL_LABELS):
        rendered.append(
            RenderedStatement(cypher.lock_nodes(label), "commit: read for update (locks_reads)")
        )
        rendered.append(
            RenderedStatement(
                cypher.row_lock_node(label),
                "commit, per-row ops (bench): read for update (locks_reads)",
            )
        )
    for dimensions in RENDERED_VECTOR_DIMENSIONS:
        rendered.append(
            RenderedStatement(
                cypher.create_scene_vector_index(dimensions),
                "retrieval: create the scene vector index (may_have_vector_index)",
            )
        )
    rendered.append(
        RenderedStatement(
            cypher.VECTOR_INDEX_STATE, "retrieval: vector index state (may_have_vector_index)"
        )
    )
    rendered.append(
        RenderedStatement(
            cypher.QUERY_SCENE_VECTOR_INDEX,
            "retrieval: similar scenes by the vector index (may_have_vector_index)",
        )
    )
    return rendered
