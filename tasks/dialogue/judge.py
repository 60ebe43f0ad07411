"""Judge slot: identity conflicts (which block the commit) and contradictions (which do not).

An identity conflict is a name bound to two different entities, shown by the graph: the
graph binds the name to one entity, and this turn's grounded proposals (tasks.dialogue.
extractor, every one with its quote) bind it to another, or call it another kind of thing.
Each conflict carries the facts of both sides (`graph_evidence`, `turn_evidence`).

Two sources, merged:
- deterministic rules over the grounded plan: a known entity proposed as another kind; an
  alias that names another known entity (it would bind that name twice);
- the model's verdict (prompts/dialogue/judge.j2), vetted: small models report the chat's own
  speakers as conflicting with each other, or conflicts about nothing the graph holds. A
  reported conflict counts only when its entity is one this turn's grounded proposals bind, the
  graph already holds that entity with facts (bio, traits or relations), and neither side is a
  participant of the chat (the front end names its speakers; two speakers are two people). A
  reported conflict between two different known entities counts only when this turn binds a
  name of one to the other, which the alias rule already finds. Everything dismissed is kept in
  `JudgeSummary.dismissed` with why.
"""

from __future__ import annotations

import re

from core.llm import LLMGateway
from kg import vocabulary as vocab
from kg.dialogue import DialogueEntity
from prompts import render_messages
from prompts.dialogue.models import IdentityConflictOut, JudgeVerdict, TurnExtraction
from tasks.dialogue.extractor import ExtractionPlan, NameBinding
from tasks.dialogue.models import ChatMessage
from tasks.dialogue.parts import Contradiction, IdentityConflict, JudgeSummary
from tasks.dialogue.retriever import Retrieval
from tasks.dialogue.routing import Route

_KIND_SUFFIX = re.compile(r"\s*\([^()]*\)\s*$")


class _Graph:
    """The conversation's known entities by name and alias, with the facts the graph shows."""

    def __init__(self, retrieval: Retrieval, participants: list[str]) -> None:
        self.retrieval = retrieval
        self.by_id = {e.entity_id: e for e in retrieval.known_entities}
        self.by_key: dict[str, DialogueEntity] = {}
        for entity in retrieval.known_entities:
            for name in (entity.name, *entity.aliases):
                self.by_key.setdefault(vocab.name_key(name), entity)
        self.participants = {vocab.name_key(p) for p in participants if p.strip()}

    def find(self, name: str) -> DialogueEntity | None:
        """The known entity a name (or "Name (Kind)") refers to."""
        return self.by_key.get(vocab.name_key(_KIND_SUFFIX.sub("", name))) or self.by_key.get(
            vocab.name_key(name)
        )

    def is_participant(self, name: str, entity: DialogueEntity | None = None) -> bool:
        names = [_KIND_SUFFIX.sub("", name)] + ([entity.name, *entity.aliases] if entity else [])
        return any(vocab.name_key(n) in self.participants for n in names if n.strip())

    def facts(self, entity: DialogueEntity) -> list[str]:
        """What the graph holds about an entity: its facts, without the bare fact that it exists."""
        out: list[str] = []
        if entity.bio_summary:
            out.append(f"bio of {entity.name}: {entity.bio_summary}")
        if entity.bio_traits:
            out.append(f"traits of {entity.name}: {', '.join(entity.bio_traits)}")
        for rel in self.retrieval.relations:
            if entity.entity_id in (rel.source_id, rel.target_id):
                line = f"{rel.source_name} -{rel.type}-> {rel.target_name}"
                out.append(line + (f' ("{rel.quote}")' if rel.quote else ""))
        return out

    def evidence(self, entity: DialogueEntity, name: str) -> list[str]:
        since = f" since turn {entity.first_turn}" if entity.first_turn else ""
        return [f"{name!r} names {entity.name} ({entity.kind}){since}", *self.facts(entity)]


def _binding_quote(binding: NameBinding) -> list[str]:
    return [binding.quote] if binding.quote else []


def rule_conflicts(plan: ExtractionPlan, retrieval: Retrieval) -> list[IdentityConflict]:
    """Names this turn's grounded proposals bind differently from the graph."""
    graph = _Graph(retrieval, plan.participants)
    conflicts: list[IdentityConflict] = []
    for binding in plan.bindings:
        known = graph.by_id.get(binding.entity_id)
        kind = binding.kind
        # A participant is whoever the chat says speaks: a proposed kind for one is not evidence.
        if (
            known
            and not graph.is_participant(binding.name, known)
            and vocab.FALLBACK_LABEL not in (kind, known.kind)
            and kind != known.kind
        ):
            conflicts.append(
                IdentityConflict(
                    entity=binding.name,
                    conflicts_with=f"{known.name} ({known.kind})",
                    reason=f"known as a {known.kind}, proposed as a {kind}",
                    source="rule",
                    name=binding.name,
                    graph_evidence=graph.evidence(known, binding.name),
                    turn_evidence=_binding_quote(binding),
                )
            )
        for alias in binding.aliases:
            other = graph.find(alias)
            if other is not None and other.entity_id != binding.entity_id:
                conflicts.append(
                    IdentityConflict(
                        entity=binding.name,
                        conflicts_with=other.name,
                        reason=f"alias {alias!r} belongs to another known entity",
                        source="rule",
                        name=alias,
                        graph_evidence=graph.evidence(other, alias),
                        turn_evidence=_binding_quote(binding),
                    )
                )
    return conflicts


