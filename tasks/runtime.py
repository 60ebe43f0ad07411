"""The services a run needs (settings, LLM gateway, content store, graph), built once.

This is the composition root of a run: the one place that wires core's services (LLM
gateway, content store) to kg's graph store, so it sits above both, in the tasks layer
that uses it; the flows (the entry points) build it with `set_runtime(Runtime(settings))`
and take its `services()` (tasks/services.py), which they pass to every stage as the
`services` parameter. No stage calls `runtime()`: a stage sees only the ports
(core/ports.py, kg/ports.py), so it runs as well over a test's fakes.

`Runtime` is the run's `LanguageModel` (core/ports.py): it hands calls to the gateway,
built on first use (a run that asks no model starts none), and it knows the fingerprint
of what decides a tier's answers, which the cached stages put into their cache keys
(tasks/policy.py). The fingerprint is made of settings only, so equal settings in two
processes give equal keys: a resumed run finds the first run's answers.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.content import ContentStore
from core.llm import LLMGateway
from core.ports import M, Message
from core.settings import Settings, load_settings
from kg.store import GraphStore
from tasks.services import Services


@dataclass
class Runtime:
    settings: Settings
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _gateway: LLMGateway | None = None
    _graph: GraphStore | None = None
    _content: ContentStore | None = None
    _services: Services | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def content(self) -> ContentStore:
        with self._lock:
            return self._content_store()

    @property
    def gateway(self) -> LLMGateway:
        with self._lock:
            if self._gateway is None:
                self._gateway = LLMGateway(self.settings, run_id=self.run_id)
            return self._gateway

    @property
    def graph(self) -> GraphStore:
        with self._lock:
            if self._graph is None:
                self._graph = GraphStore.open(self.settings)
            return self._graph

    def services(self) -> Services:
        """The run's ports for its stages, built once (and the graph connected then)."""
        graph = self.graph
        with self._lock:
            if self._services is None:
                self._services = Services(
                    settings=self.settings,
                    llm=self,
                    content=self._content_store(),
                    graph_reader=graph,
                    graph_writer=graph,
                )
            return self._services

    def _content_store(self) -> ContentStore:
        if self._content is None:
            self._content = ContentStore(self.settings.saga_dir / "content")
        return self._content

    # --- the LanguageModel port (core/ports.py) ------------------------------------------

    def structured(
        self,
        tier: str,
        messages: Sequence[Message],
        output_model: type[M],
        *,
        purpose: str = "",
        max_tokens: int | None = None,
    ) -> M:
        return self.gateway.structured(
            tier, messages, output_model, purpose=purpose, max_tokens=max_tokens
        )

    def text(
        self,
        tier: str,
        messages: Sequence[Message],
        *,
        purpose: str = "",
        max_tokens: int | None = None,
        anti_repetition: bool = False,
        sample: int = 0,
    ) -> str:
        return self.gateway.text(
            tier,
            messages,
            purpose=purpose,
            max_tokens=max_tokens,
            anti_repetition=anti_repetition,
            sample=sample,
        )

    def embed(self, texts: Sequence[str], *, purpose: str = "") -> np.ndarray:
        return self.gateway.embed(texts, purpose=purpose)

    def sends_anti_repetition_first(self, tier: str) -> bool:
        return self.gateway.sends_anti_repetition_first(tier)

    def model_fingerprint(self, tier: str) -> str:
        """What decides an LLM answer besides the prompt: part of every LLM task's cache key."""
        tier_settings = self.settings.tier(tier)
        models = ",".join(c.model for c in tier_settings.models) or self.settings.default_model
        sampling = tier_settings.anti_repetition.model_dump_json()
        # The default seed adds nothing, so the caches of a project begun before requests were
        # seeded stay valid (their answers are kept, as a resumed run keeps any answer it has).
        seed = "" if self.settings.llm_seed == 0 else f"|seed={self.settings.llm_seed}"
        return f"{self.settings.openai_base_url or 'local'}|{tier}|{models}|{tier_settings.temperature}|{sampling}{seed}"

    def embedding_fingerprint(self) -> str:
        """What decides a vector besides the text (LLMGateway.embedding_fingerprint): another
        model or build must not mix its vectors into old caches."""
        return self.gateway.embedding_fingerprint()

    def save_call_log(self) -> Path | None:
        """The run's LLM call records so far, to `.saga/runs/llm_calls_<run id>.parquet` (one
        file per run, rewritten whole and atomically; LLMGateway.save_records): the novel saves
        it after initialization, after each chapter and when it fails, and every run when its
        runtime closes (a scheduled healing's enrichments too). Nothing when no model was asked."""
        with self._lock:
            gateway = self._gateway
        if gateway is None:
            return None
        return gateway.save_records(
            self.settings.saga_dir / "runs" / f"llm_calls_{self.run_id}.parquet"
        )

    def close(self) -> None:
        self.save_call_log()
        with self._lock:
            if self._graph is not None:
                self._graph.close()
                self._graph = None
                self._services = None


_current: Runtime | None = None
_current_lock = threading.Lock()


def set_runtime(runtime: Runtime) -> Runtime:
    global _current
    with _current_lock:
        _current = runtime
    return runtime


def runtime() -> Runtime:
    if _current is None:
        raise RuntimeError(
            "no Runtime set: flows call tasks.runtime.set_runtime() before running tasks"
        )
    return _current


@contextmanager
def project_runtime(project_dir: str | Path) -> Iterator[Runtime]:
    """The caller's runtime when it is for this project (the CLI, or the novel flow around its
    healing and QA), else a new one for the run (a deployment run), whose graph connection is
    closed afterwards (an open driver would keep an embedded graph's process from exiting) and
    the caller's runtime, if any, current again."""
    global _current
    previous = _current
    if previous is not None and previous.settings.project_dir == Path(project_dir).resolve():
        yield previous
        return
    own = set_runtime(Runtime(load_settings(project_dir)))
    try:
        yield own
    finally:
        own.close()
        with _current_lock:
            _current = previous
