"""Unit tests of the dialogue sidecar's pure parts: request validation, routing, grounding of
extractions, judge rules, the commit gate, the injection budget, vector recall, HTTP mapping."""

from __future__ import annotations

import json

import numpy as np
import pytest

from api import turn_status
from core.recall import HybridIndex, MemoryDoc, embedded_text, named_in, unaddressed
from core.settings import load_settings
from kg.dialogue import (
    DialogueEntity,
    DialogueMilestone,
    DialogueRelation,
    MemoryRow,
    anchor_token,
)
from kg.dialogue.memory import cache_is_current
from prompts.dialogue.models import HistorianReport, IdentityConflictOut, TurnExtraction
from tasks.dialogue.extractor import plan_extraction
from tasks.dialogue.gate import commit_gate
from tasks.dialogue.historian import chronicle_from
from tasks.dialogue.injector import build_packet
from tasks.dialogue.judge import rule_conflicts, vet_reported
from tasks.dialogue.models import (
    MAX_BODY_BYTES,
    MAX_MESSAGE_CHARS,
    ChatMessage,
    IdentityConflict,
    JudgeSummary,
    TurnCommitRequest,
    TurnResult,
    TurnState,
    parse_request,
)
from tasks.dialogue.retriever import (
    RecalledTurn,
    Retrieval,
    TurnMemoryIndex,
    memory_doc,
    memory_row,
    mentioned_entities,
    recall_query,
    recalled,
    row_messages,
    row_text,
    row_texts,
    select_relations,
    turn_text,
    without_pending,
)
from tasks.dialogue.routing import resolve_routes


def _req(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "conversation_id": "c1",
        "turn_id": 1,
        "messages": [{"role": "user", "name": "Ann", "content": "Hello Bob!"}],
    }
    base.update(overrides)
    return base


def _invalid(raw: object) -> str:
    result = parse_request(raw)  # type: ignore[arg-type]
    assert isinstance(result, TurnResult), f"accepted: {raw!r}"[:200]
    assert result.code == "INVALID_REQUEST" and result.state == TurnState.RECEIVED
    assert result.reason and "\n" not in result.reason
    return result.reason


# --- request validation ----------------------------------------------------------------------


def test_valid_request_parses_and_int_or_str_turn_ids_share_a_key() -> None:
    a = parse_request(_req(turn_id=7))
    b = parse_request(json.dumps(_req(turn_id="7")).encode())
    assert isinstance(a, TurnCommitRequest) and isinstance(b, TurnCommitRequest)
    assert a.key == b.key == "c1:7"
    assert a.payload_canonical() == b.payload_canonical()


@pytest.mark.parametrize("missing", ["conversation_id", "turn_id", "messages"])
def test_missing_ids_and_messages_are_invalid(missing: str) -> None:
    raw = _req()
    del raw[missing]
    assert missing in _invalid(raw)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation_id", 123),
        ("turn_id", [1]),
        ("turn_id", 1.5),
        ("turn_id", True),
        ("turn_id", -1),
        ("messages", "hello"),
        ("messages", []),
        ("conversation_id", "   "),
        ("conversation_id", "a\nb"),
    ],
)
def test_wrong_types_and_bad_ids_are_invalid(field: str, value: object) -> None:
    assert field in _invalid(_req(**{field: value}))


def test_bad_message_fields_are_invalid() -> None:
    assert "role" in _invalid(_req(messages=[{"role": "narrator", "content": "x"}]))
    assert "content" in _invalid(_req(messages=[{"role": "user", "content": 5}]))
    assert "mood" in _invalid(_req(messages=[{"role": "user", "content": "x", "mood": "happy"}]))
    assert "models.narrator" in _invalid(_req(config={"models": {"narrator": "gpt"}}))
    assert "models.extractor" in _invalid(_req(config={"models": {"extractor": "has space"}}))


def test_one_megabyte_message_is_invalid_as_object_and_as_body() -> None:
    big = "x" * (1024 * 1024)
    assert "content" in _invalid(_req(messages=[{"role": "user", "content": big}]))
    reason = _invalid(json.dumps(_req(messages=[{"role": "user", "content": big}])).encode())
    assert "limit" in reason
    assert (
        parse_request(
            json.dumps(_req(messages=[{"role": "user", "content": big}])).encode()
        ).error_kind
        == "too_large"
    )  # type: ignore[union-attr]


def test_message_size_counts_characters_and_the_whole_body_is_capped_in_bytes() -> None:
    # Characters, as the schema's maxLength counts them: 30,000 three-byte characters pass.
    assert isinstance(
        parse_request(_req(messages=[{"role": "user", "content": "\u20ac" * 30_000}])),
        TurnCommitRequest,
    )
    assert "at most 65536 characters" in _invalid(
        _req(messages=[{"role": "user", "content": "x" * (MAX_MESSAGE_CHARS + 1)}])
    )
    # The body is capped in bytes (what JSON Schema cannot state): too_large, whatever it holds.
    window = [{"role": "user", "content": "y" * 60_000} for _ in range(6)]
    body = json.dumps(_req(window=window)).encode()
    assert len(body) > MAX_BODY_BYTES
    refused = parse_request(body)
    assert (
        isinstance(refused, TurnResult)
        and refused.error_kind == "too_large"
        and str(MAX_BODY_BYTES) in (refused.reason or "")
    )


def test_non_utf8_and_lone_surrogates_are_invalid() -> None:
    body = json.dumps(_req()).encode().replace(b"Hello", b"H\xff\xfello")
    assert "UTF-8" in _invalid(body)
    # A JSON "\ud800" escape is refused by the JSON parser.
    assert "JSON" in _invalid(
        '{"conversation_id": "c", "turn_id": 1, "messages": [{"role": "user", "content": "\\ud800"}]}'
    )
    assert "not valid JSON" in _invalid(b"{not json")
    assert _invalid(b"[1, 2]")


