"""Record every Cypher text the neo4j driver sends, with the names of its parameters.

The test session installs this in its own process (tests/conftest.py) and, through the
`sitecustomize` beside this file (this folder goes first on PYTHONPATH), in every Python
subprocess a test starts (`python -m flows.novel`, `python -m kg`, the dialogue sidecar ...),
so whatever runs is collected, whoever runs it. It wraps the one `run` every session and
transaction class of the driver inherits (sync and async), so no query path is missed.

Each process appends one JSON line per new (text, parameter names) pair to
`$KG_CYPHER_RECORD_DIR/<pid>.jsonl` as it happens (a SIGKILLed process keeps what it
sent); `merge` folds the files into one list of distinct texts for tools/cypher-lint.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RECORD_DIR_ENV = "KG_CYPHER_RECORD_DIR"

_seen: set[tuple[str, tuple[str, ...]]] = set()
_lock = threading.Lock()
_installed_dir: Path | None = None


def _text_of(query: Any) -> str | None:
    text = getattr(query, "text", query)  # neo4j.Query wraps the text
    return text if isinstance(text, str) else None


def _note(query: Any, parameters: Any, kwargs: dict[str, Any]) -> None:
    text = _text_of(query)
    if text is None or _installed_dir is None:
        return
    names = set(kwargs)
    if isinstance(parameters, dict):
        names.update(parameters)
    entry = (text, tuple(sorted(names)))
    with _lock:
        if entry in _seen:
            return
        _seen.add(entry)
        with (_installed_dir / f"{os.getpid()}.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps({"text": text, "params": list(entry[1])}) + "\n")


def _wrap_sync(run: Any) -> Any:
    def recorded_run(self: Any, query: Any, parameters: Any = None, **kwargs: Any) -> Any:
        _note(query, parameters, kwargs)
        return run(self, query, parameters, **kwargs)

    recorded_run.__wrapped__ = run  # type: ignore[attr-defined]
    return recorded_run


def _wrap_async(run: Any) -> Any:
    async def recorded_run(self: Any, query: Any, parameters: Any = None, **kwargs: Any) -> Any:
        _note(query, parameters, kwargs)
        return await run(self, query, parameters, **kwargs)

    recorded_run.__wrapped__ = run  # type: ignore[attr-defined]
    return recorded_run


def _run_owners() -> Iterable[tuple[type, bool]]:
    import neo4j

    seen: set[type] = set()
    for cls, is_async in (
        (neo4j.Session, False),
        (neo4j.Transaction, False),
        (neo4j.ManagedTransaction, False),
        (neo4j.AsyncSession, True),
        (neo4j.AsyncTransaction, True),
        (neo4j.AsyncManagedTransaction, True),
    ):
        owner = next(c for c in cls.__mro__ if "run" in vars(c))
        if owner not in seen:
            seen.add(owner)
            yield owner, is_async


def install(record_dir: Path) -> None:
    """Start recording into `record_dir` (idempotent; also sets the env var for children)."""
    global _installed_dir
    record_dir.mkdir(parents=True, exist_ok=True)
    os.environ[RECORD_DIR_ENV] = str(record_dir)
    if _installed_dir is not None:
        _installed_dir = record_dir
        return
    _installed_dir = record_dir
    for owner, is_async in _run_owners():
        run = vars(owner)["run"]
        if not hasattr(run, "__wrapped__"):
            owner.run = (_wrap_async if is_async else _wrap_sync)(run)  # type: ignore[attr-defined]


def merge(record_dir: Path) -> dict[str, list[list[str]]]:
    """Every recorded text with the distinct parameter-name lists it was sent with."""
    found: dict[str, set[tuple[str, ...]]] = {}
    for path in sorted(record_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except ValueError:  # a line cut short by a SIGKILL
                continue
            found.setdefault(item["text"], set()).add(tuple(item["params"]))
    return {text: [list(p) for p in sorted(sets)] for text, sets in sorted(found.items())}
