"""GraphStore: the one way the project talks to the graph (Neo4j or embedded ArcadeDB).

Owns the driver lifecycle, connects with bounded retries, maps driver failures to the
project's one-line errors, and exposes the chapter commit/rollback, migrations, stats,
export/import. Every write goes through `session.execute_write` so the driver retries
transient failures (ArcadeDB's DeadlockDetected) by re-running the whole transaction;
the two retries of our own (connecting, a chapter commit that lost a uniqueness race) use
tenacity.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import neo4j
import tenacity
from neo4j import GraphDatabase, ManagedTransaction
from neo4j import exceptions as nx

from core.errors import GraphOwnerGoneError, GraphUnavailableError, GraphWriteError, SkaldError
from core.graph_server import (
    EmbeddedArcadeDB,
    GraphEndpoint,
    credentials_hint,
    free_space_short,
    graph_endpoint,
    owner_exited,
    owner_gone,
)
from core.settings import Settings
from kg import cypher, mirror, schema, transfer
from kg import vocabulary as vocab
from kg.commit import GraphOps, commit_chapter_tx, history, rollback_tx
from kg.dialect import ServerInfo
from kg.errors import ChapterNotCommittedError, GraphQueryError
from kg.models import ChangeSetInfo, ChapterDelta, CommitResult, Entity, GraphStats, RollbackResult
from kg.records import entity_from_props

log = logging.getLogger("skald.kg")

_RACE_ATTEMPTS = 4
#: Failures that may pass while a server starts: worth another connection attempt.
_UNREACHABLE = (nx.DriverError, nx.Neo4jError, OSError)
P = ParamSpec("P")
T = TypeVar("T")


def _lost_a_commit_race(exc: BaseException) -> bool:
    return isinstance(exc, GraphWriteError) and isinstance(exc.__cause__, nx.ConstraintError)


def _rows_of(
    runner: neo4j.Session | ManagedTransaction, query: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every row of `query` run in `runner` (a session: auto-commit; or a managed transaction)."""
    return [record.data() for record in runner.run(query, params)]


