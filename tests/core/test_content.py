"""Content store: round trips, versioning, atomicity, integrity checks, refusal rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from core.content import ContentMissingError, ContentRef, ContentStore, read_state, safe_name
from core.errors import ContentIntegrityError, InvalidInputError
from tests.conftest import child_pythonpath


class Beat(BaseModel):
    index: int
    summary: str


class ScenePlan(BaseModel):
    title: str
    beats: list[Beat]


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / ".saga" / "content")


def stored_files(store: ContentStore) -> list[Path]:
    """Artifact files only (not the lock file, and no leftover temp files)."""
    return sorted(p for p in store.root.rglob("*") if p.is_file() and not p.name.startswith("."))


def flip_one_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- round trips


def test_text_round_trip_and_layout(store: ContentStore) -> None:
    text = "Sigrun drew her blade. «Now», she said — and the hall went still.\n"
    ref = store.put_text("scene_text", "chapter_002/scene_01", text)

    assert store.get_text(ref) == text
    assert ref.content_type == "scene_text"
    assert ref.version == 1
    assert ref.size_bytes == len(text.encode("utf-8"))
    assert ref.path == f"scene_text/chapter_002/scene_01.v1.{ref.sha256[:12]}.txt"
    assert (store.root / ref.path).is_file()
    assert store.exists(ref)
    store.verify(ref)


def test_json_round_trip_is_canonical(store: ContentStore) -> None:
    data = {"z": 1, "a": ["ü", 2.5, None], "m": {"y": True, "b": "x"}}
    ref = store.put_json("entities", "chapter_001", data)

    assert store.get_json(ref) == data
    raw = (store.root / ref.path).read_bytes().decode("utf-8")
    assert raw == '{"a":["ü",2.5,null],"m":{"b":"x","y":true},"z":1}'
    # Key order does not matter: same canonical bytes, same ref.
    assert (
        store.put_json(
            "entities", "chapter_001", {"m": {"b": "x", "y": True}, "z": 1, "a": ["ü", 2.5, None]}
        )
        == ref
    )


def test_json_refuses_nan(store: ContentStore) -> None:
    with pytest.raises(ValueError, match="JSON"):
        store.put_json("entities", "bad", {"x": float("nan")})


def test_model_round_trip(store: ContentStore) -> None:
    plan = ScenePlan(
        title="The Long Hall",
        beats=[Beat(index=1, summary="arrival"), Beat(index=2, summary="duel")],
    )
    ref = store.put_json("plans", "chapter_003", plan)

    assert store.get_model(ref, ScenePlan) == plan
    assert store.get_json(ref) == plan.model_dump(mode="json")
    # Models nested inside plain containers are dumped too.
    ref2 = store.put_json("plans", "beats", [Beat(index=1, summary="a")])
    assert store.get_json(ref2) == [{"index": 1, "summary": "a"}]


def test_model_validation_failure_is_integrity_error(store: ContentStore) -> None:
    ref = store.put_json("plans", "wrong_shape", {"title": "x"})
    with pytest.raises(ContentIntegrityError, match="does not validate as ScenePlan"):
        store.get_model(ref, ScenePlan)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(3.5),
        np.zeros((0, 8), dtype=np.int64),
        np.array([1 + 2j, 3 - 4j]),
    ],
    ids=["float32-2d", "0d", "empty", "complex"],
)
def test_array_round_trip(store: ContentStore, array: np.ndarray) -> None:
    ref = store.put_array("embeddings", "chapter_001/scene_01", array)
    loaded = store.get_array(ref)
    assert loaded.dtype == array.dtype
    assert loaded.shape == array.shape
    np.testing.assert_array_equal(loaded, array)


def test_array_layout_does_not_change_identity(store: ContentStore) -> None:
    c_order = np.arange(6, dtype=np.float64).reshape(2, 3)
    f_order = np.asfortranarray(c_order)
    assert store.put_array("embeddings", "e", c_order) == store.put_array(
        "embeddings", "e", f_order
    )


def test_object_dtype_array_refused(store: ContentStore) -> None:
    with pytest.raises(ValueError, match="object dtype"):
        store.put_array("embeddings", "objs", np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match="object dtype"):
        store.put_array("embeddings", "rec", np.zeros(2, dtype=[("x", "f4"), ("o", "O")]))
    assert stored_files(store) == []


def test_get_bytes_returns_stored_bytes(store: ContentStore) -> None:
    ref = store.put_text("drafts", "d", "abc")
    assert store.get_bytes(ref) == b"abc"


def test_wrong_reader_for_kind_is_value_error(store: ContentStore) -> None:
    ref = store.put_text("drafts", "d", "plain")
    with pytest.raises(ValueError, match="get_json"):
        store.get_json(ref)
    with pytest.raises(ValueError, match="get_array"):
        store.get_array(ref)


# ---------------------------------------------------------------- versioning


def test_identical_content_stored_once(store: ContentStore) -> None:
    first = store.put_text("drafts", "chapter_001", "same words")
    second = store.put_text("drafts", "chapter_001", "same words")

    assert second == first
    assert second.version == 1
    assert len(stored_files(store)) == 1
    assert store.versions("drafts", "chapter_001") == [first]


def test_new_content_gets_next_version_and_old_stays_readable(store: ContentStore) -> None:
    v1 = store.put_text("drafts", "chapter_001", "first draft")
    v2 = store.put_text("drafts", "chapter_001", "second draft")

    assert (v1.version, v2.version) == (1, 2)
    assert v1.path != v2.path
    assert store.get_text(v1) == "first draft"
    assert store.get_text(v2) == "second draft"
    assert store.latest("drafts", "chapter_001") == v2
    assert store.versions("drafts", "chapter_001") == [v1, v2]
    assert len(stored_files(store)) == 2


def test_reverting_content_makes_it_latest_again(store: ContentStore) -> None:
    store.put_text("drafts", "c", "A")
    store.put_text("drafts", "c", "B")
    v3 = store.put_text("drafts", "c", "A")

    assert v3.version == 3
    latest = store.latest("drafts", "c")
    assert latest == v3
    assert store.get_text(latest) == "A"


def test_versions_are_per_name_and_type(store: ContentStore) -> None:
    assert store.latest("drafts", "chapter_001") is None
    assert store.versions("drafts", "chapter_001") == []
    a = store.put_text("drafts", "a", "x")
    a_v1 = store.put_text("drafts", "a.v1", "y")  # a name that looks like a versioned file
    a_sub = store.put_text("drafts", "a/b", "z")
    other_type = store.put_text("plans", "a", "w")

    assert store.versions("drafts", "a") == [a]
    assert store.versions("drafts", "a.v1") == [a_v1]
    assert store.versions("drafts", "a/b") == [a_sub]
    assert store.versions("plans", "a") == [other_type]
    assert {r.version for r in (a, a_v1, a_sub, other_type)} == {1}


def test_latest_and_versions_work_from_a_fresh_store(store: ContentStore) -> None:
    store.put_text("drafts", "c", "one")
    v2 = store.put_json("drafts", "c", {"two": 2})
    # Another process sees the same versions: everything is derived from the disk.
    fresh = ContentStore(store.root)
    assert fresh.latest("drafts", "c") == v2
    assert fresh.get_json(v2) == {"two": 2}
    assert fresh.put_text("drafts", "c", "three").version == 3


def test_rewriting_identical_content_repairs_a_corrupt_latest_file(store: ContentStore) -> None:
    ref = store.put_text("drafts", "c", "the true text")
    flip_one_byte(store.root / ref.path, 0)
    assert not store.exists(ref)

    assert store.put_text("drafts", "c", "the true text") == ref
    assert store.get_text(ref) == "the true text"


def test_latest_refuses_a_corrupt_file(store: ContentStore) -> None:
    ref = store.put_text("drafts", "c", "text")
    flip_one_byte(store.root / ref.path, 1)
    with pytest.raises(ContentIntegrityError, match="corrupted"):
        store.latest("drafts", "c")


# ---------------------------------------------------------------- integrity


@pytest.mark.parametrize("kind", ["text", "json", "array"])
def test_flipping_one_byte_raises_on_read(store: ContentStore, kind: str) -> None:
    if kind == "text":
        ref = store.put_text("scene_text", "chapter_001/scene_01", "The raven circled twice.")
        read = store.get_text
    elif kind == "json":
        ref = store.put_json("entities", "chapter_001", {"name": "Sigrun", "role": "shieldmaiden"})
        read = store.get_json
    else:
        ref = store.put_array("embeddings", "chapter_001", np.linspace(0, 1, 16, dtype=np.float32))
        read = store.get_array
    path = store.root / ref.path
    before = path.stat().st_size

    flip_one_byte(path, path.stat().st_size // 2)

    assert path.stat().st_size == before  # same size: only the hash can catch it
    with pytest.raises(ContentIntegrityError) as info:
        read(ref)
    message = str(info.value)
    assert str(path) in message
    assert "sha256" in message and "expected" in message and "found" in message
    assert "delete it and re-run" in message
    assert "\n" not in message
    with pytest.raises(ContentIntegrityError):
        store.get_bytes(ref)
    with pytest.raises(ContentIntegrityError):
        store.verify(ref)
    assert not store.exists(ref)


def test_truncated_file_raises(store: ContentStore) -> None:
    ref = store.put_text("drafts", "chapter_001", "a longer draft that will be cut short")
    path = store.root / ref.path
    path.write_bytes(path.read_bytes()[:10])

    with pytest.raises(ContentIntegrityError, match=rf"expected {ref.size_bytes} bytes, found 10"):
        store.get_text(ref)
    assert not store.exists(ref)


def test_missing_file_raises(store: ContentStore) -> None:
    ref = store.put_text("drafts", "chapter_001", "gone soon")
    (store.root / ref.path).unlink()

    with pytest.raises(ContentMissingError, match="missing"):
        store.get_text(ref)
    with pytest.raises(ContentIntegrityError, match="missing"):
        store.verify(ref)
    assert not store.exists(ref)


def _draft_ref(stem: str, ext: str, sha: str, size: int) -> ContentRef:
    """A ref to version 1 of drafts/`stem`, named as the store names its files."""
    return ContentRef(
        path=f"drafts/{stem}.v1.{sha[:12]}.{ext}",
        content_type="drafts",
        version=1,
        size_bytes=size,
        sha256=sha,
    )


@pytest.mark.parametrize("ext", ["pkl", "pickle", "PKL"])
def test_pickle_ref_refused(store: ContentStore, ext: str) -> None:
    ref = _draft_ref("evil", ext, "ab" * 32, 5)
    path = store.root / ref.path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x80\x04K\x01.")  # pickle of the int 1

    for read in (store.get_bytes, store.get_text, store.get_json, store.get_array, store.verify):
        with pytest.raises(ContentIntegrityError, match="refusing to load pickle"):
            read(ref)
    assert not store.exists(ref)


@pytest.mark.parametrize("ext", ["exe", "npz", "py", "yaml"])
def test_other_extensions_refused(store: ContentStore, ext: str) -> None:
    ref = _draft_ref("x", ext, "cd" * 32, 1)
    with pytest.raises(ContentIntegrityError, match="refusing to load"):
        store.get_bytes(ref)


@pytest.mark.parametrize(
    "path",
    [
        "../outside.v1.{h}.txt",
        "drafts/../../outside.v1.{h}.txt",
        "/etc/passwd.v1.{h}.txt",
        "drafts//x.v1.{h}.txt",
        "other/x.v1.{h}.txt",  # content_type does not match the path
        "drafts/x.v2.{h}.txt",  # version does not match the path
        "drafts/x.v1.000000000000.txt",  # hash does not match the path
    ],
)
def test_unsafe_or_inconsistent_refs_refused(store: ContentStore, path: str) -> None:
    sha = "ef" * 32
    ref = ContentRef(
        path=path.format(h=sha[:12]), content_type="drafts", version=1, size_bytes=1, sha256=sha
    )
    with pytest.raises(ContentIntegrityError, match="refusing|inconsistent"):
        store.get_bytes(ref)


def test_symlink_out_of_store_refused(store: ContentStore, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "x.txt").write_text("secret")
    (store.root / "drafts").mkdir(parents=True)
    (store.root / "drafts" / "leak").symlink_to(outside)
    ref = store.put_text("drafts", "inner", "ok")
    escaped = ref.model_copy(update={"path": f"drafts/leak/inner.v1.{ref.sha256[:12]}.txt"})
    with pytest.raises(ContentIntegrityError, match="outside the store"):
        store.get_bytes(escaped)


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        "../x",
        "a/../b",
        "a/..",
        "/abs/path",
        "a//b",
        "a/",
        "./a",
        ".hidden",
        "a/.lock",
        "a\\b",
        "C:x",
        "sp ace",
        "é",
    ],
)
def test_unsafe_names_rejected(store: ContentStore, name: str) -> None:
    with pytest.raises(ValueError, match="invalid content name"):
        safe_name(name)
    with pytest.raises(ValueError, match="invalid content name"):
        store.put_text("drafts", name, "x")
    with pytest.raises(ValueError, match="invalid content name"):
        store.latest("drafts", name)


@pytest.mark.parametrize("content_type", ["", "..", "a/b", ".x", "a.b"])
def test_unsafe_content_types_rejected(store: ContentStore, content_type: str) -> None:
    with pytest.raises(ValueError, match="invalid content type"):
        store.put_text(content_type, "x", "x")


@pytest.mark.parametrize("name", ["chapter_002/scene_01", "a", "A-b_c.d", "x/y/z", "v1.2"])
def test_safe_names_accepted(store: ContentStore, name: str) -> None:
    assert safe_name(name) == name
    ref = store.put_text("drafts", name, "ok")
    assert store.get_text(ref) == "ok"


# ---------------------------------------------------------------- the ref


def test_ref_is_frozen_hashable_and_json_round_trips(store: ContentStore) -> None:
    ref = store.put_text("drafts", "c", "hello")

    assert hash(ref) == hash(ContentRef(**ref.model_dump()))
    assert {ref: "cached"}[ContentRef(**ref.model_dump())] == "cached"
    as_json = ref.model_dump_json()
    assert ContentRef.model_validate_json(as_json) == ref
    assert ContentRef.model_validate(json.loads(json.dumps(ref.model_dump(mode="json")))) == ref
    with pytest.raises(ValidationError):
        ref.version = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        ContentRef(**ref.model_dump(), extra_field=1)
    with pytest.raises(ValidationError):
        ContentRef(**{**ref.model_dump(), "sha256": "not-a-hash"})


# ---------------------------------------------------------------- atomicity


def test_failed_write_leaves_no_file(store: ContentStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = store.put_text("drafts", "c", "v1 text")

    def crash(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk on fire"):
        store.put_text("drafts", "c", "v2 text")
    monkeypatch.undo()

    # No half-written final file and no leftover temp file; v1 is still the latest.
    assert [p.name for p in store.root.joinpath("drafts").iterdir() if p.name != ".lock"] == [
        Path(ref.path).name
    ]
    assert store.latest("drafts", "c") == ref
    assert store.put_text("drafts", "c", "v2 text").version == 2


# ---------------------------------------------------------------- concurrency


def test_concurrent_threads_same_content_one_file(store: ContentStore) -> None:
    barrier = threading.Barrier(16)

    def write(_: int) -> ContentRef:
        barrier.wait()
        return store.put_text(
            "scene_text", "chapter_001/scene_01", "identical text from every thread"
        )

    with ThreadPoolExecutor(max_workers=16) as pool:
        refs = list(pool.map(write, range(16)))

    assert len(set(refs)) == 1
    assert refs[0].version == 1
    assert len(stored_files(store)) == 1
    assert store.get_text(refs[0]) == "identical text from every thread"


def test_concurrent_threads_different_content_get_distinct_versions(store: ContentStore) -> None:
    barrier = threading.Barrier(12)

    def write(i: int) -> ContentRef:
        barrier.wait()
        return store.put_text("drafts", "chapter_001", f"draft number {i}")

    with ThreadPoolExecutor(max_workers=12) as pool:
        refs = list(pool.map(write, range(12)))

    assert sorted(r.version for r in refs) == list(range(1, 13))
    assert len(stored_files(store)) == 12
    for i, ref in enumerate(refs):
        assert store.get_text(ref) == f"draft number {i}"


#: One writer process: waits for "go" on stdin, so all start together, then writes and prints its ref.
_WRITER = (
    "import sys; from pathlib import Path; from core.content import ContentStore; "
    "sys.stdin.readline(); "
    "print(ContentStore(Path(sys.argv[1])).put_text('drafts', 'shared', sys.argv[2]).model_dump_json())"
)


def test_concurrent_processes_allocate_distinct_versions(store: ContentStore) -> None:
    # Plain subprocesses: a fork copies this test process's JVM (the embedded graph) and the
    # browser tests' Playwright threads (a forked writer exited 1 once in CI), and a spawn
    # context leaves multiprocessing's resource tracker running after the session.
    texts = ["same"] * 3 + [f"different {i}" for i in range(3)]
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(store.root), t],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for t in texts
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    refs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        refs.append(ContentRef.model_validate_json(out.strip().splitlines()[-1]))

    versions = store.versions("drafts", "shared")
    # Every write got a distinct, contiguous version, except identical consecutive ones.
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    assert {r.version for r in refs} == {v.version for v in versions}
    assert len(stored_files(store)) == len(versions)
    assert 4 <= len(versions) <= 6
    for ref in refs:
        store.verify(ref)


def test_text_at_a_path_is_read_only_with_its_hash_and_inside_the_store(tmp_path: Path) -> None:
    from core.content import ContentStore

    store = ContentStore(tmp_path / "content")
    ref = store.put_text("scenes", "chapter_001/scene_01", "The lamp went out.")
    assert store.get_text_at(ref.path, ref.sha256) == "The lamp went out."
    assert store.get_text_at(ref.path, None) == "The lamp went out."
    assert store.get_text_at(ref.path, "0" * 64) is None  # changed since the graph recorded it
    assert store.get_text_at("scenes/missing.txt", None) is None
    (tmp_path / "secret.txt").write_text("outside")
    assert store.get_text_at("../secret.txt", None) is None


def test_a_state_file_reads_as_its_model_and_a_corrupted_one_says_which_and_what_to_do(
    tmp_path: Path,
) -> None:
    class State(BaseModel):
        takes: dict[int, int] = {}

    path = tmp_path / "state.json"
    assert read_state(path, State, "delete it") is None  # none yet
    path.write_text('{"takes": {"2": 3}}')
    assert read_state(path, State, "delete it") == State(takes={2: 3})
    for broken, problem in (
        ('{"takes": {"2": 3}', "Invalid JSON: EOF while parsing"),
        ('{"takes": {"2": "twice"}}', "takes.2: Input should be a valid integer"),
        (b"\xff\xfe", "cannot be read"),
    ):
        if isinstance(broken, bytes):
            path.write_bytes(broken)
        else:
            path.write_text(broken)
        with pytest.raises(InvalidInputError) as caught:
            read_state(path, State, "delete it")
        message = str(caught.value)
        assert str(path) in message and problem in message, message
        assert "\n" not in message and caught.value.hint == "delete it"


def test_a_write_that_fills_the_disk_names_its_file_and_leaves_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from core.content import atomic_write
    from core.errors import disk_full

    path = tmp_path / "exports" / "manuscript.md"
    atomic_write(path, b"# Chapter 1\n")

    def full(fd: int) -> None:  # what the kernel answers when the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as raised:
        atomic_write(path, b"# Chapter 1\n\n# Chapter 2\n")
    assert disk_full(raised.value) is raised.value and raised.value.filename == str(path)
    assert path.read_bytes() == b"# Chapter 1\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["manuscript.md"]  # no temp file