def test_payload_hash_covers_messages_and_actor_but_not_model_choices() -> None:
    base = parse_request(_req())
    other_model = parse_request(_req(config={"models": {"extractor": "m2"}, "token_budget": 2048}))
    other_text = parse_request(_req(messages=[{"role": "user", "content": "Bye"}]))
    generate = parse_request(_req(config={"actor": {"mode": "generate"}}))
    assert isinstance(base, TurnCommitRequest)
    assert base.payload_canonical() == other_model.payload_canonical()  # type: ignore[union-attr]
    assert base.payload_canonical() != other_text.payload_canonical()  # type: ignore[union-attr]
    assert base.payload_canonical() != generate.payload_canonical()  # type: ignore[union-attr]


# --- routing ---------------------------------------------------------------------------------


def test_routing_precedence_request_then_settings_then_tier(tmp_path: object) -> None:
    settings = load_settings(
        str(tmp_path), slot_models={"judge": "settings-judge", "extractor": "settings-ex"}
    )
    routes = resolve_routes(settings, {"extractor": "request-ex"})
    assert (routes["extractor"].model, routes["extractor"].source) == ("request-ex", "request")
    assert (routes["judge"].model, routes["judge"].source) == ("settings-judge", "settings")
    assert (routes["historian"].model, routes["historian"].source, routes["historian"].tier) == (
        None,
        "tier",
        "small",
    )
    assert routes["actor"].tier == "narrative"
    assert routes["retriever"].source == "none"


# --- extraction grounding and judge rules ------------------------------------------------------------

KNOWN = [
    DialogueEntity(entity_id="entity:melanie", name="Melanie", kind="Character", aliases=["Mel"]),
    DialogueEntity(entity_id="entity:paris", name="Paris", kind="Location"),
]


TURN = (
    "Caroline: Mel and I are friends now. I trust Mel again, I used to distrust her. Mel knows Melanie, ha. "
    "I attend the support group weekly. Mel paints and is kind."
)


def _action(
    verb: str, source: str, target: str, rel: str, quote: str, **extra: object
) -> dict[str, object]:
    return {
        "action": verb,
        "source": source,
        "target": target,
        "type": rel,
        "from_type": None,
        "weight_delta": 0.1,
        "weight": 0.5,
        "reason": "",
        "quote": quote,
        **extra,
    }


def test_plan_extraction_resolves_aliases_normalises_types_and_drops_self_loops() -> None:
    raw = TurnExtraction.model_validate(
        {
            "entities": [
                {
                    "name": "Caroline",
                    "kind": "person",
                    "aliases": [],
                    "quote": "Caroline: Mel and I are friends",
                }
            ],
            "actions": [
                _action(
                    "EVOLVE",
                    "Caroline",
                    "Mel",
                    "friends with",
                    "Mel and I are friends now",
                    weight_delta=0.2,
                ),
                _action(
                    "REPLACE",
                    "Caroline",
                    "Mel",
                    "trusts",
                    "I trust Mel again",
                    from_type="distrusts",
                    weight=0.7,
                ),
                _action("DELETE", "Mel", "Melanie", "KNOWS", "Mel knows Melanie, ha"),
                _action(
                    "EVOLVE",
                    "Caroline",
                    "the support group",
                    "attends weekly",
                    "I attend the support group weekly",
                ),
            ],
            "bio_patches": [
                {
                    "entity": "Mel",
                    "summary": "  Paints  ",
                    "traits_add": ["kind", "kind", "calm"],
                    "traits_remove": ["calm"],
                    "quote": "Mel paints and is kind",
                }
            ],
            "facts": ["Caroline went to a group.", "Caroline went to a group.", " "],
        }
    )
    plan = plan_extraction(raw, KNOWN, TURN, ["Caroline"])
    ids = {e.entity_id: e for e in plan.entities}
    assert ids["entity:caroline"].kind == "Character"
    assert (
        "entity:melanie" in ids and ids["entity:melanie"].name == "Melanie"
    )  # alias resolved, name kept
    evolve, replace, unknown = plan.actions
    assert (evolve.source_id, evolve.target_id, evolve.type) == (
        "entity:caroline",
        "entity:melanie",
        "FRIEND_OF",
    )
    assert evolve.quote == "Mel and I are friends now"
    assert (replace.type, replace.from_type) == ("TRUSTS", "DISTRUSTS")
    assert (unknown.type, unknown.raw_type) == ("RELATES_TO", "attends weekly")
    assert "entity:support-group" in ids
    assert plan.dropped == ["DELETE Mel -KNOWS-> Melanie itself"] or any(
        "itself" in d for d in plan.dropped
    )
    assert plan.bio_patches[0].entity_id == "entity:melanie"
    assert (
        plan.bio_patches[0].summary == "Paints"
        and plan.bio_patches[0].quote == "Mel paints and is kind"
    )
    assert plan.bio_patches[0].traits_add == ["kind"] and plan.bio_patches[0].traits_remove == [
        "calm"
    ]
    assert plan.facts == ["Caroline went to a group."]


