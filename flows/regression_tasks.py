"""The Prefect tasks of a regression run (`flows.regression`), one run per dialogue: replay
(`replay-dialogue`), recall probe (`recall-probe`), whole-dialogue ingest (`ingest-dialogue`)
and its probe (`whole-dialogue-recall`).

Tasks get plain parameters; the DialogueService they share is looked up by run id, registered
for the run's length by `serving` (one service per run, closed when the run ends).
`stop_on_interrupt` tells the replays to stop at their next turn when the run is interrupted.
A graph failure under a dialogue (GraphUnavailableError) retries its task, which reconnects
and resumes from the journal; any other failure does not.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.futures import PrefectFuture, as_completed
from pydantic import BaseModel

from core.errors import GraphUnavailableError
from core.interrupt import stopping_workers_if_torn_down
from tasks.dialogue.evidence_audit import EvidenceAudit
from tasks.dialogue.ingest import ingest
from tasks.dialogue.models import TurnConfig
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.replay import (
    DialogueSpec,
    ProbeRow,
    RecallRow,
    TurnRow,
    recall_probe,
    replay,
    whole_dialogue_probe,
)

#: Task retries after the graph failed under a dialogue (its serving process exited, say):
#: the retry reconnects (to a new owner of an embedded graph) and resumes from the journal.
GRAPH_RETRIES = 2
GRAPH_RETRY_DELAY_S = 5

R = TypeVar("R")


class DialogueOutcome(BaseModel):
    rows: list[TurnRow]


def _graph_failed(task: Any, task_run: TaskRun, state: State) -> bool:
    """Retry a dialogue's task only when the graph failed under it (not for a bug or bad input)."""
    return isinstance(state.result(raise_on_failure=False), GraphUnavailableError)


#: The options of the tasks that talk to the graph turn by turn (replay, ingest, recall probes):
#: each is safe to run again (a replay resumes from its journal, an ingest skips the turns
#: already stored, a probe only reads).
_RETRIED_ON_GRAPH_FAILURE: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "persist_result": False,
    "retries": GRAPH_RETRIES,
    "retry_delay_seconds": GRAPH_RETRY_DELAY_S,
    "retry_condition_fn": _graph_failed,
}

_services: dict[str, DialogueService] = {}
_services_lock = threading.Lock()
_stops: dict[str, threading.Event] = {}


def _service(run_id: str) -> DialogueService:
    with _services_lock:
        return _services[run_id]


def _stop_event(run_id: str) -> threading.Event:
    with _services_lock:
        return _stops.setdefault(run_id, threading.Event())


@contextmanager
def serving(run_id: str, service: DialogueService) -> Iterator[DialogueService]:
    """The run's service, found by its tasks while the block runs; closed after it."""
    with _services_lock:
        _services[run_id] = service
    try:
        yield service
    finally:
        with _services_lock:
            _services.pop(run_id, None)
            _stops.pop(run_id, None)
        service.close()


def saving_calls(
    futures: list[PrefectFuture[R]], service: DialogueService, out_dir: Path
) -> list[R]:
    """The futures' results in their order, the run's LLM call log saved each time one ends:
    killed, a run loses only the calls of the dialogues in flight (a resumed run writes its own
    file beside them). A dialogue that failed fails the run as soon as it ends."""
    for future in as_completed(futures):
        service.gateway.save_records(out_dir)
        future.result()
    return [future.result() for future in futures]


@contextmanager
def stop_on_interrupt(run_id: str) -> Iterator[None]:
    """On SIGTERM (Prefect's TerminationSignal) or Ctrl-C, tell the run's dialogues to stop at
    their next turn: entered inside the task runner, so this runs before the runner's exit
    waits for its threads, and the dialogues do not run on."""
    try:
        with stopping_workers_if_torn_down():  # and the turns in flight stop at their next call
            yield
    except BaseException:
        _stop_event(run_id).set()
        raise


@task(
    name="replay-dialogue",
    task_run_name="replay-{conversation_id}",
    **_RETRIED_ON_GRAPH_FAILURE,
)
def replay_dialogue_task(
    run_id: str,
    spec: DialogueSpec,
    conversation_id: str,
    window: int,
    turn_config: TurnConfig,
    journal: str | None = None,
) -> DialogueOutcome:
    rows = replay(
        _service(run_id),
        spec,
        conversation_id,
        run_id,
        window=window,
        config=turn_config,
        journal=Path(journal) if journal else None,
        stop=_stop_event(run_id),
    )
    committed = sum(r.committed for r in rows)
    get_run_logger().info("%s: %d/%d turns committed", conversation_id, committed, len(rows))
    return DialogueOutcome(rows=rows)


@task(
    name="recall-probe",
    task_run_name="recall-{conversation_id}",
    **_RETRIED_ON_GRAPH_FAILURE,
)
def recall_probe_task(
    run_id: str, spec: DialogueSpec, conversation_id: str, k: int, committed_refs: list[str]
) -> list[RecallRow]:
    return recall_probe(
        _service(run_id), spec, conversation_id, run_id, k=k, committed_refs=set(committed_refs)
    )


@task(
    name="ingest-dialogue",
    task_run_name="ingest-{conversation_id}",
    **_RETRIED_ON_GRAPH_FAILURE,
)
def ingest_dialogue_task(
    run_id: str, spec: DialogueSpec, conversation_id: str, extract: bool
) -> dict[str, Any]:
    report = ingest(_service(run_id), [(spec, conversation_id)], extract=extract)[0]
    get_run_logger().info(
        "%s: %d turns (%d added, %d already there), %.3g turns/s",
        conversation_id,
        report.turns,
        report.added,
        report.already,
        report.turns_per_s,
    )
    return report.model_dump(mode="json")


@task(
    name="whole-dialogue-recall",
    task_run_name="recall-{conversation_id}",
    **_RETRIED_ON_GRAPH_FAILURE,
)
def whole_dialogue_probe_task(
    run_id: str,
    spec: DialogueSpec,
    conversation_id: str,
    audit: EvidenceAudit | None = None,
) -> tuple[list[ProbeRow], dict[str, int]]:
    return whole_dialogue_probe(_service(run_id), spec, conversation_id, run_id, audit)
