"""Extractor slot: entities, relation actions (EVOLVE / REPLACE / DELETE), bio patches, facts.

The model proposes (prompts/dialogue/extractor.j2 -> TurnExtraction); `plan_extraction`
grounds the proposal before anything can reach the graph:
- evidence (core.grounding, as for a novel's scenes): every entity, action and bio patch
  carries a quote that must be in the turn's messages; names must be names and be in the
  messages, or be the conversation's known entities or speakers that the messages refer to;
  an action's ends must be entities of the turn, known ones, or names its quote gives;
- names resolve to the conversation's known entities by normalised name or alias, relation
  types are normalised into the kg vocabulary (unknown ones become RELATES_TO with the raw
  text kept), self-loops and empty patches are dropped, and every action endpoint becomes an
  entity of the turn.
Everything refused is listed in `ExtractionPlan.dropped` with why (the turn's trace counts it).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.grounding import KnownNames, SourceText, mentions, name_problem
from core.llm import LLMGateway
from core.sentences import clip_to_sentence
from kg import vocabulary as vocab
from kg.dialogue import (
    BioPatchWrite,
    DialogueEntity,
    EntityWrite,
    RelationActionWrite,
    dialogue_entity_id,
)
from prompts import render_messages
from prompts.dialogue.models import (
    BioPatchOut,
    DialogueEntityOut,
    RelationActionOut,
    TurnExtraction,
)
from tasks.dialogue.models import ChatMessage
from tasks.dialogue.retriever import Retrieval, turn_text
from tasks.dialogue.routing import Route

WINDOW_LINES = 6
KNOWN_ENTITY_LINES = 40
MAX_FACT_CHARS = 300


class NameBinding(BaseModel):
    """A grounded proposal binding a name (and its aliases) to an entity: what the judge's
    identity rules compare with the names the graph already binds."""

    name: str
    entity_id: str
    kind: str = Field(description="the kind the proposal gives (normalised)")
    aliases: list[str] = Field(default_factory=list)
    quote: str = Field("", description="the words of the turn that state it")


class ExtractionPlan(BaseModel):
    entities: list[EntityWrite] = Field(default_factory=list)
    actions: list[RelationActionWrite] = Field(default_factory=list)
    bio_patches: list[BioPatchWrite] = Field(default_factory=list)
    facts: list[str] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list, description="proposals refused, with why")
    #: name_key -> the extracted kind, for the judge's identity rules.
    proposed_kinds: dict[str, str] = Field(default_factory=dict)
    bindings: list[NameBinding] = Field(
        default_factory=list, description="grounded entity proposals"
    )
    participants: list[str] = Field(
        default_factory=list, description="the chat's speakers (window and turn)"
    )


class _Resolver:
    """Maps names to entity ids: known entities and this turn's entities by name or alias
    first, else a new id."""

    def __init__(self, known: list[DialogueEntity]) -> None:
        self.known = {e.entity_id: e for e in known}
        self.by_key: dict[str, str] = {}
        for entity in known:
            for name in (entity.name, *entity.aliases):
                self.by_key.setdefault(vocab.name_key(name), entity.entity_id)
        self.entities: dict[str, EntityWrite] = {}

    def resolve(self, name: str, kind: str | None = None, aliases: list[str] | None = None) -> str:
        name = " ".join(name.split())
        entity_id = self.by_key.get(vocab.name_key(name)) or dialogue_entity_id(name)
        known = self.known.get(entity_id)
        label = vocab.normalize_label(kind)[0] if kind else None
        current = self.entities.get(entity_id)
        if current is None:
            current = EntityWrite(
                entity_id=entity_id,
                name=known.name if known else name,
                kind=known.kind if known else (label or vocab.FALLBACK_LABEL),
            )
            self.entities[entity_id] = current
        elif label and current.kind == vocab.FALLBACK_LABEL and not known:
            current.kind = label
        for alias in (name, *(aliases or [])):
            alias = " ".join(alias.split())
            key = vocab.name_key(alias)
            if not alias:
                continue
            # Later mentions in the same turn find this entity by any of its names.
            self.by_key.setdefault(key, entity_id)
            if key != vocab.name_key(current.name) and alias not in current.aliases:
                current.aliases.append(alias)
        return entity_id


def _clean_list(items: list[str], limit: int = 10) -> list[str]:
    out: list[str] = []
    for item in items:
        text = clip_to_sentence(" ".join(item.split()), MAX_FACT_CHARS)
        if text and text not in out:
            out.append(text)
    return out[:limit]


class TurnEvidence:
    """The turn's messages as evidence: what a fact's quote and names are checked against."""

    def __init__(self, text: str, known: list[DialogueEntity], speakers: list[str]) -> None:
        self.source = SourceText(text)
        self.known = KnownNames(
            [[e.name, *e.aliases] for e in known] + [[s] for s in speakers if s.strip()]
        )
        # The chat's participants are in every turn: "I" and "you" name them.
        self.participants = {vocab.name_key(s) for s in speakers if s.strip()}
        self.names: set[str] = set()  # name keys of the turn's grounded entities

    def name_problem(self, name: str) -> str | None:
        if vocab.name_key(name) in self.participants:
            return None
        if self.known.is_known(name):
            return (
                None
                if self.known.referred(name, self.source)
                else "a known name the messages do not mention"
            )
        return name_problem(name) or (
            None if self.source.names(name) else "name not in the messages"
        )

    def quote_problem(self, quote: str, *named: str) -> str | None:
        problem = self.source.quote_problem(quote)
        if (
            problem is None
            and named
            and not any(
                vocab.name_key(n) in self.participants or mentions(SourceText(quote), n, self.known)
                for n in named
            )
        ):
            problem = "the quote does not name it"
        return problem

    def endpoint_problem(self, name: str, quote: str) -> str | None:
        if vocab.name_key(name) in self.names | self.participants:
            return None
        problem = self.name_problem(name)
        if problem is not None or self.known.is_known(name):
            return problem
        return None if mentions(SourceText(quote), name) else "not an entity of the turn"


def plan_extraction(
    raw: TurnExtraction,
    known: list[DialogueEntity],
    text: str,
    speakers: list[str] | tuple[str, ...] = (),
) -> ExtractionPlan:
    """Ground a model's proposal in the turn's messages (`text`, with their speakers) and the
    conversation's graph (pure: no I/O). Entities first: the names they bind are evidence the
    actions and bio patches are then checked against, resolved by the same resolver."""
    resolver = _Resolver(known)
    evidence = TurnEvidence(text, known, list(speakers))
    plan = ExtractionPlan(participants=[s for s in dict.fromkeys(speakers) if s.strip()])
    for entity in raw.entities:
        _plan_entity(entity, evidence, resolver, plan)
    for action in raw.actions:
        _plan_action(action, evidence, resolver, plan)
    for patch in raw.bio_patches:
        _plan_bio_patch(patch, evidence, resolver, plan)
    plan.facts = _clean_list(raw.facts)
    plan.entities = list(resolver.entities.values())
    return plan


def _plan_entity(
    entity: DialogueEntityOut, evidence: TurnEvidence, resolver: _Resolver, plan: ExtractionPlan
) -> None:
    """Bind one proposed entity (its name, kind and aliases), or record why it was dropped."""
    if not entity.name.strip():
        return
    problem = evidence.name_problem(entity.name) or evidence.quote_problem(
        entity.quote, entity.name
    )
    if problem is not None:
        plan.dropped.append(f"entity {entity.name[:80]!r}: {problem}")
        return
    # The chat's participants are different people by definition: one participant's name is
    # never another entity's alias (a small model merging the two speakers is dropped here,
    # not reported as an identity conflict).
    own = vocab.name_key(entity.name)
    aliases = []
    for alias in entity.aliases:
        if vocab.name_key(alias) in evidence.participants and vocab.name_key(alias) != own:
            plan.dropped.append(
                f"alias {alias[:80]!r} of {entity.name[:80]!r}: another participant of the chat"
            )
        else:
            aliases.append(alias)
    evidence.names.update(vocab.name_key(n) for n in (entity.name, *aliases))
    entity_id = resolver.resolve(entity.name, entity.kind, aliases)
    kind = vocab.normalize_label(entity.kind)[0]
    plan.proposed_kinds[own] = kind
    plan.bindings.append(
        NameBinding(
            name=" ".join(entity.name.split()),
            entity_id=entity_id,
            kind=kind,
            aliases=[" ".join(a.split()) for a in aliases if a.strip()],
            quote=" ".join(entity.quote.split()),
        )
    )


def _plan_action(
    action: RelationActionOut, evidence: TurnEvidence, resolver: _Resolver, plan: ExtractionPlan
) -> None:
    """Resolve one proposed relation action's endpoints, or record why it was dropped."""
    if not action.source.strip() or not action.target.strip():
        plan.dropped.append(f"{action.action}: empty endpoint")
        return
    problem = (
        evidence.endpoint_problem(action.source, action.quote)
        or evidence.endpoint_problem(action.target, action.quote)
        or evidence.quote_problem(action.quote, action.source, action.target)
    )
    if problem is not None:
        plan.dropped.append(
            f"{action.action} {action.source[:60]} -{action.type[:40]}-> {action.target[:60]}: "
            f"{problem}"
        )
        return
    rel_type, raw_type = vocab.normalize_rel_type(action.type)
    source_hint, target_hint = vocab.endpoint_hint(rel_type)
    source = resolver.resolve(action.source, source_hint)
    target = resolver.resolve(action.target, target_hint)
    if source == target:
        plan.dropped.append(f"{action.action} {action.source} -{rel_type}-> itself")
        return
    from_type = vocab.normalize_rel_type(action.from_type)[0] if action.from_type else None
    plan.actions.append(
        RelationActionWrite(
            action=action.action,
            source_id=source,
            target_id=target,
            type=rel_type,
            raw_type=raw_type,
            from_type=from_type if action.action == "REPLACE" else None,
            weight_delta=action.weight_delta,
            weight=action.weight,
            reason=clip_to_sentence(" ".join(action.reason.split()), 300),
            quote=" ".join(action.quote.split()),
        )
    )


