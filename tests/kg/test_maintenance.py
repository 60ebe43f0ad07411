"""Graph maintenance: healing (merge, graduate, enrich) and QA, on the real graph.

Test graphs are written through the real commit path (`GraphStore.commit_chapter`): the
seeded story of tests/support/story_seed.py, its planted duplicates and look-alikes, and
its planted QA problems.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from core.settings import HealingSettings, Settings
from kg import healing as h
from kg import maintenance_cypher as mq
from kg import qa
from kg.errors import GraphQueryError
from kg.models import (
    ChapterDelta,
    Entity,
    EntitySource,
    Relationship,
)
from kg.store import GraphStore
from tasks.healing import EmbeddingCache
from tasks.runtime import Runtime, set_runtime
from tests.conftest import REPO_ROOT
from tests.support.prefect_artifacts import artifact_keys
from tests.support.scripted_llm import ScriptedLLM
from tests.support.story_seed import (
    ANNA_BAKER,
    ANNA_SAILOR,
    CAPTAIN,
    COMPASS,
    JOHN,
    JOHN_SMITH,
    JOHNNY,
    MARY,
    character,
    plant_qa_problems,
    seed_story,
    story_deltas,
)

# --- Fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        server.on(
            schema="EntityEnrichment",
            respond={
                "summary": "A central figure of Eastport.",
                "facets": ["harbour", "town"],
                "confidence": 0.8,
            },
        )
        yield server


@pytest.fixture
def runtime_with_llm(graph_settings: Settings, llm: ScriptedLLM) -> Iterator[Runtime]:
    """The flows' runtime for the session graph's project, LLM and embeddings scripted."""
    settings = graph_settings.model_copy(
        update={"openai_base_url": llm.base_url, "embedding_base_url": llm.base_url}
    )
    rt = set_runtime(Runtime(settings))
    yield rt
    rt.close()


def rels_of(store: GraphStore, ids: list[str]) -> set[tuple[Any, ...]]:
    """(type, outgoing, other, chapter, key) of every relationship of `ids`, other ends outside `ids`."""
    rows = store.read(mq.RELS_OF, ids=ids)
    return {
        (r["type"], r["outgoing"], r["other"], r["props"].get("chapter"), r["props"].get("key"))
        for r in rows
        if r["other"] not in ids
    }


# --- Names, blocking, scoring (pure) ----------------------------------------------------------


def test_canonical_tokens_drop_titles_and_map_nicknames() -> None:
    assert h.canonical_tokens("Dr. William Turner", "Character") == ("william", "turner")
    assert h.canonical_tokens("Bill Turner", "Character") == ("william", "turner")
    assert h.canonical_tokens("Johnny", "Character") == ("john",)
    # Only people have titles and nicknames: a place keeps every word.
    assert h.canonical_tokens("King Harbour", "Location") == ("king", "harbour")


def test_token_similarity_containment_typos_and_different_people() -> None:
    john_smith = h.canonical_tokens("John Smith", "Character")
    assert (
        h.token_similarity(h.canonical_tokens("John", "Character"), john_smith)
        == h.CONTAINMENT_SCORE
    )
    assert h.token_similarity(h.canonical_tokens("Jhon Smith", "Character"), john_smith) >= 0.85
    assert h.token_similarity(h.canonical_tokens("John Baker", "Character"), john_smith) < 0.85
    assert h.token_similarity(h.canonical_tokens("Smith John", "Character"), john_smith) == 1.0


def test_soundex_blocks_typos_together() -> None:
    assert h.soundex("john") == h.soundex("jonh") == "J500"
    assert h.soundex("robert") == h.soundex("rupert") == "R163"


def _snap(
    entities: list[Entity], edges: list[tuple[str, str]] = (), scenes: list[list[str]] = ()
) -> h.HealingSnapshot:
    """An in-memory snapshot (the shape load_snapshot returns)."""
    by_id = {e.id: e for e in entities if e.id}
    snap = h.HealingSnapshot(entities=by_id)
    for a, b in edges:
        snap.neighbours.setdefault(a, set()).add(b)
        snap.neighbours.setdefault(b, set()).add(a)
        snap.rel_counts[a] = snap.rel_counts.get(a, 0) + 1
        snap.rel_counts[b] = snap.rel_counts.get(b, 0) + 1
        snap.related.add(frozenset((a, b)))
    keys = h.key_index(by_id)
    for n, refs in enumerate(scenes):
        resolved = h.resolve_scene_refs(refs, by_id, keys)
        for i, left in enumerate(resolved):
            for right in resolved[i + 1 :]:
                for x in left:
                    for y in right:
                        if x != y:
                            snap.co_scene.setdefault(frozenset((x, y)), f"scene {n}")
    return snap


def _c(eid: str, name: str, **extra: Any) -> Entity:
    return Entity.model_validate(
        {"id": eid, "label": "Character", "name": name, "is_provisional": True, **extra}
    )


def test_a_name_listed_twice_in_a_scene_means_two_people() -> None:
    snap = _snap(
        [_c("c:a1", "Anna"), _c("c:a2", "Anna"), _c("c:b", "Bob")], scenes=[["Anna", "Anna"]]
    )
    assert h.veto_reason(snap, "c:a1", "c:a2") == "appear together in scene 0"
    # Listed once, an ambiguous name proves nothing about the two Annas.
    snap = _snap(
        [_c("c:a1", "Anna"), _c("c:a2", "Anna"), _c("c:b", "Bob")], scenes=[["Anna", "Bob"]]
    )
    assert h.veto_reason(snap, "c:a1", "c:a2") is None


def test_first_name_joins_the_better_supported_full_name_only() -> None:
    places = [Entity(id=f"l:{n}", label="Location", name=f"Place {n}") for n in range(6)]
    people = [_c("c:js", "John Smith"), _c("c:jb", "John Baker"), _c("c:j", "John")]
    # John shares three places with John Smith and two with John Baker: both pairs pass on
    # their own, but one John cannot be two people.
    edges = [
        ("c:js", "l:0"),
        ("c:js", "l:1"),
        ("c:js", "l:2"),
        ("c:j", "l:0"),
        ("c:j", "l:1"),
        ("c:j", "l:2"),
        ("c:jb", "l:3"),
        ("c:jb", "l:4"),
        ("c:j", "l:3"),
        ("c:j", "l:4"),
    ]
    snap = _snap([*people, *places], edges)
    result = h.detect_duplicates(snap, HealingSettings())
    assert [(p.survivor_id, p.merged_ids) for p in result.plans] == [("c:js", ["c:j"])]


def test_an_ambiguous_first_name_is_refused() -> None:
    places = [Entity(id=f"l:{n}", label="Location", name=f"Place {n}") for n in range(4)]
    people = [_c("c:js", "John Smith"), _c("c:jb", "John Baker"), _c("c:j", "John")]
    edges = [
        ("c:js", "l:0"),
        ("c:js", "l:1"),
        ("c:j", "l:0"),
        ("c:j", "l:1"),
        ("c:jb", "l:2"),
        ("c:jb", "l:3"),
        ("c:j", "l:2"),
        ("c:j", "l:3"),
    ]
    result = h.detect_duplicates(_snap([*people, *places], edges), HealingSettings())
    assert result.plans == []
    assert {(v.a_id, v.b_id, v.veto) for v in result.vetoed if "c:j" in (v.a_id, v.b_id)} == {
        ("c:j", "c:jb", "ambiguous: 'John' matches two different entities"),
        ("c:j", "c:js", "ambiguous: 'John' matches two different entities"),
    }


def test_similar_names_need_a_shared_relationship_besides_alike_descriptions() -> None:
    hill = Entity(
        id="l:h", label="Location", name="Salt Hill", description="a windy hill by the sea"
    )
    mill = Entity(
        id="l:m", label="Location", name="Salt Mill", description="a windy hill by the sea"
    )
    alike = lambda texts: np.ones((len(texts), 4))  # noqa: E731
    assert h.detect_duplicates(_snap([hill, mill]), HealingSettings(), alike).plans == []
    ferry = Entity(id="c:f", label="Character", name="Ferryman")
    both = _snap([hill, mill, ferry], [("c:f", "l:h"), ("c:f", "l:m")])
    assert [p.merged_ids for p in h.detect_duplicates(both, HealingSettings(), alike).plans] == [
        ["l:m"]
    ]


def test_a_nickname_match_is_weaker_than_the_same_name() -> None:
    friend = _c("c:f", "Friend")
    same = _snap(
        [_c("c:a", "Dr. Eleanor Venn"), _c("c:b", "Eleanor Venn"), friend],
        [("c:a", "c:f"), ("c:b", "c:f")],
    )
    assert [p.merged_ids for p in h.detect_duplicates(same, HealingSettings()).plans] == [["c:b"]]
    nick = _snap(
        [_c("c:a", "Nora Venn"), _c("c:b", "Eleanor Venn"), friend],
        [("c:a", "c:f"), ("c:b", "c:f")],
    )
    assert h.name_match(nick, "c:a", "c:b") == (1.0, "nickname")
    assert (
        h.detect_duplicates(nick, HealingSettings()).plans == []
    )  # one shared friend: maybe sisters


def test_numbered_names_are_never_merged() -> None:
    snap = _snap(
        [
            _c("c:d1", "Deckhand 1"),
            _c("c:d2", "Deckhand 2"),
            Entity(id="l:x", label="Location", name="X"),
            Entity(id="l:y", label="Location", name="Y"),
        ],
        [("c:d1", "l:x"), ("c:d2", "l:x"), ("c:d1", "l:y"), ("c:d2", "l:y")],
    )
    result = h.detect_duplicates(snap, HealingSettings())
    assert result.plans == []
    assert [v.veto for v in result.vetoed] == ["different numbers in their names"]


def test_embeddings_corroborate_a_name_match_without_shared_relationships() -> None:
    snap = _snap(
        [
            _c("c:wt", "William Turner", description="a ship's carpenter"),
            _c("c:bt", "Bill Turner", description="a ship's carpenter"),
        ]
    )
    same = h.detect_duplicates(snap, HealingSettings(), lambda texts: np.ones((len(texts), 4)))
    assert [p.merged_ids for p in same.plans] == [["c:bt"]]
    orthogonal = h.detect_duplicates(snap, HealingSettings(), lambda texts: np.eye(len(texts), 4))
    assert orthogonal.plans == []
    assert h.detect_duplicates(snap, HealingSettings()).plans == []  # names alone are not enough


def test_blocking_finds_every_pair_the_naive_comparison_accepts() -> None:
    names = [
        "John Smith",
        "John",
        "Johnny Smith",
        "Jonh Smith",
        "Dr. John Smith",
        "Mary Reed",
        "Mary",
        "Maria Reed",
        "Bill Turner",
        "William Turner",
        "Will",
        "Anna Vale",
        "Anna Vance",
    ]
    snap = _snap([_c(f"c:{i}", n) for i, n in enumerate(names)])
    blocked, _ = h.candidate_pairs(snap)
    naive = h.naive_pairs(snap)
    assert len(blocked) < len(naive)
    settings = HealingSettings()
    passing = {(e.a_id, e.b_id) for e in h.score_pairs(snap, naive, settings)[0]}
    assert passing <= blocked


def test_merged_entity_keeps_every_source_and_conflicting_value() -> None:
    survivor = _c(
        "c:js",
        "John Smith",
        description="A fisherman",
        attributes={"age": 40},
        sources=[EntitySource(type="outline", chapter=0)],
        is_provisional=False,
        status_intervals=[{"status": "alive", "from_chapter": 0}],
        first_chapter=0,
        last_chapter=2,
    )
    other = _c(
        "c:j",
        "John",
        aliases=["Jack"],
        description="A sailor",
        attributes={"age": 41, "boat": "Gull"},
        traits=["brave"],
        sources=[EntitySource(type="extraction", chapter=3, original_name="John")],
        status_intervals=[{"status": "dead", "from_chapter": 5}],
        first_chapter=3,
        last_chapter=5,
    )
    merged = h.merged_entity(
        survivor, [other], created_at="2026-01-01T00:00:00+00:00", confidence=0.9, chapter=5
    )
    assert (
        merged.id == "c:js" and merged.name == "John Smith" and merged.description == "A fisherman"
    )
    assert merged.aliases == ["John", "Jack"]
    assert merged.attributes["age"] == 40 and merged.attributes["boat"] == "Gull"
    assert merged.attributes["description_history"] == ["A sailor"]
    assert json.loads(merged.attributes["attribute_history"][0]) == {
        "from": "c:j",
        "key": "age",
        "value": 41,
    }
    assert [s.type for s in merged.sources] == ["outline", "extraction", "merge"]
    assert merged.sources[-1].original_name == "John" and merged.sources[-1].chapter == 5
    assert [i.status for i in merged.status_intervals] == ["alive", "dead"]
    assert (merged.first_chapter, merged.last_chapter, merged.is_provisional) == (0, 5, False)


def test_graduation_confidence_formula() -> None:
    snap = _snap(
        [
            _c("c:x", "X", description="someone", traits=["kind"], first_chapter=2),
            *(Entity(id=f"l:{n}", label="Location", name=f"L{n}") for n in range(3)),
        ],
        [("c:x", "l:0"), ("c:x", "l:1")],
    )
    snap.chapters = [1, 2, 3]
    grad = h.graduation_score(snap, "c:x")
    assert (grad.connectivity, grad.completeness, grad.age) == (
        round(2 / 3, 4),
        0.8,
        round(2 / 3, 4),
    )
    assert grad.confidence == round(0.4 * 2 / 3 + 0.3 * 0.8 + 0.3 * 2 / 3, 4)


# --- Healing on the real graph ---------------------------------------------------------------------


def test_merge_is_one_transaction(store: GraphStore) -> None:
    seed_story(store)
    snap = h.load_snapshot(store)
    plan = h.detect_duplicates(snap, HealingSettings()).plans[0]
    before = store.export_data()

    def merge_then_fail(tx: Any) -> None:
        h.merge_tx(tx, plan, "2026-01-01T00:00:00+00:00", 4)
        raise RuntimeError("crash after the merge statements")

    with pytest.raises(RuntimeError):
        store.execute_write(merge_then_fail)
    assert store.export_data() == before


def test_merge_deduplicates_facts_and_drops_links_between_the_merged(store: GraphStore) -> None:
    store.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[character("Tom Reed"), character("Ann")],
            relationships=[Relationship(source="Tom Reed", target="Ann", type="KNOWS", chapter=1)],
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=1,
            entities=[character("Tom")],
            relationships=[
                Relationship(source="Tom", target="Ann", type="KNOWS"),
                Relationship(source="Tom", target="Tom Reed", type="KNOWS"),
            ],
        )
    )
    plan = h.MergePlan(
        label="Character",
        survivor_id="character:tom-reed",
        survivor_name="Tom Reed",
        merged_ids=["character:tom"],
        merged_names=["Tom"],
        evidence=[],
    )
    result = store.execute_write(h.merge_tx, plan, "2026-01-01T00:00:00+00:00", 1)
    # KNOWS Ann in chapter 1 and APPEARS_IN chapter 1 are already Tom Reed's (he was the
    # object of Tom's KNOWS in chapter 1); Tom KNOWS Tom Reed would be a self-loop.
    assert (
        result.relationships_moved,
        result.relationships_deduplicated,
        result.relationships_dropped,
    ) == (0, 2, 1)
    knows = [r for r in rels_of(store, ["character:tom-reed"]) if r[0] == "KNOWS"]
    assert [(r[2], r[3]) for r in knows] == [("character:ann", 1)]
    assert [e.id for e in store.find_entities("Tom")] == ["character:tom-reed"]
    assert store.get_entity("character:tom") is None
    assert qa.run_checks(store, HealingSettings()) == []


def test_rollback_past_healing_is_exact(store: GraphStore) -> None:
    """Healing's writes (merge, graduation, enrichment) are recorded on the newest change-set,
    so rolling back a chapter written before them gives back the graph from before it, exactly."""
    deltas = story_deltas()
    for delta in deltas[:2]:
        store.commit_chapter(delta)
    before_chapter_2 = store.export_data()
    for delta in deltas[2:]:
        store.commit_chapter(delta)
    settings = HealingSettings()
    for plan in h.detect_duplicates(h.load_snapshot(store), settings).plans:
        store.execute_write(h.merge_tx, plan, "2026-01-01T00:00:00+00:00", 4)
    store.execute_write(h.graduate_tx, h.graduation_candidates(h.load_snapshot(store), settings), 4)
    store.execute_write(
        h.enrich_tx,
        h.EnrichmentResult(
            id=MARY,
            name="Mary Reed",
            relationship_count=9,
            summary="The harbour's memory.",
            confidence=0.7,
        ),
        "2026-01-01T00:00:00+00:00",
        4,
    )
    assert (
        store.get_entity(JOHN) is None and store.get_entity(JOHNNY) is None
    )  # merged into John Smith
    assert not store.get_entity(COMPASS).is_provisional  # type: ignore[union-attr]
    # A later chapter refers to the merged name; then healing runs again on top of it.
    store.commit_chapter(
        ChapterDelta(
            chapter=5,
            relationships=[Relationship(source="Johnny", target="Old Pier", type="TRAVELS_TO")],
        )
    )
    store.execute_write(
        h.enrich_tx,
        h.EnrichmentResult(
            id=JOHN_SMITH,
            name="John Smith",
            relationship_count=12,
            summary="A fisherman.",
            confidence=0.6,
        ),
        "2026-01-01T00:00:00+00:00",
        5,
    )
    result = store.rollback_chapter(2, cascade=True)
    assert result.chapters == [5, 4, 3, 2]
    assert store.export_data() == before_chapter_2
    assert [e.id for e in store.find_entities("John")] == [JOHN]  # the lookups are back too


@pytest.mark.usefixtures("prefect_api")
def test_heal_flow_merges_exactly_the_true_duplicates(
    store: GraphStore, runtime_with_llm: Runtime
) -> None:
    from flows.maintenance import heal_flow, qa_flow

    seed_story(store)
    johns = [JOHN_SMITH, JOHN, JOHNNY]
    rels_before = rels_of(store, johns)
    sources_before = [s for eid in johns for s in store.get_entity(eid).sources]  # type: ignore[union-attr]
    annas_before = {eid: store.get_entity(eid) for eid in (ANNA_BAKER, ANNA_SAILOR)}

    report = heal_flow(str(runtime_with_llm.settings.project_dir))

    assert [(m.survivor_id, sorted(m.merged_ids)) for m in report.merges] == [
        (JOHN_SMITH, sorted([JOHN, JOHNNY]))
    ]
    john = store.get_entity(JOHN_SMITH)
    assert john is not None and john.name == "John Smith"  # the outline's name wins
    assert {"John", "Johnny"} <= set(john.aliases)
    assert store.get_entity(JOHN) is None and store.get_entity(JOHNNY) is None
    assert (
        rels_of(store, [JOHN_SMITH]) == rels_before
    )  # every relationship, type, chapter and key kept
    assert all(s in john.sources for s in sources_before)
    assert sorted(s.original_name for s in john.sources if s.type == "merge") == ["John", "Johnny"]
    assert "A fisherman" in john.attributes["description_history"]
    for name in ("John", "Johnny", "john smith"):
        assert [e.id for e in store.find_entities(name)] == [JOHN_SMITH]
    # The Annas: same name, shared friends, but they met in one scene: never merged.
    for eid, before in annas_before.items():
        after = store.get_entity(eid)
        assert (
            after is not None and after.name == "Anna" and after.description == before.description
        )  # type: ignore[union-attr]
    assert [(v.a_id, v.b_id) for v in report.vetoed] == [(ANNA_BAKER, ANNA_SAILOR)]
    assert "appear together in chapter 2 scene 1" in (report.vetoed[0].veto or "")
    audits = h.merge_audits(store)
    assert [(a["survivor_id"], a["merged_ids"]) for a in audits] == [(JOHN_SMITH, [JOHN, JOHNNY])]
    assert audits[0]["evidence"] and audits[0]["created_by"] == "heal_graph"
    # Stamped with story time (after chapter 4, the change-set healing amends), never the clock.
    moment = f"after chapter 4, change-set {store.history_head()[0]}"
    assert (audits[0]["created_at"], audits[0]["chapter"]) == (
        moment,
        4,
    ) and report.story_at == moment
    assert {s.created_at for s in john.sources if s.type == "merge"} == {moment}

    # Enrichment: the busy entities (>= 5 story relationships) got the LLM summary.
    enriched = {e.id for e in report.enriched}
    assert {JOHN_SMITH, MARY} <= enriched
    mary = store.get_entity(MARY)
    assert (
        mary is not None
        and mary.attributes["enrichment_summary"] == "A central figure of Eastport."
    )
    assert mary.description == "The harbour master"  # enrichment adds, never overwrites
    assert [s.type for s in mary.sources][-1] == "enrichment"
    # Graduation: provisional entities that became well connected and described.
    graduated = {g.id for g in report.graduated}
    assert COMPASS in graduated and not store.get_entity(COMPASS).is_provisional  # type: ignore[union-attr]
    assert all(g.confidence >= 0.6 for g in report.graduated)
    history = sorted((runtime_with_llm.settings.saga_dir / "healing").glob("heal-*.json"))
    assert history and json.loads(history[-1].read_text())["merges"][0]["survivor_id"] == JOHN_SMITH
    assert artifact_keys("graph-healing-summary", "graph-healing-merges") == {
        "graph-healing-summary",
        "graph-healing-merges",
    }

    again = heal_flow(str(runtime_with_llm.settings.project_dir))
    assert again.merges == [] and again.enriched == []  # healed: nothing left to do

    qa_report = qa_flow(str(runtime_with_llm.settings.project_dir))
    assert qa_report.findings == []
    table = pq.read_table(qa_report.report_path)
    assert table.num_rows == 0 and "entity_ids" in table.column_names


@pytest.mark.usefixtures("prefect_api")
def test_healing_at_another_moment_writes_the_same_graph(
    store: GraphStore, runtime_with_llm: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same graph healed at two wall-clock moments (years apart) exports the same bytes:
    merges, MergeAudit nodes and enrichments carry story time and content-derived ids."""
    import flows.maintenance
    import tasks.healing
    from flows.maintenance import heal_flow

    exports, reports = [], []
    for clock in ("2026-01-01T00:00:00+00:00", "2031-06-15T12:34:56+00:00"):
        monkeypatch.setattr(flows.maintenance, "now_iso", lambda clock=clock: clock)
        monkeypatch.setattr(tasks.healing, "now_iso", lambda clock=clock: clock)
        store.wipe()
        seed_story(store)
        reports.append(heal_flow(str(runtime_with_llm.settings.project_dir)))
        exports.append(json.dumps(store.export_data(), sort_keys=True))
    assert [r.started_at for r in reports] == [
        "2026-01-01T00:00:00+00:00",
        "2031-06-15T12:34:56+00:00",
    ]
    assert all(r.merges and r.enriched for r in reports)  # something was written each time
    assert exports[0] == exports[1]
    assert "2026-01-01" not in exports[0] and "2031-06-15" not in exports[1]


