"""The writer's steering of single chapters: guidance files, redo, and what must be redone.

- `guidance/chapter_NNN.md` (free text) steers chapter N's outline refresh, scene plan and
  drafts. It is an input of those cached tasks, so changing it changes their cache keys.
- A redo (`--redo-from N`) raises the "take" of chapters N.. by one; a take above 1 adds a
  note to the chapter's guidance, so the chapter is written afresh rather than replayed.
  The redo stays pending until a run finishes: the same `--redo-from N` given again to a run
  that was killed or failed before its end resumes that redo (the takes it asked for) instead
  of asking for new ones, so the book ends as the uninterrupted redo would have left it.
- `.saga/steering.json` records, per written chapter, the fingerprint of the guidance and
  take it was written with. When a written chapter's fingerprint no longer matches (its
  guidance file changed, or a redo asked for it), chapters from the first such one on are
  rolled back in the graph (exactly, newest first) and their files moved aside under
  `chapters/replaced/<UTC time>/`; they are then written again. Earlier chapters replay
  from the cache with no LLM call.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from prefect import get_run_logger
from pydantic import BaseModel, Field

from core.content import USER_TEXT_ENCODING, ContentRef, atomic_write, read_state
from core.errors import InvalidInputError
from prompts import render_text
from prompts.initialization.models import ChapterOutline
from tasks.export import set_aside
from tasks.policy import graph_task
from tasks.services import Services

STEERING_FILE = "steering.json"


class WrittenWith(BaseModel):
    """The inputs a written chapter was made with: replaying them hits the cache exactly."""

    outline: ChapterOutline
    character_names: tuple[str, ...]
    planned: ChapterOutline | None = Field(
        None,
        description="the chapter's plan in outline/chapters.yaml when it was written (None: it "
        "had none, or the record is older than plans in records)",
    )


class ImportedChapter(BaseModel):
    """A chapter of an imported manuscript: not written by Skald, so never replayed."""

    title: str
    summary: str
    ending: str
    text: ContentRef | None = Field(
        None,
        description="the chapter's text as imported (content store): a deleted chapter file is "
        "restored from it (None in projects imported before it was kept)",
    )


class Steering(BaseModel):
    """What `.saga/steering.json` holds."""

    takes: dict[int, int] = Field(
        default_factory=dict, description="chapter -> take (1 when absent)"
    )
    written: dict[int, str] = Field(
        default_factory=dict, description="chapter -> fingerprint it was written with"
    )
    inputs: dict[int, WrittenWith] = Field(
        default_factory=dict, description="chapter -> its outline and cast"
    )
    imported: dict[int, ImportedChapter] = Field(
        default_factory=dict, description="chapters of an imported manuscript"
    )
    redo_pending: int | None = Field(
        default=None,
        description="the first chapter of a redo whose run has not finished (None when none)",
    )


def guidance_path(project_dir: Path, number: int) -> Path:
    return project_dir / "guidance" / f"chapter_{number:03d}.md"


#: A file in guidance/ named as if for a chapter ("chapter_1.md", "Chapter-01.txt", "ch3.md"):
#: read only under its exact name, so any other spelling would be ignored without a word.
_GUIDANCE_LIKE = re.compile(r"ch(?:apter)?[ _-]?0*(\d+)\.(?:md|markdown|txt)", re.IGNORECASE)


def guidance_files(project_dir: Path) -> dict[int, Path]:
    """The chapters' guidance files (chapter -> path); InvalidInputError naming a file in
    guidance/ whose name looks like a chapter's guidance but is not the name read, with the
    name to give it. Files named otherwise (notes) are left alone."""
    found: dict[int, Path] = {}
    folder = project_dir / "guidance"
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        like = _GUIDANCE_LIKE.fullmatch(path.name)
        if like is None or not path.is_file():
            continue
        number = int(like.group(1))
        expected = guidance_path(project_dir, number)
        if number >= 1 and path.name == expected.name:
            found[number] = path
            continue
        if number < 1:
            hint = "chapters are numbered from 1"
        elif expected.exists():
            hint = f"guidance/{expected.name} is the one read: merge the two, then remove this one"
        else:
            hint = f"rename it to guidance/{expected.name}"
        raise InvalidInputError(
            f"guidance/{path.name}: not read as guidance (only guidance/chapter_NNN.md is)",
            hint=hint,
        )
    return found


def read_guidance(project_dir: Path, number: int) -> str:
    path = guidance_path(project_dir, number)
    if not path.is_file():
        return ""
    try:
        return path.read_text(encoding=USER_TEXT_ENCODING).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(
            f"{path.relative_to(project_dir)}: cannot be read: {exc}", hint="save it as UTF-8 text"
        ) from None


def load_steering(saga_dir: Path) -> Steering:
    hint = "delete it (chapters are then taken as written with their current guidance)"
    return read_state(saga_dir / STEERING_FILE, Steering, hint) or Steering()


def save_steering(saga_dir: Path, steering: Steering) -> None:
    atomic_write(
        saga_dir / STEERING_FILE, (steering.model_dump_json(indent=2) + "\n").encode("utf-8")
    )


def chapter_guidance(project_dir: Path, number: int, take: int) -> str:
    """The writer's steering text for a chapter: its guidance file, plus a redo note after a redo."""
    parts = [read_guidance(project_dir, number)]
    if take > 1:
        parts.append(render_text("narrative/redo_note", take=take))
    text = "\n\n".join(p for p in parts if p)
    return render_text("narrative/writer_guidance", guidance=text) if text else ""


