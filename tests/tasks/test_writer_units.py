"""Units of the writer's controls: bible validation and ownership, bible diffs, guidance
staleness, manuscript splitting. (End to end: tests/flows/test_novel_writer_e2e.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.errors import InvalidInputError
from tasks.bible import StoryBible, bible_delta, load_story_bible, write_owned
from tasks.manuscript import split_manuscript
from tasks.steering import (
    Steering,
    chapter_guidance,
    fingerprint,
    finish_redo,
    first_stale_chapter,
    guidance_files,
    load_steering,
    request_redo,
)

MARA = {
    "name": "Mara Quill",
    "role": "protagonist",
    "description": "The keeper.",
    "traits": ["stubborn"],
    "motivation": "learn the truth",
    "backstory": "",
    "voice": "",
}


def _project(tmp_path: Path, **sheet: object) -> Path:
    (tmp_path / "characters").mkdir(parents=True, exist_ok=True)
    (tmp_path / "characters" / "mara_quill.yaml").write_text(yaml.safe_dump({**MARA, **sheet}))
    return tmp_path


def test_valid_bible_loads(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "world").mkdir()
    (root / "world" / "locations.yaml").write_text(
        yaml.safe_dump([{"name": "Gull Rock", "description": "A rock."}])
    )
    (root / "characters" / "tobias_venn.yml").write_text(
        yaml.safe_dump({**MARA, "name": "Tobias Venn", "role": "keeper"})
    )
    (root / "characters" / "tobias_venn.yaml.bak").write_text("not a sheet: [")  # not read
    bible = load_story_bible(root)
    assert [c.name for c in bible.characters] == ["Mara Quill", "Tobias Venn"]
    assert bible.locations[0].name == "Gull Rock"
    # The same character under both extensions is one character too many.
    (root / "characters" / "mara_quill.yml").write_text(yaml.safe_dump(MARA))
    with pytest.raises(InvalidInputError, match="is already the character of"):
        load_story_bible(root)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            {"mood": "grim"},
            "characters/mara_quill.yaml: field 'mood': unknown field; allowed fields: name, role",
        ),
        (
            {"traits": "brave"},
            "characters/mara_quill.yaml: field 'traits': Input should be a valid list",
        ),
        (
            {"motivation": 3},
            "characters/mara_quill.yaml: field 'motivation': Input should be a valid string",
        ),
        (
            {"name": ""},
            "characters/mara_quill.yaml: field 'name': String should have at least 1 character",
        ),
    ],
)
def test_bad_bible_edit_names_file_field_and_what_is_allowed(
    tmp_path: Path, edit: dict[str, object], expected: str
) -> None:
    root = _project(tmp_path, **edit)
    with pytest.raises(InvalidInputError) as caught:
        load_story_bible(root)
    assert str(caught.value).startswith(expected), str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_yaml_and_bad_list_entry(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "world").mkdir()
    (root / "world" / "relationships.yaml").write_text(
        "- source: Mara\n  target: Tobias\n  type: FRIEND_OF\n  since: 3\n"
    )
    with pytest.raises(
        InvalidInputError, match=r"world/relationships.yaml: entry 1, field 'since': unknown field"
    ):
        load_story_bible(root)
    (root / "world" / "relationships.yaml").write_text("- source: [unclosed\n")
    with pytest.raises(
        InvalidInputError, match=r"world/relationships.yaml: not valid YAML at line"
    ):
        load_story_bible(root)


def test_write_owned_never_overwrites_the_writers_edit(tmp_path: Path) -> None:
    root, saga = tmp_path / "book", tmp_path / "book" / ".saga"
    assert write_owned(root, saga, "characters/a.yaml", "v1\n")
    assert write_owned(root, saga, "characters/a.yaml", "v2\n")  # still Skald's: updated
    assert (root / "characters/a.yaml").read_text() == "v2\n"
    (root / "characters/a.yaml").write_text("the writer's\n")
    assert not write_owned(root, saga, "characters/a.yaml", "v3\n")
    assert (root / "characters/a.yaml").read_text() == "the writer's\n"
    # A file Skald never recorded is the writer's, unless it already holds what Skald would write.
    (root / "characters/b.yaml").write_text("same\n")
    assert write_owned(root, saga, "characters/b.yaml", "same\n")
    (root / "characters/c.yaml").write_text("hand-made\n")
    assert not write_owned(root, saga, "characters/c.yaml", "generated\n")


def test_bible_delta_pushes_only_what_the_writer_changed() -> None:
    baseline = StoryBible.model_validate({"characters": [MARA]})
    assert bible_delta(baseline, baseline, 1, -1) is None
    edited = StoryBible.model_validate(
        {
            "characters": [
                {**MARA, "motivation": "find her sister", "traits": ["stubborn", "haunted"]},
                {**MARA, "name": "Tobias Venn", "role": "supporting"},
            ]
        }
    )
    delta = bible_delta(baseline, edited, 2, -1)
    assert (
        delta is not None
        and delta.changeset == -1
        and delta.chapter == 2
        and delta.source_type == "user"
    )
    assert [(u.entity, u.changes) for u in delta.property_updates] == [
        ("Mara Quill", {"traits": ["stubborn", "haunted"], "motivation": "find her sister"})
    ]
    assert [e.name for e in delta.entities] == ["Tobias Venn"]
    assert delta.delta_hash() != delta.model_copy(update={"changeset": -2}).delta_hash()


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("chapter_1.md", "rename it to guidance/chapter_001.md"),
        ("Chapter-02.txt", "rename it to guidance/chapter_002.md"),
        ("ch3.md", "rename it to guidance/chapter_003.md"),
        ("chapter_0004.md", "guidance/chapter_004.md is the one read: merge the two"),
        ("chapter_000.md", "chapters are numbered from 1"),
    ],
)
def test_a_guidance_file_named_almost_right_stops_the_run_with_its_right_name(
    tmp_path: Path, name: str, hint: str
) -> None:
    folder = tmp_path / "guidance"
    folder.mkdir()
    (folder / "chapter_004.md").write_text("Mara lies to Tobias.")
    (folder / name).write_text("Ilse finds the letter.")
    with pytest.raises(InvalidInputError) as raised:
        guidance_files(tmp_path)
    assert f"guidance/{name}: not read as guidance" in str(raised.value)
    assert hint in str(raised.value)


def test_guidance_files_are_read_by_their_name_and_notes_are_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "guidance"
    folder.mkdir()
    for name in ("chapter_002.md", "chapter_1000.md", "notes.md", "chapters-plan.txt", "ideas"):
        (folder / name).write_text("x")
    assert guidance_files(tmp_path) == {
        2: folder / "chapter_002.md",
        1000: folder / "chapter_1000.md",
    }
    assert guidance_files(tmp_path / "no-such-project") == {}


def test_chapter_files_stop_a_new_book_only_where_skald_keeps_nothing(tmp_path: Path) -> None:
    from flows.book import refuse_unowned_chapters

    refuse_unowned_chapters(tmp_path)  # an empty directory
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "notes.md").write_text("ideas")
    refuse_unowned_chapters(tmp_path)  # not a chapter file
    (tmp_path / ".saga").mkdir()
    (tmp_path / ".saga" / "run.lock").write_text("")
    (tmp_path / "chapters" / "chapter_001.md").write_text("# Chapter 1\n\nMine.\n")
    with pytest.raises(InvalidInputError, match="holds no Skald project but has chapters/"):
        refuse_unowned_chapters(tmp_path)  # a run lock is no project
    # The look-alikes: a killed first run's or import's own files, beside its store or graph.
    for kept in ("content", "graph"):
        (tmp_path / ".saga" / kept).mkdir()
        refuse_unowned_chapters(tmp_path)
        (tmp_path / ".saga" / kept).rmdir()


def test_a_started_book_refuses_another_genre_acts_or_characters_and_takes_its_own(
    tmp_path: Path,
) -> None:
    from flows.book import resolve_project

    premise = "A ferry pilot keeps a ledger of the drowned."
    spec = resolve_project(tmp_path, premise, "gothic", 2, 3, 5)
    assert (spec.genre, spec.acts, spec.characters) == ("gothic", 2, 5)  # acts <= chapters
    # Continuing: nothing said, or the same said again (acts as asked at the start), is the book.
    assert resolve_project(tmp_path, None, None, 9, None, None) == spec
    assert resolve_project(tmp_path, premise, " gothic ", 9, 3, 5) == spec
    for genre, acts, characters, said in (
        ("horror", None, None, "genre 'gothic', not 'horror'"),
        (None, 1, None, "acts 2, not 1"),
        (None, None, 4, "characters 5, not 4"),
        ("horror", None, 4, "genre 'gothic', not 'horror' and characters 5, not 4"),
    ):
        with pytest.raises(InvalidInputError) as refused:
            resolve_project(tmp_path, None, genre, 9, acts, characters)
        assert str(refused.value).startswith(f"{tmp_path} was started with {said} (")
    # A new book with nothing said takes the defaults.
    fresh = resolve_project(tmp_path / "new", premise, None, 5, None, None)
    assert (fresh.genre, fresh.acts, fresh.characters) == ("literary fiction", 3, 4)


def test_guidance_marks_its_chapter_stale_and_nothing_else(tmp_path: Path) -> None:
    steering = Steering(written={1: fingerprint(""), 2: fingerprint("")})
    assert first_stale_chapter(steering, tmp_path, [1, 2, 3]) is None  # 3: no record, no guidance
    (tmp_path / "guidance").mkdir()
    (tmp_path / "guidance" / "chapter_002.md").write_text("Mara lies.\n")
    assert first_stale_chapter(steering, tmp_path, [1, 2, 3]) == 2
    assert first_stale_chapter(steering, tmp_path, [1]) is None
    steering.written[2] = fingerprint(chapter_guidance(tmp_path, 2, 1))
    assert first_stale_chapter(steering, tmp_path, [1, 2]) is None
    steering.takes[1] = 2  # a redo of chapter 1
    assert first_stale_chapter(steering, tmp_path, [1, 2]) == 1
    assert "take 2" in chapter_guidance(tmp_path, 1, 2) and "Mara lies." in chapter_guidance(
        tmp_path, 2, 1
    )


def test_a_pending_redo_is_resumed_and_another_first_chapter_asks_anew(tmp_path: Path) -> None:
    assert request_redo(tmp_path, 2, 3)
    assert not request_redo(tmp_path, 2, 3)  # the same redo, its run killed: resumed
    assert load_steering(tmp_path).takes == {2: 2, 3: 2}
    assert request_redo(tmp_path, 3, 3)  # another redo while one is pending: new takes
    assert (load_steering(tmp_path).takes, load_steering(tmp_path).redo_pending) == (
        {2: 2, 3: 3},
        3,
    )
    finish_redo(tmp_path)
    assert request_redo(tmp_path, 3, 3)  # finished: the same command is a new redo
    assert load_steering(tmp_path).takes == {2: 2, 3: 4}


def test_split_manuscript_by_level_two_headings_with_title() -> None:
    text = "# My Book\n\nfront matter\n\n## Chapter 1: One\n\nA.\n\n* * *\n\nB.\n\n## Chapter 2\n\nC.\n"
    book = split_manuscript(text, "fallback")
    assert book.title == "My Book"
    assert [(c.number, c.title, c.scenes) for c in book.chapters] == [
        (1, "One", ["A.", "B."]),
        (2, "Chapter 2", ["C."]),
    ]
    assert book.preamble == "front matter"  # not imported, and the import says so


def test_a_manuscript_saved_with_a_byte_order_mark_keeps_its_first_chapter() -> None:
    text = "# Harbor\n\nA.\n\n# Night\n\nC.\n"
    book = split_manuscript("\ufeff" + text, "salt road")
    assert book == split_manuscript(text, "salt road")
    assert [c.title for c in book.chapters] == ["Harbor", "Night"] and book.preamble == ""


def test_split_manuscript_by_level_one_headings() -> None:
    book = split_manuscript("# Harbor\n\nA.\n\n---\n\nB.\n\n# Night\n\nC.\n", "salt road")
    assert book.title == "salt road" and [c.title for c in book.chapters] == ["Harbor", "Night"]
    assert book.chapters[0].scenes == ["A.", "B."]


def test_split_manuscript_without_headings_fails_with_one_line() -> None:
    with pytest.raises(InvalidInputError, match="no chapters"):
        split_manuscript("Just prose, no headings.\n", "x")