def test_merge_audit_id_comes_from_the_merge_plan() -> None:
    """Same plan after the same chapter: same id (a resumed or repeated healing run). Another
    merged entity, survivor or chapter: another id."""
    plan = h.MergePlan(
        label="Character",
        survivor_id=JOHN_SMITH,
        survivor_name="John Smith",
        merged_ids=[JOHN, JOHNNY],
        merged_names=["John", "Johnny"],
        evidence=[],
    )
    same = plan.model_copy(update={"survivor_name": "John S.", "evidence": []})
    other_merged = plan.model_copy(update={"merged_ids": [JOHN]})
    other_survivor = plan.model_copy(
        update={"survivor_id": JOHN, "merged_ids": [JOHN_SMITH, JOHNNY]}
    )
    assert h.merge_audit_id(plan, 4) == h.merge_audit_id(same, 4)
    assert h.merge_audit_id(plan, 4).startswith("merge:")
    ids = {
        h.merge_audit_id(plan, 4),
        h.merge_audit_id(other_merged, 4),
        h.merge_audit_id(other_survivor, 4),
        h.merge_audit_id(plan, 5),
    }
    assert len(ids) == 4


# --- QA on the real graph ----------------------------------------------------------------------


def test_qa_reports_nothing_on_a_clean_graph(store: GraphStore) -> None:
    seed_story(store)
    assert qa.run_checks(store, HealingSettings()) == []