def fingerprint(guidance: str) -> str:
    return hashlib.sha256(guidance.encode("utf-8")).hexdigest()[:16]


def first_stale_chapter(steering: Steering, project_dir: Path, written: list[int]) -> int | None:
    """The first written chapter whose guidance or take changed since it was written.

    A chapter without a record was written before guidance existed: with no guidance file
    and no redo, it is up to date.
    """
    for number in sorted(written):
        current = fingerprint(chapter_guidance(project_dir, number, steering.takes.get(number, 1)))
        if steering.written.get(number, fingerprint("")) != current:
            return number
    return None


@graph_task("roll_back_chapters_from")
def roll_back_chapters_from(services: Services, first: int, reason: str) -> list[int]:
    """Roll back chapters `first`.. in the graph (newest first, with any story-bible syncs made
    after them) and move their files aside; returns the chapters rolled back."""
    log = get_run_logger()
    committed = [c for c in services.graph_reader.committed_chapters() if c.chapter >= first]
    rolled: list[int] = []
    if committed:
        oldest = min(committed, key=lambda c: c.seq).chapter
        result = services.graph_writer.rollback_chapter(oldest, cascade=True)
        rolled = result.chapters
        log.info(
            "%s: rolled back change-sets %s (newest first): %d nodes and %d relationships removed, "
            "%d nodes restored",
            reason,
            rolled,
            result.deleted_nodes,
            result.deleted_relationships,
            result.restored_nodes,
        )
    root = services.settings.project_dir
    files = sorted(
        p
        for p in (root / "chapters").glob("chapter_*.md")
        if p.stem.removeprefix("chapter_").isdigit()
        and int(p.stem.removeprefix("chapter_")) >= first
    )
    if files:
        log.info("%s: previous chapter files kept in %s", reason, set_aside(root, files))
    steering = load_steering(services.settings.saga_dir)
    steering.written = {n: f for n, f in steering.written.items() if n < first}
    steering.inputs = {n: w for n, w in steering.inputs.items() if n < first}
    steering.imported = {n: c for n, c in steering.imported.items() if n < first}
    save_steering(services.settings.saga_dir, steering)
    return rolled


def request_redo(saga_dir: Path, first: int, last_known: int) -> bool:
    """Raise the take of chapters first..last_known by one (the redo's new versions), unless
    the same redo is still pending (its run was killed or failed): then it is resumed, with the
    takes it already asked for. True when new takes were asked for."""
    steering = load_steering(saga_dir)
    if steering.redo_pending == first:
        return False
    for number in range(first, max(first, last_known) + 1):
        steering.takes[number] = steering.takes.get(number, 1) + 1
    steering.redo_pending = first
    save_steering(saga_dir, steering)
    return True


def finish_redo(saga_dir: Path) -> None:
    """A run reached its end: a pending redo is done, so the same `--redo-from` asks anew."""
    steering = load_steering(saga_dir)
    if steering.redo_pending is not None:
        steering.redo_pending = None
        save_steering(saga_dir, steering)


def record_written(
    saga_dir: Path,
    number: int,
    guidance: str,
    outline: ChapterOutline,
    character_names: tuple[str, ...],
    planned: ChapterOutline | None,
) -> None:
    steering = load_steering(saga_dir)
    written = WrittenWith(outline=outline, character_names=character_names, planned=planned)
    if (
        steering.written.get(number) != fingerprint(guidance)
        or steering.inputs.get(number) != written
    ):
        steering.written[number] = fingerprint(guidance)
        steering.inputs[number] = written
        save_steering(saga_dir, steering)


def written_chapters(services: Services) -> list[int]:
    """Chapters with a committed change-set or a chapter file."""
    numbers = {c.chapter for c in services.graph_reader.committed_chapters() if c.chapter > 0}
    for path in (services.settings.project_dir / "chapters").glob("chapter_*.md"):
        digits = path.stem.removeprefix("chapter_")
        if digits.isdigit():
            numbers.add(int(digits))
    return sorted(numbers)