def _plan_bio_patch(
    patch: BioPatchOut, evidence: TurnEvidence, resolver: _Resolver, plan: ExtractionPlan
) -> None:
    """Resolve one proposed bio patch's entity, or record why it was dropped (an empty patch
    is skipped)."""
    summary = " ".join((patch.summary or "").split()) or None
    remove = _clean_list(patch.traits_remove)
    add = [t for t in _clean_list(patch.traits_add) if t not in remove]
    if summary is None and not add and not remove:
        return
    problem = evidence.endpoint_problem(patch.entity, patch.quote) or evidence.quote_problem(
        patch.quote
    )
    if problem is not None:
        plan.dropped.append(f"bio of {patch.entity[:80]!r}: {problem}")
        return
    entity_id = resolver.resolve(patch.entity, "Character")
    plan.bio_patches.append(
        BioPatchWrite(
            entity_id=entity_id,
            summary=summary,
            traits_add=add,
            traits_remove=remove,
            quote=" ".join(patch.quote.split()),
        )
    )


def extract(
    gateway: LLMGateway,
    route: Route,
    messages: list[ChatMessage],
    window: list[ChatMessage],
    retrieval: Retrieval,
    *,
    purpose: str = "",
) -> tuple[TurnExtraction, ExtractionPlan]:
    known = retrieval.mentioned + [
        e for e in retrieval.known_entities if e not in retrieval.mentioned
    ]
    prompt = render_messages(
        "dialogue/extractor",
        known_entities=[f"{e.name} ({e.kind})" for e in known[:KNOWN_ENTITY_LINES]],
        relations=[
            f"{r.source_name} -{r.type} {r.weight:.2f}-> {r.target_name}"
            for r in retrieval.relations
        ],
        window_lines=[m.line() for m in window[-WINDOW_LINES:]],
        turn_lines=[m.line() for m in messages],
    )
    raw = gateway.structured(route.tier, prompt, TurnExtraction, purpose=purpose, model=route.model)
    # The chat's participants: whoever spoke before (remembered or in the window) or now.
    speakers = list(
        dict.fromkeys([*retrieval.speakers, *(m.speaker for m in (*window, *messages))])
    )
    return raw, plan_extraction(raw, retrieval.known_entities, turn_text(messages), speakers)
