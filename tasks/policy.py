"""How pipeline tasks cache, retry and are timed.

Cached stages are cached on disk, with results persisted as JSON under `<project>/.saga/`,
so a re-run after a crash repeats no finished call. The key is Prefect's own composition of
cache policies:

    (INPUTS - "services") + TASK_SOURCE [+ CacheKeyFnPolicy(ModelFingerprint(tier))]

- the inputs, but for the `services` parameter (tasks/services.py: the ports a stage calls,
  whose identity differs between processes and says nothing about the answer);
- the task's source;
- for a stage that asks a model (`llm_task`, `embedding_task`), the fingerprint of the
  models of its tier (`LanguageModel.model_fingerprint`, core/ports.py), read from the
  `services` parameter: another model or temperature makes another key, while two runs with
  equal settings (a run and its resume) make the same one;
- for a stage that reads the graph "as of chapter N - 1" (`graph_read_task`), the history of
  that graph (`GraphReader.history_fingerprint(N)`, kg.commit.history: every change-set
  committed before chapter N, healing's amendments included), read when the stage is called:
  a replayed chapter gets what it got the first time, whatever was committed or healed
  after it, and a chapter written on another graph gets a new answer.

Only transient failures (core.errors.classify) are retried at the task level; the gateway has already retried
within its own budget by then.

Every task made here is a stage of the process's ledger (core.stages): its body's CPU and
wall time are booked under the task's name, so a new task shows up in a run's time split
by itself. The timing wrapper keeps the function's source for Prefect (`inspect.getsource`
follows `__wrapped__`), so cache keys do not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE, CacheKeyFnPolicy, CachePolicy
from prefect.context import TaskRunContext

from core.errors import classify
from core.stages import stage

F = TypeVar("F", bound=Callable[..., Any])

#: The parameter that carries a stage's ports (tasks/services.py); never hashed.
SERVICES = "services"
CACHE_BY_INPUTS_AND_SOURCE = (INPUTS - SERVICES) + TASK_SOURCE


@dataclass(frozen=True)
class ModelFingerprint:
    """A Prefect `cache_key_fn`: the fingerprint of the models a stage asks, read from its
    `services` parameter. `tier` None: the embedding model."""

    tier: str | None

    def __call__(self, context: TaskRunContext | None, inputs: dict[str, Any]) -> str:
        llm = _services(inputs).llm
        if self.tier is None:
            return llm.embedding_fingerprint()
        return llm.model_fingerprint(self.tier)


@dataclass(frozen=True)
class GraphHistory:
    """A Prefect `cache_key_fn`: the history of the graph as of the chapter before the one in
    the stage's input named `chapter`, read through its `services` parameter."""

    chapter: str

    def __call__(self, context: TaskRunContext | None, inputs: dict[str, Any]) -> str:
        return _services(inputs).graph_reader.history_fingerprint(int(inputs[self.chapter]))


def _services(inputs: dict[str, Any]) -> Any:
    services = inputs.get(SERVICES)
    if services is None:
        raise TypeError(
            f"this task's cache key needs its {SERVICES!r} parameter (tasks/services.py)"
        )
    return services


def model_cache_policy(tier: str | None) -> CachePolicy:
    """Inputs but `services`, the source, and the fingerprint of `tier`'s models."""
    return CACHE_BY_INPUTS_AND_SOURCE + CacheKeyFnPolicy(cache_key_fn=ModelFingerprint(tier))


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


def llm_task(name: str, tier: str, **options: Any) -> Callable[[F], F]:
    """A cached stage that asks the models of `tier`: their fingerprint is in its key."""
    return cached_task(name, cache_policy=model_cache_policy(tier), **options)


def embedding_task(name: str, **options: Any) -> Callable[[F], F]:
    """A cached stage that embeds: the embedding model's fingerprint is in its key."""
    return cached_task(name, cache_policy=model_cache_policy(None), **options)


def graph_read_task(name: str, chapter: str, **options: Any) -> Callable[[F], F]:
    """A cached stage that reads the graph as of the chapter before its input `chapter`:
    the history of that graph is in its key."""
    policy = CACHE_BY_INPUTS_AND_SOURCE + CacheKeyFnPolicy(cache_key_fn=GraphHistory(chapter))
    return cached_task(name, cache_policy=policy, **options)


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
