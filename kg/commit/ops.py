"""GraphOps: every statement a commit or rollback runs, batched with UNWIND in chunks
(bench/graph_commit.py subclasses it to run the same plan one statement per row)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from neo4j import ManagedTransaction

from kg import cypher


def grouped(items: list[Any], key: Callable[[Any], Hashable]) -> dict[Any, list[Any]]:
    """`items` in groups by `key`, the groups in sorted key order: batched writes (one
    statement a label or relationship type) run in the same order on every run."""
    groups: dict[Any, list[Any]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(sorted(groups.items()))


class GraphOps:
    """The statements a commit or rollback needs, batched with UNWIND."""

    #: rows per UNWIND statement: keeps Bolt messages moderate on very large chapters.
    chunk = 5000

    @staticmethod
    def rows(tx: ManagedTransaction, query: str, **params: Any) -> list[dict[str, Any]]:
        return [record.data() for record in tx.run(query, **params)]

    @staticmethod
    def run(tx: ManagedTransaction, query: str, **params: Any) -> None:
        tx.run(query, **params).consume()

    def _chunks(self, items: list[Any]) -> list[list[Any]]:
        return [items[i : i + self.chunk] for i in range(0, len(items), self.chunk)]

    # reads
    def read_changesets(self, tx: ManagedTransaction) -> list[dict[str, Any]]:
        return self.rows(tx, cypher.READ_CHANGESETS)

    def read_changeset_props(
        self, tx: ManagedTransaction, chapters: list[int]
    ) -> dict[int, dict[str, Any]]:
        found = self.rows(tx, cypher.READ_CHANGESET_PROPS, chapters=chapters)
        return {row["props"]["chapter"]: row["props"] for row in found}

    #: Node reads by id, plain and for update (the benchmark's per-row subclass swaps them).
    read_query = staticmethod(cypher.read_nodes)
    lock_query = staticmethod(cypher.lock_nodes)

    def _props_by_id(
        self, tx: ManagedTransaction, query: str, ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        return {
            row["id"]: row["props"]
            for part in self._chunks(ids)
            for row in self.rows(tx, query, ids=part)
        }

    def read_nodes(
        self, tx: ManagedTransaction, label: str, ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        return self._props_by_id(tx, self.read_query(label), ids)

    def lock_nodes(
        self, tx: ManagedTransaction, label: str, ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        """Like read_nodes, but takes the nodes' write locks first (read for update)."""
        return self._props_by_id(tx, self.lock_query(label), ids)

    def read_names(self, tx: ManagedTransaction, keys: list[str]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for part in self._chunks(keys):
            found += self.rows(tx, cypher.READ_NAMES, keys=part)
        return found

    def read_rels(
        self, tx: ManagedTransaction, keys_by_type: dict[str, list[str]]
    ) -> dict[str, dict[str, Any]]:
        types = tuple(sorted(t for t, keys in keys_by_type.items() if keys))
        if not types:
            return {}
        params = {f"k{i}": keys_by_type[t] for i, t in enumerate(types)}
        return {
            row["key"]: row["props"]
            for row in self.rows(tx, cypher.read_rels_by_key(types), **params)
        }

    # writes
    def create_nodes(
        self, tx: ManagedTransaction, labels: tuple[str, ...], rows: list[dict[str, Any]]
    ) -> None:
        for part in self._chunks(rows):
            self.run(tx, cypher.create_nodes(labels), rows=part)

    def update_nodes(self, tx: ManagedTransaction, label: str, rows: list[dict[str, Any]]) -> None:
        """rows: {"id", "changes"} where changes maps changed keys to values (None removes)."""
        for part in self._chunks(rows):
            self.run(tx, cypher.update_nodes(label), rows=part)

    def restore_nodes(self, tx: ManagedTransaction, label: str, rows: list[dict[str, Any]]) -> None:
        """rows: {"id", "props"}: the complete property map to put back."""
        for part in self._chunks(rows):
            self.run(tx, cypher.restore_nodes(label), rows=part)

    def delete_nodes(self, tx: ManagedTransaction, label: str, ids: list[str]) -> None:
        for part in self._chunks(ids):
            self.run(tx, cypher.delete_nodes(label), ids=part)

    def create_rels(
        self, tx: ManagedTransaction, group: tuple[str, str, str], rows: list[dict[str, Any]]
    ) -> None:
        for part in self._chunks(rows):
            self.run(tx, cypher.create_rels(*group), rows=part)

    def update_rels(
        self, tx: ManagedTransaction, group: tuple[str, str, str], rows: list[dict[str, Any]]
    ) -> None:
        for part in self._chunks(rows):
            self.run(tx, cypher.update_rels(*group), rows=part)

    def delete_rels(self, tx: ManagedTransaction, rel_type: str, keys: list[str]) -> None:
        for part in self._chunks(keys):
            self.run(tx, cypher.delete_rels(rel_type), keys=part)

    def create_names(self, tx: ManagedTransaction, rows: list[dict[str, Any]]) -> None:
        for part in self._chunks(rows):
            self.run(tx, cypher.CREATE_NAMES, rows=part)

    def delete_names(self, tx: ManagedTransaction, rows: list[dict[str, Any]]) -> None:
        for part in self._chunks(rows):
            self.run(tx, cypher.DELETE_NAMES, rows=part)

    def delete_names_of(self, tx: ManagedTransaction, entity_ids: list[str]) -> None:
        for part in self._chunks(entity_ids):
            self.run(tx, cypher.DELETE_NAMES_OF, ids=part)

    def create_changeset(self, tx: ManagedTransaction, props: dict[str, Any]) -> None:
        self.run(tx, cypher.CREATE_CHANGESET, props=props)

    def delete_changeset(self, tx: ManagedTransaction, chapter: int) -> None:
        self.run(tx, cypher.DELETE_CHANGESET, chapter=chapter)
