"""`python -m kg` as a separate process against the session graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from kg.models import ChapterDelta, Entity, PropertyUpdate, Relationship
from kg.schema import LATEST_VERSION
from kg.store import GraphStore

REPO_ROOT = Path(__file__).resolve().parents[2]


def kg(
    project: Path, *args: str, module: str = "kg", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # The child finds the session graph like any second process would: NEO4J_URI from the
    # environment, or the embedded server this test process runs for `project`.
    return subprocess.run(
        [sys.executable, "-m", module, *args, "--project-dir", str(project)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def store(graph_settings: Settings) -> Iterator[GraphStore]:
    graph = GraphStore.open(graph_settings)
    graph.wipe()
    graph.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                Entity(label="Character", name="Aragorn"),
                Entity(label="Location", name="Bree"),
            ],
            relationships=[Relationship(source="Aragorn", target="Bree", type="located in")],
        )
    )
    yield graph
    graph.close()


def test_help_lists_every_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kg", "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0
    for command in ("migrate", "stats", "export", "import", "rollback"):
        assert command in result.stdout


def test_migrate_stats_export_rollback_import(
    store: GraphStore, graph_settings: Settings, tmp_path: Path
) -> None:
    project = graph_settings.project_dir
    migrated = kg(project, "migrate")
    assert migrated.returncode == 0 and "schema up to date" in migrated.stdout, migrated.stderr[
        -2000:
    ]

    stats = kg(project, "stats", "--json")
    assert stats.returncode == 0, stats.stderr[-2000:]
    counts = json.loads(stats.stdout)
    assert counts["labels"]["Character"] == 1 and counts["relationship_types"]["LOCATED_IN"] == 1
    assert counts["committed_chapters"] == [0]
    table = kg(project, "stats")
    assert "Character" in table.stdout and "committed chapters: 0" in table.stdout

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert kg(project, "export", "--out", str(first)).returncode == 0
    assert kg(project, "export", "--out", str(second)).returncode == 0
    assert first.read_bytes() == second.read_bytes()

    # A chapter committed here is rolled back by another process, exactly.
    store.commit_chapter(
        ChapterDelta(
            chapter=1,
            entities=[Entity(label="Character", name="Strider Impostor")],
            property_updates=[
                PropertyUpdate(entity="Aragorn", changes={"description": "Changed", "mood": "dark"})
            ],
        )
    )
    rolled = kg(project, "rollback", "--chapter", "1")
    assert rolled.returncode == 0 and "rolled back chapter(s) 1" in rolled.stdout, rolled.stderr[
        -2000:
    ]
    after = tmp_path / "after.json"
    assert kg(project, "export", "--out", str(after)).returncode == 0
    assert after.read_bytes() == first.read_bytes()

    refused = kg(project, "import", str(first))
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1].startswith("kg: error: the graph already holds")
    store.wipe()
    imported = kg(project, "import", str(first))
    assert imported.returncode == 0, imported.stderr[-2000:]
    again = tmp_path / "again.json"
    assert kg(project, "export", "--out", str(again)).returncode == 0
    assert again.read_bytes() == first.read_bytes()


def test_errors_are_one_line_with_a_non_zero_exit(
    store: GraphStore, graph_settings: Settings, tmp_path: Path
) -> None:
    project = graph_settings.project_dir
    missing = kg(project, "rollback", "--chapter", "7")
    assert missing.returncode == 1
    last = missing.stderr.strip().splitlines()[-1]
    assert last == "kg: error: chapter 7 has no committed change-set to roll back (committed: 0)"
    store.commit_chapter(ChapterDelta(chapter=1, entities=[Entity(label="Character", name="Sam")]))
    ordered = kg(project, "rollback", "--chapter", "0")
    assert (
        ordered.returncode == 1
        and "roll those back first" in ordered.stderr.strip().splitlines()[-1]
    )
    cascade = kg(project, "rollback", "--chapter", "0", "--cascade")
    assert cascade.returncode == 0 and "chapter(s) 1, 0" in cascade.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    broken = kg(project, "import", str(bad))
    assert broken.returncode == 1 and broken.stderr.strip().splitlines()[-1].startswith(
        "kg: error: import file"
    )
    usage = kg(project, "rollback")
    assert usage.returncode == 2 and "--chapter" in usage.stderr
    # A project directory that does not exist is a mistyped path, not an empty project: one
    # line, and no graph is made there. The look-alikes: an existing project answers (above),
    # and import may start a project (restoring an export into a new directory).
    missing = tmp_path / "no-such-project"
    for command in (("stats",), ("export", "--out", str(tmp_path / "x.json")), ("codex",)):
        refused = kg(missing, *command)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines() == [
            f"kg: error: --project-dir {missing} is not a directory (point it at an existing "
            "project, one python -m flows.novel or the sidecar wrote)"
        ]
        assert not missing.exists()
    # Nor is a directory that exists but holds no project (the wrong folder), when the graph is
    # the embedded one that would be made there; with NEO4J_URI it is elsewhere (above).
    empty = tmp_path / "not-a-project"
    empty.mkdir()
    embedded = {k: v for k, v in os.environ.items() if not k.startswith("NEO4J_")}
    for module, command in (("kg", "stats"), ("flows.maintenance", "qa")):
        refused = kg(empty, command, module=module, env=embedded)
        assert refused.returncode == 2, refused.stderr[-2000:]
        (line,) = refused.stderr.strip().splitlines()
        assert f"--project-dir {empty} holds no Skald project (no .saga/ folder)" in line
        assert list(empty.iterdir()) == []


def test_a_process_that_forgets_to_close_its_store_still_exits(tmp_path: Path) -> None:
    # The embedded server runs inside the process and waits for open Bolt connections when
    # it stops at exit; GraphStore closes itself first, so the process does not hang.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEO4J_")}
    script = (
        "import sys\n"
        "from core.settings import load_settings\n"
        "from kg.store import GraphStore\n"
        "store = GraphStore.open(load_settings(sys.argv[1]))\n"
        "print(store.schema_version())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == str(LATEST_VERSION)
