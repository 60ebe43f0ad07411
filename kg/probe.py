"""A real write check for `core.doctor`: write inside a transaction, roll it back, verify."""

from __future__ import annotations

import uuid

from core.errors import GraphWriteError
from kg import vocabulary as vocab
from kg.store import GraphStore

_PROBE_CREATE = f"CREATE (p:{vocab.VALUE_NODE} {{probe: $marker}}) RETURN count(p) AS n"
_PROBE_COUNT = f"MATCH (p:{vocab.VALUE_NODE} {{probe: $marker}}) RETURN count(p) AS n"


def probe_rollback(store: GraphStore) -> str:
    """Create a marker node in an explicit transaction, roll it back, and check it is gone."""
    marker = f"doctor-{uuid.uuid4().hex}"
    with store.driver.session(database=store.endpoint.database) as session:
        tx = session.begin_transaction()
        try:
            tx.run(_PROBE_CREATE, marker=marker).consume()
            seen = tx.run(_PROBE_COUNT, marker=marker).single(strict=True)["n"]
        finally:
            tx.rollback()
        after = session.execute_read(lambda t: t.run(_PROBE_COUNT, marker=marker).single(strict=True)["n"])
    if seen != 1 or after != 0:
        raise GraphWriteError(f"transaction probe saw {seen} node(s) inside and {after} after rollback",
                              hint="the graph server does not roll back transactions correctly")
    return f"write visible in its transaction, gone after rollback ({store.server.agent})"
