"""Atomic chapter commits with a change-set, and exact rollback.

Both run inside ONE managed write transaction (`commit_chapter_tx`, `rollback_tx` are
transaction functions for `session.execute_write`), so a crash, a kill or a failed
statement leaves the graph exactly as before, and the driver's retry of transient errors
(ArcadeDB reports DeadlockDetected under concurrency) re-runs the whole function.

A commit is planned in Python from the pre-state it reads in the same transaction:

1. read every node the delta may touch (by explicit id, derived id, name and alias keys),
2. resolve each reference (id, then name/alias match, then derived id; otherwise a new
   provisional entity), merge the delta into full property maps, and append to each
   changed entity's `revisions_json` the previous values (so reads "as of chapter N"
   can undo later chapters, see kg.records.props_as_of),
3. write with a handful of `UNWIND $rows` statements grouped by label / type,
4. store a `ChangeSet` node holding what was created and the previous property maps of
   everything updated.

Rollback replays a change-set backwards: delete what it created, `SET n = $previous` on
what it updated (which also removes properties that did not exist before). Statements go
through `GraphOps`, whose per-row subclass in bench/graph_commit.py runs the same plan one
statement per row for comparison.

Modules: `ids` (node ids and the embedding hash), `ops` (GraphOps: the batched statements),
`planner` (the pre-state read and the plan of node/relationship writes), `transactions`
(`commit_chapter_tx`, `rollback_tx`).
"""

from kg.commit.ids import NOVEL_INFO_ID, changeset_id, chapter_id, embedding_sha, scene_id
from kg.commit.ops import GraphOps
from kg.commit.planner import NodeWrite, RelWrite
from kg.commit.transactions import commit_chapter_tx, rollback_tx

__all__ = [
    "NOVEL_INFO_ID",
    "GraphOps",
    "NodeWrite",
    "RelWrite",
    "changeset_id",
    "chapter_id",
    "commit_chapter_tx",
    "embedding_sha",
    "rollback_tx",
    "scene_id",
]