def test_plan_extraction_refuses_facts_the_turn_does_not_state() -> None:
    raw = TurnExtraction.model_validate(
        {
            "entities": [
                {
                    "name": "Loca-Lina-Lina-Lina",
                    "kind": "Character",
                    "quote": "Mel and I are friends now",
                },
                {"name": "Ilse", "kind": "Character", "quote": "Ilse moved to Bergen"},
                {"name": "Mel", "kind": "Character", "quote": "Mel paints and is kind"},
            ],
            "actions": [
                _action(
                    "EVOLVE", "Caroline", "Ilse", "FAMILY_OF", "My sister Ilse moved to Bergen"
                ),
                _action(
                    "EVOLVE", "Caroline", "Mel", "LOVES", "Caroline loves Mel more than anyone"
                ),
                _action("EVOLVE", "Caroline", "Mel", "KNOWS", ""),
                _action("EVOLVE", "Melanie", "Caroline", "TRUSTS", "I trust Mel again"),
            ],
            "bio_patches": [
                {
                    "entity": "Mel",
                    "summary": "A sailor.",
                    "traits_add": [],
                    "traits_remove": [],
                    "quote": "Mel sails every summer",
                }
            ],
        }
    )
    plan = plan_extraction(raw, KNOWN, TURN, ["Caroline"])
    reasons = "\n".join(plan.dropped)
    assert "'Loca-Lina-Lina-Lina': repeated fragment" in reasons
    assert "entity 'Ilse': name not in the messages" in reasons
    assert "FAMILY_OF-> Ilse: name not in the messages" in reasons
    assert "LOVES-> Mel: quote not in the text" in reasons
    assert "KNOWS-> Mel: no quote" in reasons
    assert "bio of 'Mel': quote not in the text" in reasons
    # Look-alikes kept: a known name by its alias, the speaker as "I" (named by the line), a
    # known name the quote calls by its alias.
    assert [e.name for e in plan.entities] == ["Melanie", "Caroline"]
    assert [(a.type, a.source_id) for a in plan.actions] == [("TRUSTS", "entity:melanie")]
    assert len(plan.dropped) == 6


def _entity(
    name: str, kind: str, quote: str, aliases: list[str] | None = None
) -> dict[str, object]:
    return {"name": name, "kind": kind, "aliases": aliases or [], "quote": quote}


def test_rule_conflicts_flag_kind_clashes_and_merging_aliases_with_evidence() -> None:
    known = [*KNOWN, DialogueEntity(entity_id="entity:caroline", name="Caroline", kind="Character")]
    retrieval = Retrieval(known_entities=known)
    text = "Caroline: Paris is my neighbour now. Melanie, we call her Paris too. Mel paints."
    raw = TurnExtraction.model_validate(
        {
            "entities": [
                _entity(
                    "Paris", "Character", "Paris is my neighbour now"
                ),  # a Location, now a person
                _entity(
                    "Melanie", "Character", "Melanie, we call her Paris too", ["Paris"]
                ),  # binds Paris twice
                _entity("Mel", "Character", "Mel paints"),  # look-alike: her own alias
                _entity(
                    "Caroline", "Location", "Caroline: Paris is my neighbour"
                ),  # look-alike: a participant
            ]
        }
    )
    plan = plan_extraction(raw, known, text, ["Caroline"])
    conflicts = rule_conflicts(plan, retrieval)
    assert sorted(c.reason for c in conflicts) == [
        "alias 'Paris' belongs to another known entity",
        "known as a Location, proposed as a Character",
    ]
    assert all(c.source == "rule" and c.has_evidence for c in conflicts)
    alias = next(c for c in conflicts if c.name == "Paris" and c.entity == "Melanie")
    assert alias.graph_evidence[0] == "'Paris' names Paris (Location)"
    assert alias.turn_evidence == ["Melanie, we call her Paris too"]


def test_a_participants_name_is_never_another_entitys_alias() -> None:
    text = "Seraphina: Welcome, traveller. Tester: Thanks, Seraphina, my sister Ilse sends her regards."
    raw = TurnExtraction.model_validate(
        {
            "entities": [
                _entity(
                    "Seraphina", "Character", "Seraphina: Welcome, traveller", ["Tester"]
                ),  # merges the speakers
                _entity(
                    "Ilse", "Character", "my sister Ilse sends her regards", ["Ilsa"]
                ),  # look-alike: kept
            ]
        }
    )
    plan = plan_extraction(raw, [], text, ["Seraphina", "Tester"])
    assert "alias 'Tester' of 'Seraphina': another participant of the chat" in plan.dropped
    by_name = {e.name: e.aliases for e in plan.entities}
    assert by_name == {"Seraphina": [], "Ilse": ["Ilsa"]}
    assert rule_conflicts(plan, Retrieval()) == []


ILSE = DialogueEntity(
    entity_id="entity:ilse",
    name="Ilse",
    kind="Character",
    bio_summary="Tester's sister, lives in Bergen.",
    first_turn="2",
)
SERAPHINA = DialogueEntity(
    entity_id="entity:seraphina", name="Seraphina", kind="Character", bio_summary="A guardian."
)
TESTER = DialogueEntity(entity_id="entity:tester", name="Tester", kind="Character")
BARE = DialogueEntity(entity_id="entity:bjorn", name="Bjorn", kind="Character")


def _reported(*pairs: tuple[str, str]) -> list[IdentityConflictOut]:
    return [
        IdentityConflictOut(entity=a, conflicts_with=b, reason="the model says so")
        for a, b in pairs
    ]


def test_reported_conflicts_count_only_when_the_graph_can_show_them() -> None:
    known = [ILSE, SERAPHINA, TESTER, BARE]
    retrieval = Retrieval(
        known_entities=known,
        relations=[
            DialogueRelation(
                rel_id="r1",
                source_id="entity:tester",
                source_name="Tester",
                target_id="entity:ilse",
                target_name="Ilse",
                type="SIBLING_OF",
                weight=0.8,
                status="active",
                quote="My sister Ilse moved to Bergen",
            )
        ],
    )
    text = "Tester: Ilse from work, my new colleague, met Bjorn. Seraphina: I am glad, Tester."
    raw = TurnExtraction.model_validate(
        {
            "entities": [
                _entity("Ilse", "Character", "Ilse from work, my new colleague"),
                _entity("Bjorn", "Character", "my new colleague, met Bjorn"),
                _entity("Seraphina", "Character", "I am glad, Tester"),
                _entity("Tester", "Character", "I am glad, Tester"),
            ]
        }
    )
    plan = plan_extraction(raw, known, text, ["Tester", "Seraphina"])
    kept, dismissed = vet_reported(
        _reported(
            (
                "Ilse",
                "Ilse (Tester's sister)",
            ),  # true case: a known Ilse with facts, a new "Ilse from work"
            ("Seraphina", "Tester"),  # the chat's own two speakers
            ("Seraphina (Character)", ""),  # a participant
            ("Bjorn", "someone else"),  # known, but the graph holds no fact about him
            ("Gandalf", "Saruman"),  # nothing the graph holds
            ("Ilse", "Bjorn"),  # two known entities, no name of one bound to the other
        ),
        plan,
        retrieval,
        [],
    )
    assert [(c.entity, c.name) for c in kept] == [("Ilse", "Ilse")]
    assert kept[0].graph_evidence == [
        "'Ilse' names Ilse (Character) since turn 2",
        "bio of Ilse: Tester's sister, lives in Bergen.",
        'Tester -SIBLING_OF-> Ilse ("My sister Ilse moved to Bergen")',
    ]
    assert kept[0].turn_evidence == ["Ilse from work, my new colleague"]
    why = [d.split(": ", 1)[1] for d in dismissed]
    assert why == [
        "a participant of the chat (the chat names its speakers)",
        "a participant of the chat (the chat names its speakers)",
        "the graph holds no facts about Bjorn to contradict",
        "the graph holds no entity named 'Gandalf'",
        "two different known entities, and this turn binds no name of one to the other",
    ]


