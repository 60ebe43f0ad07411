"""The Obsidian vault of the world (`python -m kg vault`), built from the real graph: every
[[link]] resolves, front matter parses, facts keep their quote and chapter, names that collide
get files of their own, and a later export rewrites only the notes Skald wrote and nobody
changed since.

The vault of the scripted long book is checked in tests/flows/test_long_story.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from kg.codex import build_novel_codex
from kg.models import ChapterDelta, Entity, EntitySource, Relationship, SceneDelta, StatusChange
from kg.store import GraphStore
from kg.vault import RECORD_FILE, VaultNote, vault_notes, write_vault
from kg.vault.notes import escape, safe_stem
from tests.support.cli import graph_env, run_module
from tests.support.vault_reading import front, unresolved_links

COLON_NAME = 'Ada "Red" Vane: the Second'


def _src(chapter: int, scene: int, quote: str, **extra: object) -> EntitySource:
    return EntitySource(type="extraction", chapter=chapter, scene=scene, quote=quote, **extra)


def write_world(store: GraphStore) -> None:
    """The bible and two chapters: a friendship that sours, a death, a name with a colon and
    quotes, three entries all called Gull Rock, and a quote that looks like Obsidian syntax."""
    bible = EntitySource(type="outline", chapter=0)
    store.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                Entity(
                    label="Character",
                    name="Mara Quill",
                    aliases=["Mara"],
                    traits=["brave"],
                    sources=[bible],
                    first_chapter=0,
                    attributes={"role": "protagonist"},
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                Entity(
                    label="Character",
                    name="Tobias Venn",
                    sources=[bible],
                    first_chapter=0,
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                Entity(
                    label="Location",
                    name="Gull Rock",
                    sources=[bible],
                    first_chapter=0,
                    description="A reef with a lighthouse.",
                ),
            ],
            relationships=[
                Relationship(
                    source="Mara Quill",
                    target="Gull Rock",
                    type="LOCATED_IN",
                    chapter=0,
                    target_label="Location",
                )
            ],
            novel_info={
                "title": "The Drowned Letter",
                "logline": "A keeper chases a ghost's letter.",
            },
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=1,
            title="The Letter",
            summary="Mara meets Tobias.",
            entities=[
                Entity(
                    label="Character",
                    name="Mara Quill",
                    sources=[_src(1, 1, "Mara met Tobias Venn.")],
                ),
                Entity(
                    label="Character",
                    name="Tobias Venn",
                    sources=[_src(1, 1, "Mara met Tobias Venn.")],
                ),
                Entity(
                    label="Character",
                    name="Gull Rock",
                    description="A smuggler who took the reef's name.",
                    sources=[_src(1, 2, "The smuggler called himself Gull Rock.")],
                ),
                Entity(
                    label="Item",
                    name="gull rock",
                    sources=[_src(1, 2, "She pocketed a gull rock, grey and smooth.")],
                ),
            ],
            relationships=[
                Relationship(
                    source="Mara Quill",
                    target="Tobias Venn",
                    type="FRIEND_OF",
                    scene=1,
                    quote="Mara met Tobias Venn.",
                )
            ],
            scenes=[
                SceneDelta(
                    index=1,
                    title="Meeting",
                    location="Gull Rock",
                    characters=["Mara", "Tobias Venn"],
                    summary="Mara meets Tobias on the reef.",
                ),
                SceneDelta(index=2, title="The smuggler", characters=["Mara Quill", "a stranger"]),
            ],
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=2,
            title="The Betrayal: [[Part]] #2",
            summary="Tobias turns; Ada arrives.",
            entities=[
                Entity(
                    label="Character",
                    name=COLON_NAME,
                    sources=[_src(2, 1, "Ada wrote [[never]] in the ledger #1.")],
                ),
            ],
            relationships=[
                Relationship(
                    source="Tobias Venn",
                    target="Mara Quill",
                    type="ENEMY_OF",
                    scene=1,
                    quote="Tobias Venn struck Mara.",
                )
            ],
            status_changes=[
                StatusChange(
                    entity="Tobias Venn",
                    status="dead",
                    scene=2,
                    quote="Tobias Venn drowned off the point.",
                )
            ],
            scenes=[
                SceneDelta(index=1, title="Blow", characters=["Tobias Venn", COLON_NAME]),
                SceneDelta(index=2, title="Drowning", location="Gull Rock"),
            ],
        )
    )


@pytest.fixture(scope="module")
def world(graph: GraphStore, graph_settings: Settings) -> Iterator[GraphStore]:
    """The session graph holding write_world's story (the module's tests leave it as they find it)."""
    graph.wipe()
    write_world(graph)
    yield graph


@pytest.fixture(scope="module")
def saga(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty .saga for the in-process builds: the session project's .saga holds other tests'
    quality rows and QA findings (a chapter flagged there would be flagged here)."""
    return tmp_path_factory.mktemp("vault-saga")


