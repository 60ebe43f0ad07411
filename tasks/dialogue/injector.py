"""Injector slot: the `injection_packet` for the front end's next prompt, within a token budget.

The retrieval is laid out in the context envelope's sections (tasks.context, spec 004):
who is involved (bios), how they relate, the milestones so far, and recalled earlier turns;
the envelope's proportional budgeting drops what does not fit, lowest priority last.
"""

from __future__ import annotations

from core.settings import ContextBudget
from tasks.context import build_envelope
from tasks.dialogue.parts import InjectionPacket, InjectionSection
from tasks.dialogue.retriever import RecalledTurn, Retrieval

# Dialogue memory has no lore or guidance: their shares go to the other sections.
INJECTION_SHARES = ContextBudget(
    characters=0.30, relationships=0.20, summaries=0.15, history=0.35, lore=0.0, guidance=0.0
)


def _entity_line(name: str, kind: str, bio: str, traits: list[str]) -> str:
    line = f"{name} ({kind})"
    if bio:
        line += f": {bio}"
    if traits:
        line += "; traits: " + ", ".join(traits)
    return line


def _passage(turn: RecalledTurn) -> str:
    header = ", ".join([f"turn {turn.turn_id}"] + ([turn.when] if turn.when else []))
    if turn.event_dates:
        header += "; " + "; ".join(turn.event_dates)
    return f"[{header}] {turn.text}"


def build_packet(retrieval: Retrieval, token_budget: int) -> InjectionPacket:
    # Entities named now first, then the ones the selected relations bring in.
    focus = {e.entity_id: e for e in retrieval.mentioned}
    by_id = {e.entity_id: e for e in retrieval.known_entities}
    for rel in retrieval.relations:
        for eid in (rel.source_id, rel.target_id):
            if eid in by_id and eid not in focus:
                focus[eid] = by_id[eid]
    characters = [_entity_line(e.name, e.kind, e.bio_summary, e.bio_traits) for e in focus.values()]
    relationships = [
        f"{r.source_name} -{r.type}-> {r.target_name} (strength {r.weight:.2f})"
        for r in retrieval.relations
    ]
    summaries = [
        f"turn {m.turn_id}: {m.text}" for m in sorted(retrieval.milestones, key=lambda m: m.seq)
    ]
    # The session time goes with the passage: "yesterday" in a turn only means something
    # next to the date it was said (temporal questions are a third of long-chat recall). The
    # dates it resolves to are spelled out too: a chat model is poor at calendar arithmetic.
    history = [_passage(t) for t in retrieval.recalled]
    if history and retrieval.asked_dates:
        # The message's own "yesterday", dated the same way, so the passages of that day are
        # found by their date without calendar arithmetic.
        history.insert(0, "In the message answered now: " + "; ".join(retrieval.asked_dates))
    envelope = build_envelope(
        {
            "characters": characters,
            "relationships": relationships,
            "summaries": summaries,
            "history": history,
        },
        INJECTION_SHARES,
        context_window=token_budget,
        reserved_tokens=0,
    )
    return InjectionPacket(
        text=envelope.text,
        token_budget=envelope.total_budget,
        used_tokens=envelope.used_tokens,
        sections=[
            InjectionSection(
                name=s.name,
                budget_tokens=s.budget_tokens,
                used_tokens=s.used_tokens,
                items_in=s.items_in,
                items_kept=s.items_kept,
            )
            for s in envelope.sections
        ],
        entity_ids=list(focus),
        relation_ids=[r.rel_id for r in retrieval.relations],
        recalled_turns=[t.turn_id for t in retrieval.recalled],
    )
