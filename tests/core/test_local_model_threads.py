"""How many threads the local llama-server gets (core.llm_server.local_model_threads)."""

from __future__ import annotations

import pytest

import core.llm_server as llm_server


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (3, 2), (4, 2), (8, 4), (64, 4)])
def test_one_thread_on_a_small_machine_and_half_of_a_bigger_ones_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    monkeypatch.delenv("LLAMA_ARG_THREADS", raising=False)
    monkeypatch.setattr(llm_server.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert llm_server.local_model_threads() == threads


def test_llama_cpp_own_variable_wins_and_a_bad_value_is_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(llm_server.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setenv("LLAMA_ARG_THREADS", "1")
    assert llm_server.local_model_threads() == 1
    for bad in ("0", "-2", "two", ""):
        monkeypatch.setenv("LLAMA_ARG_THREADS", bad)
        assert llm_server.local_model_threads() == 2
