"""The context envelope (spec 004): per-section token budgets for a drafting prompt.

Each section gets a share of the tier's context window. The shares of empty sections are
reallocated to the others in proportion to their own shares, and so is what a section does
not need of its share: sections that fit keep what they need, and the rest of the budget is
shared out again, in proportion to the shares, among the sections that do not (until every
section fits or none of the rest does). So nothing is wasted, and a section only loses items
when the whole prompt is full. Sections are lists of items in priority order; items are kept
whole while they fit, and the last one that does not fit is cut at a word boundary. Every
section that loses items says so in its report (`cut`), which the caller logs.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from core.settings import ContextBudget

SECTION_ORDER: tuple[str, ...] = (
    "guidance",
    "characters",
    "relationships",
    "lore",
    "summaries",
    "history",
)
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
    needed_tokens: int = 0

    @property
    def cut(self) -> str:
        """What the section lost and why ("" when it lost nothing)."""
        if not self.truncated and self.items_kept == self.items_in:
            return ""
        lost = self.items_in - self.items_kept
        what = f"{lost} of {self.items_in} items left out" if lost else "the last item shortened"
        if lost and self.truncated and self.items_kept:
            what += ", the last kept one shortened"
        return (
            f"{self.name}: {what} (it needed {self.needed_tokens} tokens, its budget was {self.budget_tokens} "
            "after reallocation; items are in priority order, the last ones go)"
        )


class ContextEnvelope(BaseModel):
    text: str
    total_budget: int
    used_tokens: int
    sections: list[SectionReport] = Field(default_factory=list)


def allocate(
    shares: dict[str, float],
    present: set[str],
    total_tokens: int,
    needs: dict[str, int] | None = None,
) -> dict[str, int]:
    """Token budget per present section: absent sections' shares reallocated proportionally,
    and, given `needs` (tokens each section would take whole), what a section does not need
    shared out again among the ones that need more, in proportion to their shares."""
    live = {name: share for name, share in shares.items() if name in present and share > 0}
    if not live:
        return {}
    configured_total = sum(shares.values())
    if needs is None:
        # Scale present sections up so together they use what all sections were given.
        scale = configured_total / sum(live.values())
        return {name: int(total_tokens * share * scale) for name, share in live.items()}
    budget = total_tokens * min(1.0, configured_total)
    budgets: dict[str, int] = {}
    open_shares = dict(live)
    while open_shares:
        scale = budget / sum(open_shares.values())
        fitting = {
            name for name, share in open_shares.items() if needs.get(name, 0) <= share * scale
        }
        if not fitting:
            budgets.update({name: int(share * scale) for name, share in open_shares.items()})
            break
        for name in sorted(fitting):
            budgets[name] = needs.get(name, 0)
            budget -= budgets[name]
            del open_shares[name]
    return {name: budgets[name] for name in live}


def _section_need(name: str, items: list[str]) -> int:
    return (
        estimate_tokens(SECTION_TITLES[name]) + 1 + sum(estimate_tokens(item) + 1 for item in items)
    )


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
    needs = {
        name: _section_need(name, [i.strip() for i in sections[name] if i.strip()])
        for name in present
    }
    budgets = allocate(budget.model_dump(), present, total, needs)
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
                name=name,
                share=getattr(budget, name),
                budget_tokens=limit,
                used_tokens=used if kept else 0,
                items_in=len(items),
                items_kept=len(kept),
                truncated=truncated,
                needed_tokens=needs[name],
            )
        )
    return ContextEnvelope(
        text="\n\n".join(parts), total_budget=total, used_tokens=used_total, sections=reports
    )
