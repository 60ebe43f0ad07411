"""Pure unit tests of the graph layer: vocabulary, keys and ids, models, value codec."""

from __future__ import annotations

import datetime
import math
from pathlib import Path

import neo4j.time as ntime
import pytest
from pydantic import ValidationError

from kg import cypher
from kg import vocabulary as vocab
from kg.models import ChapterDelta, Entity, PropertyUpdate, Relationship, StatusChange
from kg.records import (
    RelationshipRow,
    decode_value,
    encode_value,
    entity_from_props,
    entity_props,
    latest_per_slot,
    name_rows,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("FRIEND_OF", ("FRIEND_OF", None)),
        ("friend_of", ("FRIEND_OF", "friend_of")),
        ("is friends with", ("FRIEND_OF", "is friends with")),
        ("Loves", ("LOVES", "Loves")),
        ("located at", ("LOCATED_IN", "located at")),
        ("was betrayed", ("BETRAYED", "was betrayed")),
        ("Took part in", ("PARTICIPATES_IN", "Took part in")),
        ("owes a debt to", ("RELATES_TO", "owes a debt to")),
        ("}) DETACH DELETE n //", ("RELATES_TO", "}) DETACH DELETE n //")),
        ("", ("RELATES_TO", "")),
    ],
)
def test_relationship_types_normalise_into_the_vocabulary(
    raw: str, expected: tuple[str, str | None]
) -> None:
    assert vocab.normalize_rel_type(raw) == expected


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ("Character", "Character"),
        ("person", "Character"),
        ("Place", "Location"),
        ("city", "Location"),
        ("Organization", "Faction"),
        ("magic system", "Lore"),
        ("Weapon", "Item"),
        ("`Robert'); DROP", "Concept"),
    ],
)
def test_labels_normalise_into_the_vocabulary(raw: str, label: str) -> None:
    assert vocab.normalize_label(raw)[0] == label


def test_name_keys_ignore_case_punctuation_and_leading_article() -> None:
    assert vocab.normalize_name("  The  Ring ") == "ring"
    assert vocab.normalize_name("O'Brien") == vocab.normalize_name("OBrien") == "obrien"
    assert vocab.normalize_name("Ærø-Town!") == "ærø town"
    assert vocab.normalize_name("😀🔥") == "😀🔥"  # symbols only: still a usable key
    long = "x" * 10_000
    assert len(vocab.name_key(long)) < 200 and vocab.name_key(long) == vocab.name_key(long.upper())


def test_entity_ids_are_deterministic_readable_and_bounded() -> None:
    assert (
        vocab.entity_id("Character", "Aragorn son of Arathorn")
        == "character:aragorn-son-of-arathorn"
    )
    assert (
        vocab.entity_id("Character", "ARAGORN son of arathorn")
        == "character:aragorn-son-of-arathorn"
    )
    # Punctuation is dropped from ids; what is left is plain text, never Cypher.
    assert vocab.entity_id("Item", "}) DETACH DELETE n //") == "item:detach-delete-n"
    assert "~" in vocab.entity_id("Item", "Ærø")  # non-ASCII: slug plus hash
    assert vocab.entity_id("Item", "😀") != vocab.entity_id("Item", "🔥")
    assert len(vocab.entity_id("Character", "y" * 10_000)) < 100


def test_rel_keys_distinguish_raw_types_only_for_relates_to() -> None:
    a = vocab.rel_key("x", "RELATES_TO", "y", 3, "owes")
    b = vocab.rel_key("x", "RELATES_TO", "y", 3, "fears the dark of")
    assert a != b
    assert vocab.rel_key("x", "FRIEND_OF", "y", 3, "friends with") == vocab.rel_key(
        "x", "FRIEND_OF", "y", 3, None
    )
    assert vocab.rel_key("x", "FRIEND_OF", "y", 3) != vocab.rel_key("x", "FRIEND_OF", "y", 4)


def test_cypher_builders_refuse_labels_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError):
        cypher.create_nodes(("Entity", "Character`) DETACH DELETE n //"))
    with pytest.raises(ValueError):
        cypher.delete_rels("LOVES]->() DELETE r //")
    assert "`Entity`:`Character`" in cypher.create_nodes(("Entity", "Character"))


