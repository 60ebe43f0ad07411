"""Per-turn trace: timestamped state transitions, per-slot latency, tokens from the gateway.

LLM calls of concurrent turns share one gateway, so each call's `purpose` carries the
turn's trace id (`dialogue.<slot>|<trace_id>`) and the trace picks its own records back out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from core.llm import CallRecord
from tasks.dialogue.parts import SlotTrace, StateStamp, TurnState, TurnTrace
from tasks.dialogue.routing import Route

PURPOSE_PREFIX = "dialogue."
#: Refused facts listed in a trace (all are counted).
MAX_DROPPED_LISTED = 20


class TraceRecorder:
    def __init__(self, key: str | None, attempt: str = "commit") -> None:
        self.trace_id = uuid.uuid4().hex[:16]
        self.key = key
        self.attempt = attempt
        self._t0 = time.perf_counter()
        self._states: list[StateStamp] = []
        self._slots: dict[str, SlotTrace] = {}
        self._dropped: list[str] = []
        self.state = TurnState.RECEIVED
        self.enter(TurnState.RECEIVED)

    def enter(self, state: TurnState) -> None:
        self.state = state
        self._states.append(
            StateStamp(state=state, at=datetime.now(UTC), elapsed_ms=self.elapsed_ms())
        )

    def dropped(self, reasons: Iterable[str]) -> None:
        """Facts grounding refused (the extractor's and the historian's), each with why."""
        self._dropped.extend(reasons)

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self._t0) * 1000.0, 3)

    @property
    def tag(self) -> str:
        """What the gateway indexes this turn's call records by (after "|" in the purpose)."""
        return self.trace_id

    def purpose(self, slot: str) -> str:
        return f"{PURPOSE_PREFIX}{slot}|{self.trace_id}"

    @contextmanager
    def slot(self, route: Route) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._slots[route.slot] = SlotTrace(
                slot=route.slot,
                tier=route.tier,
                model=route.model,
                route=route.source,
                latency_ms=round((time.perf_counter() - started) * 1000.0, 3),
            )

    def finish(self, records: Iterable[CallRecord], replay_of: str | None = None) -> TurnTrace:
        suffix = f"|{self.trace_id}"
        # Copies: a trace may be finished more than once (stored result, then the reply).
        slots = {name: trace.model_copy() for name, trace in self._slots.items()}
        calls = prompt = completion = 0
        spans: list[tuple[float, float]] = []
        for record in records:
            if not record.purpose.endswith(suffix):
                continue
            slot = record.purpose[len(PURPOSE_PREFIX) : -len(suffix)]
            end = record.ts.timestamp() * 1000.0
            spans.append((end - record.latency_ms, end))
            calls += 1
            prompt += record.prompt_tokens
            completion += record.completion_tokens
            trace = slots.get(slot)
            if trace is not None:
                trace.llm_calls += 1
                trace.llm_ms = round(trace.llm_ms + record.latency_ms, 3)
                trace.prompt_tokens += record.prompt_tokens
                trace.completion_tokens += record.completion_tokens
                if trace.model is None and record.model:
                    trace.model = record.model
        # Slots run concurrently (judge and historian, the commit embedding during the
        # extractor): the turn's LLM time is the wall time with at least one call in flight.
        llm_ms = 0.0
        covered_to = float("-inf")
        for start, end in sorted(spans):
            if end > covered_to:
                llm_ms += end - max(start, covered_to)
                covered_to = end
        total = self.elapsed_ms()
        return TurnTrace(
            trace_id=self.trace_id,
            key=self.key,
            attempt=self.attempt,  # type: ignore[arg-type]
            states=list(self._states),
            slots=list(slots.values()),
            total_ms=total,
            llm_ms=round(llm_ms, 3),
            overhead_ms=round(max(0.0, total - llm_ms), 3),
            llm_calls=calls,
            prompt_tokens=prompt,
            completion_tokens=completion,
            replay_of=replay_of,
            facts_dropped=len(self._dropped),
            dropped=self._dropped[:MAX_DROPPED_LISTED],
        )
