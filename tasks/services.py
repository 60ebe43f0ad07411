"""`Services`: what a stage calls, handed to it as a Prefect parameter (`services`).

The ports are the Protocols of core/ports.py (the LLM, the content store) and kg/ports.py
(the graph's reader and writer), so a unit test builds a `Services` over small fakes and runs
a stage's function as it is; a run builds it once from its `Runtime` (`Runtime.services()`,
tasks/runtime.py), and its flows pass it to every stage.

Its identity is no part of any cache key: tasks/policy.py leaves the `services` parameter out
of the inputs it hashes and puts the model fingerprint of the stage's tier in instead, so two
processes with equal settings (a run and its resume) compute the same keys.

A plain class with slots, not a dataclass or a pydantic model: Prefect walks dataclasses and
pydantic models among a task's parameters looking for futures to resolve, and would walk the
whole gateway and graph store on every call; it leaves other objects alone.
"""

from __future__ import annotations

from typing import Any

from core.ports import Content, LanguageModel
from core.settings import Settings
from kg.ports import GraphReader, GraphWriter


class Services:
    """The settings and the ports of one run. Immutable: set once when built."""

    __slots__ = ("settings", "llm", "content", "_graph_reader", "_graph_writer")

    settings: Settings
    llm: LanguageModel
    content: Content
    _graph_reader: GraphReader | None
    _graph_writer: GraphWriter | None

    def __init__(
        self,
        *,
        settings: Settings,
        llm: LanguageModel,
        content: Content,
        graph_reader: GraphReader | None = None,
        graph_writer: GraphWriter | None = None,
    ) -> None:
        for name, value in (
            ("settings", settings),
            ("llm", llm),
            ("content", content),
            ("_graph_reader", graph_reader),
            ("_graph_writer", graph_writer),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Services is immutable: {name} is set when it is built")

    @property
    def graph_reader(self) -> GraphReader:
        if self._graph_reader is None:
            raise RuntimeError("these Services have no graph reader: build them with graph_reader=")
        return self._graph_reader

    @property
    def graph_writer(self) -> GraphWriter:
        if self._graph_writer is None:
            raise RuntimeError("these Services have no graph writer: build them with graph_writer=")
        return self._graph_writer

    def __repr__(self) -> str:  # Prefect logs parameters by repr: keep it short and stable
        return f"Services(project={self.settings.project_dir.name!r})"
