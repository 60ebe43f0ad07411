"""bench.sidecar_load's levels: every level sends the same conversations, N at a time."""

from __future__ import annotations

import threading

import httpx

from bench.sidecar_load_level import Level, dialogue_turns


class CountingLevel(Level):
    """A level whose conversations only meet at the wave's start line (no server)."""

    def __init__(self, n: int, scripts: int) -> None:
        super().__init__("http://unused", n, 3, dialogue_turns(), float("inf"), scripts=scripts)
        self.counting = threading.Lock()
        self.active = 0
        self.most_at_once = 0
        self.ran: list[int] = []

    def run_conversation(self, i: int) -> None:
        with self.counting:
            self.active += 1
            self.ran.append(i)
        self.start.wait()  # every conversation of the wave is in here at once
        with self.counting:
            self.most_at_once = max(self.most_at_once, self.active)
        self.start.wait()  # and none leaves before all have counted
        with self.counting:
            self.active -= 1

    def read_back(self, client: httpx.Client) -> int:
        return 0


def test_one_conversation_at_a_time_runs_every_conversation_of_the_largest_level() -> None:
    level = CountingLevel(1, 16)
    report = level.run(httpx.Client())
    assert sorted(level.ran) == list(range(16))
    assert level.most_at_once == 1
    assert report.conversations == 1 and report.turns_sent == 16 * 3


def test_four_at_a_time_runs_the_same_sixteen_in_waves_of_four() -> None:
    level = CountingLevel(4, 16)
    level.run(httpx.Client())
    assert sorted(level.ran) == list(range(16))
    assert level.most_at_once == 4


def test_the_largest_level_runs_its_conversations_all_at_once() -> None:
    level = CountingLevel(16, 16)
    report = level.run(httpx.Client())
    assert level.most_at_once == 16 and report.turns_sent == 16 * 3
    # the same conversations as the other levels, under their own ids
    assert level.script(5) == CountingLevel(1, 16).script(5)
    assert level.conversation_id(5) != CountingLevel(1, 16).conversation_id(5)
