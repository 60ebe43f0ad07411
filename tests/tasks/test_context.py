"""Context envelope: budgets, proportional reallocation, truncation."""

from core.settings import ContextBudget
from tasks.context import allocate, build_envelope, estimate_tokens


def test_allocate_reallocates_absent_sections_proportionally() -> None:
    shares = {
        "history": 0.3,
        "summaries": 0.1,
        "lore": 0.15,
        "characters": 0.2,
        "relationships": 0.1,
        "guidance": 0.15,
    }
    budgets = allocate(shares, {"history", "summaries"}, 1000)
    # history:summaries keep their 3:1 ratio and together take the whole budget.
    assert budgets == {"history": 750, "summaries": 250}


def test_allocate_with_everything_present_uses_configured_shares() -> None:
    shares = {"a": 0.5, "b": 0.25}
    assert allocate(shares, {"a", "b"}, 1000) == {"a": 500, "b": 250}


def test_envelope_respects_each_section_budget_and_reports_truncation() -> None:
    long_items = [f"summary of chapter {i}: " + "word " * 200 for i in range(20)]
    envelope = build_envelope(
        {"summaries": long_items, "characters": ["Mara: a keeper"], "lore": []},
        ContextBudget(),
        context_window=4096,
        reserved_tokens=1096,
    )
    by_name = {s.name: s for s in envelope.sections}
    assert "lore" not in by_name  # empty sections take no budget
    assert by_name["summaries"].truncated is True
    assert by_name["summaries"].used_tokens <= by_name["summaries"].budget_tokens
    assert by_name["characters"].items_kept == 1
    assert envelope.used_tokens <= envelope.total_budget == 3000
    assert estimate_tokens(envelope.text) <= 3000 + 20  # headings and bullets are estimated too


def test_empty_sections_give_empty_envelope() -> None:
    envelope = build_envelope({}, ContextBudget(), 4096, 1000)
    assert envelope.text == "" and envelope.sections == []


def test_allocate_gives_what_a_section_does_not_need_to_the_ones_that_need_more() -> None:
    shares = {
        "history": 0.3,
        "summaries": 0.1,
        "lore": 0.15,
        "characters": 0.2,
        "relationships": 0.1,
        "guidance": 0.15,
    }
    present = {"history", "lore", "characters", "relationships"}
    needs = {"history": 100, "lore": 50, "characters": 900, "relationships": 400}
    budgets = allocate(shares, present, 1000, needs)
    # history and lore keep what they need; characters and relationships share the rest 2:1.
    assert budgets["history"] == 100 and budgets["lore"] == 50
    assert budgets["characters"] == 566 and budgets["relationships"] == 283
    assert sum(budgets.values()) <= 1000
    # Everything fits: every section gets what it needs and nothing more.
    assert allocate(shares, present, 10_000, needs) == needs


def test_envelope_reports_what_it_cut_and_why() -> None:
    relationships = [f"Mara Quill knows person {i} (since chapter {i})" for i in range(200)]
    envelope = build_envelope(
        {
            "relationships": relationships,
            "lore": ["Gull Rock: a lighthouse"],
            "characters": ["Mara Quill (character): the keeper"],
        },
        ContextBudget(),
        4096,
        3000,
    )
    by_name = {s.name: s for s in envelope.sections}
    assert by_name["lore"].cut == "" and by_name["characters"].cut == ""
    cut = by_name["relationships"].cut
    assert cut.startswith("relationships: ") and "of 200 items left out" in cut and "budget" in cut
    # The relationships took what the others did not need: the whole budget is used, and no more.
    assert by_name["relationships"].budget_tokens > int(1096 * 0.1 / 1.0)
    assert envelope.used_tokens <= envelope.total_budget