def test_a_reported_conflict_needs_the_turn_to_bind_the_name() -> None:
    # Look-alike of the true case above: Ilse is known with facts, but this turn does not mention her.
    retrieval = Retrieval(known_entities=[ILSE, TESTER])
    plan = plan_extraction(
        TurnExtraction.model_validate({"entities": [_entity("Tester", "Character", "I baked")]}),
        [ILSE, TESTER],
        "Tester: I baked sourdough today.",
        ["Tester", "Seraphina"],
    )
    kept, dismissed = vet_reported(_reported(("Ilse", "")), plan, retrieval, [])
    assert kept == [] and dismissed == [
        "Ilse vs ?: this turn's grounded proposals do not bind Ilse"
    ]


def test_commit_gate_blocks_without_actions_or_with_identity_conflicts() -> None:
    raw = TurnExtraction.model_validate(
        {
            "entities": [],
            "actions": [_action("EVOLVE", "Ann", "Ben", "KNOWS", "I have known Ben for years")],
            "bio_patches": [],
            "facts": [],
        }
    )
    with_action = plan_extraction(raw, [], "Ann: I have known Ben for years.", ["Ann"])
    assert len(with_action.actions) == 1, with_action.dropped
    empty = plan_extraction(TurnExtraction(), [], "")
    clean = JudgeSummary()
    conflicted = JudgeSummary(identity_conflicts=[IdentityConflict(entity="A", reason="x")])
    assert commit_gate(with_action, clean).passed
    blocked = commit_gate(empty, clean)
    assert not blocked.passed and blocked.reasons == ["no relation actions"]
    assert commit_gate(empty, clean, require_actions=False).passed
    both = commit_gate(empty, conflicted)
    assert (
        not both.passed and both.identity_conflicts == 0 and both.reasons == ["no relation actions"]
    ), "a conflict without evidence is no conflict"
    assert blocked.nothing_new and not both.passed and both.nothing_new


def test_the_gate_blocks_a_conflict_with_evidence_and_reports_nothing_new_apart() -> None:
    raw = TurnExtraction.model_validate(
        {"actions": [_action("EVOLVE", "Ann", "Ben", "KNOWS", "I have known Ben for years")]}
    )
    with_action = plan_extraction(raw, [], "Ann: I have known Ben for years.", ["Ann"])
    empty = plan_extraction(TurnExtraction(), [], "")
    evidenced = JudgeSummary(
        identity_conflicts=[
            IdentityConflict(
                entity="Ben",
                reason="x",
                graph_evidence=["'Ben' names Ben (Location)"],
                turn_evidence=["known Ben"],
            )
        ]
    )
    blocked = commit_gate(with_action, evidenced)
    assert (
        not blocked.passed
        and blocked.reasons == ["identity conflicts (Ben)"]
        and not blocked.nothing_new
    )
    both = commit_gate(empty, evidenced)
    assert (
        both.reasons == ["no relation actions", "identity conflicts (Ben)"] and not both.nothing_new
    )
    nothing = commit_gate(empty, JudgeSummary())
    result = TurnResult(ok=False, state=TurnState.ROLLED_BACK, gate=nothing)
    assert result.nothing_new and json.loads(result.model_dump_json())["nothing_new"] is True
    assert not TurnResult(ok=False, state=TurnState.ROLLED_BACK, gate=both).nothing_new


def test_chronicle_dedupes_and_links_milestone_entities() -> None:
    report = HistorianReport.model_validate(
        {
            "events": ["Ann moved.", "Ann  moved.", ""],
            "milestones": [
                {
                    "text": "Ann adopted a dog",
                    "entities": ["Mel", "Nobody"],
                    "importance": 0.9,
                    "quote": "I adopted a dog with Mel",
                },
                {"text": "Ann adopted a dog", "entities": [], "importance": 0.1, "quote": "a dog"},
                {
                    "text": "Ann won the lottery",
                    "entities": [],
                    "importance": 0.9,
                    "quote": "I won the lottery yesterday",
                },
            ],
        }
    )
    text = "Ann: I moved last month, and I adopted a dog with Mel!"
    chronicle = chronicle_from(
        report, Retrieval(known_entities=KNOWN), plan_extraction(TurnExtraction(), [], text), text
    )
    assert chronicle.events == ["Ann moved."]
    assert len(chronicle.milestones) == 1 and chronicle.milestones[0].entity_ids == [
        "entity:melanie"
    ]
    assert chronicle.milestones[0].quote == "I adopted a dog with Mel"
    assert chronicle.dropped == [
        "milestone 'Ann won the lottery': quote not in the text (best match 58/100)"
    ] or (len(chronicle.dropped) == 1 and "lottery" in chronicle.dropped[0])


# --- retrieval and injection ------------------------------------------------------------------


