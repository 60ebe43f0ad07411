"""Contract tests of GraphStore against the session graph (embedded ArcadeDB, or NEO4J_URI)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from neo4j import ManagedTransaction
from neo4j import exceptions as neo4j_exceptions

from core.errors import GraphUnavailableError, GraphWriteError
from core.graph_server import GraphEndpoint, free_port, graph_endpoint
from core.settings import Settings
from kg import retrieval, schema
from kg.commit import GraphOps
from kg.errors import (
    ChapterConflictError,
    ChapterNotCommittedError,
    ImportRefusedError,
    RollbackOrderError,
)
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


def snapshot(store: GraphStore) -> str:
    return dumps_export(store.export_data())


def outline() -> ChapterDelta:
    user = EntitySource(type="outline", chapter=0, confidence=1.0)
    return ChapterDelta(
        chapter=0,
        title="Outline",
        summary="A ring must be destroyed.",
        source_type="outline",
        novel_info={"title": "The Ring", "genre": "fantasy", "themes": ["friendship", "power"]},
        entities=[
            Entity(
                label="Character",
                name="Aragorn",
                aliases=["Strider"],
                description="A ranger.",
                traits=["brave"],
                attributes={"age": 87},
                sources=[user],
                status_intervals=[{"status": "alive", "from_chapter": 0}],
            ),
            Entity(label="Character", name="Frodo Baggins", aliases=["Frodo"], sources=[user]),
            Entity(label="Location", name="Rivendell", description="Elven refuge.", sources=[user]),
            Entity(label="Location", name="The Shire", sources=[user]),
        ],
        relationships=[
            Relationship(source="Frodo", target="The Shire", type="lives in"),
            Relationship(source="Aragorn", target="Frodo Baggins", type="protects"),
        ],
    )


def chapter_one() -> ChapterDelta:
    """Creates nodes, adds relationships AND changes properties of existing entities."""
    return ChapterDelta(
        chapter=1,
        title="Flight",
        summary="Frodo reaches Rivendell.",
        embedding=[0.1, 0.2, 0.3],
        scenes=[
            SceneDelta(
                index=1,
                title="Road",
                summary="On the road.",
                characters=["Frodo"],
                embedding=[1.0, 0.0, 0.0],
            ),
            SceneDelta(
                index=2,
                title="Ford",
                summary="At the ford.",
                location="Rivendell",
                embedding=[0.0, 1.0, 0.0],
            ),
        ],
        entities=[
            Entity(
                label="Character", name="strider", description="Heir of Isildur.", traits=["wary"]
            ),
            Entity(
                label="Character",
                name="Arwen",
                sources=[EntitySource(type="extraction", chapter=1, confidence=0.7)],
            ),
            Entity(label="Item", name="The One Ring", aliases=["the Ring"]),
        ],
        relationships=[
            Relationship(source="Frodo", target="Rivendell", type="travels to", scene=2),
            Relationship(source="Arwen", target="Aragorn", type="loves"),
            Relationship(source="Frodo", target="the Ring", type="carries"),
            Relationship(source="Frodo", target="Sam", type="is friends with"),
            Relationship(source="Witch-king", target="Frodo", type="hunts relentlessly"),
        ],
        property_updates=[
            PropertyUpdate(
                entity="Rivendell", changes={"description": "Last Homely House.", "climate": "mild"}
            ),
            PropertyUpdate(entity="Aragorn", changes={"age": None, "rank": "captain"}),
        ],
        status_changes=[StatusChange(entity="Frodo", status="wounded")],
    )


def test_migrations_are_versioned_and_idempotent(store: GraphStore) -> None:
    assert store.migrate() == []
    assert store.schema_version() == schema.LATEST_VERSION
    names = store.index_names()
    for expected in (
        "kg_entityname_key",
        "kg_entity_name_key",
        "kg_rel_key_friend_of",
        "kg_kgturn_status",
    ):
        assert expected in names, sorted(names)
    # The uniqueness constraints are enforced, and a failed write keeps nothing.
    store.commit_chapter(outline())
    before = snapshot(store)
    with pytest.raises(GraphWriteError):
        store.execute_write(_create_duplicate_entity)
    assert snapshot(store) == before


def _create_duplicate_entity(tx: ManagedTransaction) -> None:
    GraphOps().create_nodes(tx, ("Entity", "Character"), [{"props": {"id": "character:extra"}}])
    GraphOps().create_nodes(tx, ("Entity", "Character"), [{"props": {"id": "character:aragorn"}}])


def test_commit_resolves_entities_and_creates_provisional_ones(store: GraphStore) -> None:
    init = store.commit_chapter(outline())
    assert init.resolved["Frodo"] == init.resolved["Frodo Baggins"] == "character:frodo-baggins"
    assert init.provisional_ids == []  # outline entities are canonical
    result = store.commit_chapter(chapter_one())
    # alias, case and leading-article insensitive resolution onto existing entities
    assert result.resolved["strider"] == "character:aragorn"
    assert result.resolved["Frodo"] == "character:frodo-baggins"
    assert result.resolved["the Ring"] == result.resolved["The One Ring"] == "item:one-ring"
    # unresolved names become provisional entities with a label implied by the type
    assert result.resolved["Sam"] == "character:sam"
    assert set(result.provisional_ids) == {
        "character:arwen",
        "character:sam",
        "character:witch-king",
        "item:one-ring",
    }

    aragorn = store.get_entity("character:aragorn")
    assert aragorn is not None
    assert aragorn.name == "Aragorn" and aragorn.aliases == ["Strider", "strider"]
    # extraction never overwrites the outline's description; traits and aliases accumulate
    assert aragorn.description == "A ranger." and aragorn.traits == ["brave", "wary"]
    assert aragorn.attributes == {"rank": "captain"}  # age removed, rank added
    assert (aragorn.first_chapter, aragorn.last_chapter, aragorn.is_provisional) == (0, 1, False)
    assert [s.type for s in aragorn.sources] == ["outline", "extraction"]
    frodo = store.get_entity("character:frodo-baggins")
    assert (
        frodo is not None and frodo.status_as_of(0) is None and frodo.status_as_of(1) == "wounded"
    )

    # Chapter 0 is the initialization phase: no Chapter node; its title/summary describe the novel.
    info = retrieval.novel_info(store)
    assert info == {
        "title": "The Ring",
        "genre": "fantasy",
        "themes": ["friendship", "power"],
        "summary": "A ring must be destroyed.",
    }
    stats = store.stats()
    assert stats.committed_chapters == [0, 1]
    assert (
        stats.labels["Chapter"] == 1
        and stats.labels["Scene"] == 2
        and stats.labels["NovelInfo"] == 1
    )
    assert (
        stats.relationship_types["RELATES_TO"] == 1
    )  # "hunts relentlessly" is not in the vocabulary
    assert {
        "FRIEND_OF",
        "LOVES",
        "TRAVELS_TO",
        "OWNS",
        "MENTIONS",
        "APPEARS_IN",
        "HAS_SCENE",
    } <= set(stats.relationship_types)
    assert [e.id for e in store.find_entities("STRIDER")] == ["character:aragorn"]
    assert store.find_entities("Rivendell", label="Character") == []


def test_same_delta_twice_gives_the_same_graph(store: GraphStore) -> None:
    store.commit_chapter(outline())
    first = store.commit_chapter(chapter_one())
    once = snapshot(store)
    again = store.commit_chapter(chapter_one())
    assert again.noop and again.resolved == first.resolved
    assert snapshot(store) == once
    # commit -> rollback -> commit also converges on the same bytes
    store.rollback_chapter(1)
    store.commit_chapter(chapter_one())
    assert snapshot(store) == once


def test_the_neo4j_commit_path_reads_for_update_and_writes_the_same_graph(
    store: GraphStore,
) -> None:
    """On Neo4j (`ServerInfo.locks_reads`) a commit reads its pre-state through
    `cypher.lock_nodes`; that path runs here too and must write byte-for-byte the same graph."""
    from kg.commit import commit_chapter_tx

    for delta in (outline(), chapter_one()):
        store.commit_chapter(delta)
    plain = snapshot(store)
    store.wipe()
    for delta in (outline(), chapter_one()):
        store.execute_write(commit_chapter_tx, delta, lock_reads=True)
    assert snapshot(store) == plain


def test_rollback_restores_the_exact_previous_graph(store: GraphStore) -> None:
    store.commit_chapter(outline())
    with pytest.raises(ChapterNotCommittedError):
        store.set_chapter_summary(0, "The initialization phase has no Chapter node.")
    before = snapshot(store)
    result = store.commit_chapter(chapter_one())
    assert result.created_nodes and result.updated_nodes and result.created_relationships
    store.set_chapter_summary(1, "Frodo is hurt.", ["ford"])
    assert snapshot(store) != before
    rolled = store.rollback_chapter(1)
    assert rolled.chapters == [1] and rolled.restored_nodes == result.updated_nodes
    assert snapshot(store) == before  # byte-identical export
    with pytest.raises(ChapterNotCommittedError):
        store.rollback_chapter(1)


def test_rollback_order_is_enforced_unless_cascading(store: GraphStore) -> None:
    empty = snapshot(store)
    store.commit_chapter(outline())
    after_outline = snapshot(store)
    store.commit_chapter(chapter_one())
    with pytest.raises(RollbackOrderError, match="chapter\\(s\\) 1 were committed after it"):
        store.rollback_chapter(0)
    assert store.rollback_chapter(0, cascade=True).chapters == [1, 0]
    assert snapshot(store) == empty
    store.commit_chapter(outline())
    assert snapshot(store) == after_outline


def test_a_different_delta_for_a_committed_chapter(store: GraphStore) -> None:
    store.commit_chapter(outline())
    store.commit_chapter(chapter_one())
    revised = chapter_one().model_copy(update={"summary": "Frodo reaches Rivendell, barely."})
    with pytest.raises(ChapterConflictError):
        store.commit_chapter(revised)
    replaced = store.commit_chapter(revised, replace=True)
    assert replaced.replaced and not replaced.noop
    via_replace = snapshot(store)
    store.rollback_chapter(1)
    store.commit_chapter(revised)
    assert snapshot(store) == via_replace


class _FailingOps(GraphOps):
    """Fails after the nodes and some relationships are written, inside the transaction."""

    def create_rels(
        self, tx: ManagedTransaction, group: tuple[str, str, str], rows: list[dict[str, Any]]
    ) -> None:
        super().create_rels(tx, group, rows)
        raise RuntimeError("injected failure half-way through the commit")


def test_a_commit_failing_half_way_writes_nothing(store: GraphStore) -> None:
    store.commit_chapter(outline())
    before = snapshot(store)
    with pytest.raises(RuntimeError, match="injected failure"):
        store.commit_chapter(chapter_one(), ops=_FailingOps())
    assert snapshot(store) == before


HOSTILE = [
    'O\'Brien "the" `Tick`',
    "}) DETACH DELETE n //",
    "x') MATCH (m) DETACH DELETE m; //",
    "Zoë 😀🔥 \u202eevil",
    "back\\slash\nnew line\ttab",
    "$param {rows} `Entity`:Character",
    "L" * 10_240,
]


def test_hostile_names_are_stored_verbatim_and_harm_nothing(store: GraphStore) -> None:
    store.commit_chapter(outline())
    outline_only = snapshot(store)
    delta = ChapterDelta(
        chapter=1,
        title=HOSTILE[1],
        summary=HOSTILE[6],
        entities=[
            Entity(label="Character", name=name, description=name, traits=[name])
            for name in HOSTILE
        ]
        + [
            Entity(
                label="`Entity`) DETACH DELETE n //",
                name="Weird Thing",
                attributes={HOSTILE[1]: HOSTILE[2]},
            )
        ],
        relationships=[
            Relationship(
                source=HOSTILE[i], target=HOSTILE[i + 1], type=HOSTILE[(i + 2) % len(HOSTILE)]
            )
            for i in range(len(HOSTILE) - 1)
        ]
        + [Relationship(source="Aragorn", target=HOSTILE[0], type="]->() DETACH DELETE r //")],
        property_updates=[
            PropertyUpdate(entity="Rivendell", changes={HOSTILE[2]: HOSTILE[3], "note": HOSTILE[6]})
        ],
        status_changes=[StatusChange(entity=HOSTILE[3], status=HOSTILE[1][:60])],
    )
    result = store.commit_chapter(delta)
    for name in HOSTILE:
        entity = store.get_entity(result.resolved[name])
        assert entity is not None
        assert (entity.name, entity.description, entity.traits) == (name, name, [name])
        assert [e.id for e in store.find_entities(name)] == [result.resolved[name]]
    weird = store.get_entity(result.resolved["Weird Thing"])
    assert (
        weird is not None
        and weird.label == "Concept"
        and weird.raw_label == "`Entity`) DETACH DELETE n //"
    )
    assert weird.attributes == {HOSTILE[1]: HOSTILE[2]}
    rivendell = store.get_entity("location:rivendell")
    assert rivendell is not None and rivendell.attributes == {
        HOSTILE[2]: HOSTILE[3],
        "note": HOSTILE[6],
    }
    stats = store.stats()
    assert set(stats.relationship_types) <= {
        "RELATES_TO",
        "LOCATED_IN",
        "PROTECTS",
        "MENTIONS",
        "APPEARS_IN",
        "HAS_SCENE",
    }
    # The outline's data is intact, and the whole chapter rolls back exactly.
    assert store.get_entity("character:frodo-baggins") is not None
    store.rollback_chapter(1)
    assert snapshot(store) == outline_only


def test_export_import_round_trip(store: GraphStore) -> None:
    store.commit_chapter(outline())
    store.commit_chapter(chapter_one())
    exported = store.export_data()
    text = dumps_export(exported)
    assert text == snapshot(store)  # two exports of the same graph are identical
    assert all("SchemaMeta" not in n["labels"] for n in exported["nodes"])
    with pytest.raises(ImportRefusedError, match="already holds"):
        store.import_data(exported)
    store.wipe()
    counts = store.import_data(exported)
    assert counts == {
        "nodes": len(exported["nodes"]),
        "relationships": len(exported["relationships"]),
    }
    assert snapshot(store) == text
    # The imported change-sets still work: rollback of chapter 1 after the import.
    store.rollback_chapter(1)
    assert store.stats().committed_chapters == [0]
    # Merge mode re-applies the full export onto the partial graph.
    store.import_data(exported, merge=True)
    assert snapshot(store) == text


def test_export_leaves_out_operational_properties_only(store: GraphStore) -> None:
    """A turn's commit time, committing process and trace stay in the graph but not in the
    export; a merge audit's created_at (a story stamp since issue 33, not a clock: healing
    writes the same bytes whenever it runs, so it is content like any other) and the turn's
    content are exported."""
    turn = {
        "key": "c:1",
        "conversation_id": "c",
        "turn_id": "1",
        "seq": 1,
        "status": "COMMITTED",
        "result_json": "{}",
        "committed_at": "2026-11-23T21:00:00+00:00",
        "committed_by": "host:1:ab",
        "trace_json": '{"total_ms": 5.0}',
    }
    audit = {"id": "merge-audit:1", "created_at": "after chapter 4, change-set 9", "chapter": 4}
    store.import_data(
        {
            "format": "skald-kg-export",
            "version": 1,
            "relationships": [],
            "nodes": [
                {"ref": "KGTurn/c:1", "labels": ["KGTurn"], "properties": turn},
                {"ref": "MergeAudit/merge-audit:1", "labels": ["MergeAudit"], "properties": audit},
            ],
        }
    )
    exported = {n["labels"][0]: n["properties"] for n in store.export_data()["nodes"]}
    assert exported["KGTurn"] == {
        k: v for k, v in turn.items() if k not in ("committed_at", "committed_by", "trace_json")
    }
    assert exported["MergeAudit"] == audit
    # Kept in the graph: a replay reads the trace back.
    from kg.dialogue import DialogueRepository

    stored = DialogueRepository(store).get_turn("c:1")
    assert stored is not None and stored.trace_json == turn["trace_json"]


def test_import_refuses_labels_outside_the_vocabulary(store: GraphStore) -> None:
    bad = {
        "format": "skald-kg-export",
        "version": 1,
        "nodes": [
            {"ref": "x", "labels": ["Entity`) DETACH DELETE n //"], "properties": {"id": "x"}}
        ],
        "relationships": [],
    }
    with pytest.raises(ImportRefusedError, match="outside the graph vocabulary"):
        store.import_data(bad)
    bad["nodes"] = [{"ref": "x", "labels": ["Entity"], "properties": {"id": "x"}}]
    bad["relationships"] = [
        {"type": "X]->() DELETE r //", "start": "x", "end": "x", "properties": {}}
    ]
    with pytest.raises(ImportRefusedError, match="outside the graph vocabulary"):
        store.import_data(bad)
    assert store.stats().nodes == 1  # only the schema meta node


def test_embeddings_and_numbers_round_trip_exactly(store: GraphStore) -> None:
    vector = [0.1 + 0.2, 1e-300, -0.0, 1 / 3, 123456.789]
    delta = ChapterDelta(
        chapter=1,
        embedding=vector,
        scenes=[SceneDelta(index=1, embedding=vector)],
        entities=[
            Entity(label="Item", name="Stone", attributes={"weight": 1.0, "count": 1, "big": 2**62})
        ],
    )
    store.commit_chapter(delta)
    scenes = retrieval.consistency_facts(store, [], as_of_chapter=1).scene_embeddings
    assert [(chapter, index, [float(x) for x in v]) for chapter, index, v in scenes] == [
        (1, 1, vector)
    ]
    stone = store.get_entity("item:stone")
    assert stone is not None and stone.attributes == {"weight": 1.0, "count": 1, "big": 2**62}
    assert isinstance(stone.attributes["weight"], float) and isinstance(
        stone.attributes["count"], int
    )


def test_concurrent_commits_of_overlapping_chapters_all_land(store: GraphStore) -> None:
    store.commit_chapter(outline())
    errors: list[BaseException] = []

    def commit(chapter: int) -> None:
        delta = ChapterDelta(
            chapter=chapter,
            entities=[
                Entity(label="Character", name="Gandalf"),
                Entity(label="Character", name=f"Guest {chapter}"),
            ],
            relationships=[Relationship(source="Gandalf", target="Frodo", type="mentors")],
            property_updates=[PropertyUpdate(entity="Aragorn", changes={f"seen_{chapter}": True})],
        )
        try:
            store.commit_chapter(delta)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(n,)) for n in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    infos = store.committed_chapters()
    assert sorted(i.chapter for i in infos) == [0, 1, 2, 3]
    assert [i.seq for i in infos] == [1, 2, 3, 4]
    aragorn = store.get_entity("character:aragorn")
    assert aragorn is not None and {k for k in aragorn.attributes if k.startswith("seen_")} == {
        "seen_1",
        "seen_2",
        "seen_3",
    }
    assert len(store.find_entities("Gandalf")) == 1


def test_unreachable_graph_is_one_clear_line(graph_settings: Settings) -> None:
    endpoint = graph_endpoint(graph_settings)
    dead = GraphEndpoint(f"bolt://127.0.0.1:{free_port()}", "neo4j", "x", endpoint.database, False)
    with pytest.raises(GraphUnavailableError) as info:
        GraphStore(dead, connect_attempts=2, retry_delay=0.01).connect()
    message = str(info.value)
    assert "\n" not in message and dead.uri in message and "after 2 attempts" in message


def test_a_change_set_holds_what_changed_not_the_entitys_history(store: GraphStore) -> None:
    """A character met in every chapter gathers sources and revisions; each chapter's change-set
    records how long those lists were, not their content, so it does not grow with the book,
    and rolling back still restores them exactly."""
    from kg import cypher

    store.commit_chapter(outline())
    after_outline = dumps_export(store.export_data())
    sizes = []
    for chapter in range(1, 13):
        quote = f"Aragorn spoke with the rangers again in chapter {chapter}, long into the night."
        store.commit_chapter(
            ChapterDelta(
                chapter=chapter,
                entities=[
                    Entity(
                        label="Character",
                        name="Aragorn",
                        traits=["weary"],
                        sources=[
                            EntitySource(
                                type="extraction", chapter=chapter, confidence=0.6, quote=quote
                            )
                        ],
                    )
                ],
            )
        )
        props = store.read(cypher.READ_CHANGESET_PROPS, chapters=[chapter])[0]["props"]
        sizes.append(len(props["updated_nodes_json"]))
    aragorn = store.get_entity("character:aragorn")
    assert aragorn is not None and len(aragorn.sources) >= 12
    assert max(sizes[3:]) - min(sizes[3:]) < 40, (
        sizes
    )  # flat: the undo keeps lengths, not the history
    store.rollback_chapter(1, cascade=True)
    assert dumps_export(store.export_data()) == after_outline


def _refused_on_commit(tx: ManagedTransaction) -> None:
    # What ArcadeDB answered over Bolt when a write met a full disk (measured on a full tmpfs
    # under a running sidecar): nothing in it says "disk".
    raise neo4j_exceptions.Neo4jError._hydrate_neo4j(
        code="Neo.ClientError.Transaction.TransactionNotFound",
        message="Transaction error on commit",
    )


def test_a_write_refused_on_a_full_disk_says_so_and_a_refusal_with_room_does_not(
    store: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kg.store as kg_store
    from core.errors import disk_full

    root = store.endpoint.root
    if root is None:
        pytest.skip("a Neo4j server's disk is not this process's to look at")
    shortage: dict[str, int | None] = {"mb": 3}
    monkeypatch.setattr(kg_store, "free_space_short", lambda path: shortage["mb"])
    with pytest.raises(GraphWriteError) as full:
        store.execute_write(_refused_on_commit)
    assert str(full.value).startswith(
        f"graph write failed and was rolled back: only 3 MiB free on the disk holding {root} ("
    )
    assert "free some space on that disk" in str(full.value)
    # A command ends on the disk-full line (core.cli.run_main), naming the graph's folder.
    cause = disk_full(full.value)
    assert cause is not None and cause.filename == str(root)
    # The look-alike: the same refusal with room on the disk is not blamed on it.
    shortage["mb"] = None
    with pytest.raises(GraphWriteError) as other:
        store.execute_write(_refused_on_commit)
    assert "MiB free" not in str(other.value) and disk_full(other.value) is None
    assert "TransactionNotFound" in str(other.value)
