"""A process killed with SIGKILL in the middle of a large chapter commit changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.settings import Settings
from kg.models import ChapterDelta, Entity, EntitySource, Relationship
from kg.store import GraphStore
from kg.transfer import dumps_export
from tests.support.cli import graph_vars

REPO_ROOT = Path(__file__).resolve().parents[2]

# The child builds a large delta and commits it through GraphOps that announce (via the
# marker file) once the transaction has started writing, so the kill lands mid-commit.
CHILD = r"""
import random, sys
from pathlib import Path
from core.settings import load_settings
from kg.commit import GraphOps
from kg.models import ChapterDelta, Entity, PropertyUpdate, Relationship
from kg.store import GraphStore

marker, project = Path(sys.argv[1]), sys.argv[2]
ENTITIES, RELATIONSHIPS = int(sys.argv[3]), int(sys.argv[4])

class Announcing(GraphOps):
    chunk = 250  # many statements, so the transaction is long and clearly "in the middle"
    writes = 0

    def run(self, tx, query, **params):
        super().run(tx, query, **params)
        self.writes += 1
        if self.writes == 4:
            marker.write_text("writing")

rng = random.Random(7)
names = [f"Extra {i}" for i in range(ENTITIES)] + ["Aragorn", "Frodo", "Rivendell"]
delta = ChapterDelta(
    chapter=1,
    title="A very long chapter",
    entities=[Entity(label="Character", name=n, description="x" * 50) for n in names[:ENTITIES]],
    relationships=[
        Relationship(source=rng.choice(names), target=rng.choice(names), type=rng.choice(["knows", "loves", "fears"]))
        for _ in range(RELATIONSHIPS)
    ],
    property_updates=[PropertyUpdate(entity="Aragorn", changes={"description": "changed", "mood": "grim"})],
)
store = GraphStore.open(load_settings(project))
store.commit_chapter(delta, ops=Announcing())
marker.write_text("finished")
"""


def base_delta() -> ChapterDelta:
    source = EntitySource(type="outline", chapter=0)
    return ChapterDelta(
        chapter=0,
        source_type="outline",
        entities=[
            Entity(label="Character", name="Aragorn", description="A ranger.", sources=[source]),
            Entity(label="Character", name="Frodo", sources=[source]),
            Entity(label="Location", name="Rivendell", sources=[source]),
        ],
        relationships=[Relationship(source="Aragorn", target="Frodo", type="protects")],
    )


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_mid_commit_leaves_the_graph_exactly_as_before(
    graph_settings: Settings, tmp_path: Path
) -> None:
    store = GraphStore.open(graph_settings)
    try:
        store.wipe()
        store.commit_chapter(base_delta())
        before = dumps_export(store.export_data())

        env = {
            **os.environ,
            **graph_vars(graph_settings),
        }
        marker = tmp_path / "marker"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(marker), str(tmp_path / "child"), "5000", "20000"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 600
            while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert marker.exists(), (
                f"child never started writing: {child.stderr.read().decode()[-2000:] if child.stderr else ''}"
            )
            time.sleep(0.5)
            assert child.poll() is None and marker.read_text() == "writing", (
                "the commit ended before the kill"
            )
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL

        assert dumps_export(store.export_data()) == before
        assert store.stats().committed_chapters == [0]
        # The graph is fully usable afterwards: the same chapter commits and rolls back.
        small = ChapterDelta(chapter=1, entities=[Entity(label="Character", name="Sam")])
        store.commit_chapter(small)
        store.rollback_chapter(1)
        assert dumps_export(store.export_data()) == before
    finally:
        store.close()
