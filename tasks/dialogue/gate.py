"""The commit gate (spec 000 section 3): a prepared turn is written only when it carries at
least one relation action and the judge reports no identity conflict.

An identity conflict counts only with evidence on both sides (what the graph binds the name
to, and the words of this turn that bind it elsewhere): the judge builds them so, and a
conflict without evidence is not one. A turn held back only because it has no relation
action is `nothing_new`: its text is remembered (episodic memory), nothing failed.
"""

from __future__ import annotations

from tasks.dialogue.extractor import ExtractionPlan
from tasks.dialogue.parts import GateDecision, JudgeSummary


def commit_gate(
    plan: ExtractionPlan, verdict: JudgeSummary, *, require_actions: bool = True
) -> GateDecision:
    reasons: list[str] = []
    no_actions = require_actions and not plan.actions
    if no_actions:
        reasons.append("no relation actions")
    conflicts = [c for c in verdict.identity_conflicts if c.has_evidence]
    if conflicts:
        names = ", ".join(sorted({c.entity for c in conflicts}))
        reasons.append(f"identity conflicts ({names})")
    return GateDecision(
        passed=not reasons,
        reasons=reasons,
        actions=len(plan.actions),
        identity_conflicts=len(conflicts),
        nothing_new=no_actions and not conflicts,
    )