@pytest.mark.usefixtures("prefect_api")
def test_qa_finds_every_planted_problem(store: GraphStore, runtime_with_llm: Runtime) -> None:
    from flows.maintenance import qa_flow

    seed_story(store)
    plant_qa_problems(store)
    report = qa_flow(str(runtime_with_llm.settings.project_dir))
    found = {(f.check, tuple(f.entity_ids), tuple(f.chapters)) for f in report.findings}
    assert found == {
        ("contradictory_traits", (MARY,), (0, 5)),
        ("dead_character_acting", (CAPTAIN,), (3, 5)),
        ("dangling_reference", ("item:lost-letter",), ()),
        ("dangling_reference", ("character:stub", MARY), (5,)),
        ("dangling_reference", (MARY, COMPASS), (9,)),
        ("dangling_reference", (), (5,)),
        (
            "provisional_buildup",
            tuple(next(f.entity_ids for f in report.findings if f.check == "provisional_buildup")),
            (1, 2, 5),
        ),
        ("before_first_appearance", (MARY, "event:harbour-ball"), (2, 5)),
    }
    by_check = {f.check: f for f in report.findings}
    assert "Ghost Sailor" in next(
        f.entity_names for f in report.findings if not f.entity_ids and f.chapters == [5]
    )
    assert "'brave' and 'cowardly'" in by_check["contradictory_traits"].message
    assert "TRAVELS_TO Old Pier in chapter 5" in by_check["dead_character_acting"].message
    assert by_check["dead_character_acting"].severity == "error"
    # 17 of 25 provisional: John, Johnny, the compass, the sailor Anna, the ball and 12 deckhands.
    assert len(by_check["provisional_buildup"].entity_ids) == 17
    table = pq.read_table(report.report_path).to_pylist()
    assert len(table) == len(report.findings)
    assert {r["check"] for r in table} == set(qa.CHECKS)
    # Named and stamped by the chapter and change-set it checked through, never the clock.
    head = store.history_head()[0]
    assert Path(report.report_path).name == f"qa-ch0005-cs{head:06d}.parquet"
    assert all(
        r["story_at"] == report.story_at == f"after chapter 5, change-set {head}" for r in table
    )
    assert "run_at" not in table[0]
    assert artifact_keys("graph-qa-findings", "graph-qa-summary") == {
        "graph-qa-findings",
        "graph-qa-summary",
    }


