"""Historian slot: the events a turn reports, and which of them are milestones.

Events are kept on the turn's record (recall text); milestones become KGMilestone nodes and
reach later prompts through the injection packet. Milestone entities are linked by id only
when they resolve to an entity of the conversation or of this turn.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.grounding import SourceText
from core.llm import LLMGateway
from core.sentences import clip_to_sentence
from kg import vocabulary as vocab
from kg.dialogue import MilestoneWrite
from prompts import render_messages
from prompts.dialogue.models import HistorianReport
from tasks.dialogue.extractor import ExtractionPlan
from tasks.dialogue.models import ChatMessage
from tasks.dialogue.retriever import Retrieval, turn_text
from tasks.dialogue.routing import Route

MAX_TEXT = 400


class Chronicle(BaseModel):
    events: list[str] = Field(default_factory=list)
    milestones: list[MilestoneWrite] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list, description="milestones refused, with why")


def chronicle_from(
    report: HistorianReport, retrieval: Retrieval, plan: ExtractionPlan, text: str
) -> Chronicle:
    """Normalise the model's report (pure: dedupe, trim, resolve milestone entities); a
    milestone whose quote is not in the turn's messages (`text`) is refused."""
    source = SourceText(text)
    ids: dict[str, str] = {}
    for entity in retrieval.known_entities:
        for name in (entity.name, *entity.aliases):
            ids.setdefault(vocab.name_key(name), entity.entity_id)
    for write in plan.entities:
        for name in (write.name, *write.aliases):
            ids.setdefault(vocab.name_key(name), write.entity_id)
    events: list[str] = []
    for event in report.events:
        line = clip_to_sentence(" ".join(event.split()), MAX_TEXT)
        if line and line not in events:
            events.append(line)
    milestones: list[MilestoneWrite] = []
    dropped: list[str] = []
    seen: set[str] = set()
    for item in report.milestones:
        line = clip_to_sentence(" ".join(item.text.split()), MAX_TEXT)
        if not line or line in seen:
            continue
        problem = source.quote_problem(item.quote)
        if problem is not None:
            dropped.append(f"milestone {line[:80]!r}: {problem}")
            continue
        seen.add(line)
        linked = [ids[k] for k in (vocab.name_key(n) for n in item.entities) if k in ids]
        milestones.append(
            MilestoneWrite(
                text=line,
                importance=item.importance,
                entity_ids=list(dict.fromkeys(linked)),
                quote=" ".join(item.quote.split()),
            )
        )
    return Chronicle(events=events, milestones=milestones, dropped=dropped)


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
        milestones=[
            f"turn {m.turn_id}: {m.text}" for m in sorted(retrieval.milestones, key=lambda m: m.seq)
        ],
        turn_lines=[m.line() for m in messages],
        changes=[line for line in proposal if line != "(none)"],
    )
    report = gateway.structured(
        route.tier, prompt, HistorianReport, purpose=purpose, model=route.model
    )
    return chronicle_from(report, retrieval, raw_plan, turn_text(messages))