def _vault(store: GraphStore, saga_dir: Path, as_of: int | None = None) -> list[VaultNote]:
    return vault_notes(build_novel_codex(store, saga_dir, as_of))


def _digest(vault: Path) -> dict[str, str]:
    return {
        str(p.relative_to(vault)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(vault.rglob("*"))
        if p.is_file()
    }


def test_every_link_resolves_and_every_note_has_its_front_matter(
    world: GraphStore, saga: Path, tmp_path: Path
) -> None:
    report = write_vault(_vault(world, saga), tmp_path)
    found, bad = unresolved_links(tmp_path)
    assert found == report.links > 50 and bad == []
    notes = {
        str(p.relative_to(tmp_path)): p.read_text(encoding="utf-8") for p in tmp_path.rglob("*.md")
    }
    assert sorted(notes) == [
        "Chapters/Chapter 1.md",
        "Chapters/Chapter 2.md",
        f"Characters/{safe_stem(COLON_NAME)}.md",
        "Characters/Gull Rock (Character).md",
        "Characters/Mara Quill.md",
        "Characters/Tobias Venn.md",
        "Index.md",
        "Items/gull rock (Item).md",
        "Places/Gull Rock.md",
        "Scenes/Chapter 1 - Scene 1.md",
        "Scenes/Chapter 1 - Scene 2.md",
        "Scenes/Chapter 2 - Scene 1.md",
        "Scenes/Chapter 2 - Scene 2.md",
        "Story bible.md",
    ]
    assert safe_stem(COLON_NAME) == "Ada Red Vane the Second"
    tobias = front(notes["Characters/Tobias Venn.md"])
    assert {k: tobias[k] for k in ("type", "status", "first_chapter", "aliases")} == {
        "type": "character",
        "status": "dead",
        "first_chapter": 0,
        "aliases": [],
    }
    ada = front(notes[f"Characters/{safe_stem(COLON_NAME)}.md"])
    # The name YAML has to quote comes back whole, and [[Ada "Red" Vane: the Second]] finds the note.
    assert (
        ada["name"] == COLON_NAME and ada["aliases"] == [COLON_NAME] and ada["first_chapter"] == 2
    )
    place = front(notes["Places/Gull Rock.md"])
    assert (place["type"], place["status"], place["first_chapter"]) == ("place", None, 0)
    # A title no [[link]] can name is no alias, and keeps its words without making a link itself.
    assert front(notes["Chapters/Chapter 2.md"])["aliases"] == []
    assert front(notes["Chapters/Chapter 2.md"])["title"] == "The Betrayal: [Part] #2"
    assert front(notes["Chapters/Chapter 1.md"])["aliases"] == ["The Letter"]
    chapter = front(notes["Chapters/Chapter 1.md"])
    assert {k: chapter[k] for k in ("type", "status", "first_chapter", "title")} == {
        "type": "chapter",
        "status": "written",
        "first_chapter": 1,
        "title": "The Letter",
    }


def test_relationships_link_with_their_chapter_range_and_facts_keep_quote_and_chapter(
    world: GraphStore, saga: Path
) -> None:
    notes = {n.path: n.text for n in _vault(world, saga)}
    mara = notes["Characters/Mara Quill.md"]
    assert (
        "- FRIEND_OF \u2192 [[Tobias Venn]]: from [[Chapter 1]], ended in [[Chapter 2]] "
        "(then Tobias Venn ENEMY_OF Mara Quill in chapter 2)"
    ) in mara
    assert "- ENEMY_OF \u2190 [[Tobias Venn]]: from [[Chapter 2]] on" in mara
    assert "- LOCATED_IN \u2192 [[Gull Rock]]: from [[Story bible|the story bible]] on" in mara
    assert (
        "- [[Chapter 1]], scene 1: FRIEND_OF \u2192 Tobias Venn \u201cMara met Tobias Venn.\u201d"
        in mara
    )
    tobias = notes["Characters/Tobias Venn.md"]
    assert "- dead: from [[Chapter 2]] \u201cTobias Venn drowned off the point.\u201d" in tobias
    assert (
        "- [[Chapter 2]], scene 2: status: dead \u201cTobias Venn drowned off the point.\u201d"
        in tobias
    )
    # The chapter's scenes have notes; a scene's names link to the entry they name (an alias
    # included), a name that is no entry stays text, and the place is the Location of that name.
    chapter = notes["Chapters/Chapter 1.md"]
    assert "1. [[Chapter 1 - Scene 1|Scene 1: Meeting]] \u00b7 at [[Gull Rock]]" in chapter
    assert "2. [[Chapter 1 - Scene 2|Scene 2: The smuggler]]" in chapter
    scene = notes["Scenes/Chapter 1 - Scene 1.md"]
    assert "**Characters:** [[Mara Quill|Mara]] \u00b7 [[Tobias Venn]]" in scene
    assert "Mara meets Tobias on the reef." in scene and front(scene)["chapter"] == 1
    assert (
        "**Characters:** [[Mara Quill]] \u00b7 a stranger" in notes["Scenes/Chapter 1 - Scene 2.md"]
    )
    # Text from the story cannot make links, tags or headings of its own.
    ada = notes[f"Characters/{safe_stem(COLON_NAME)}.md"]
    assert f"\u201c{escape('Ada wrote [[never]] in the ledger #1.')}\u201d" in ada
    assert "\\[\\[never\\]\\] in the ledger \\#1." in ada
    assert "# Chapter 2: The Betrayal: \\[\\[Part\\]\\] \\#2" in notes["Chapters/Chapter 2.md"]


def test_the_vault_is_the_same_bytes_whatever_the_hash_seed(
    world: GraphStore, graph_settings: Settings, tmp_path: Path
) -> None:
    runs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        done = _kg(
            "vault",
            "--project-dir",
            str(graph_settings.project_dir),
            "--out",
            str(out),
            env=graph_env(graph_settings, PYTHONHASHSEED=seed),
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(_digest(out))
    assert runs[0] == runs[1] and len(runs[0]) == 15  # 14 notes and the record


def test_a_later_export_rewrites_only_the_notes_skald_wrote(
    world: GraphStore, saga: Path, tmp_path: Path
) -> None:
    vault = tmp_path / "vault"
    write_vault(_vault(world, saga, as_of=1), vault)
    mine = vault / "Ideas" / "Tobias.md"
    mine.parent.mkdir()
    mine.write_text("Tobias should betray her [[Mara Quill]].\n", encoding="utf-8")
    edited = vault / "Characters" / "Mara Quill.md"
    edited.write_text(
        edited.read_text(encoding="utf-8") + "\nShe hates the sea.\n", encoding="utf-8"
    )
    unedited = vault / "Characters" / "Tobias Venn.md"
    before = unedited.read_text(encoding="utf-8")
    kept = {p: p.read_bytes() for p in (mine, edited)}

    # The world changes: chapter 2 is written (Tobias turns and drowns, Ada arrives).
    report = write_vault(_vault(world, saga), vault)
    assert {p: p.read_bytes() for p in kept} == kept, "the writer's notes are untouched"
    assert report.kept == ["Characters/Mara Quill.md"]
    after = unedited.read_text(encoding="utf-8")
    assert after != before and "- dead: from [[Chapter 2]]" in after, (
        "an unchanged Skald note follows the world"
    )
    assert (
        "Characters/Tobias Venn.md" in report.written
        and (vault / "Chapters" / "Chapter 2.md").is_file()
    )
    again = write_vault(_vault(world, saga), vault)
    assert (
        again.written == [] and again.kept == ["Characters/Mara Quill.md"] and again.removed == []
    )

    # A rollback takes chapter 2 out again: what Skald wrote for it goes, unless the writer changed it.
    ada = vault / "Characters" / f"{safe_stem(COLON_NAME)}.md"
    ada.write_text(ada.read_text(encoding="utf-8") + "\nMine now.\n", encoding="utf-8")
    back = write_vault(_vault(world, saga, as_of=1), vault)
    assert back.released == [f"Characters/{safe_stem(COLON_NAME)}.md"] and ada.is_file()
    assert {"Chapters/Chapter 2.md", "Scenes/Chapter 2 - Scene 1.md"} <= set(back.removed)
    assert not (vault / "Chapters" / "Chapter 2.md").exists()
    assert unedited.read_text(encoding="utf-8") == before
    assert {p: p.read_bytes() for p in kept} == kept
    # Released notes are the writer's from then on: a later export with Ada in the world keeps it.
    forward = write_vault(_vault(world, saga), vault)
    assert (
        f"Characters/{safe_stem(COLON_NAME)}.md" in forward.kept
        and "Mine now." in ada.read_text("utf-8")
    )


def test_a_note_left_by_an_interrupted_export_is_still_skalds(
    world: GraphStore, saga: Path, tmp_path: Path
) -> None:
    write_vault(_vault(world, saga, as_of=0), tmp_path)  # the story bible: no scenes yet
    # A file where the Scenes folder goes stops the next export half-way: the notes before
    # Scenes/ (in path order) already hold the new text when it fails.
    (tmp_path / "Scenes").write_text("in the way\n", encoding="utf-8")
    with pytest.raises(OSError):
        write_vault(_vault(world, saga), tmp_path)
    tobias = tmp_path / "Characters" / "Tobias Venn.md"
    assert "- dead: from [[Chapter 2]]" in tobias.read_text(encoding="utf-8"), (
        "written before the failure"
    )
    (tmp_path / "Scenes").unlink()
    # The next export (another world again: as of chapter 1) still knows those notes as its own.
    report = write_vault(_vault(world, saga, as_of=1), tmp_path)
    assert report.kept == [] and {"Characters/Tobias Venn.md", "Chapters/Chapter 1.md"} <= set(
        report.written
    )
    assert "Chapters/Chapter 2.md" in report.removed
    record = json.loads((tmp_path / RECORD_FILE).read_text(encoding="utf-8"))["notes"]
    assert record["Characters/Tobias Venn.md"] == [hashlib.sha256(tobias.read_bytes()).hexdigest()]
    # The look-alike: a note holding no text Skald recorded is the writer's.
    tobias.write_text("my own Tobias\n", encoding="utf-8")
    assert write_vault(_vault(world, saga), tmp_path).kept == ["Characters/Tobias Venn.md"]


def _kg(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_module("kg", *args, env=env)


def test_kg_vault_reports_what_it_did_and_refuses_bad_requests_in_one_line(
    world: GraphStore, graph_settings: Settings, tmp_path: Path
) -> None:
    env = graph_env(graph_settings)
    shown = _kg("vault", "--help", env=env)
    assert shown.returncode == 0 and "--as-of-chapter" in shown.stdout and "--out" in shown.stdout
    assert "vault" in _kg("--help", env=env).stdout
    project = tmp_path / "book"
    project.mkdir()
    made = _kg("vault", "--project-dir", str(project), env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    vault = project / "exports" / "vault"
    assert made.stdout.startswith(
        f"vault of 'The Drowned Letter' as of chapter 2 in {vault}: 14 notes, "
    )
    assert "14 written, 0 unchanged, 0 kept as yours" in made.stdout
    (vault / "Index.md").write_text("my index\n", encoding="utf-8")
    again = _kg("vault", "--project-dir", str(project), env=env)
    assert (
        "0 written, 13 unchanged, 1 kept as yours" in again.stdout
        and "kept (you changed it): Index.md" in again.stdout
    )
    past = _kg("vault", "--project-dir", str(project), "--as-of-chapter", "1", env=env)
    assert past.returncode == 0, past.stderr[-2000:]
    assert past.stdout.startswith(
        f"vault of 'The Drowned Letter' as of chapter 1 in {project / 'exports' / 'vault-chapter-001'}: "
    )
    # The project's vault, with the writer's own note in it, is not touched by the past.
    assert (vault / "Index.md").read_text(encoding="utf-8") == "my index\n"
    assert (
        "0 written, 13 unchanged, 1 kept as yours"
        in _kg("vault", "--project-dir", str(project), env=env).stdout
    )
    (vault / RECORD_FILE).write_text("{not json", encoding="utf-8")
    a_file = tmp_path / "file.md"
    a_file.write_text("x", encoding="utf-8")
    for args, message in (
        (("--as-of-chapter", "-1"), "kg: error: --as-of-chapter must be 0 or more (got -1)"),
        (
            ("--as-of-chapter", "7"),
            "kg: error: --as-of-chapter 7 is past the book: the graph holds chapters 1-2",
        ),
        (("--out", str(a_file)), f"kg: error: --out {a_file} is a file"),
        ((), f"kg: error: {vault / RECORD_FILE} is not Skald's record of the notes it wrote"),
    ):
        refused = _kg("vault", "--project-dir", str(project), *args, env=env)
        assert refused.returncode == 2, (args, refused.stderr[-1000:])
        assert refused.stderr.strip().splitlines()[-1].startswith(message), refused.stderr[-1000:]
    assert (vault / "Index.md").read_text(encoding="utf-8") == "my index\n"
    missing = _kg("vault", "--project-dir", str(tmp_path / "nope"), env=env)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