def _one_line(exc: BaseException, limit: int = 300) -> str:
    if isinstance(exc, nx.Neo4jError):
        text = f"{exc.code}: {exc.message}" if exc.code else str(exc.message or exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _close_at_exit(ref: weakref.ReferenceType[GraphStore]) -> None:
    store = ref()
    if store is not None:
        store.close()


class GraphStore:
    """A connected graph. Use `GraphStore.open(settings)` or `with GraphStore(endpoint) as g`."""

    def __init__(
        self,
        endpoint: GraphEndpoint,
        *,
        connect_attempts: int = 5,
        retry_delay: float = 0.5,
        max_transaction_retry_time: float = 30.0,
    ) -> None:
        self.endpoint = endpoint
        self.connect_attempts = max(1, connect_attempts)
        self.retry_delay = retry_delay
        self.max_transaction_retry_time = max_transaction_retry_time
        self._driver: neo4j.Driver | None = None
        self._server: ServerInfo | None = None
        self._connecting = threading.Lock()
        #: The embedded graph's serving process went away: find (or become) its new owner
        #: on the next connect instead of knocking at the old port.
        self._owner_gone = False

    # --- lifecycle -----------------------------------------------------------------------

    @classmethod
    def open(cls, settings: Settings, *, migrate: bool = True) -> GraphStore:
        """Connect to the configured graph (starting the embedded one if needed)."""
        store = cls(graph_endpoint(settings), connect_attempts=settings.graph_connect_attempts)
        store.connect()
        if migrate:
            try:
                store.migrate()
            except BaseException:
                store.close()
                raise
        return store

    def connect(self) -> GraphStore:
        """Open the driver and check the server answers; bounded retries with backoff."""
        with self._connecting:
            return self._connect()

    def _connect(self) -> GraphStore:
        if self._driver is not None:
            return self
        if self._owner_gone and self.endpoint.root is not None:
            self.endpoint = EmbeddedArcadeDB.for_dir(self.endpoint.root).endpoint()
            self._owner_gone = False
        ep = self.endpoint
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.connect_attempts),
            wait=tenacity.wait_exponential(multiplier=self.retry_delay, max=4.0),
            retry=tenacity.retry_if_exception_type(_UNREACHABLE),
            before_sleep=lambda state: log.info(
                "graph at %s not reachable (attempt %d): %s",
                ep.uri,
                state.attempt_number,
                _one_line(state.outcome.exception() if state.outcome else Exception()),
            ),
            reraise=True,
        )
        try:
            driver, info = retrying(self._open_checked_driver)
        except _UNREACHABLE as exc:
            raise GraphUnavailableError(
                f"graph at {ep.uri} is unreachable after {self.connect_attempts} attempts ({_one_line(exc)})",
                hint="start the Neo4j server, fix NEO4J_URI, or unset NEO4J_URI to use the embedded ArcadeDB",
            ) from exc
        self._driver = driver
        self._server = ServerInfo(agent=info.agent or "", address=str(info.address))
        # Close before interpreter exit: an embedded server started earlier in this
        # process stops in its own (earlier-registered, so later-run) atexit hook and
        # waits for open Bolt connections, so a forgotten store would hang the exit.
        atexit.register(_close_at_exit, weakref.ref(self))
        log.info("graph: connected to %s (%s)", ep.label, self._server.agent)
        return self

    def _open_checked_driver(self) -> tuple[neo4j.Driver, Any]:
        """`_open_driver`, with the failures no retry can fix turned into one clear line."""
        ep = self.endpoint
        try:
            return self._open_driver()
        except nx.AuthError as exc:
            raise GraphUnavailableError(
                f"graph at {ep.uri} refused the credentials for user {ep.username!r}: {_one_line(exc)}",
                hint=credentials_hint(ep),
            ) from exc
        except nx.ConfigurationError as exc:
            raise GraphUnavailableError(
                f"graph driver configuration refused: {_one_line(exc)}"
            ) from exc

    def _open_driver(self) -> tuple[neo4j.Driver, Any]:
        """A verified driver. Server notifications (e.g. "unknown label" on a fresh graph) are
        noise here, so they are switched off, except on servers too old to filter them."""
        ep = self.endpoint
        for quiet in ({"notifications_min_severity": "OFF"}, {}):
            driver = GraphDatabase.driver(
                ep.uri,
                auth=(ep.username, ep.password),
                max_transaction_retry_time=self.max_transaction_retry_time,
                connection_timeout=10.0,
                user_agent="skald-kg",
                **quiet,
            )
            try:
                driver.verify_connectivity()
                return driver, driver.get_server_info()
            except nx.ConfigurationError as exc:
                driver.close()
                if not quiet or "otification" not in str(exc):
                    raise
            except BaseException:
                driver.close()
                raise
        raise AssertionError("unreachable")

    def _raise_if_owner_gone(self, cause: BaseException | None) -> None:
        """GraphOwnerGoneError when the other process that served this embedded graph exited
        (the connection is dropped first, so the next use finds a new owner)."""
        gone = owner_gone(self.endpoint)
        if gone is not None:
            self._forget_lost_owner()
            raise GraphOwnerGoneError(gone) from cause

    def _raise_if_disk_full(self, cause: BaseException) -> None:
        """A write the embedded graph refused on a disk that filled: said so, not as ArcadeDB
        says it over Bolt ("TransactionNotFound: Transaction error on commit"). The error
        carries the full disk as an OSError, so a command ends on core.errors' disk-full line."""
        root = self.endpoint.root
        if root is None:
            return
        free_mb = free_space_short(root)
        if free_mb is None:
            return
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root))
        full.__cause__ = cause
        raise GraphWriteError(
            f"graph write failed and was rolled back: only {free_mb} MiB free on the disk "
            f"holding {root} ({_one_line(cause)})",
            hint="free some space on that disk, then send it again",
        ) from full

    def _forget_lost_owner(self) -> None:
        """Drop the connection to a server whose process exited; the next use reconnects."""
        with self._connecting:
            driver, self._driver, self._server = self._driver, None, None
            self._owner_gone = True
        if driver is not None:
            with contextlib.suppress(Exception):  # its connections are dead already
                driver.close()

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    def __enter__(self) -> GraphStore:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def driver(self) -> neo4j.Driver:
        if self._driver is None:
            self.connect()
        assert self._driver is not None
        return self._driver

    @property
    def server(self) -> ServerInfo:
        if self._server is None:
            self.connect()
        assert self._server is not None
        return self._server

    # --- transactions --------------------------------------------------------------------

    def execute_write(
        self,
        work: Callable[Concatenate[ManagedTransaction, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run `work(tx, ...)` in one managed write transaction (retried on transient errors)."""
        with self._session("write") as session:
            return session.execute_write(work, *args, **kwargs)

    def execute_read(
        self,
        work: Callable[Concatenate[ManagedTransaction, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        with self._session("read") as session:
            return session.execute_read(work, *args, **kwargs)

    def read_in_one_round_trip(
        self,
        work: Callable[Concatenate[neo4j.Session, P], T | None],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T | None:
        """`work(session, ...)`, whose statements run as auto-commit transactions: one round
        trip each (no BEGIN, no COMMIT) and no retry. None when `work` says so or an error the
        driver would retry met it (transient, a lost connection, an expired session): the caller
        then reads in a managed transaction (`execute_read`), which retries as before."""
        with self._session("read") as session:
            try:
                return work(session, *args, **kwargs)
            except (nx.TransientError, nx.ServiceUnavailable, nx.SessionExpired):
                return None

    @contextlib.contextmanager
    def _session(self, kind: Literal["read", "write"]) -> Iterator[neo4j.Session]:
        """A session whose driver errors surface as the project's one-line errors."""
        if self._driver is not None and owner_exited(self.endpoint):
            # Asked first: against the dead port the driver would retry the managed
            # transaction for max_transaction_retry_time (30 s) before failing. (Without a
            # driver, the next connect finds the graph's current owner by itself.)
            self._raise_if_owner_gone(None)
        try:
            # The access mode routes a session's auto-commit statements on a cluster (managed
            # transactions route themselves).
            access = neo4j.READ_ACCESS if kind == "read" else neo4j.WRITE_ACCESS
            with self.driver.session(
                database=self.endpoint.database, default_access_mode=access
            ) as session:
                yield session
        except SkaldError:
            raise
        except (nx.Neo4jError, nx.DriverError) as exc:
            # An embedded graph served by another process that exited: whatever the driver
            # says (connection refused, "BEGIN not expected in state: AUTHENTICATION" from a
            # server half way through stopping), one line naming it and what to do instead.
            self._raise_if_owner_gone(exc)
            if isinstance(exc, nx.ServiceUnavailable | nx.SessionExpired):
                lost = "; the transaction was not committed" if kind == "write" else ""
                raise GraphUnavailableError(
                    f"graph at {self.endpoint.uri} became unreachable{lost} ({_one_line(exc)})",
                    hint="check the graph server and retry",
                ) from exc
            if kind == "write":
                self._raise_if_disk_full(exc)
                raise GraphWriteError(
                    f"graph write failed and was rolled back: {_one_line(exc)}"
                ) from exc
            raise GraphQueryError(f"graph read failed: {_one_line(exc)}") from exc

    def read(self, query: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of one read query (queries come from kg.cypher). One statement needs no
        transaction of its own: it runs auto-commit, one round trip instead of three (BEGIN,
        the statement, COMMIT), and a sidecar's turn reads twice before its lease (the turn's
        stored record, the lease's holder). An error the driver would retry reads it again
        in a managed transaction, which retries."""
        rows = self.read_in_one_round_trip(_rows_of, query, params)
        return rows if rows is not None else self.execute_read(_rows_of, query, params)

    def write(self, query: str, **params: Any) -> list[dict[str, Any]]:
        return self.execute_write(_rows_of, query, params)

    def write_once(self, query: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of one write query in one attempt: no driver retry (its first backoff is ~1 s).
        For a caller that retries on its own, sooner (a lease heartbeat: on ArcadeDB a renewal
        that meets a concurrent change to the lease fails at once and is simply sent again)."""
        with self._session("write") as session, session.begin_transaction() as tx:
            rows = [r.data() for r in tx.run(query, **params)]
            tx.commit()
            return rows

    # --- schema --------------------------------------------------------------------------

    def schema_version(self) -> int:
        rows = self.read(cypher.READ_SCHEMA_META, id=schema.SCHEMA_META_ID)
        return int(rows[0]["version"]) if rows and rows[0]["version"] is not None else 0

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the tags applied (empty when up to date)."""
        rows = self.read(cypher.READ_SCHEMA_META, id=schema.SCHEMA_META_ID)
        version = int(rows[0]["version"]) if rows else 0
        applied_tags: list[str] = list(rows[0]["applied"] or []) if rows else []
        if version > schema.LATEST_VERSION:
            raise GraphUnavailableError(
                f"graph schema version {version} is newer than this code supports ({schema.LATEST_VERSION})",
                hint="upgrade skald, or point NEO4J_URI / --project-dir at another graph",
            )
        done: list[str] = []
        for migration in schema.MIGRATIONS:
            if migration.version <= version:
                continue
            for statement in migration.statements:
                # Schema statements get their own transactions (Neo4j forbids mixing them with data writes).
                self.write(statement)
            applied_tags.append(migration.tag)
            self.write(
                cypher.WRITE_SCHEMA_META,
                id=schema.SCHEMA_META_ID,
                version=migration.version,
                applied=applied_tags,
            )
            done.append(migration.tag)
            log.info("graph: applied migration %s", migration.tag)
        return done

    def index_names(self) -> dict[str, str]:
        return {r["name"]: r["type"] for r in self.read(cypher.SHOW_INDEXES)}

    # --- chapters ------------------------------------------------------------------------

    def commit_chapter(
        self, delta: ChapterDelta, *, replace: bool = False, ops: GraphOps | None = None
    ) -> CommitResult:
        """Write a chapter atomically with its change-set.

        Idempotent: the same delta again is a no-op. A different delta for a committed
        chapter raises ChapterConflictError unless `replace=True`, which rolls the old one
        back in the same transaction first (allowed only for the newest commit).
        `ops` swaps the statement strategy (the benchmark's per-row path); leave it None.
        """
        # A uniqueness violation here means a concurrent commit created the same entity (or
        # took the same change-set seq) first; the transaction was rolled back, so planning
        # again from the new state is safe. The driver only retries errors the server calls
        # transient, which this is not.
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(_RACE_ATTEMPTS),
            wait=lambda state: random.uniform(0.05, 0.2) * state.attempt_number,
            retry=tenacity.retry_if_exception(_lost_a_commit_race),
            before_sleep=lambda state: log.info(
                "graph: chapter %d commit raced another writer (%s); retrying",
                delta.chapter,
                state.outcome.exception() if state.outcome else None,
            ),
            reraise=True,
        )
        result = retrying(
            self.execute_write,
            commit_chapter_tx,
            delta,
            replace=replace,
            ops=ops,
            lock_reads=self.server.locks_reads,
        )
        log.info(
            "graph: chapter %d %s (%d nodes created, %d updated, %d relationships) in %.2fs",
            delta.chapter,
            "unchanged" if result.noop else "committed",
            result.created_nodes,
            result.updated_nodes,
            result.created_relationships,
            result.seconds,
        )
        return result

    def rollback_chapter(self, chapter: int, *, cascade: bool = False) -> RollbackResult:
        """Restore the exact graph state from before `chapter` was committed (one transaction).

        Refused (RollbackOrderError) when chapters were committed after it, unless
        `cascade=True`, which rolls those back too, newest first.
        """
        result = self.execute_write(rollback_tx, chapter, cascade=cascade)
        log.info("graph: rolled back chapter(s) %s in %.2fs", result.chapters, result.seconds)
        return result

    def committed_chapters(self) -> list[ChangeSetInfo]:
        """Change-sets in the graph, in commit order."""
        rows = self.read(cypher.READ_CHANGESET_INFOS)
        infos = [
            ChangeSetInfo(**{k: (0 if v is None else v) for k, v in row.items()}) for row in rows
        ]
        return sorted(infos, key=lambda i: i.seq)

    def history_head(self) -> tuple[int, str]:
        """(number, fingerprint) of the newest change-set (kg.commit.history); (0, "") when none."""

        def work(tx: ManagedTransaction) -> tuple[int, str]:
            newest = history.newest(tx)
            return (
                (0, "")
                if newest is None
                else (int(newest["seq"]), history.fingerprint_before(tx, newest["seq"] + 1))
            )

        return self.execute_read(work)

    def history_at(self, seq: int) -> str | None:
        """The fingerprint of the history through change-set number `seq` (None: there is no such one)."""

        def work(tx: ManagedTransaction) -> str | None:
            return history.fingerprint_before(tx, seq + 1) if history.by_seq(tx, seq) else None

        return self.execute_read(work)

    def latest_chapter(self) -> int:
        """The highest chapter with a Chapter node (0: none yet)."""
        rows = self.read(cypher.LATEST_CHAPTER)
        return int(rows[0]["latest"]) if rows and rows[0]["latest"] is not None else 0

    def committed_hash(self, chapter: int) -> str | None:
        """The delta hash committed for a chapter (change-set key), or None (one indexed read)."""
        rows = self.read(cypher.CHANGESET_BY_CHAPTER, chapter=chapter)
        return str(rows[0]["delta_hash"]) if rows else None

    def mark_maintained(self, chapter: int) -> bool:
        """Note on the chapter's change-set that healing and QA ran after it (False: none)."""
        return bool(self.write(cypher.MARK_MAINTAINED, chapter=chapter))

    def maintained(self, chapter: int) -> bool:
        """Whether healing and QA ran after the chapter's change-set as it is now committed
        (a rollback deletes the change-set, and its mark with it)."""
        rows = self.read(cypher.READ_MAINTAINED, chapter=chapter)
        return bool(rows and rows[0]["maintained"])

    def history_fingerprint(self, chapter: int) -> str:
        """What the graph holds before `chapter`, as a digest (kg.commit.history): every
        change-set committed before it (before its own change-set when it is committed, else
        all of them), with the amendments healing recorded on them. Equal fingerprints mean
        reads "as of chapter - 1" see the same graph, so a stage reading it may be cached under
        the fingerprint. A few indexed reads, whatever the length of the book."""

        def work(tx: ManagedTransaction) -> str:
            own = history.by_chapter(tx, chapter)
            return history.fingerprint_before(tx, own["seq"] if own else None)

        return self.execute_read(work)

    def set_chapter_summary(
        self, chapter: int, summary: str, key_events: list[str] | tuple[str, ...] = ()
    ) -> None:
        """Store the summary written after a chapter's commit on its Chapter node.

        Only a committed chapter has a Chapter node (created by its commit), so rolling the
        chapter back removes the summary with it and rollback stays exact.
        """
        rows = self.write(
            cypher.SET_CHAPTER_SUMMARY,
            id=f"chapter:{chapter}",
            summary=summary,
            key_events=[str(e) for e in key_events],
        )
        if not rows:
            raise ChapterNotCommittedError(
                f"chapter {chapter} has no Chapter node to hold its summary",
                hint="commit the chapter first (chapter 0, the initialization phase, has none)",
            )

    # --- entities ------------------------------------------------------------------------

    def get_entity(self, entity_id: str) -> Entity | None:
        rows = self.read(cypher.read_nodes(vocab.ENTITY), ids=[entity_id])
        return entity_from_props(rows[0]["props"]) if rows else None

    def entities_with_label(self, label: str) -> list[Entity]:
        """Every entity of one label (e.g. all characters), in id order."""
        label = vocab.normalize_label(label)[0]
        return [
            entity_from_props(r["props"])
            for r in self.read(cypher.READ_ENTITIES_WITH_LABEL, label=label)
        ]

    def find_entities(self, name: str, label: str | None = None) -> list[Entity]:
        """Entities whose name or alias normalises like `name` (best match first)."""
        if label is not None:
            label = vocab.normalize_label(label)[0]
        rows = self.read(cypher.FIND_ENTITIES_BY_KEY, keys=[vocab.name_key(name)])
        found = [
            (0 if r["kind"] == "name" else 1, r["props"]["id"], entity_from_props(r["props"]))
            for r in rows
            if label is None or r["props"].get("label") == label
        ]
        return [e for _, _, e in sorted(found, key=lambda t: (t[0], t[1]))]

    # --- whole graph ---------------------------------------------------------------------

    def stats(self) -> GraphStats:
        def work(tx: ManagedTransaction) -> GraphStats:
            labels = {r["label"]: r["count"] for r in tx.run(cypher.COUNT_LABELS)}
            types = {r["type"]: r["count"] for r in tx.run(cypher.COUNT_REL_TYPES)}
            nodes = tx.run(cypher.COUNT_NODES).single()
            meta = tx.run(cypher.READ_SCHEMA_META, id=schema.SCHEMA_META_ID).single()
            chapters = [r["chapter"] for r in tx.run(cypher.READ_CHANGESETS)]
            return GraphStats(
                labels=dict(sorted(labels.items())),
                relationship_types=dict(sorted(types.items())),
                nodes=int(nodes["count"]) if nodes else 0,
                relationships=sum(types.values()),
                schema_version=int(meta["version"]) if meta and meta["version"] is not None else 0,
                committed_chapters=chapters,
            )

        return self.execute_read(work)

    def export_data(self) -> dict[str, Any]:
        """All nodes and relationships with properties, deterministic order, no element ids."""
        return self.execute_read(transfer.export_tx)

    def export_json(self, path: str | Path) -> Path:
        """Write `export_data()` as canonical JSON (byte-identical for the same graph)."""
        return transfer.write_export(self.export_data(), Path(path))

    def import_data(self, data: dict[str, Any], *, merge: bool = False) -> dict[str, int]:
        """Load an export (into an empty graph, or with merge=True merging nodes by id)."""
        transfer.validate_export(data)
        try:
            return self.execute_write(transfer.import_tx, data, merge=merge)
        finally:
            mirror.forget(self)  # an import writes outside the change-sets the mirror follows

    def import_json(self, path: str | Path, *, merge: bool = False) -> dict[str, int]:
        return self.import_data(transfer.read_export(Path(path)), merge=merge)

    def wipe(self, *, batch: int = 10000) -> int:
        """Delete every node and relationship except the schema meta node; returns nodes deleted."""
        total = 0
        mirror.forget(self)
        while True:
            rows = self.write(cypher.WIPE_BATCH, limit=batch)
            deleted = int(rows[0]["deleted"]) if rows else 0
            total += deleted
            if deleted < batch:
                return total