def _rel(i: int, source: str, target: str, weight: float) -> DialogueRelation:
    return DialogueRelation(
        rel_id=f"r{i}",
        source_id=source,
        source_name=source,
        target_id=target,
        target_name=target,
        type="KNOWS",
        weight=weight,
        status="active",
    )


def test_mentions_and_relation_selection_prefer_the_focus() -> None:
    found = mentioned_entities(KNOWN, "Mel said she loves PARIS, but not Melbourne.")
    assert [e.name for e in found] == ["Melanie", "Paris"]
    assert mentioned_entities(KNOWN, "Melbourne is far") == []
    rels = [_rel(1, "x", "y", 0.9), _rel(2, "a", "entity:paris", 0.2), _rel(3, "x", "z", 0.5)]
    assert [r.rel_id for r in select_relations(rels, {"entity:paris"}, 2)] == ["r2", "r1"]


def test_injection_packet_stays_within_its_token_budget() -> None:
    retrieval = Retrieval(
        known_entities=KNOWN,
        mentioned=KNOWN,
        relations=[_rel(i, "entity:melanie", "entity:paris", 0.5) for i in range(40)],
    )
    packet = build_packet(retrieval, token_budget=128)
    assert packet.used_tokens <= 128 and packet.token_budget == 128
    assert "## Characters" in packet.text and "Melanie (Character)" in packet.text
    rel_section = next(s for s in packet.sections if s.name == "relationships")
    assert rel_section.items_in == 40 and rel_section.items_kept < 40


def test_recalled_passages_carry_the_time_they_were_said() -> None:
    said = RecalledTurn(
        key="c:3",
        turn_id="3",
        seq=3,
        speaker="Caroline",
        score=1.0,
        text="Caroline: I went to a LGBTQ support group yesterday.",
        when="1:56 pm on 8 May, 2023",
    )
    undated = RecalledTurn(
        key="c:4", turn_id="4", seq=4, speaker="Melanie", score=0.5, text="Melanie: Wow!"
    )
    packet = build_packet(Retrieval(recalled=[said, undated]), token_budget=256)
    assert (
        "[turn 3, 1:56 pm on 8 May, 2023] Caroline: I went to a LGBTQ support group" in packet.text
    )
    assert "[turn 4] Melanie: Wow!" in packet.text


def test_recalled_passages_spell_out_the_dates_their_time_expressions_mean() -> None:
    index = HybridIndex(3)
    index.add(
        [
            MemoryDoc(
                key="c:1",
                text="Caroline: I went to a LGBTQ support group yesterday.",
                speaker="Caroline",
                when="1:56 pm on 8 May, 2023",
                meta={"turn_id": "1", "seq": 1},
            ),
            MemoryDoc(
                key="c:2",
                text="Caroline: We had a week of rain at the support group.",
                speaker="Caroline",
                when="1:56 pm on 8 May, 2023",
                meta={"turn_id": "2", "seq": 2},
            ),
            MemoryDoc(
                key="c:3",
                text="Caroline: Yesterday the support group met; yesterday was long. "
                "Last Friday it did not.",
                speaker="Caroline",
                when="1:56 pm on 8 May, 2023",
                meta={"turn_id": "3", "seq": 3},
            ),
        ],
        None,
    )
    hits = {hit.key: recalled(hit) for hit in index.search("support group", None, 3)}
    assert hits["c:1"].event_dates == ["yesterday = Sunday 7 May 2023"]
    assert hits["c:2"].event_dates == []  # a duration is no date
    # One day named twice is noted once, as first written; another day keeps its own note.
    assert hits["c:3"].event_dates == [
        "Yesterday = Sunday 7 May 2023",
        "Last Friday = Friday 5 May 2023",
    ]
    packet = build_packet(Retrieval(recalled=[hits["c:1"], hits["c:2"]]), token_budget=256)
    assert (
        "[turn 1, 1:56 pm on 8 May, 2023; yesterday = Sunday 7 May 2023] Caroline: I went to a LGBTQ"
        in packet.text
    )
    assert "[turn 2, 1:56 pm on 8 May, 2023] Caroline: We had a week of rain" in packet.text
    # The asked message's own dates come first, spelled out the same way; with no passage
    # recalled there is nothing to date and no note.
    asked = ["yesterday = Sunday 7 May 2023"]
    dated = build_packet(Retrieval(recalled=[hits["c:1"]], asked_dates=asked), token_budget=256)
    assert dated.text.splitlines()[1:3] == [
        "- In the message answered now: yesterday = Sunday 7 May 2023",
        "- [turn 1, 1:56 pm on 8 May, 2023; yesterday = Sunday 7 May 2023] Caroline: I went to"
        " a LGBTQ support group yesterday.",
    ]
    assert build_packet(Retrieval(asked_dates=asked), token_budget=256).text == ""


def _row(
    seq: int, text: str, vector: list[float], *, key: str | None = None, speaker: str = "Ann"
) -> MemoryRow:
    return MemoryRow(
        key=key or f"c:{seq}",
        conversation_id="c",
        turn_id=str(seq),
        seq=seq,
        speaker=speaker,
        text=f"{speaker}: {text}",
        group=f"session {seq}",
        embedding=vector,
    )


def test_a_remembered_turns_messages_come_back_from_its_text() -> None:
    # A front end's turn: a message of two lines, then the reply; a line that only looks like a
    # speaker's ("Note: ...", not a speaker of the turn) stays inside the message.
    messages = [
        ChatMessage(role="user", name="User", content="hi\nNote: the lamp is out", time="t"),
        ChatMessage(role="assistant", name="Seraphina", content="I will light it.", time="t"),
    ]
    row = memory_row("c", "c:1", "1", messages)
    again = row_messages(row)
    assert [(m.speaker, m.content) for m in again] == [(m.speaker, m.content) for m in messages]
    assert turn_text(again) == row.text
    # A speaker whose name holds the other's ("Ann" and "Anna") is told apart by ": ".
    pair = [
        ChatMessage(role="user", name="Anna", content="yes"),
        ChatMessage(role="user", name="Ann", content="no"),
    ]
    assert [m.speaker for m in row_messages(memory_row("c", "c:2", "2", pair))] == ["Anna", "Ann"]


