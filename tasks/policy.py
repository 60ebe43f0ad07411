"""How pipeline tasks cache and retry.

LLM stages are cached on disk keyed by their inputs and their source code (Prefect
INPUTS + TASK_SOURCE), with results persisted as JSON under `<project>/.saga/`, so a
re-run after a crash repeats no finished call. Only transient failures are retried at
the task level; the gateway has already retried within its own budget by then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE

from core.errors import GraphUnavailableError, LLMUnavailableError

F = TypeVar("F", bound=Callable[..., Any])

CACHE_BY_INPUTS_AND_SOURCE = INPUTS + TASK_SOURCE
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (LLMUnavailableError, GraphUnavailableError, ConnectionError, TimeoutError)


def retry_transient_only(task_obj: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry_condition_fn: retry only errors that a later attempt can fix."""
    try:
        state.result()
    except TRANSIENT_ERRORS:
        return True
    except BaseException:
        return False
    return False


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
    return task(name=name, **(settings | options))  # type: ignore[return-value]


def graph_task(name: str, **options: Any) -> Callable[[F], F]:
    """A stage that reads or writes the graph: never cached (it must look at the graph
    itself), retried only on transient errors; writes are idempotent."""
    return task(  # type: ignore[return-value]
        name=name,
        cache_policy=NO_CACHE,
        persist_result=False,
        retries=2,
        retry_delay_seconds=[2, 10],
        retry_condition_fn=retry_transient_only,
        **options,
    )
