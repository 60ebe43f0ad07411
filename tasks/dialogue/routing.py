"""Per-slot model routing for the dialogue sidecar (spec 000 section 5).

Precedence: the request's `config.models.<slot>` > `settings.slot_models[slot]` > the
slot's tier chain (with its health-ordered fallback). A named model runs on the endpoint the
tier would use for it (core.llm `model=`), so an override never needs its own URL.
The retriever and injector make no chat call (graph + vector recall, token budgeting);
their route is still resolved and traced so a front end sees one table for all six slots.
An override that cannot apply (retriever, injector, or the actor of a recorded turn) is
refused by the request's own model (tasks.dialogue.models), so the API's schema states it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from core.settings import SLOT_NAMES, Settings

#: The tier each slot runs on when nothing names a model.
SLOT_TIERS: dict[str, str] = {
    "retriever": "small",
    "injector": "small",
    "actor": "narrative",
    "extractor": "small",
    "judge": "small",
    "historian": "small",
}
#: Slots whose work is a chat completion (the others only embed or compute).
LLM_SLOTS: frozenset[str] = frozenset({"actor", "extractor", "judge", "historian"})


class Route(BaseModel):
    slot: str
    tier: str
    model: str | None = None
    source: Literal["request", "settings", "tier", "none"] = "tier"


def resolve_routes(settings: Settings, overrides: dict[str, str] | None = None) -> dict[str, Route]:
    """The route of every slot for one turn."""
    overrides = overrides or {}
    routes: dict[str, Route] = {}
    for slot in SLOT_NAMES:
        tier = SLOT_TIERS[slot]
        if slot in overrides:
            routes[slot] = Route(slot=slot, tier=tier, model=overrides[slot], source="request")
        elif settings.slot_models.get(slot):
            routes[slot] = Route(
                slot=slot, tier=tier, model=settings.slot_models[slot], source="settings"
            )
        elif slot in LLM_SLOTS:
            routes[slot] = Route(slot=slot, tier=tier)
        else:
            routes[slot] = Route(slot=slot, tier=tier, source="none")
    return routes
