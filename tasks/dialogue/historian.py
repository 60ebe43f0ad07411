"""Historian slot: the events a turn reports, and which of them are milestones.

Events are kept on the turn's record (recall text); milestones become KGMilestone nodes and
reach later prompts through the injection packet. Milestone entities are linked by id only
when they resolve to an entity of the conversation or of this turn.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.llm import LLMGateway
from kg import vocabulary as vocab
from kg.dialogue import MilestoneWrite
from prompts import render_messages
from prompts.dialogue.models import HistorianReport
from tasks.dialogue.extractor import ExtractionPlan
from tasks.dialogue.models import ChatMessage
from tasks.dialogue.retriever import Retrieval
from tasks.dialogue.routing import Route

MAX_TEXT = 400


class Chronicle(BaseModel):
    events: list[str] = Field(default_factory=list)
    milestones: list[MilestoneWrite] = Field(default_factory=list)


def chronicle_from(report: HistorianReport, retrieval: Retrieval, plan: ExtractionPlan) -> Chronicle:
    """Normalise the model's report (pure: dedupe, trim, resolve milestone entities)."""
    ids: dict[str, str] = {}
    for entity in retrieval.known_entities:
        for name in (entity.name, *entity.aliases):
            ids.setdefault(vocab.name_key(name), entity.entity_id)
    for write in plan.entities:
        for name in (write.name, *write.aliases):
            ids.setdefault(vocab.name_key(name), write.entity_id)
    events: list[str] = []
    for event in report.events:
        text = " ".join(event.split())[:MAX_TEXT]
        if text and text not in events:
            events.append(text)
    milestones: list[MilestoneWrite] = []
    seen: set[str] = set()
    for item in report.milestones:
        text = " ".join(item.text.split())[:MAX_TEXT]
        if not text or text in seen:
            continue
        seen.add(text)
        linked = [ids[k] for k in (vocab.name_key(n) for n in item.entities) if k in ids]
        milestones.append(
            MilestoneWrite(text=text, importance=item.importance, entity_ids=list(dict.fromkeys(linked)))
        )
    return Chronicle(events=events, milestones=milestones)


def historian(
    gateway: LLMGateway,
    route: Route,
    messages: list[ChatMessage],
    retrieval: Retrieval,
    raw_plan: ExtractionPlan,
    proposal: list[str],
    *,
    purpose: str = "",
) -> Chronicle:
    session_time = next((m.time for m in reversed(messages) if m.time), None)
    prompt = render_messages(
        "dialogue/historian",
        session_time=session_time,
        milestones=[f"turn {m.turn_id}: {m.text}" for m in sorted(retrieval.milestones, key=lambda m: m.seq)],
        turn_lines=[m.line() for m in messages],
        changes=[line for line in proposal if line != "(none)"],
    )
    report = gateway.structured(route.tier, prompt, HistorianReport, purpose=purpose, model=route.model)
    return chronicle_from(report, retrieval, raw_plan)