def test_qa_of_a_few_chapters_finds_what_they_wrote(store: GraphStore) -> None:
    """The novel flow's QA checks the chapters written since the last run: what chapter 5 wrote
    is found as the whole-graph QA finds it; only the name lookup left behind by a deletion
    outside the change-sets needs the whole graph."""
    seed_story(store)
    plant_qa_problems(store)
    whole = {
        (f.check, tuple(f.entity_ids), tuple(f.chapters))
        for f in qa.run_checks(store, HealingSettings())
    }
    scoped = {
        (f.check, tuple(f.entity_ids), tuple(f.chapters))
        for f in qa.run_checks(store, HealingSettings(), chapters=[5])
    }
    assert scoped == whole - {("dangling_reference", ("item:lost-letter",), ())}
    # Chapters 1-2 wrote none of the chapter 5 problems (Mary's traits are hers whenever she is checked).
    early = qa.run_checks(store, HealingSettings(), chapters=[1, 2])
    assert {f.check for f in early} == {
        "contradictory_traits",
        "provisional_buildup",
        "before_first_appearance",
    }
    assert all(f.chapters != [5] and "Ghost Sailor" not in f.entity_names for f in early)


def _import_knows(store: GraphStore, props: dict[str, Any]) -> None:
    """A KNOWS relationship from Mary to the captain with `props`, as an untrusted import
    could bring it in."""
    exported = store.export_data()
    nodes = [n for n in exported["nodes"] if n["properties"].get("id") in (MARY, CAPTAIN)]
    refs = {n["properties"]["id"]: n["ref"] for n in nodes}
    store.import_data(
        {
            "format": exported["format"],
            "version": exported["version"],
            "nodes": nodes,
            "relationships": [
                {"type": "KNOWS", "start": refs[MARY], "end": refs[CAPTAIN], "properties": props}
            ],
        },
        merge=True,
    )


