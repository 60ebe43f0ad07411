"""The embedded graph's JVM in the process that runs it: JPype's link between the JVM's
collector and Python's is cut once the JVM starts (core.graph_server.detach_jvm_gc_link), and
only that link; the JIT runs its first tier only unless the user's ARCADEDB_JVM_ARGS sets the
tiers (core.graph_server.JIT_TIER_ARGS); its crash log goes to the graph's log folder; a
server's startup objects leave the collector's scans
(core.heap.freeze_startup_objects)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.graph_server import (
    JIT_TIER_ARGS,
    JVM_ERROR_FILE_VAR,
    _jit_args,
    _jvm_error_file,
    detach_jvm_gc_link,
)
from core.heap import freeze_startup_objects
from core.settings import Settings


def _jpype_callbacks() -> list[Callable[..., Any]]:
    return [cb for cb in gc.callbacks if getattr(cb, "__module__", None) == "_jpype"]


def test_the_running_embedded_graph_leaves_no_jvm_link_in_pythons_collector(
    graph_settings: Settings,
) -> None:
    # graph_settings started the embedded ArcadeDB in this process (its JVM, through JPype).
    import jpype

    assert jpype.isJVMStarted()
    assert _jpype_callbacks() == []


def test_the_running_embedded_graphs_jvm_compiles_with_the_first_tier_only(
    graph_settings: Settings,
) -> None:
    import jpype

    arguments = [
        str(a)
        for a in jpype.JClass("java.lang.management.ManagementFactory")
        .getRuntimeMXBean()
        .getInputArguments()
    ]
    assert set(JIT_TIER_ARGS) <= set(arguments), arguments


def test_the_users_own_tier_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARCADEDB_JVM_ARGS", raising=False)
    assert _jit_args() == list(JIT_TIER_ARGS)
    monkeypatch.setenv("ARCADEDB_JVM_ARGS", "-XX:MaxDirectMemorySize=1g")  # not about tiers
    assert _jit_args() == list(JIT_TIER_ARGS)
    monkeypatch.setenv("ARCADEDB_JVM_ARGS", "-XX:-TieredCompilation")
    assert _jit_args() == []


def test_detaching_removes_jpypes_callbacks_and_keeps_everyone_elses() -> None:
    seen: list[str] = []

    def jpype_like(phase: str, info: dict[str, int]) -> None:  # a stand-in for _jpype._collect
        seen.append(phase)

    def own(phase: str, info: dict[str, int]) -> None:  # e.g. a profiler's: not JPype's
        seen.append(phase)

    jpype_like.__module__ = "_jpype"
    gc.callbacks.extend([jpype_like, own])
    try:
        assert detach_jvm_gc_link() == 1
        assert jpype_like not in gc.callbacks
        assert own in gc.callbacks
        assert detach_jvm_gc_link() == 0  # nothing left to remove
    finally:
        for callback in (jpype_like, own):
            if callback in gc.callbacks:
                gc.callbacks.remove(callback)


def test_freezing_moves_the_live_objects_out_of_the_collectors_scans() -> None:
    before = gc.get_freeze_count()
    kept = [[] for _ in range(1000)]  # tracked containers alive at the freeze
    try:
        # Other threads of the session keep allocating and freeing (a frozen object that dies
        # leaves the count): the count only says the freeze took the objects alive then.
        frozen = freeze_startup_objects()
        assert frozen >= before + len(kept)
        assert not any(id(x) == id(kept[0]) for x in gc.get_objects())
    finally:
        gc.unfreeze()


def test_the_running_embedded_graphs_jvm_writes_a_crash_log_into_the_graphs_log_folder(
    graph_settings: Settings,
) -> None:
    """Not into the directory the command was run from (arcadedb_embedded's ./log/, or the
    current directory itself when that is missing); and the variable is not left set."""
    import jpype

    arguments = [
        str(a)
        for a in jpype.JClass("java.lang.management.ManagementFactory")
        .getRuntimeMXBean()
        .getInputArguments()
    ]
    error_files = [a for a in arguments if a.startswith("-XX:ErrorFile=")]
    log_dir = graph_settings.saga_dir / "graph" / "log"
    assert error_files[-1] == f"-XX:ErrorFile={log_dir}/hs_err_pid%p.log", error_files
    assert JVM_ERROR_FILE_VAR not in os.environ


def test_the_users_own_crash_log_place_wins_and_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JVM_ERROR_FILE_VAR, "/var/crash/jvm-%p.log")
    with _jvm_error_file(tmp_path):
        assert os.environ[JVM_ERROR_FILE_VAR] == "/var/crash/jvm-%p.log"
    assert os.environ[JVM_ERROR_FILE_VAR] == "/var/crash/jvm-%p.log"
    monkeypatch.delenv(JVM_ERROR_FILE_VAR)
    with _jvm_error_file(tmp_path):
        assert os.environ[JVM_ERROR_FILE_VAR] == f"{tmp_path}/hs_err_pid%p.log"
    assert JVM_ERROR_FILE_VAR not in os.environ