def _said(time: str, turn: str = "1", content: str = "we went to the lake") -> MemoryRow:
    return memory_row(
        "c", f"c:{turn}", turn, [ChatMessage(role="user", name="Ann", content=content, time=time)]
    )


@pytest.mark.parametrize(
    "morning, evening",
    [
        ("2023-05-08T09:15:00Z", "2023-05-08T21:40:12.345Z"),  # ISO 8601
        ("1683537300", "1683582012345"),  # Unix seconds and milliseconds
        ("May 8, 2023 9:15am", "May 8, 2023 9:40pm"),  # SillyTavern's send_date
        ("9:15 am on 8 May, 2023", "9:40 pm on 8 May, 2023"),  # LoCoMo's
    ],
)
def test_a_turns_group_is_the_day_it_was_said_whatever_form_its_time_takes(
    morning: str, evening: str
) -> None:
    # The neighbour and session features join turns of one group: a group per timestamp would
    # leave every turn of a chat with ISO times alone (0.776 held out against 0.834).
    first, second = _said(morning, "1"), _said(evening, "2")
    assert first.group == second.group == "8 May, 2023"
    assert memory_doc(first).group == memory_doc(second).group == "8 May, 2023"
    # Look-alike: the next day is another group.
    assert _said("2023-05-09T09:15:00Z").group == "9 May, 2023"


def test_a_turns_group_keeps_a_recorded_session_and_mends_a_row_stored_per_timestamp() -> None:
    session = _said("2023-05-08T09:15:00Z").model_copy(update={"group": "session 3"})
    assert memory_doc(session).group == "session 3"
    # Stored before groups were days: its group the whole ISO time; read as its day now.
    legacy = _said("2023-05-08T09:15:00Z").model_copy(update={"group": "2023-05-08T09:15:00Z"})
    assert memory_doc(legacy).group == "8 May, 2023"
    # No full date to read: the text after " on ", as before.
    assert _said("9:15 am on a Tuesday").group == "a Tuesday"


def test_a_turn_said_at_an_iso_or_unix_time_is_found_by_its_months_name() -> None:
    index = HybridIndex(2)
    rows = [
        _said("2023-05-08T09:15:00Z", "1"),
        _said("1686391200", "2"),  # 10 June 2023
        _said("10:00 am on 12 July, 2023", "3"),
    ]
    index.add([memory_doc(r) for r in rows], None)
    assert index.lexical.ranking("may", 10, 3) == [0]
    assert index.lexical.ranking("june", 10, 3) == [1]
    assert index.lexical.ranking("july", 10, 3) == [2]  # a time that names its month already


def test_turn_memory_index_appends_by_position_and_resets_on_a_new_life() -> None:
    index = TurnMemoryIndex()
    index.sync(
        [_row(1, "the lighthouse lamp", [1.0, 0.0]), _row(2, "a boat in the harbour", [0.6, 0.8])],
        reset=False,
    )
    assert index.cursor()[0] == 2 and index.cursor()[1].startswith("c:2#") and len(index) == 2
    assert [h.turn_id for h in index.search("boat", np.array([0.6, 0.8]), 1, [])] == ["2"]
    index.sync([_row(2, "a boat in the harbour", [0.6, 0.8])], reset=False)  # already known
    assert len(index) == 2
    index.sync([_row(1, "orchard apples", [0.0, 1.0], key="c:9")], reset=True)
    assert len(index) == 1 and index.cursor()[0] == 1 and index.cursor()[1].startswith("c:9#")
    # Another embedding model (3 dimensions): the lexical side still answers.
    assert [h.key for h in index.search("apples", np.array([1.0, 0.0, 0.0]), 3, [])] == ["c:9"]


def test_a_row_another_embedding_model_made_is_indexed_by_its_words_only() -> None:
    index = TurnMemoryIndex()
    rows = [
        _row(1, "the lighthouse lamp", [1.0, 0.0]).model_copy(update={"embedded_by": "old"}),
        _row(2, "a boat in the harbour", [0.6, 0.8]).model_copy(update={"embedded_by": "new"}),
        _row(3, "orchard apples", [0.0, 1.0]),  # remembered before rows named their model
    ]
    pinned = index.sync(rows, reset=False, vectors_from="new")
    assert pinned is not None and pinned.hybrid is not None
    assert pinned.hybrid.dense.count == 2  # rows 2 and 3: the model's own and the unnamed one
    # Row 1's vector is the query's own, but another model made it: the vectors do not find it.
    assert [h.key for h in pinned.search("xyzzy", np.array([1.0, 0.0]), 3, [])] == ["c:3", "c:2"]
    assert [h.key for h in pinned.search("lighthouse", None, 1, [])] == ["c:1"]  # its words do
    # Look-alike: a caller naming no model (a test, a bench) uses every vector of the length.
    whole = TurnMemoryIndex().sync(rows, reset=False)
    assert whole is not None and whole.hybrid is not None and whole.hybrid.dense.count == 3
    assert "c:1" in [h.key for h in whole.search("xyzzy", np.array([1.0, 0.0]), 3, [])]


def test_the_first_vector_of_a_model_with_another_length_is_used_after_only_foreign_ones() -> None:
    index = TurnMemoryIndex()
    old = _row(1, "the lighthouse lamp", [1.0, 0.0]).model_copy(update={"embedded_by": "old"})
    index.sync([old], reset=False, vectors_from="new")  # no vector of the model in use yet
    new = _row(2, "a boat", [0.0, 0.6, 0.8]).model_copy(update={"embedded_by": "new"})
    pinned = index.sync([new], reset=False, vectors_from="new")
    assert pinned is not None and pinned.hybrid is not None
    assert (pinned.hybrid.dimensions, pinned.hybrid.dense.count) == (3, 1)
    assert [h.key for h in pinned.search("xyzzy", np.array([0.0, 0.6, 0.8]), 2, [])] == ["c:2"]
    # Look-alike: once the index holds a vector, another length never replaces it.
    other = _row(3, "a kite", [1.0, 0.0]).model_copy(update={"embedded_by": "new"})
    pinned = index.sync([other], reset=False, vectors_from="new")
    assert pinned is not None and pinned.hybrid is not None
    assert (pinned.hybrid.dimensions, pinned.hybrid.dense.count) == (3, 1)


