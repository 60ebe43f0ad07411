"""How a turn ends when it does not run to COMMITTED: an idempotent replay, an idempotency
conflict, IN_PROGRESS, or ROLLED_BACK (with its trace persisted, since the graph keeps nothing
of a rolled-back turn by design). Also the turn trace's completion from the gateway's records.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from core.errors import SkaldError, classify
from core.llm import LLMGateway
from kg.dialogue import StoredTurn
from tasks.dialogue.models import ErrorKind, TurnResult, failed_kind
from tasks.dialogue.parts import TurnState, TurnTrace
from tasks.dialogue.trace import TraceRecorder

log = logging.getLogger("skald.dialogue")

#: key, conversation_id and turn_id of the call, as TurnResult names them.
Ids = dict[str, str]


class Outcomes:
    """Builds the results of turns that end early or fail, and keeps count of rolled-back ones."""

    def __init__(self, saga_dir: Path, gateway: Callable[[], LLMGateway | None]) -> None:
        self._folder = saga_dir / "runs" / "sidecar"
        self._gateway = gateway  # the service's gateway, or None while none was needed
        self._lock = threading.Lock()
        self.rolled_back_count = 0

    # ------------------------------------------------------------------ traces
    def finish_trace(self, trace: TraceRecorder, *, keep: bool = False) -> TurnTrace:
        """The turn's trace from its own call records only (taken out of the gateway by the
        turn's tag: no scan of every record since start). `keep` leaves them for a later finish."""
        gateway = self._gateway()
        if gateway is None:
            return trace.finish([])
        records = gateway.records_for(trace.tag) if keep else gateway.take_records(trace.tag)
        return trace.finish(records)

    def drop_records(self, trace: TraceRecorder) -> None:
        """Forget a call's records without a trace (a memory query keeps none)."""
        gateway = self._gateway()
        if gateway is not None:
            gateway.take_records(trace.tag)

    # ------------------------------------------------------------------ early ends
    def replay(
        self, ids: Ids, stored: StoredTurn, payload_hash: str, trace: TraceRecorder
    ) -> TurnResult:
        """The stored result of a committed turn sent again, or a conflict when its payload differs."""
        if stored.payload_hash != payload_hash:
            return self.conflict(ids)
        original = TurnResult.model_validate_json(stored.result_json)
        answered_as = stored.payload_conversation_id
        if answered_as is not None and answered_as != ids["conversation_id"]:
            original = rekeyed(original, answered_as, ids["conversation_id"])
        # Turns committed before the trace had its own property carry it inside the result.
        original_trace = (
            TurnTrace.model_validate_json(stored.trace_json)
            if stored.trace_json
            else original.trace
        )
        trace.enter(TurnState.COMMITTED)
        return original.model_copy(
            update={
                # The request's ids: a turn of a renamed conversation was first answered
                # under its old id.
                **ids,
                "idempotent_hit": True,
                "trace": trace.finish(
                    [], replay_of=original_trace.trace_id if original_trace else None
                ),
            }
        )

    @staticmethod
    def conflict(ids: Ids) -> TurnResult:
        return TurnResult.invalid(
            f"idempotency conflict: turn {ids['key']} is already committed with a different payload",
            key=ids["key"],
            kind="conflict",
        ).model_copy(update={"conversation_id": ids["conversation_id"], "turn_id": ids["turn_id"]})

    @staticmethod
    def in_progress(ids: Ids, why: str) -> TurnResult:
        return TurnResult(
            ok=False,
            state=TurnState.RECEIVED,
            code="IN_PROGRESS",
            error_kind="busy",
            reason=f"turn {ids['key']} not started: {why}",
            retryable=True,
            **ids,
        )

    # ------------------------------------------------------------------ rollbacks
    def failed(self, ids: Ids, trace: TraceRecorder, exc: Exception) -> TurnResult:
        """ROLLED_BACK by `exc`: its kind and retryability as core.errors.classify says; the
        project's own errors are their one line, anything else is logged with its traceback."""
        if isinstance(exc, SkaldError):
            reason = str(exc)
        else:
            log.exception("turn %s failed unexpectedly", ids["key"])
            reason = f"internal error: {type(exc).__name__}: {exc}"
        failure = classify(exc)
        return self.rolled_back(
            ids, trace, reason, retryable=failure.retryable, kind=failed_kind(failure)
        )

    def rolled_back(
        self, ids: Ids, trace: TraceRecorder, reason: str, *, retryable: bool, kind: ErrorKind
    ) -> TurnResult:
        base = TurnResult(ok=False, state=TurnState.ROLLED_BACK, **ids)
        return self.finish_rolled_back(base, trace, reason, retryable=retryable, kind=kind)

    def finish_rolled_back(
        self,
        base: TurnResult,
        trace: TraceRecorder,
        reason: str,
        *,
        retryable: bool,
        kind: ErrorKind,
    ) -> TurnResult:
        """`base` (what the turn got to) ended ROLLED_BACK: traced, logged and persisted."""
        failed_in = trace.state.value
        trace.enter(TurnState.ROLLED_BACK)
        log.info("turn %s rolled back in %s: %s", base.key, failed_in, reason)
        result = base.model_copy(
            update={
                "ok": False,
                "state": TurnState.ROLLED_BACK,
                "committed": False,
                "code": "ROLLED_BACK",
                "error_kind": kind,
                "reason": reason,
                "retryable": retryable,
                "timed_out": kind == "timeout",
                "actions": [],
                "trace": self.finish_trace(trace),
            }
        )
        self._persist(result)
        return result

    def _persist(self, result: TurnResult) -> None:
        """Append a rolled-back turn's result and trace to <project>/.saga/runs/sidecar/
        rolled-back-<day>.jsonl (the graph keeps nothing of such a turn by design)."""
        with self._lock:
            self.rolled_back_count += 1
            try:
                self._folder.mkdir(parents=True, exist_ok=True)
                day = datetime.now(UTC).strftime("%Y-%m-%d")
                with (self._folder / f"rolled-back-{day}.jsonl").open(
                    "a", encoding="utf-8"
                ) as handle:
                    handle.write(
                        json.dumps(result.model_dump(mode="json"), ensure_ascii=False) + "\n"
                    )
            except OSError as exc:
                log.warning(
                    "could not persist the trace of rolled-back turn %s: %s", result.key, exc
                )


def rekeyed(result: TurnResult, old: str, new: str) -> TurnResult:
    """A stored answer of a turn first committed under conversation `old`, as its conversation
    now names it: the ids made from turns' keys ("old:5#r0": relations, events, milestones, and
    the relations its packet showed) re-keyed to `new`, as the rename or copy re-keyed the
    graph's (kg.dialogue.rename); everything else as it was answered."""
    prefix = f"{old}:"

    def key(value: str) -> str:
        return f"{new}:{value[len(prefix) :]}" if value.startswith(prefix) else value

    packet = result.injection_packet
    return result.model_copy(
        update={
            "actions": [
                a.model_copy(
                    update={
                        "rel_id": a.rel_id and key(a.rel_id),
                        "event_id": a.event_id and key(a.event_id),
                    }
                )
                for a in result.actions
            ],
            "events": [key(e) for e in result.events],
            "milestones": [key(m) for m in result.milestones],
            "injection_packet": packet
            and packet.model_copy(update={"relation_ids": [key(r) for r in packet.relation_ids]}),
        }
    )
