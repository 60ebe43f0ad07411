"""The history of the graph as a hash chain over its change-sets, read by index, not by scan.

Change-sets are numbered `seq` 1, 2, 3, ... in commit order: a commit takes the next number
and a rollback removes the newest ones, so the numbers stay contiguous and the newest is
number `count(ChangeSet)` (checked; a graph where that does not hold falls back to a scan).

Each commit stores `chain_sha` = H(F(previous), chapter, delta hash), where F(change-set) =
H(its chain_sha, its amendments_sha): so F(k) names everything committed up to change-set
k and everything healing recorded on them. `fingerprint_before(seq)` is F of the change-set
before `seq` (or of the newest): two equal fingerprints mean the same graph history, which
is what lets stages reading "as of chapter N - 1" be cached (tasks.policy.graph_read_task)
and lets kg.mirror keep its copy of the story current. A graph written before chains
existed has change-sets without `chain_sha`; F is then computed over all of them (a scan),
with the same formula, so old and new change-sets chain alike.
"""

from __future__ import annotations

import hashlib
from typing import Any

from neo4j import ManagedTransaction

from kg import cypher


def _h(*parts: object) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode("utf-8")).hexdigest()[:24]


def chain_sha(previous: str, chapter: int, delta_hash: str) -> str:
    return _h(previous, chapter, delta_hash)


def fingerprint(row: dict[str, Any]) -> str:
    """F of one change-set row (chain_sha, amendments_sha)."""
    return _h(row["chain_sha"], row.get("amendments_sha") or "")


def _rows(tx: ManagedTransaction, query: str, **params: Any) -> list[dict[str, Any]]:
    return [record.data() for record in tx.run(query, **params)]


def by_seq(tx: ManagedTransaction, seq: int) -> dict[str, Any] | None:
    found = _rows(tx, cypher.CHANGESET_BY_SEQ, seq=seq)
    return found[0] if found else None


def by_chapter(tx: ManagedTransaction, chapter: int) -> dict[str, Any] | None:
    found = _rows(tx, cypher.CHANGESET_BY_CHAPTER, chapter=chapter)
    return found[0] if found else None


def newest(tx: ManagedTransaction) -> dict[str, Any] | None:
    """The newest change-set's scalars (None: the graph has none)."""
    count = _rows(tx, cypher.COUNT_CHANGESETS)[0]["count"]
    if not count:
        return None
    row = by_seq(tx, count)
    if row is not None and by_seq(tx, count + 1) is None:
        return row
    every = _rows(tx, cypher.READ_CHANGESETS)  # numbering broken (an odd import): scan
    return by_chapter(tx, every[-1]["chapter"]) if every else None


def fingerprint_before(tx: ManagedTransaction, seq: int | None) -> str:
    """F of the change-set before `seq` (None: of the newest); "" when there is none."""
    row = newest(tx) if seq is None else by_seq(tx, seq - 1)
    if row is None:
        return ""
    if row.get("chain_sha"):
        return fingerprint(row)
    return _scanned(tx, row["seq"])


def _scanned(tx: ManagedTransaction, through_seq: int) -> str:
    """F computed over every change-set up to `through_seq` (graphs older than the chain)."""
    value = ""
    for row in _rows(tx, cypher.READ_CHANGESETS):
        if row["seq"] > through_seq:
            break
        chain = chain_sha(value, row["chapter"], row["delta_hash"])
        value = fingerprint({"chain_sha": chain, "amendments_sha": row["amendments_sha"]})
    return value
