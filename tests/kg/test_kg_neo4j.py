"""The kg contract suite runs on whatever graph the session uses; this makes the Neo4j run visible."""

from __future__ import annotations

import os

import pytest

from core.settings import Settings
from kg.store import GraphStore

pytestmark = pytest.mark.neo4j


@pytest.mark.skipif(
    not os.environ.get("NEO4J_URI"),
    reason="NEO4J_URI not set: Neo4j contract run skipped (ArcadeDB run covers CI)",
)
def test_the_session_graph_is_neo4j(graph_settings: Settings) -> None:
    store = GraphStore.open(graph_settings)
    try:
        assert store.server.is_neo4j, store.server.agent
        assert store.schema_version() > 0
    finally:
        store.close()
