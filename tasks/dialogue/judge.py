"""Judge slot: identity conflicts (which block the commit) and contradictions (which do not).

Two sources, merged: deterministic rules over the grounded extraction (a known entity
proposed as another kind; an alias that would merge two known entities), and the model's
verdict (prompts/dialogue/judge.j2). A model-reported identity conflict counts only when it
names an entity this turn actually touches: small models invent conflicts, and an invented
one would block the turn for nothing.
"""

from __future__ import annotations

from core.llm import LLMGateway
from kg import vocabulary as vocab
from prompts import render_messages
from prompts.dialogue.models import JudgeVerdict, TurnExtraction
from tasks.dialogue.extractor import ExtractionPlan
from tasks.dialogue.models import ChatMessage, Contradiction, IdentityConflict, JudgeSummary
from tasks.dialogue.retriever import Retrieval
from tasks.dialogue.routing import Route


def rule_conflicts(raw: TurnExtraction, retrieval: Retrieval) -> list[IdentityConflict]:
    by_key = {}
    for entity in retrieval.known_entities:
        for name in (entity.name, *entity.aliases):
            by_key.setdefault(vocab.name_key(name), entity)
    conflicts: list[IdentityConflict] = []
    for proposed in raw.entities:
        known = by_key.get(vocab.name_key(proposed.name))
        kind = vocab.normalize_label(proposed.kind)[0]
        if known and vocab.FALLBACK_LABEL not in (kind, known.kind) and kind != known.kind:
            conflicts.append(
                IdentityConflict(
                    entity=proposed.name,
                    conflicts_with=f"{known.name} ({known.kind})",
                    reason=f"known as a {known.kind}, proposed as a {kind}",
                    source="rule",
                )
            )
        for alias in proposed.aliases:
            other = by_key.get(vocab.name_key(alias))
            if known and other and other.entity_id != known.entity_id:
                conflicts.append(
                    IdentityConflict(
                        entity=proposed.name,
                        conflicts_with=other.name,
                        reason=f"alias {alias!r} belongs to another known entity",
                        source="rule",
                    )
                )
    return conflicts


def _touched_keys(raw: TurnExtraction) -> set[str]:
    names = [e.name for e in raw.entities] + [a for e in raw.entities for a in e.aliases]
    names += [x for a in raw.actions for x in (a.source, a.target)]
    names += [p.entity for p in raw.bio_patches]
    return {vocab.name_key(n) for n in names if n.strip()}


def proposal_lines(raw: TurnExtraction, plan: ExtractionPlan) -> list[str]:
    names = {e.entity_id: e.name for e in plan.entities}
    lines = [f"entity {e.name} ({e.kind})" + (f", also called {', '.join(e.aliases)}" if e.aliases else "")
             for e in plan.entities]
    for a in plan.actions:
        src, tgt = names.get(a.source_id, a.source_id), names.get(a.target_id, a.target_id)
        if a.action == "EVOLVE":
            lines.append(f"EVOLVE {src} -{a.type}-> {tgt} by {a.weight_delta:+.2f}")
        elif a.action == "REPLACE":
            lines.append(f"REPLACE {src} -{a.from_type or 'any'}-> {tgt} with {a.type} ({a.weight:.2f})")
        else:
            lines.append(f"DELETE {src} -{a.type}-> {tgt}")
    for p in plan.bio_patches:
        who = names.get(p.entity_id, p.entity_id)
        if p.summary:
            lines.append(f"bio of {who}: {p.summary}")
        if p.traits_add or p.traits_remove:
            lines.append(f"traits of {who}: +{', '.join(p.traits_add)} -{', '.join(p.traits_remove)}")
    return lines or ["(none)"]


def judge(
    gateway: LLMGateway,
    route: Route,
    messages: list[ChatMessage],
    retrieval: Retrieval,
    raw: TurnExtraction,
    plan: ExtractionPlan,
    *,
    purpose: str = "",
) -> JudgeSummary:
    prompt = render_messages(
        "dialogue/judge",
        known_entities=[
            f"{e.name} ({e.kind})" + (f": {e.bio_summary}" if e.bio_summary else "")
            for e in retrieval.mentioned or retrieval.known_entities[:20]
        ],
        relations=[f"{r.source_name} -{r.type}-> {r.target_name}" for r in retrieval.relations],
        turn_lines=[m.line() for m in messages],
        proposals=proposal_lines(raw, plan),
    )
    verdict = gateway.structured(route.tier, prompt, JudgeVerdict, purpose=purpose, model=route.model)
    touched = _touched_keys(raw)
    conflicts = rule_conflicts(raw, retrieval)
    seen = {(vocab.name_key(c.entity), vocab.name_key(c.conflicts_with)) for c in conflicts}
    for item in verdict.identity_conflicts:
        key = (vocab.name_key(item.entity), vocab.name_key(item.conflicts_with))
        if key[0] in touched and key not in seen:
            seen.add(key)
            conflicts.append(
                IdentityConflict(
                    entity=item.entity, conflicts_with=item.conflicts_with, reason=item.reason, source="judge"
                )
            )
    contradictions = [
        Contradiction(statement=c.statement, contradicts=c.contradicts, severity=c.severity)
        for c in verdict.contradictions
        if c.statement.strip()
    ]
    return JudgeSummary(identity_conflicts=conflicts, contradictions=contradictions)
