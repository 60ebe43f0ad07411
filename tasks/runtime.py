"""The services a run needs (settings, LLM gateway, content store, graph), built once.

Prefect tasks take only plain, hashable inputs so their cache keys are stable; the
services they use come from here instead of from their parameters.

This is the composition root of a run: the one place that wires core's services (LLM
gateway, content store) to kg's graph store, so it sits above both, in the tasks layer
that uses it; the flows (the entry points) build it with `set_runtime(Runtime(settings))`.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

from core.content import ContentStore
from core.llm import LLMGateway
from core.settings import Settings
from kg.store import GraphStore


@dataclass
class Runtime:
    settings: Settings
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _gateway: LLMGateway | None = None
    _graph: GraphStore | None = None
    _content: ContentStore | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def content(self) -> ContentStore:
        with self._lock:
            if self._content is None:
                self._content = ContentStore(self.settings.saga_dir / "content")
            return self._content

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

    def llm_fingerprint(self, tier: str) -> str:
        """What decides an LLM answer besides the prompt: part of every LLM task's cache key."""
        tier_settings = self.settings.tier(tier)
        models = ",".join(c.model for c in tier_settings.models) or self.settings.default_model
        sampling = tier_settings.anti_repetition.model_dump_json()
        return f"{self.settings.openai_base_url or 'local'}|{tier}|{models}|{tier_settings.temperature}|{sampling}"

    def embedding_fingerprint(self) -> str:
        return f"{self.settings.embedding_base_url or 'local'}|{self.settings.embedding_model}"

    def close(self) -> None:
        with self._lock:
            if self._graph is not None:
                self._graph.close()
                self._graph = None


_current: Runtime | None = None
_current_lock = threading.Lock()


def set_runtime(runtime: Runtime) -> Runtime:
    global _current
    with _current_lock:
        _current = runtime
    return runtime


def runtime() -> Runtime:
    if _current is None:
        raise RuntimeError("no Runtime set: flows call tasks.runtime.set_runtime() before running tasks")
    return _current
