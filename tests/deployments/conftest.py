"""Fixtures of the deployment tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.logged_process import LoggedProcess


@pytest.fixture
def procs() -> Iterator[list[LoggedProcess]]:
    """The test's own servers and workers: killed (with their process groups) at the end."""
    started: list[LoggedProcess] = []
    yield started
    for proc in reversed(started):
        if proc.proc.poll() is None:
            proc.kill()