def test_a_cache_from_before_a_re_embedding_is_not_current() -> None:
    held = anchor_token("c:2", "Ann: a boat")
    assert cache_is_current(2, held, 2, "c:2", "Ann: a boat", 0)
    assert not cache_is_current(2, held, 2, "c:2", "Ann: a boat", 1)  # re-embedded since
    assert cache_is_current(2, anchor_token("c:2", "Ann: a boat", 1), 2, "c:2", "Ann: a boat", 1)
    # A bare key proves nothing once vectors changed under the same keys and texts.
    assert cache_is_current(2, "c:2", 2, "c:2", "Ann: a boat", 0)
    assert not cache_is_current(2, "c:2", 2, "c:2", "Ann: a boat", 1)
    # The index keeps the epoch its rows were read at in its anchor.
    index = TurnMemoryIndex()
    index.sync([_row(2, "a boat", [1.0, 0.0])], reset=False, vectors_epoch=3)
    assert index.cursor()[1] == anchor_token("c:2", "Ann: a boat", 3)


# --- HTTP status mapping ------------------------------------------------------------------------


def test_http_status_mapping() -> None:
    ok = TurnResult(ok=True, state=TurnState.COMMITTED, committed=True)
    assert turn_status(ok) == 200
    assert turn_status(TurnResult.invalid("x")) == 400
    assert turn_status(TurnResult.invalid("x", kind="too_large")) == 413
    assert turn_status(TurnResult.invalid("x", kind="forbidden")) == 403
    assert turn_status(TurnResult.invalid("x", kind="conflict")) == 409
    busy = TurnResult(ok=False, state=TurnState.RECEIVED, code="IN_PROGRESS", retryable=True)
    assert turn_status(busy) == 409
    rolled = TurnResult(ok=False, state=TurnState.ROLLED_BACK, code="ROLLED_BACK", retryable=True)
    assert turn_status(rolled) == 503
    assert turn_status(rolled.model_copy(update={"retryable": False})) == 200
    bug = rolled.model_copy(update={"retryable": False, "error_kind": "internal"})
    assert turn_status(bug) == 500


def test_a_reader_from_before_a_rewind_adds_nothing_to_the_index_built_after_it() -> None:
    index = TurnMemoryIndex()
    index.sync(
        [
            _row(1, "sister Ilse moved to Bergen", [1.0, 0.0]),
            _row(2, "the weather has been rainy", [0.0, 1.0]),
        ],
        reset=False,
    )
    _, _, generation = index.read_cursor()
    index.sync(
        [], reset=True
    )  # a rewind (VectorIndexRegistry.forget) while the reader was in the graph
    assert not index.sync(
        [_row(3, "rainy all week, stayed in", [0.0, 1.0])], reset=False, generation=generation
    )
    assert len(index) == 0
    # Look-alike: a reader that took its cursor after the reset adds its rows.
    _, _, generation = index.read_cursor()
    assert index.sync(
        [_row(1, "sunny all week, went hiking", [0.0, 1.0])], reset=False, generation=generation
    )
    assert [h.text for h in index.search("hiking", None, 5, [])] == [
        "Ann: sunny all week, went hiking"
    ]


def test_a_pending_write_holds_back_the_old_text_of_its_turn_only() -> None:
    def turn(turn_id: str, text: str) -> RecalledTurn:
        return RecalledTurn(
            key=f"c:{turn_id}",
            turn_id=turn_id,
            seq=int(turn_id),
            speaker="Tester",
            text=text,
            score=1.0,
        )

    retrieval = Retrieval(
        recalled=[
            turn("3", "Tester: My sister Ilse moved to Bergen."),
            turn("7", "Tester: It was rainy all week."),
            turn("9", "Tester: I baked sourdough."),
        ],
        milestones=[
            DialogueMilestone(milestone_id="m1", turn_id="3", seq=3, text="Ilse moved"),
            DialogueMilestone(milestone_id="m2", turn_id="9", seq=9, text="sourdough"),
        ],
        relations=[
            DialogueRelation(
                rel_id="r1",
                source_id="a",
                source_name="Tester",
                target_id="b",
                target_name="Ilse",
                type="SIBLING_OF",
                weight=0.5,
                status="active",
                since_turn="3",
            )
        ],
        known_entities=[
            DialogueEntity(
                entity_id="a",
                name="Tester",
                bio_summary="Tester said it was rainy all week.",
                last_turn="7",
            ),
            DialogueEntity(
                entity_id="b", name="Ilse", bio_summary="Tester's sister.", last_turn="3"
            ),
        ],
    )
    pending = {
        "7": "Tester: It was sunny all week.",  # an edit not written yet: the old text goes
        "3": "Tester: My sister Ilse moved to Bergen.",  # look-alike: same text, kept
        "9": None,
    }  # a delete: its milestone goes (its text is stale)
    kept, held = without_pending(retrieval, pending, k=5)
    assert held == ["7", "9"]
    assert [t.turn_id for t in kept.recalled] == ["3"]
    assert [m.turn_id for m in kept.milestones] == ["3"] and [r.rel_id for r in kept.relations] == [
        "r1"
    ]
    assert [e.bio_summary for e in kept.known_entities] == [
        "",
        "Tester's sister.",
    ]  # the old words of turn 7 go
    assert without_pending(retrieval, {}, k=2)[0].recalled == retrieval.recalled[:2]
    # A pending turn that was not recalled still holds back the bio it wrote last, when memory
    # holds another text for it; look-alike: memory already holds the new text.
    not_recalled = retrieval.model_copy(update={"recalled": []})
    kept, held = without_pending(
        not_recalled,
        {"7": "Tester: It was sunny all week."},
        5,
        {"7": "Tester: It was rainy all week."},
    )
    assert held == [] and kept.known_entities[0].bio_summary == ""
    kept, _ = without_pending(
        not_recalled,
        {"7": "Tester: It was sunny all week."},
        5,
        {"7": "Tester: It was sunny all week."},
    )
    assert kept.known_entities[0].bio_summary == "Tester said it was rainy all week."
    # Mid-replace: memory holds no text for turn 7 (rewound, not yet written again) while the bio
    # was read before the rewind; look-alike: a turn never committed holds back nothing.
    kept, held = without_pending(
        not_recalled, {"7": "Tester: It was sunny all week."}, 5, {"7": None}
    )
    assert held == [] and kept.known_entities[0].bio_summary == ""
    kept, _ = without_pending(not_recalled, {"12": "Tester: Hello again."}, 5, {"12": None})
    assert [e.bio_summary for e in kept.known_entities] == [
        e.bio_summary for e in retrieval.known_entities
    ]
    assert kept.milestones == retrieval.milestones and kept.relations == retrieval.relations


