"""Writing a vault without touching the writer's notes: the story bible's ownership rule
(tasks/bible.py) for a folder of notes.

Skald records the SHA-256 of every note it wrote in `<vault>/.skald/written.json` (Obsidian
hides folders whose name starts with a dot). On a later export a note is rewritten only
while it holds exactly what Skald last wrote there, or does not exist; a note the writer
edited, and every note Skald did not write, is never touched. A file that already holds
exactly the new text becomes Skald's (a vault copied elsewhere, a record lost).

Stale notes (an entity a rollback or a merge took out of the graph, a scene a revision
dropped): removed while unchanged; a stale note the writer edited stays, and from then on is
simply the writer's (Skald forgets it).

An interrupted export loses nothing: the record is saved before any note is written, naming
for each note both what Skald wrote before and what it is about to write, and is narrowed to
the new text at the end. A note left with either is still Skald's on the next run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.content import atomic_write
from core.errors import InvalidInputError, first_problem
from kg.vault.notes import VaultNote

RECORD_FILE = Path(".skald") / "written.json"


class WrittenRecord(BaseModel):
    """`.skald/written.json`: per note path, the SHA-256 of what Skald may have left there."""

    model_config = ConfigDict(extra="forbid")

    notes: dict[str, list[str]] = Field(default_factory=dict)


class VaultReport(BaseModel):
    """What an export did, note paths relative to the vault."""

    notes: int = Field(description="notes the world has")
    links: int = Field(description="[[links]] in them")
    written: list[str] = Field(default_factory=list, description="new or rewritten notes")
    unchanged: list[str] = Field(default_factory=list, description="already held the new text")
    kept: list[str] = Field(default_factory=list, description="the writer's: left as they are")
    removed: list[str] = Field(
        default_factory=list, description="stale notes of Skald's, unchanged, deleted"
    )
    released: list[str] = Field(
        default_factory=list, description="stale notes the writer edited: left, now theirs"
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_record(vault: Path) -> WrittenRecord:
    path = vault / RECORD_FILE
    if not path.exists():
        return WrittenRecord()
    try:
        return WrittenRecord.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else first_problem(exc, "record").message
        raise InvalidInputError(
            f"{path} is not Skald's record of the notes it wrote: {reason}",
            hint="remove it to start over: Skald then takes every existing note as yours",
        ) from None


def _save_record(vault: Path, notes: dict[str, list[str]]) -> None:
    ordered = {path: sorted(set(shas)) for path, shas in sorted(notes.items())}
    atomic_write(
        vault / RECORD_FILE, (json.dumps({"notes": ordered}, indent=1) + "\n").encode("utf-8")
    )


def _current(path: Path) -> bytes | None:
    """The note's bytes; None if there is no file (a folder in its place counts as the writer's;
    a file in place of its folder fails the write that needs the folder, after the record)."""
    if path.is_dir():
        return b"\0folder"
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_vault(notes: Sequence[VaultNote], vault: Path) -> VaultReport:
    """Write `notes` under `vault` by the ownership rule; the report says what happened."""
    wanted = {note.path: note.text.encode("utf-8") for note in notes}
    record = _read_record(vault)
    report = VaultReport(notes=len(wanted), links=sum(len(note.links) for note in notes))
    owned = dict(record.notes)
    plan: dict[str, bytes] = {}
    for rel, data in wanted.items():
        current = _current(vault / rel)
        if current == data:
            report.unchanged.append(rel)
            owned[rel] = [_sha(data)]
        elif current is None or _sha(current) in owned.get(rel, []):
            plan[rel] = data
        else:
            report.kept.append(rel)
            owned.pop(rel, None)
    stale = sorted(set(owned) - set(wanted))
    if plan or stale or owned != record.notes:
        # Saved first: a note left half-way by a crash is still Skald's, old text or new.
        _save_record(
            vault,
            {**owned, **{rel: [*owned.get(rel, []), _sha(data)] for rel, data in plan.items()}},
        )
    for rel, data in plan.items():
        atomic_write(vault / rel, data)
        owned[rel] = [_sha(data)]
        report.written.append(rel)
    for rel in stale:
        path = vault / rel
        current = _current(path)
        if current is not None and _sha(current) in owned[rel]:
            path.unlink()
            report.removed.append(rel)
        elif current is not None:
            report.released.append(rel)
        del owned[rel]
    if owned != record.notes or plan:
        _save_record(vault, owned)
    return report