def vet_reported(
    reported: list[IdentityConflictOut],
    plan: ExtractionPlan,
    retrieval: Retrieval,
    found: list[IdentityConflict],
) -> tuple[list[IdentityConflict], list[str]]:
    """The model's identity conflicts that the graph can show (with their evidence), and the
    dismissed ones, each with why."""
    graph = _Graph(retrieval, plan.participants)
    touched: dict[str, NameBinding] = {}
    for binding in plan.bindings:
        touched.setdefault(binding.entity_id, binding)
    seen = {vocab.name_key(c.entity) for c in found}
    kept: list[IdentityConflict] = []
    dismissed: list[str] = []
    for item in reported:
        label = f"{item.entity[:80]} vs {item.conflicts_with[:80] or '?'}"
        subject = graph.find(item.entity)
        other = graph.find(item.conflicts_with) if item.conflicts_with.strip() else None
        if graph.is_participant(item.entity, subject) or (
            item.conflicts_with.strip() and graph.is_participant(item.conflicts_with, other)
        ):
            dismissed.append(f"{label}: a participant of the chat (the chat names its speakers)")
        elif subject is None:
            dismissed.append(f"{label}: the graph holds no entity named {item.entity[:80]!r}")
        elif subject.entity_id not in touched:
            dismissed.append(f"{label}: this turn's grounded proposals do not bind {subject.name}")
        elif other is not None and other.entity_id != subject.entity_id:
            dismissed.append(
                f"{label}: two different known entities, and this turn binds no name of one to the other"
            )
        elif vocab.name_key(subject.name) in seen or vocab.name_key(item.entity) in seen:
            dismissed.append(f"{label}: already reported")
        elif not graph.facts(subject):
            dismissed.append(
                f"{label}: the graph holds no facts about {subject.name} to contradict"
            )
        else:
            seen.add(vocab.name_key(subject.name))
            kept.append(
                IdentityConflict(
                    entity=item.entity,
                    conflicts_with=item.conflicts_with,
                    reason=item.reason,
                    source="judge",
                    name=subject.name,
                    graph_evidence=graph.evidence(subject, subject.name),
                    turn_evidence=_binding_quote(touched[subject.entity_id]),
                )
            )
    return [c for c in kept if c.has_evidence], dismissed


def proposal_lines(raw: TurnExtraction, plan: ExtractionPlan) -> list[str]:
    names = {e.entity_id: e.name for e in plan.entities}
    lines = [
        f"entity {e.name} ({e.kind})"
        + (f", also called {', '.join(e.aliases)}" if e.aliases else "")
        for e in plan.entities
    ]
    for a in plan.actions:
        src, tgt = names.get(a.source_id, a.source_id), names.get(a.target_id, a.target_id)
        if a.action == "EVOLVE":
            lines.append(f"EVOLVE {src} -{a.type}-> {tgt} by {a.weight_delta:+.2f}")
        elif a.action == "REPLACE":
            lines.append(
                f"REPLACE {src} -{a.from_type or 'any'}-> {tgt} with {a.type} ({a.weight:.2f})"
            )
        else:
            lines.append(f"DELETE {src} -{a.type}-> {tgt}")
    for p in plan.bio_patches:
        who = names.get(p.entity_id, p.entity_id)
        if p.summary:
            lines.append(f"bio of {who}: {p.summary}")
        if p.traits_add or p.traits_remove:
            lines.append(
                f"traits of {who}: +{', '.join(p.traits_add)} -{', '.join(p.traits_remove)}"
            )
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
    verdict = gateway.structured(
        route.tier, prompt, JudgeVerdict, purpose=purpose, model=route.model
    )
    conflicts = rule_conflicts(plan, retrieval)
    reported, dismissed = vet_reported(verdict.identity_conflicts, plan, retrieval, conflicts)
    conflicts += reported
    contradictions = [
        Contradiction(statement=c.statement, contradicts=c.contradicts, severity=c.severity)
        for c in verdict.contradictions
        if c.statement.strip()
    ]
    return JudgeSummary(
        identity_conflicts=conflicts, contradictions=contradictions, dismissed=dismissed
    )
