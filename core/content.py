"""Content store: large artifacts on disk, lightweight immutable references in the pipeline.

Drafts, scene texts, plans, extracted entities and embeddings live under
`<project>/.saga/content/<content_type>/<name>.v<version>.<sha256[:12]>.<ext>`; tasks pass
`ContentRef`s around (small, hashable, JSON-serialisable, good Prefect cache keys).

Guarantees:
- content-addressed and versioned: writing the same bytes as the latest version of a name
  returns that version's ref (no new file); different bytes get `max(version) + 1`, older
  versions are kept. Versions are derived from the files on disk, so every process agrees.
- atomic writes (temp file in the same dir, fsync, os.replace): a crash never leaves a
  half-written file under a final name.
- every read checks size then SHA-256 and raises ContentIntegrityError on any mismatch.
- only .txt/.md, .json and .npy are ever loaded; pickles are refused (they execute code).
- version allocation is serialised per content_type with a thread lock plus fcntl.flock,
  so threads and processes writing the same name never clash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ContentIntegrityError, InvalidInputError, first_error

__all__ = [
    "ContentMissingError",
    "ContentRef",
    "USER_TEXT_ENCODING",
    "ContentStore",
    "safe_content_type",
    "safe_name",
]

M = TypeVar("M", bound=BaseModel)

REGENERATE_HINT = "delete it and re-run; the pipeline will regenerate it"
#: How files a writer edits are read (manuscripts, chapter files, guidance, premises, exports
#: to import): UTF-8, with a byte-order mark (what Windows editors may save) taken as none.
#: Read as plain UTF-8, the mark hid a manuscript's first heading, so its first chapter was lost.
USER_TEXT_ENCODING = "utf-8-sig"
TEXT_EXTS = frozenset({"txt", "md"})
JSON_EXTS = frozenset({"json"})
ARRAY_EXTS = frozenset({"npy"})
ALLOWED_EXTS = TEXT_EXTS | JSON_EXTS | ARRAY_EXTS
PICKLE_EXTS = frozenset({"pkl", "pickle"})
SHORT_HASH = 12
# Leaves room for ".v<version>.<hash12>.<ext>" inside the usual 255-byte file-name limit.
MAX_SEGMENT = 200
_CHUNK = 1 << 20

_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]+")
_CONTENT_TYPE_RE = re.compile(r"[A-Za-z0-9_-]+")
_STORED_RE = re.compile(
    r"(?P<base>.+)\.v(?P<version>[0-9]+)\.(?P<short>[0-9a-f]{12})\.(?P<ext>[a-z]+)"
)


class ContentMissingError(ContentIntegrityError):
    """A ref points at a file that is not in the store."""


class ContentRef(BaseModel):
    """Immutable pointer to one stored version of an artifact (hashable, JSON-safe)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1, description="POSIX path relative to the store root")
    content_type: str = Field(min_length=1)
    version: int = Field(ge=1)
    size_bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @property
    def ext(self) -> str:
        """File extension without the dot, lower-cased ('' when there is none)."""
        name = self.path.rsplit("/", 1)[-1]
        return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def safe_content_type(content_type: str) -> str:
    """Validate a content type: one folder name of [A-Za-z0-9_-], not hidden."""
    if not isinstance(content_type, str) or not _CONTENT_TYPE_RE.fullmatch(content_type):
        raise ValueError(
            f"invalid content type {content_type!r}: use one folder name of letters, digits, '_' or '-'"
        )
    if len(content_type) > MAX_SEGMENT:
        raise ValueError(
            f"invalid content type {content_type[:40]!r}...: longer than {MAX_SEGMENT} characters"
        )
    return content_type


