"""Benchmark of the graph layer: batched chapter commits, rollback, per-scene retrieval.

    python -m bench.graph_commit [--rounds 5] [--chapters 50] [--queries 200]

Starts its own embedded ArcadeDB in a temporary project directory (NEO4J_URI is ignored
unless --use-configured-graph is given, because the benchmark wipes the graph), then:

1. commits one chapter delta of 300 entities, 1,000 relationships and 200 property updates
   of existing entities, batched (UNWIND, the production path) and one statement per row
   (the same plan and change-set through per-row statements), each rolled back after
   timing, alternating the order; medians are reported with the ratio;
2. times the rollback of the batched commit;
3. builds a 50-chapter graph and measures p50/p95 of `retrieval.scene_context` (named
   characters' profiles and relationships, location context, last 3 summaries, and
   similar scenes by embedding) for the next chapter.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from neo4j import ManagedTransaction

from core.graph_server import graph_endpoint
from core.settings import load_settings
from kg import cypher, retrieval
from kg.commit import GraphOps
from kg.models import (
    ChapterDelta,
    Entity,
    EntitySource,
    PropertyUpdate,
    Relationship,
    SceneDelta,
    StatusChange,
)
from kg.store import GraphStore
from kg.transfer import dumps_export

REL_TYPES = [
    "knows",
    "friend of",
    "enemy of",
    "loves",
    "distrusts",
    "serves",
    "protects",
    "ally of",
    "rival of",
]
EMBEDDING_DIM = 384


class PerRowOps(GraphOps):
    """The same commit plan, but every row is its own statement (the naive approach)."""

    read_query = staticmethod(cypher.row_read_node)
    lock_query = staticmethod(cypher.row_lock_node)

    def _props_by_id(
        self, tx: ManagedTransaction, query: str, ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        return {
            row["id"]: row["props"] for node_id in ids for row in self.rows(tx, query, id=node_id)
        }

    def read_names(self, tx: ManagedTransaction, keys: list[str]) -> list[dict[str, Any]]:
        return [row for key in keys for row in self.rows(tx, cypher.ROW_READ_NAME, key=key)]

    def read_rels(
        self, tx: ManagedTransaction, keys_by_type: dict[str, list[str]]
    ) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for rel_type, keys in keys_by_type.items():
            for key in keys:
                for row in self.rows(tx, cypher.row_read_rel(rel_type), key=key):
                    found[row["key"]] = row["props"]
        return found

    def create_nodes(
        self, tx: ManagedTransaction, labels: tuple[str, ...], rows: list[dict[str, Any]]
    ) -> None:
        for row in rows:
            self.run(tx, cypher.row_create_node(labels), props=row["props"])

    def update_nodes(self, tx: ManagedTransaction, label: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.run(tx, cypher.row_update_node(label), id=row["id"], changes=row["changes"])

    def create_rels(
        self, tx: ManagedTransaction, group: tuple[str, str, str], rows: list[dict[str, Any]]
    ) -> None:
        for row in rows:
            self.run(
                tx,
                cypher.row_create_rel(*group),
                src=row["src"],
                tgt=row["tgt"],
                props=row["props"],
            )

    def update_rels(
        self, tx: ManagedTransaction, group: tuple[str, str, str], rows: list[dict[str, Any]]
    ) -> None:
        for row in rows:
            self.run(
                tx,
                cypher.row_update_rel(*group),
                src=row["src"],
                tgt=row["tgt"],
                key=row["key"],
                props=row["props"],
            )

    def create_names(self, tx: ManagedTransaction, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.run(tx, cypher.ROW_CREATE_NAME, props=row)

    def delete_names(self, tx: ManagedTransaction, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.run(tx, cypher.ROW_DELETE_NAME, entity_id=row["entity_id"], key=row["key"])


# --- workloads ---------------------------------------------------------------------------


def seed_delta(existing: int) -> ChapterDelta:
    source = EntitySource(type="outline", chapter=0)
    return ChapterDelta(
        chapter=0,
        source_type="outline",
        entities=[
            Entity(
                label="Character",
                name=f"Founder {i}",
                description=f"Founder number {i}.",
                sources=[source],
                status_intervals=[{"status": "alive", "from_chapter": 0}],
            )
            for i in range(existing)
        ],
    )


def commit_delta(rng: random.Random, existing: int) -> ChapterDelta:
    """300 entities (new), 1,000 relationships, 200 property updates of existing entities."""
    new = [f"Newcomer {i}" for i in range(300)]
    everyone = new + [f"Founder {i}" for i in range(existing)]
    return ChapterDelta(
        chapter=1,
        title="Benchmark chapter",
        summary="A chapter with many entities.",
        entities=[
            Entity(
                label=rng.choice(["Character", "Character", "Location", "Item", "Event"]),
                name=name,
                description=f"{name} in detail. " * 4,
                traits=["curious"],
                attributes={"rank": i},
            )
            for i, name in enumerate(new)
        ],
        relationships=[
            Relationship(
                source=a, target=b, type=rng.choice(REL_TYPES), weight=round(rng.random(), 3)
            )
            for a, b in ((rng.choice(everyone), rng.choice(everyone)) for _ in range(1000))
        ],
        property_updates=[
            PropertyUpdate(
                entity=f"Founder {i}",
                changes={"description": f"Changed in chapter 1 ({i}).", "mood": "tense"},
            )
            for i in range(200)
        ],
    )


def embedding(rng: random.Random) -> list[float]:
    return [round(rng.gauss(0.0, 1.0), 6) for _ in range(EMBEDDING_DIM)]


def story_chapter(
    rng: random.Random, chapter: int, cast: list[str], places: list[str]
) -> ChapterDelta:
    fresh = [f"Ch{chapter} Person {i}" for i in range(20)] + [
        f"Ch{chapter} Place {i}" for i in range(5)
    ]
    present = rng.sample(cast, 15) + fresh[:20]
    relationships = [
        Relationship(
            source=rng.choice(present), target=rng.choice(present), type=rng.choice(REL_TYPES)
        )
        for _ in range(100)
    ] + [
        Relationship(source=p, target=rng.choice(places + fresh[20:]), type="located in")
        for p in present[:15]
    ]
    delta = ChapterDelta(
        chapter=chapter,
        title=f"Chapter {chapter}",
        summary=f"Summary of chapter {chapter}: " + "events unfold. " * 20,
        embedding=embedding(rng),
        entities=[
            Entity(label="Character", name=n, description=f"{n} appears.") for n in fresh[:20]
        ]
        + [Entity(label="Location", name=n, description=f"{n} is a place.") for n in fresh[20:]],
        relationships=relationships,
        property_updates=[
            PropertyUpdate(entity=n, changes={"last_mood": f"mood {chapter}"})
            for n in rng.sample(cast, 10)
        ],
        status_changes=[StatusChange(entity=rng.choice(cast), status="wounded")]
        if chapter % 7 == 0
        else [],
        scenes=[
            SceneDelta(
                index=i,
                title=f"Scene {i}",
                summary=f"Scene {i} of chapter {chapter}.",
                characters=rng.sample(present, 4),
                embedding=embedding(rng),
            )
            for i in (1, 2, 3)
        ],
    )
    cast.extend(fresh[:20])
    places.extend(fresh[20:])
    return delta


# --- measurements ------------------------------------------------------------------------


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def cpu_timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, float, Any]:
    """Wall seconds and CPU seconds of this process. The embedded server's JVM threads run
    in this process, so the CPU figure is the work of client and server together, and it
    hardly moves when other programs load the machine (wall time does)."""
    cpu = time.process_time()
    seconds, result = timed(fn, *args, **kwargs)
    return seconds, time.process_time() - cpu, result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def bench_commit(store: GraphStore, rounds: int, existing: int) -> dict[str, Any]:
    rng = random.Random(42)
    store.wipe()
    store.commit_chapter(seed_delta(existing))
    delta = commit_delta(rng, existing)
    before = dumps_export(store.export_data())
    # Warm-up (JIT, caches) on both paths.
    for ops in (None, PerRowOps()):
        store.commit_chapter(delta, ops=ops)
        store.rollback_chapter(1)
    batched: list[float] = []
    per_row: list[float] = []
    rollbacks: list[float] = []
    batched_cpu: list[float] = []
    per_row_cpu: list[float] = []
    exports: dict[str, str] = {}
    for round_no in range(rounds):
        order = [("batched", None), ("per-row", PerRowOps())]
        if round_no % 2:
            order.reverse()
        for name, ops in order:
            seconds, cpu, result = cpu_timed(store.commit_chapter, delta, ops=ops)
            (batched if name == "batched" else per_row).append(seconds)
            (batched_cpu if name == "batched" else per_row_cpu).append(cpu)
            if round_no == 0:
                exports[name] = dumps_export(store.export_data())
                created = (result.created_nodes, result.created_relationships, result.updated_nodes)
            seconds, _ = timed(store.rollback_chapter, 1)
            if name == "batched":
                rollbacks.append(seconds)
    assert exports["batched"] == exports["per-row"], "both paths must write the same graph"
    assert dumps_export(store.export_data()) == before, "rollback must restore the exact graph"
    return {
        "batched": batched,
        "per_row": per_row,
        "batched_cpu": batched_cpu,
        "per_row_cpu": per_row_cpu,
        "rollback": rollbacks,
        "created": created,
    }


def bench_retrieval(store: GraphStore, chapters: int, queries: int) -> dict[str, Any]:
    rng = random.Random(7)
    store.wipe()
    cast = [f"Hero {i}" for i in range(40)]
    places = [f"Realm {i}" for i in range(10)]
    source = EntitySource(type="outline", chapter=0)
    store.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[Entity(label="Character", name=n, sources=[source]) for n in cast]
            + [Entity(label="Location", name=n, sources=[source]) for n in places],
        )
    )
    build_seconds, _ = timed(
        lambda: [
            store.commit_chapter(story_chapter(rng, c, cast, places))
            for c in range(1, chapters + 1)
        ]
    )
    stats = store.stats()

    def one_query(with_embedding: bool) -> float:
        seconds, context = timed(
            retrieval.scene_context,
            store,
            chapter=chapters + 1,
            characters=rng.sample(cast, 4),
            location=rng.choice(places),
            k_summaries=3,
            embedding=embedding(rng) if with_embedding else None,
            k_similar=3,
        )
        assert len(context.characters) == 4 and len(context.recent_summaries) == 3
        return seconds * 1000

    results: dict[str, Any] = {"build": build_seconds, "stats": stats}
    for with_embedding in (True, False):
        for _ in range(20):
            one_query(with_embedding)  # warm-up
        results["with_embedding" if with_embedding else "graph_only"] = [
            one_query(with_embedding) for _ in range(queries)
        ]
    return results


def _print_commit(commit: dict[str, Any], existing: int) -> None:
    """The batched and per-row commits' medians, their ratio, and the rollback's."""
    b, r = statistics.median(commit["batched"]), statistics.median(commit["per_row"])
    rb = statistics.median(commit["rollback"])
    nodes, rels, updated = commit["created"]
    print(
        f"chapter delta: 300 entities, 1000 relationships, 200 property updates on a graph of "
        f"{existing} entities -> {nodes} nodes created (entities + Chapter), {rels} relationships "
        f"created (story + one APPEARS_IN/MENTIONS per entity involved), {updated} nodes updated "
        f"(property updates + last_chapter of existing entities involved)"
    )
    print(
        f"commit, batched UNWIND (one transaction)      median {b * 1000:8.1f} ms  runs: "
        + ", ".join(f"{x * 1000:.0f}" for x in commit["batched"])
    )
    print(
        f"commit, one statement per row (one transaction) median {r * 1000:8.1f} ms  runs: "
        + ", ".join(f"{x * 1000:.0f}" for x in commit["per_row"])
    )
    bc, rc = (
        statistics.median(commit["batched_cpu"]),
        statistics.median(commit["per_row_cpu"]),
    )
    print(
        f"speed-up batched vs per-row: {r / b:.1f}x wall time (goal >= 10x); "
        f"CPU of client + embedded server: {bc * 1000:.0f} ms vs {rc * 1000:.0f} ms = {rc / bc:.1f}x"
    )
    print(
        f"rollback of the batched commit (one transaction) median {rb * 1000:8.1f} ms  runs: "
        + ", ".join(f"{x * 1000:.0f}" for x in commit["rollback"])
    )


def _print_retrieval(ret: dict[str, Any], chapters: int) -> None:
    """The retrieval graph built, and scene_context's p50 / p95 with and without embeddings."""
    st = ret["stats"]
    print(
        f"retrieval graph: {chapters} chapters, {st.labels.get('Entity', 0)} entities, "
        f"{st.labels.get('Scene', 0)} scenes ({EMBEDDING_DIM}-dim embeddings), {st.relationships} relationships; "
        f"built in {ret['build']:.1f} s"
    )
    for key, label in (
        (
            "with_embedding",
            "scene_context (4 profiles + location + 3 summaries + top-3 similar scenes)",
        ),
        ("graph_only", "scene_context without the embedding search"),
    ):
        values = ret[key]
        print(
            f"{label}: p50 {percentile(values, 50):6.1f} ms  p95 {percentile(values, 95):6.1f} ms  "
            f"(n={len(values)}, goal p95 < 50 ms)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.graph_commit", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="timed commits per path (median reported)"
    )
    parser.add_argument("--chapters", type=int, default=50, help="chapters in the retrieval graph")
    parser.add_argument("--queries", type=int, default=200, help="timed scene_context queries")
    parser.add_argument(
        "--existing",
        type=int,
        default=400,
        help="entities in the graph before the benchmark chapter",
    )
    parser.add_argument(
        "--use-configured-graph",
        action="store_true",
        help="use NEO4J_URI / the current project's graph instead of a temporary one (it is WIPED)",
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="skald-bench-graph-") as tmp:
        settings = (
            load_settings(tmp)
            if args.use_configured_graph
            else load_settings(tmp).model_copy(update={"neo4j_uri": None})
        )
        endpoint = graph_endpoint(settings)
        store = GraphStore(endpoint).connect()
        try:
            store.migrate()
            print(f"graph: {endpoint.label} ({store.server.agent})")
            _print_commit(bench_commit(store, args.rounds, args.existing), args.existing)
            _print_retrieval(bench_retrieval(store, args.chapters, args.queries), args.chapters)
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
