"""How pipeline tasks cache, retry and are timed.

LLM stages are cached on disk keyed by their inputs and their source code (Prefect
INPUTS + TASK_SOURCE), with results persisted as JSON under `<project>/.saga/`, so a
re-run after a crash repeats no finished call. Only transient failures (core.errors.classify)
are retried at the task level; the gateway has already retried within its own budget by then.

Every task made here is a stage of the process's ledger (core.stages): its body's CPU and
wall time are booked under the task's name, so a new task shows up in a run's time split
by itself. The timing wrapper keeps the function's source for Prefect (`inspect.getsource`
follows `__wrapped__`), so cache keys do not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE

from core.errors import classify
from core.stages import stage

F = TypeVar("F", bound=Callable[..., Any])

CACHE_BY_INPUTS_AND_SOURCE = INPUTS + TASK_SOURCE


def retry_transient_only(task_obj: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry_condition_fn: retry only failures that pass by themselves (core.errors.
    classify's `transient`: an LLM or graph that did not answer, a timeout, a lost connection)."""
    try:
        state.result()
    except Exception as exc:
        return classify(exc).transient
    except BaseException:
        return False  # cancelled or interrupted: not a failure to retry
    return False


def timed(name: str) -> Callable[[F], F]:
    """The function, booked as stage `name` of the process's ledger while it runs."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with stage(name):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap


def _timed_task(name: str, settings: dict[str, Any]) -> Callable[[F], F]:
    def make(fn: F) -> F:
        return task(name=name, **settings)(timed(name)(fn))  # type: ignore[return-value]

    return make


def cached_task(name: str, **options: Any) -> Callable[[F], F]:
    """A stage whose result is cached by inputs + source and persisted as JSON."""
    settings: dict[str, Any] = {
        "cache_policy": CACHE_BY_INPUTS_AND_SOURCE,
        "persist_result": True,
        "result_serializer": "json",
        "retries": 2,
        "retry_delay_seconds": [2, 10],
        "retry_condition_fn": retry_transient_only,
    }
    return _timed_task(name, settings | options)


def graph_task(name: str, **options: Any) -> Callable[[F], F]:
    """A stage that reads or writes the graph: never cached (it must look at the graph
    itself), retried only on transient errors; writes are idempotent."""
    settings: dict[str, Any] = {
        "cache_policy": NO_CACHE,
        "persist_result": False,
        "retries": 2,
        "retry_delay_seconds": [2, 10],
        "retry_condition_fn": retry_transient_only,
    }
    return _timed_task(name, settings | options)


def plain_task(name: str, **options: Any) -> Callable[[F], F]:
    """A stage that is neither cached nor retried (pure work on artifacts, file writes)."""
    return _timed_task(name, {"cache_policy": NO_CACHE, "persist_result": False} | options)