def safe_name(name: str) -> str:
    """Validate an artifact name like 'chapter_002/scene_01' and return it unchanged.

    Segments are [A-Za-z0-9._-] separated by '/'; absolute paths, empty segments, '.'/'..'
    and hidden segments (reserved for the store's lock and temp files) are rejected so a
    name can never escape its content-type folder.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("invalid content name '': it must not be empty")
    if name.startswith("/") or "\\" in name or (len(name) > 1 and name[1] == ":"):
        raise ValueError(
            f"invalid content name {name!r}: absolute paths are not allowed, use a relative name"
        )
    for segment in name.split("/"):
        if not segment:
            raise ValueError(
                f"invalid content name {name!r}: empty path segment (check for '//' or a trailing '/')"
            )
        if segment in (".", ".."):
            raise ValueError(
                f"invalid content name {name!r}: '.' and '..' segments are not allowed"
            )
        if segment.startswith("."):
            raise ValueError(f"invalid content name {name!r}: segments must not start with '.'")
        if not _SEGMENT_RE.fullmatch(segment):
            raise ValueError(
                f"invalid content name {name!r}: segment {segment!r} may only contain letters, digits, '.', '_', '-'"
            )
        if len(segment) > MAX_SEGMENT:
            raise ValueError(
                f"invalid content name {name!r}: a segment is longer than {MAX_SEGMENT} characters"
            )
    return name


def _canonical_json(data: Any) -> bytes:
    """Deterministic JSON bytes, so equal data always hashes (and dedupes) the same."""

    def default(obj: Any) -> Any:
        if isinstance(obj, BaseModel):
            return obj.model_dump(mode="json")
        raise TypeError(
            f"cannot store {type(obj).__name__} as JSON: convert it to plain data or a pydantic model"
        )

    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    try:
        text = json.dumps(
            data,
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
            allow_nan=False,
            default=default,
        )
    except ValueError as exc:  # NaN / Infinity are not JSON
        raise ValueError(f"cannot store data as JSON: {exc}") from exc
    return text.encode("utf-8")


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (best effort where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see either the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are ordinary project files
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            # A write to the open file names no file: the error names the one being written.
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    _fsync_dir(path.parent)


def read_state(path: Path, model: type[M], hint: str) -> M | None:
    """A state file Skald keeps under `.saga/` (the JSON of `model`), or None when there is
    none. One that cannot be read or parsed stops the run with one line naming the file and
    what to do (`hint`), before anything is written: a half-read state would be a guess."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} cannot be read: {exc}", hint=hint) from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        place, message = first_error(exc, path.name)
        where = "" if place == path.name else f"{place}: "
        raise InvalidInputError(f"{path} is corrupted: {where}{message}", hint=hint) from None


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Atomically write `content` (text as UTF-8) unless the file already holds exactly that
    (a re-run then leaves files and their mtimes alone); True if written."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    if path.exists() and path.read_bytes() == data:
        return False
    atomic_write(path, data)
    return True


def _hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, streamed so large arrays are not loaded twice."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


# One in-process lock per lock file: flock alone is per open file description, and the
# thread lock also keeps a process from queueing many descriptors on the same file.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(key, threading.Lock())