def test_models_normalise_and_keep_raw_values() -> None:
    rel = Relationship(source="A", target="B", type="is friends with")
    assert (rel.type, rel.raw_type) == ("FRIEND_OF", "is friends with")
    assert Relationship.model_validate(rel.model_dump()) == rel  # stable when re-validated
    entity = Entity(label="wizard school", name="Hogwarts")
    assert (entity.label, entity.raw_label) == ("Concept", "wizard school")
    with pytest.raises(ValidationError):
        Entity(label="Character", name="   ")
    with pytest.raises(ValidationError):
        PropertyUpdate(entity="A", changes={"name": ""})
    with pytest.raises(ValidationError):
        ChapterDelta(chapter=1, novel_info={"bad key": 1})
    with pytest.raises(ValidationError):
        StatusChange(entity="A", status="")
    with pytest.raises(ValidationError, match="initialization phase"):
        ChapterDelta(chapter=0, scenes=[{"index": 1}])


def test_delta_hash_ignores_dict_order() -> None:
    a = ChapterDelta(
        chapter=1, entities=[Entity(label="Character", name="A", attributes={"x": 1, "y": 2})]
    )
    b = ChapterDelta(
        chapter=1, entities=[Entity(label="Character", name="A", attributes={"y": 2, "x": 1})]
    )
    assert a.delta_hash() == b.delta_hash()
    assert a.delta_hash() != a.model_copy(update={"chapter": 2}).delta_hash()


def test_status_as_of_chapter() -> None:
    entity = Entity(
        label="Character",
        name="Boromir",
        status_intervals=[
            {"status": "alive", "from_chapter": 0, "to_chapter": 4},
            {"status": "dead", "from_chapter": 5},
        ],
    )
    assert [entity.status_as_of(c) for c in (0, 4, 5, 40)] == ["alive", "alive", "dead", "dead"]


def test_entity_properties_round_trip() -> None:
    entity = Entity(
        id="character:a",
        label="Character",
        name="A",
        aliases=["Ay", "A"],
        attributes={"age": 3, "ratio": 1.0, "tags": ["x"]},
        sources=[{"type": "user", "chapter": 0, "confidence": 1.0}],
        is_provisional=False,
        first_chapter=0,
        last_chapter=2,
        status_intervals=[{"status": "alive", "from_chapter": 0}],
    )
    props = entity_props(entity)
    assert props["aliases"] == ["Ay"] and props["alias_keys"] == ["ay"]
    assert all(not isinstance(v, dict) for v in props.values())  # storable property types only
    back = entity_from_props(props)
    assert back.model_dump() == entity.model_copy(update={"aliases": ["Ay"]}).model_dump()
    assert {r["kind"] for r in name_rows(props)} == {"name", "alias"}


def test_value_codec_is_exact() -> None:
    values = [
        1,
        1.0,
        0.1 + 0.2,
        -0.0,
        True,
        "t",
        [1, 2],
        [0.5, 1e-300],
        float("inf"),
        ntime.DateTime(2024, 1, 2, 3, 4, 5, 123456789, tzinfo=datetime.UTC),
        ntime.Date(2024, 2, 29),
        ntime.Duration(months=1, days=2, seconds=3),
    ]
    for value in values:
        back = decode_value(encode_value(value))
        assert back == value and type(back) is type(value)
    assert math.isnan(decode_value(encode_value(float("nan"))))


class _FakeNeo4j:
    """Just enough of GraphStore to drive the optional Neo4j vector-index branch."""

    def __init__(self, *, online: bool) -> None:
        from kg.store import ServerInfo

        self.server = ServerInfo(agent="Neo4j/5.26.0", address="x")
        self.online = online
        self.statements: list[str] = []

    def write(self, query: str, **params: object) -> list[dict[str, object]]:
        self.statements.append(query)
        return []

    def read(self, query: str, **params: object) -> list[dict[str, object]]:
        self.statements.append(query)
        if query == cypher.VECTOR_INDEX_STATE:
            return [{"type": "VECTOR", "state": "ONLINE" if self.online else "POPULATING"}]
        return [
            {
                "id": "scene:1:1",
                "chapter": 1,
                "scene": 1,
                "title": None,
                "summary": "s",
                "score": 0.9,
            }
        ]

    def execute_read(self, work: object, *args: object) -> list[object]:
        return []  # the numpy path (exercised against the real graph in test_kg_retrieval)