def test_a_memory_query_embeds_the_text_its_turn_is_stored_under_whomever_it_is_asked_about() -> (
    None
):
    """The commit stores the vector the memory query computed when the two texts are one:
    whichever speaker's name the message is asked under (or none), the text embedded for the
    query is the row's (`row_text`)."""
    speakers = {"Caroline", "Melanie"}

    def texts(content: str, name: str = "Melanie") -> tuple[str, str]:
        messages = [ChatMessage(role="user", name=name, content=content)]
        return embedded_text(recall_query(messages, speakers), speakers), row_text(
            messages, speakers
        )

    for content in (
        "How is your adoption going, Caroline?",  # asked under Caroline's name
        "I painted a lake last week.",  # under the sender's
        "How is the adoption going?",  # under no name
    ):
        query, row = texts(content)
        assert query == row, content
    assert texts("I painted a lake last week.")[1] == "I painted a lake last week."
    # The look-alike: a sender the conversation has not heard yet. The row drops the new
    # name (its speakers include its own), the query the index knew could not: two texts.
    query, row = texts("I'm Dave, I painted a lake last week.", name="Dave")
    assert row == "I'm, I painted a lake last week." and query != row
    # A turn of several messages is stored as one row: its text is every line's words.
    both = [
        ChatMessage(role="user", name="Caroline", content="I went to a support group."),
        ChatMessage(role="user", name="Melanie", content="How was it?"),
    ]
    assert row_text(both, speakers) == "I went to a support group. How was it?"
    assert row_texts(
        [memory_row("c", "c:1", "1", both[:1]), memory_row("c", "c:2", "2", both[1:])]
    ) == ["I went to a support group.", "How was it?"]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        # Addressed only: not spoken of.
        ("Thanks, Seraphina. Where does Ilse live now?", []),
        ("Seraphina, where does Ilse live?", []),
        ("Hi Seraphina! Do you remember my sister?", []),
        ("How are you, Seraphina?", []),
        ("Tester: Seraphina, my sister moved.", ["Tester"]),  # after a "Speaker:" label
        ("Did you see Melanie, Caroline?", ["Melanie"]),
        ("Melanie: thanks Caroline!", ["Melanie"]),
        # The look-alikes: spoken of.
        ("Where does Seraphina live?", ["Seraphina"]),
        ("Caroline, Melanie and I went to the park.", ["Caroline", "Melanie"]),
        ("Caroline: Melanie, Jon and I went.", ["Caroline", "Melanie", "Jon"]),
        ("I told Caroline, she agreed.", ["Caroline"]),
        ("What did Caroline, my friend, say?", ["Caroline"]),
        ("Seraphina's garden is lovely.", ["Seraphina"]),
        ("When did Caroline go to the LGBTQ support group?", ["Caroline"]),
    ],
)
def test_a_name_a_message_only_addresses_is_not_one_it_speaks_of(
    query: str, named: list[str]
) -> None:
    assert named_in(query, ["Seraphina", "Tester", "Caroline", "Melanie", "Jon"]) == named


def test_a_query_without_its_addresses_keeps_what_it_asks_about() -> None:
    names = ["Seraphina", "Tester", "Caroline", "Melanie"]
    assert unaddressed("Thanks, Seraphina. Where does Ilse live now?", names) == (
        "Where does Ilse live now?"
    )
    assert unaddressed("Tester: Hi Seraphina! My sister moved.", names) == (
        "Tester: My sister moved."
    )
    # The look-alikes: nothing addressed, nothing taken out.
    for query in ("Where does Seraphina live?", "Caroline, Melanie and I went to the park."):
        assert unaddressed(query, names) == query


def test_recall_query_names_whom_a_message_is_about() -> None:
    speakers = {"Caroline", "Melanie"}

    def asked(content: str, name: str = "Melanie", among: set[str] = speakers) -> str:
        return recall_query([ChatMessage(role="user", name=name, content=content)], among)

    assert asked("How is your adoption going?") == "Caroline: How is your adoption going?"
    assert asked("I painted a lake last week.") == "Melanie: I painted a lake last week."
    # Neither, both, or "you" in a group: no one is named, not even the sender.
    assert asked("How is the adoption going?") == "How is the adoption going?"
    assert asked("Did you see what I painted?") == "Did you see what I painted?"
    assert asked("How are you all?", among={"Caroline", "Melanie", "Jon"}) == "How are you all?"
    # Words that only contain a pronoun are not one ("Iris", "youth", "mine" in "mineral" ...).
    assert (
        asked("Iris told the youth about mineral water.")
        == "Iris told the youth about mineral water."
    )