class ContentStore:
    """Versioned, content-addressed, integrity-checked artifact store rooted at `root`."""

    safe_name = staticmethod(safe_name)

    def __init__(self, root: Path) -> None:
        # root is `<project>/.saga/content`; it is created lazily on the first write.
        self.root = Path(root)

    # ------------------------------------------------------------------ writes

    def put_text(self, content_type: str, name: str, text: str) -> ContentRef:
        """Store UTF-8 text (drafts, scene texts, plans) as `.txt`."""
        if not isinstance(text, str):
            raise TypeError(f"put_text expects str, got {type(text).__name__}")
        return self._put(content_type, name, text.encode("utf-8"), "txt")

    def put_json(self, content_type: str, name: str, data: Any) -> ContentRef:
        """Store data (or a pydantic model) as canonical JSON (sorted keys, compact, UTF-8)."""
        return self._put(content_type, name, _canonical_json(data), "json")

    def put_array(self, content_type: str, name: str, array: np.ndarray) -> ContentRef:
        """Store a numeric array as `.npy`; object dtypes are refused (they would need pickle)."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"put_array expects numpy.ndarray, got {type(array).__name__}")
        if array.dtype.hasobject:
            raise ValueError(
                f"cannot store array {name!r} with object dtype {array.dtype}: it would need pickle"
            )
        # C order so equal values give equal bytes (0-d arrays are always C-contiguous).
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return self._put(content_type, name, buffer.getvalue(), "npy")

    # ------------------------------------------------------------------ reads

    def get_bytes(self, ref: ContentRef) -> bytes:
        """The stored bytes, after checking size then SHA-256 against the ref."""
        path = self._path_for(ref)
        try:
            with path.open("rb") as handle:
                actual_size = os.fstat(handle.fileno()).st_size
                self._check_size(ref, path, actual_size)
                data = handle.read()
        except FileNotFoundError:
            raise self._missing(ref, path) from None
        except IsADirectoryError:
            raise ContentIntegrityError(
                f"content file {path} is a directory, not a stored artifact", hint=REGENERATE_HINT
            ) from None
        self._check_size(ref, path, len(data))  # the file may have changed after fstat
        self._check_hash(ref, path, hashlib.sha256(data).hexdigest())
        return data

    def get_text(self, ref: ContentRef) -> str:
        """Text of a `.txt`/`.md` (or `.json`) artifact."""
        self._require_ext(ref, TEXT_EXTS | JSON_EXTS, "get_text")
        data = self.get_bytes(ref)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._unreadable(ref, f"is not valid UTF-8 ({exc.reason})") from None

    def get_text_at(self, path: str, sha256: str | None) -> str | None:
        """The text stored at `path` (relative to the root) if it is there and, when `sha256`
        is given, has that hash; None otherwise. For references kept as (path, hash) pairs,
        e.g. on graph nodes."""
        file = (self.root / path).resolve()
        if not file.is_relative_to(self.root.resolve()):
            return None
        try:
            data = file.read_bytes()
        except OSError:
            return None
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            return None
        return data.decode("utf-8", errors="replace")

    def get_json(self, ref: ContentRef) -> Any:
        """Parsed JSON of a `.json` artifact."""
        self._require_ext(ref, JSON_EXTS, "get_json")
        data = self.get_bytes(ref)
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._unreadable(ref, f"is not valid JSON ({exc})") from None

    def get_model(self, ref: ContentRef, model_cls: type[M]) -> M:
        """A `.json` artifact validated as `model_cls`."""
        data = self.get_json(ref)
        try:
            return model_cls.model_validate(data)
        except ValidationError as exc:
            loc, message = first_error(exc, "<root>")
            raise self._unreadable(
                ref, f"does not validate as {model_cls.__name__} ({loc}: {message})"
            ) from None

    def get_array(self, ref: ContentRef) -> np.ndarray:
        """A `.npy` artifact, loaded with allow_pickle=False."""
        self._require_ext(ref, ARRAY_EXTS, "get_array")
        data = self.get_bytes(ref)
        try:
            return np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise self._unreadable(ref, f"is not a loadable .npy array ({exc})") from None

    # ------------------------------------------------------------------ checks

    def verify(self, ref: ContentRef) -> None:
        """Raise ContentIntegrityError unless the file exists and matches size and SHA-256."""
        path = self._path_for(ref)
        try:
            self._check_size(ref, path, path.stat().st_size)
            if not path.is_file():
                raise ContentIntegrityError(
                    f"content file {path} is not a regular file", hint=REGENERATE_HINT
                )
            size, sha = _hash_file(path)
        except FileNotFoundError:
            raise self._missing(ref, path) from None
        self._check_size(ref, path, size)
        self._check_hash(ref, path, sha)

    def exists(self, ref: ContentRef) -> bool:
        """True when the file is present AND its size and SHA-256 match the ref."""
        try:
            self.verify(ref)
        except ContentIntegrityError:
            return False
        return True

    # ------------------------------------------------------------------ versions

    def versions(self, content_type: str, name: str) -> list[ContentRef]:
        """Every stored version of a name, oldest first (derived from the files on disk)."""
        return [
            self._ref_from_disk(content_type, version, path)
            for version, path in self._scan(content_type, name)
        ]

    def latest(self, content_type: str, name: str) -> ContentRef | None:
        """The highest stored version of a name, or None when nothing is stored."""
        found = self._scan(content_type, name)
        if not found:
            return None
        version, path = found[-1]
        return self._ref_from_disk(content_type, version, path)

    # ------------------------------------------------------------------ internals

    def _put(self, content_type: str, name: str, data: bytes, ext: str) -> ContentRef:
        content_type = safe_content_type(content_type)
        name = safe_name(name)
        sha = hashlib.sha256(data).hexdigest()
        with self._allocation_lock(content_type):
            found = self._scan(content_type, name)
            if found:
                version, path = found[-1]
                parsed = _STORED_RE.fullmatch(path.name)
                assert parsed is not None  # _scan only returns matching names
                if parsed["short"] == sha[:SHORT_HASH] and parsed["ext"] == ext:
                    _size, on_disk = _hash_file(path)
                    if on_disk == sha:
                        # Identical to the latest version: stored once, same ref.
                        return self._make_ref(content_type, version, path, len(data), sha)
                    if on_disk[:SHORT_HASH] != parsed["short"]:
                        # The latest file is corrupt and we hold its true bytes: repair in place.
                        atomic_write(path, data)
                        return self._make_ref(content_type, version, path, len(data), sha)
                    # Otherwise a 48-bit prefix collision with different bytes: new version.
            # Dedupe only against the latest version, so after any put latest() holds exactly
            # what was just written (A, B, A gives v3 == A, not a stale v1).
            version = found[-1][0] + 1 if found else 1
            path = self.root / content_type / f"{name}.v{version}.{sha[:SHORT_HASH]}.{ext}"
            atomic_write(path, data)
        return self._make_ref(content_type, version, path, len(data), sha)

    @contextlib.contextmanager
    def _allocation_lock(self, content_type: str) -> Iterator[None]:
        """Serialise version allocation per content_type across threads and processes."""
        directory = self.root / content_type
        directory.mkdir(parents=True, exist_ok=True)
        lock_path = directory / ".lock"
        with _thread_lock(os.path.realpath(lock_path)):
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _scan(self, content_type: str, name: str) -> list[tuple[int, Path]]:
        """(version, path) of every stored file for a name, sorted by version."""
        content_type = safe_content_type(content_type)
        name = safe_name(name)
        base = self.root / content_type / name
        directory, stem = base.parent, base.name
        if not directory.is_dir():
            return []
        found: dict[int, Path] = {}
        for entry in os.scandir(directory):
            parsed = _STORED_RE.fullmatch(entry.name)
            # Exact stem match: name "a" must not pick up files of name "a.v1" and vice versa.
            if parsed is None or parsed["base"] != stem or parsed["ext"] not in ALLOWED_EXTS:
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            version = int(parsed["version"])
            if version in found:
                raise ContentIntegrityError(
                    f"content {content_type}/{name} has two files for version {version} "
                    f"({found[version].name}, {entry.name})",
                    hint="delete the wrong one and re-run",
                )
            found[version] = Path(entry.path)
        return sorted(found.items())

    def _ref_from_disk(self, content_type: str, version: int, path: Path) -> ContentRef:
        """Build a ref by hashing the file; the hash in its name catches corruption."""
        size, sha = _hash_file(path)
        parsed = _STORED_RE.fullmatch(path.name)
        assert parsed is not None
        if sha[:SHORT_HASH] != parsed["short"]:
            raise ContentIntegrityError(
                f"content file {path} is corrupted: its name says sha256 {parsed['short']}..., "
                f"its bytes hash to {sha[:SHORT_HASH]}...",
                hint=REGENERATE_HINT,
            )
        return self._make_ref(content_type, version, path, size, sha)

    def _make_ref(
        self, content_type: str, version: int, path: Path, size: int, sha: str
    ) -> ContentRef:
        rel = path.relative_to(self.root).as_posix()
        return ContentRef(
            path=rel, content_type=content_type, version=version, size_bytes=size, sha256=sha
        )

    def _path_for(self, ref: ContentRef) -> Path:
        """Absolute path of a ref, refusing anything that is not a file this store wrote.

        Refs can arrive from JSON (Prefect results, other processes), so they are checked
        like untrusted input: allowed extension, safe relative path, consistent fields.
        """
        ext = ref.ext
        if ext in PICKLE_EXTS:
            raise ContentIntegrityError(
                f"refusing to load pickle {ref.path!r}: pickles can run arbitrary code",
                hint="store it as .json, .txt or .npy instead",
            )
        if ext not in ALLOWED_EXTS:
            raise ContentIntegrityError(
                f"refusing to load {ref.path!r}: extension {('.' + ext) if ext else '(none)'} is not one of "
                f".txt, .md, .json, .npy",
                hint="only text, JSON and .npy artifacts are loaded",
            )
        try:
            content_type, _, rest = ref.path.partition("/")
            safe_content_type(content_type)
            safe_name(rest)
        except ValueError as exc:
            raise ContentIntegrityError(
                f"refusing content ref with unsafe path {ref.path!r}: {exc}"
            ) from None
        parsed = _STORED_RE.fullmatch(rest.rsplit("/", 1)[-1])
        if (
            content_type != ref.content_type
            or parsed is None
            or int(parsed["version"]) != ref.version
            or parsed["short"] != ref.sha256[:SHORT_HASH]
        ):
            raise ContentIntegrityError(
                f"content ref {ref.path!r} is inconsistent: its path does not match "
                f"content_type={ref.content_type!r}, version={ref.version}, sha256={ref.sha256[:SHORT_HASH]}...",
                hint="refs must come from ContentStore.put_* / latest / versions",
            )
        path = self.root / ref.path
        # Symlinks inside the store must not lead outside it.
        real_root = os.path.realpath(self.root)
        if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
            raise ContentIntegrityError(
                f"refusing content ref {ref.path!r}: it resolves outside the store {self.root}"
            )
        return path

    @staticmethod
    def _require_ext(ref: ContentRef, allowed: frozenset[str], method: str) -> None:
        ext = ref.ext
        if ext in PICKLE_EXTS or ext not in ALLOWED_EXTS:
            return  # _path_for raises the proper ContentIntegrityError
        if ext not in allowed:
            raise ValueError(
                f"{method} cannot read {ref.path!r}: expected {', '.join('.' + e for e in sorted(allowed))}"
            )

    @staticmethod
    def _missing(ref: ContentRef, path: Path) -> ContentMissingError:
        return ContentMissingError(
            f"content file {path} is missing (expected {ref.size_bytes} bytes, sha256 {ref.sha256[:SHORT_HASH]}...)",
            hint="re-run the step that produces it; the pipeline will regenerate it",
        )

    @staticmethod
    def _check_size(ref: ContentRef, path: Path, actual: int) -> None:
        if actual != ref.size_bytes:
            raise ContentIntegrityError(
                f"content file {path} is corrupted: expected {ref.size_bytes} bytes, found {actual}",
                hint=REGENERATE_HINT,
            )

    @staticmethod
    def _check_hash(ref: ContentRef, path: Path, actual: str) -> None:
        if actual != ref.sha256:
            raise ContentIntegrityError(
                f"content file {path} is corrupted: expected sha256 {ref.sha256[:16]}..., "
                f"found {actual[:16]}...",
                hint=REGENERATE_HINT,
            )

    def _unreadable(self, ref: ContentRef, why: str) -> ContentIntegrityError:
        return ContentIntegrityError(
            f"content file {self.root / ref.path} {why}", hint=REGENERATE_HINT
        )
