"""The context envelope (spec 004): per-section token budgets for a drafting prompt.

Each section gets a share of the tier's context window; the shares of empty sections are
reallocated to the others in proportion to their own shares, so nothing is wasted.
Sections are lists of items in priority order; items are kept whole while they fit, and
the last one that does not fit is cut at a word boundary.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from core.settings import ContextBudget

SECTION_ORDER: tuple[str, ...] = ("guidance", "characters", "relationships", "lore", "summaries", "history")
SECTION_TITLES: dict[str, str] = {
    "guidance": "Guidance",
    "characters": "Characters",
    "relationships": "Relationships",
    "lore": "Places and things",
    "summaries": "Story so far",
    "history": "Related earlier passages",
}


def estimate_tokens(text: str) -> int:
    """Cheap token estimate (~4 characters per token for English BPE vocabularies).

    Budgets only need to be right to within a few percent; real counts come back in each
    call's `usage` and are recorded by the gateway.
    """
    return math.ceil(len(text) / 4) if text else 0


class SectionReport(BaseModel):
    name: str
    share: float
    budget_tokens: int
    used_tokens: int
    items_in: int
    items_kept: int
    truncated: bool


class ContextEnvelope(BaseModel):
    text: str
    total_budget: int
    used_tokens: int
    sections: list[SectionReport] = Field(default_factory=list)


def allocate(shares: dict[str, float], present: set[str], total_tokens: int) -> dict[str, int]:
    """Token budget per present section, reallocating absent sections' shares proportionally."""
    live = {name: share for name, share in shares.items() if name in present and share > 0}
    if not live:
        return {}
    configured_total = sum(shares.values())
    live_total = sum(live.values())
    # Scale present sections up so together they use what all sections were given.
    scale = configured_total / live_total
    return {name: int(total_tokens * share * scale) for name, share in live.items()}


def _cut(text: str, max_tokens: int) -> str:
    max_chars = max_tokens * 4
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    return (cut[:space] if space > max_chars // 2 else cut).rstrip() + " …"


def build_envelope(
    sections: dict[str, list[str]],
    budget: ContextBudget,
    context_window: int,
    reserved_tokens: int,
) -> ContextEnvelope:
    """Assemble sections within `context_window - reserved_tokens` tokens.

    `reserved_tokens` covers the fixed prompt text and the completion.
    """
    total = max(0, context_window - reserved_tokens)
    present = {name for name, items in sections.items() if any(item.strip() for item in items)}
    budgets = allocate(budget.model_dump(), present, total)
    parts: list[str] = []
    reports: list[SectionReport] = []
    used_total = 0
    for name in SECTION_ORDER:
        items = [item.strip() for item in sections.get(name, []) if item.strip()]
        if name not in budgets:
            continue
        limit = budgets[name]
        kept: list[str] = []
        used = estimate_tokens(SECTION_TITLES[name]) + 1
        truncated = False
        for item in items:
            cost = estimate_tokens(item) + 1
            if used + cost <= limit:
                kept.append(item)
                used += cost
                continue
            room = limit - used - 1
            if room >= 16:  # a cut item is worth keeping only if something useful survives
                kept.append(_cut(item, room))
                used = limit
            truncated = True
            break
        if kept:
            parts.append(f"## {SECTION_TITLES[name]}\n" + "\n".join(f"- {item}" for item in kept))
            used_total += used
        reports.append(
            SectionReport(
                name=name, share=getattr(budget, name), budget_tokens=limit, used_tokens=used if kept else 0,
                items_in=len(items), items_kept=len(kept), truncated=truncated,
            )
        )
    return ContextEnvelope(text="\n\n".join(parts), total_budget=total, used_tokens=used_total, sections=reports)