def test_qa_stops_on_a_chapter_that_is_no_number_and_reports_a_missing_one(
    store: GraphStore,
) -> None:
    """A relationship dated 'five' is a row QA cannot read: one line naming the row and the
    value (not a TypeError inside a check). One with no chapter at all is
    what QA looks for: a finding."""
    seed_story(store)
    _import_knows(store, {"key": "knows:undated"})
    missing = [f for f in qa.run_checks(store, HealingSettings()) if "missing" in f.message]
    assert [(f.check, f.entity_ids, f.message) for f in missing] == [
        (
            "dangling_reference",
            [MARY, CAPTAIN],
            "KNOWS from Mary Reed to Old Captain does not connect two complete entities; "
            "missing chapter",
        )
    ]
    _import_knows(store, {"key": "knows:text", "chapter": "five"})
    with pytest.raises(GraphQueryError) as raised:
        qa.run_checks(store, HealingSettings())
    assert "malformed story relationship" in str(raised.value)
    assert "chapter: Input should be a valid integer" in str(raised.value)
    assert str(raised.value).endswith("(got 'five')")


# --- Command line ---------------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.maintenance", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_help_and_one_line_errors(tmp_path: Path) -> None:
    shown = _cli("--help")
    assert shown.returncode == 0 and "heal" in shown.stdout and "serve" in shown.stdout
    missing = _cli("qa", "--project-dir", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("maintenance: error: --project-dir")
    bad_cron = _cli("serve", "--project-dir", str(tmp_path), "--heal-cron", "every night")
    assert bad_cron.returncode == 2 and "not a valid cron expression" in bad_cron.stderr


def test_cli_qa_exits_1_on_errors_when_asked(
    store: GraphStore, graph_settings: Settings, prefect_api: None
) -> None:
    from prefect.settings import PREFECT_API_URL

    seed_story(store)
    plant_qa_problems(store)
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    done = _cli(
        "qa", "--project-dir", str(graph_settings.project_dir), "--fail-on", "error", env=env
    )
    assert done.returncode == 1, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        summary["findings"] == 8
        and summary["errors"] == 3
        and summary["dead_character_acting"] == 1
    )
    assert Path(summary["report"]).exists()


def test_embedding_cache_persists_and_embeds_only_new_texts(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def embed(texts: Any) -> np.ndarray:
        calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    cache = EmbeddingCache(tmp_path, "model-a", embed)
    first = cache(["a", "bb", "a"])
    assert calls == [["a", "bb"]] and first.tolist() == [[1, 1], [2, 1], [1, 1]]
    again = EmbeddingCache(tmp_path, "model-a", embed)  # a new run reads the file
    assert again(["bb", "ccc"]).tolist() == [[2, 1], [3, 1]]
    assert calls[-1] == ["ccc"]
    EmbeddingCache(tmp_path, "model-b", embed)(["a"])  # another model: its own cache
    assert calls[-1] == ["a"]