def test_neo4j_vector_index_is_created_once_and_used_when_online() -> None:
    from kg import retrieval

    store = _FakeNeo4j(online=False)
    assert (
        retrieval.similar_scenes(store, [1.0, 0.0], k=1, as_of_chapter=3) == []
    )  # populating: numpy
    store.online = True
    hits = retrieval.similar_scenes(store, [1.0, 0.0], k=1, as_of_chapter=3)
    assert [(h.id, h.score, h.title) for h in hits] == [("scene:1:1", 0.9, "")]
    creates = [s for s in store.statements if s.startswith("CREATE VECTOR INDEX")]
    assert len(creates) == 1 and "`vector.dimensions`: 2" in creates[0]
    # What this Neo4j path sends is what kg.dialect renders for the linter.
    from kg.dialect import neo4j_only_statements

    rendered = {r.text for r in neo4j_only_statements()}
    assert {s for s in store.statements if s not in creates} <= rendered
    assert creates[0].replace("`vector.dimensions`: 2", "`vector.dimensions`: 384") in rendered
    from kg.store import ServerInfo

    assert not ServerInfo("Neo4j/5.26.0 compatible (ArcadeDB 26.10.2)", "x").may_have_vector_index
    assert not ServerInfo("Neo4j/5.10.0", "x").may_have_vector_index
    assert ServerInfo("Neo4j/2025.01.0", "x").may_have_vector_index


def _row(owner: str, other: str, chapter: int | None, marker: str) -> RelationshipRow:
    props = {"marker": marker} if chapter is None else {"chapter": chapter, "marker": marker}
    return RelationshipRow(id=owner, type="ALLY_OF", outgoing=True, props=props, other=other)


def test_the_latest_version_of_a_relationship_holds_its_slot_and_an_older_one_does_not() -> None:
    rows = [
        _row("mara", "tobias", 2, "ch2"),
        _row("mara", "ilse", 1, "ilse"),
        _row("mara", "tobias", 1, "older"),  # earlier chapter: keeps ch2
        _row("mara", "tobias", 2, "same-chapter-later"),  # same chapter, later: replaces
        _row("tobias", "mara", None, "undated"),  # no chapter counts as 0
        _row("tobias", "mara", 0, "chapter-0"),  # 0 >= 0: replaces
    ]
    latest = latest_per_slot(((r.id, r) for r in rows), lambda r: (r.type, r.other))
    assert {owner: [r.props["marker"] for r in found] for owner, found in latest.items()} == {
        "mara": ["same-chapter-later", "ilse"],  # slots in the order first seen
        "tobias": ["chapter-0"],
    }


def test_the_embedded_graph_refuses_to_start_on_a_disk_too_full_for_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    import core.graph_server as graph_server
    from core.errors import EmbeddedGraphError

    root = tmp_path / "book" / ".saga" / "graph"  # not made yet: its disk is its parent's
    free = {"mb": 23}

    def usage(path: object) -> object:
        assert Path(str(path)) == tmp_path  # the nearest folder that exists
        return SimpleNamespace(free=free["mb"] << 20)

    monkeypatch.setattr(graph_server.shutil, "disk_usage", usage)
    graph = graph_server.EmbeddedArcadeDB(root)
    with pytest.raises(EmbeddedGraphError) as refused:
        graph._start_server(None, None)
    assert str(refused.value).startswith(
        f"only 23 MiB free on the disk holding {root}: the embedded graph needs 64 MiB ("
    )
    assert not root.exists()  # nothing started, nothing written
    free["mb"] = graph_server.GRAPH_MIN_FREE_MB  # the look-alike: just enough
    graph._check_free_space()
