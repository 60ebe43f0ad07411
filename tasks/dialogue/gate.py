"""The commit gate (spec 000 section 3): a prepared turn is written only when it carries at
least one relation action and the judge reports no identity conflict."""

from __future__ import annotations

from tasks.dialogue.extractor import ExtractionPlan
from tasks.dialogue.models import GateDecision, JudgeSummary


def commit_gate(plan: ExtractionPlan, verdict: JudgeSummary, *, require_actions: bool = True) -> GateDecision:
    reasons: list[str] = []
    if require_actions and not plan.actions:
        reasons.append("no relation actions")
    if verdict.identity_conflicts:
        names = ", ".join(sorted({c.entity for c in verdict.identity_conflicts}))
        reasons.append(f"identity conflicts ({names})")
    return GateDecision(
        passed=not reasons,
        reasons=reasons,
        actions=len(plan.actions),
        identity_conflicts=len(verdict.identity_conflicts),
    )
