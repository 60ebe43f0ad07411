"""The story bible: `characters/*.yaml`, `world/*.yaml` and `outline/*` are the writer's.

Read and validated on every run (strict pydantic models: an unknown field or a wrong type
stops the run with one line naming the file, the field and what is allowed, before anything
is written), and differences are synced to the graph as their own change-set.

Ownership: Skald records the SHA-256 of every bible file it writes in
`.saga/bible/written.json`. It (re)writes a file only while the file still holds exactly
what Skald last wrote there (or does not exist); a file the writer changed is never
touched again.

Sync: the baseline is what the graph last received from the bible (the initialization
artifacts, or the snapshot kept for the newest bible change-set still in the graph, under
`.saga/bible/synced/<delta hash>.json`), so the sync is exact under rollback. Only fields the
writer changed since the baseline are pushed: facts the chapters added to the graph (an
extracted trait, say) are not undone by an unchanged file. A bible change-set is keyed
-1, -2, ... (`python -m kg rollback --chapter -1` undoes it like a chapter) and holds from
the last written chapter on, so the next chapter's prompts see it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from core.content import USER_TEXT_ENCODING, atomic_write, read_state
from core.errors import InvalidInputError, first_problem
from kg import vocabulary as vocab
from kg.models import (
    ChapterDelta,
    Entity,
    EntitySource,
    PropertyUpdate,
    Relationship,
    user_location,
)
from prompts.initialization.models import (
    ChapterOutline,
    CharacterSheet,
    OutlineLocation,
    OutlineRelationship,
)
from tasks.policy import graph_task
from tasks.services import Services

CHARACTERS_DIR = "characters"
LOCATIONS_FILE = "world/locations.yaml"
RELATIONSHIPS_FILE = "world/relationships.yaml"
CHAPTERS_FILE = "outline/chapters.yaml"
GLOBAL_OUTLINE_FILE = "outline/global_outline.md"
_STRICT = ConfigDict(extra="forbid", strict=True)
# Character sheet fields kept as entity attributes (the rest are core entity fields).
CHARACTER_ATTRIBUTES = ("role", "motivation", "backstory", "voice")


class BibleCharacter(CharacterSheet):
    """characters/<name>.yaml: one character."""

    model_config = _STRICT


class BibleLocation(OutlineLocation):
    model_config = _STRICT


class BibleRelationship(OutlineRelationship):
    model_config = _STRICT


class BibleChapter(ChapterOutline):
    model_config = _STRICT


class StoryBible(BaseModel):
    """Everything the writer can edit, as read from the project's files."""

    characters: list[BibleCharacter] = Field(default_factory=list)
    locations: list[BibleLocation] = Field(default_factory=list)
    relationships: list[BibleRelationship] = Field(default_factory=list)
    chapters: list[BibleChapter] = Field(default_factory=list)
    global_outline: str = ""

    def character_lines(self) -> tuple[str, ...]:
        """One line per character for prompts (who they are and what drives them)."""
        lines = []
        for c in self.characters:
            parts = [f"{c.name} ({c.role})" if c.role else c.name]
            if c.description:
                parts.append(c.description)
            if c.traits:
                parts.append("traits: " + ", ".join(c.traits))
            if c.motivation:
                parts.append("motivation: " + c.motivation)
            lines.append("; ".join(parts))
        return tuple(lines)


# --- Reading and validating ------------------------------------------------------------------


def _describe_allowed(model: type[BaseModel]) -> str:
    return ", ".join(model.model_fields)


def _one_error(
    rel: str, exc: ValidationError, model: type[BaseModel], index: int | None
) -> InvalidInputError:
    """The first validation problem as one line: file, field, what is allowed."""
    problem = first_problem(exc, "(top level)")
    error, loc = problem.detail, problem.place
    where = (
        f"{rel}: entry {index + 1}, field '{loc}'" if index is not None else f"{rel}: field '{loc}'"
    )
    if problem.type == "extra_forbidden":
        return InvalidInputError(
            f"{where}: unknown field; allowed fields: {_describe_allowed(model)}",
            hint="fix or remove it and run again",
        )
    field = model.model_fields.get(str(error["loc"][0])) if error["loc"] else None
    expected = f" (expected {_type_name(field.annotation)})" if field is not None else ""
    got = (
        f", got {type(error['input']).__name__} {str(error['input'])[:40]!r}"
        if "input" in error
        else ""
    )
    return InvalidInputError(
        f"{where}: {problem.message}{expected}{got}", hint="fix it and run again"
    )


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return {"str": "text", "int": "a whole number"}.get(text, text.replace("typing.", ""))


def _load_yaml(root: Path, rel: str) -> Any:
    path = root / rel
    try:
        return yaml.safe_load(path.read_text(encoding=USER_TEXT_ENCODING))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{rel}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidInputError(
            f"{rel}: not valid YAML{line}: {getattr(exc, 'problem', exc)}",
            hint="fix the file and run again",
        ) from None


def _validated(rel: str, data: Any, model: type[BaseModel], index: int | None = None) -> Any:
    if not isinstance(data, dict):
        where = f"{rel}: entry {index + 1}" if index is not None else rel
        raise InvalidInputError(
            f"{where}: must be a mapping of fields ({_describe_allowed(model)}), "
            f"got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _one_error(rel, exc, model, index) from None


def _validated_list(root: Path, rel: str, model: type[BaseModel]) -> list[Any]:
    if not (root / rel).is_file():
        return []
    data = _load_yaml(root, rel)
    if data is None:
        return []
    if not isinstance(data, list):
        raise InvalidInputError(
            f"{rel}: must be a list of entries ({_describe_allowed(model)}), got {type(data).__name__}"
        )
    return [_validated(rel, item, model, i) for i, item in enumerate(data)]


def load_story_bible(root: Path) -> StoryBible:
    """Read and validate every bible file under `root`; InvalidInputError (one line) if any is bad."""
    characters = []
    seen: dict[str, str] = {}
    folder = root / CHARACTERS_DIR
    # .yml as well: a sheet the writer adds under YAML's other extension would otherwise be
    # left out without a word.
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        rel = str(path.relative_to(root))
        character = _validated(rel, _load_yaml(root, rel), BibleCharacter)
        key = vocab.normalize_name(character.name)
        if key in seen:
            raise InvalidInputError(
                f"{rel}: field 'name': {character.name!r} is already the character of {seen[key]}",
                hint="one file per character: rename or remove one of them",
            )
        seen[key] = rel
        characters.append(character)
    chapters = _validated_list(root, CHAPTERS_FILE, BibleChapter)
    numbers = [c.number for c in chapters]
    if len(set(numbers)) != len(numbers):
        raise InvalidInputError(
            f"{CHAPTERS_FILE}: field 'number': chapter numbers repeat ({numbers})",
            hint="number chapters 1, 2, 3, ... once each",
        )
    outline_path = root / GLOBAL_OUTLINE_FILE
    try:
        global_outline = (
            outline_path.read_text(encoding=USER_TEXT_ENCODING) if outline_path.is_file() else ""
        )
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{GLOBAL_OUTLINE_FILE}: cannot be read: {exc}") from None
    return StoryBible(
        characters=characters,
        locations=_validated_list(root, LOCATIONS_FILE, BibleLocation),
        relationships=_validated_list(root, RELATIONSHIPS_FILE, BibleRelationship),
        chapters=sorted(chapters, key=lambda c: c.number),
        global_outline=global_outline,
    )


# --- Writing without overwriting the writer's edits ------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _written_path(saga_dir: Path) -> Path:
    return saga_dir / "bible" / "written.json"


class WrittenRecords(RootModel[dict[str, str]]):
    """`.saga/bible/written.json`: each bible file's SHA-256 as Skald last wrote it."""


#: Without the records every bible file that differs from what Skald would write is the
#: writer's: deleting them never overwrites an edit.
_WRITTEN_HINT = (
    "delete it (Skald then rewrites no bible file that differs from what it would write)"
)


def write_owned(root: Path, saga_dir: Path, rel: str, text: str) -> bool:
    """Write a bible file unless the writer changed it; True if the file now holds `text`.

    A file is Skald's while it holds exactly what Skald last wrote (its SHA-256 is recorded);
    a file without a record is Skald's only if it already holds `text`.
    """
    record_path = _written_path(saga_dir)
    held = read_state(record_path, WrittenRecords, _WRITTEN_HINT)
    records = held.root if held is not None else {}
    path = root / rel
    data = text.encode("utf-8")
    if path.exists():
        current = path.read_bytes()
        if current != data and records.get(rel) != _sha(current):
            return False  # the writer's file: never overwritten
        if current != data:
            atomic_write(path, data)
    else:
        atomic_write(path, data)
    if records.get(rel) != _sha(data):
        records[rel] = _sha(data)
        atomic_write(
            record_path, (json.dumps(records, indent=2, sort_keys=True) + "\n").encode("utf-8")
        )
    return True


# --- Syncing to the graph ---------------------------------------------------------------------


def _snapshot_path(saga_dir: Path, delta_hash: str) -> Path:
    return saga_dir / "bible" / "synced" / f"{delta_hash}.json"


def bible_delta(
    baseline: StoryBible, current: StoryBible, as_of: int, key: int
) -> ChapterDelta | None:
    """The writer's changes since `baseline` as a bible change-set (None: nothing changed).

    Removing a character or a relationship from the files does not delete it from the graph
    (chapters already written mention it); say so in the README.
    """
    source = EntitySource(type="user", chapter=as_of, confidence=1.0)
    characters, character_updates = _character_changes(baseline, current, source)
    locations, location_updates = _location_changes(baseline, current, source)
    entities = characters + locations
    updates = character_updates + location_updates
    relationships = _new_relationships(baseline, current, as_of)
    if not (entities or updates or relationships):
        return None
    return ChapterDelta(
        chapter=as_of,
        changeset=key,
        source_type="user",
        entities=entities,
        relationships=relationships,
        property_updates=updates,
    )


def _character_changes(
    baseline: StoryBible, current: StoryBible, source: EntitySource
) -> tuple[list[Entity], list[PropertyUpdate]]:
    """The characters new since `baseline`, and the changed properties of the others."""
    before = {vocab.normalize_name(c.name): c for c in baseline.characters}
    entities: list[Entity] = []
    updates: list[PropertyUpdate] = []
    for character in current.characters:
        old = before.get(vocab.normalize_name(character.name))
        attributes = {k: getattr(character, k) for k in CHARACTER_ATTRIBUTES}
        if old is None:
            entities.append(
                Entity(
                    label="Character",
                    name=character.name,
                    description=character.description,
                    traits=list(dict.fromkeys(character.traits)),
                    attributes=attributes,
                    sources=[source.model_copy(update={"original_name": character.name})],
                    is_provisional=False,
                )
            )
            continue
        changes: dict[str, Any] = {}
        if character.description != old.description:
            changes["description"] = character.description
        if character.traits != old.traits:
            changes["traits"] = list(dict.fromkeys(character.traits))
        for name in CHARACTER_ATTRIBUTES:
            if getattr(character, name) != getattr(old, name):
                changes[name] = getattr(character, name)
        if changes:
            updates.append(
                PropertyUpdate(entity=character.name, label="Character", changes=changes)
            )
    return entities, updates


def _location_changes(
    baseline: StoryBible, current: StoryBible, source: EntitySource
) -> tuple[list[Entity], list[PropertyUpdate]]:
    """The locations new since `baseline`, and the changed descriptions of the others."""
    places = {vocab.normalize_name(p.name): p for p in baseline.locations}
    entities: list[Entity] = []
    updates: list[PropertyUpdate] = []
    for place in current.locations:
        old_place = places.get(vocab.normalize_name(place.name))
        if old_place is None and place.name.strip():
            entities.append(user_location(place.name, place.description, source))
        elif old_place is not None and old_place.description != place.description:
            updates.append(
                PropertyUpdate(
                    entity=place.name, label="Location", changes={"description": place.description}
                )
            )
    return entities, updates


def _new_relationships(baseline: StoryBible, current: StoryBible, as_of: int) -> list[Relationship]:
    """The relationships new since `baseline` (one of an entity with itself left out)."""
    known = {
        (vocab.normalize_name(r.source), r.type.upper(), vocab.normalize_name(r.target))
        for r in baseline.relationships
    }
    relationships = []
    for rel in current.relationships:
        ends = (vocab.normalize_name(rel.source), vocab.normalize_name(rel.target))
        if (ends[0], rel.type.upper(), ends[1]) in known or not all(ends) or ends[0] == ends[1]:
            continue
        relationships.append(
            Relationship(
                source=rel.source,
                target=rel.target,
                type=rel.type,
                chapter=as_of,
                description=rel.description,
            )
        )
    return relationships


LEARNED_DIR = "characters/learned"


@graph_task("write_learned_characters")
def write_learned_characters(services: Services) -> list[str]:
    """Characters the chapters introduced that the bible does not have, as generated files
    under `characters/learned/` (never read as bible; move one into `characters/` to adopt
    it). Like every bible file, one the writer edited is left alone."""
    root = services.settings.project_dir
    bible = load_story_bible(root)
    known = {vocab.normalize_name(n) for c in bible.characters for n in (c.name,)}
    written = []
    for entity in services.graph_reader.entities_with_label("Character"):
        if {vocab.normalize_name(n) for n in (entity.name, *entity.aliases)} & known:
            continue
        sheet = {
            "name": entity.name,
            "role": str(entity.attributes.get("role") or ""),
            "description": entity.description,
            "traits": list(entity.traits)[:8],
            "motivation": str(entity.attributes.get("motivation") or ""),
            "backstory": str(entity.attributes.get("backstory") or ""),
            "voice": str(entity.attributes.get("voice") or ""),
        }
        rel = f"{LEARNED_DIR}/{_slug(entity.name)}.yaml"
        if write_owned(
            root,
            services.settings.saga_dir,
            rel,
            yaml.safe_dump(sheet, sort_keys=False, allow_unicode=True, width=100),
        ):
            written.append(rel)
    if written:
        get_run_logger().info(
            "story bible: %d characters learned from the chapters in %s", len(written), LEARNED_DIR
        )
    return written


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:60] or "unnamed"


@graph_task("sync_story_bible")
def sync_story_bible(services: Services, initial: StoryBible) -> str | None:
    """Commit the writer's bible edits as their own change-set; returns its hash (None: no edits).

    `initial` is the bible as initialization wrote it (the graph's chapter 0).
    """
    log = get_run_logger()
    current = load_story_bible(services.settings.project_dir)
    changesets = services.graph_reader.committed_chapters()
    bible_sets = [c for c in changesets if c.chapter < 0]
    baseline = initial
    if bible_sets:
        snapshot = read_state(
            _snapshot_path(services.settings.saga_dir, bible_sets[-1].delta_hash),
            StoryBible,
            "delete it (the bible is then compared with the one initialization wrote)",
        )
        if snapshot is not None:
            baseline = snapshot
        else:
            log.warning(
                "story bible: no snapshot for the newest bible change-set; comparing with initialization"
            )
    as_of = max((c.chapter for c in changesets), default=0)
    key = min((c.chapter for c in bible_sets), default=0) - 1
    delta = bible_delta(baseline, current, max(as_of, 0), key)
    if delta is None:
        log.info("story bible: no edits to sync")
        return None
    digest = delta.delta_hash()
    # The snapshot first: a crash between the two leaves an unused file, never a commit without one.
    atomic_write(
        _snapshot_path(services.settings.saga_dir, digest),
        current.model_dump_json(indent=2).encode("utf-8"),
    )
    result = services.graph_writer.commit_chapter(delta)
    log.info(
        "story bible: synced the writer's edits as change-set %d (%d entities added, %d updated, "
        "%d relationships added; holds from chapter %d on)",
        key,
        len(delta.entities),
        len(delta.property_updates),
        len(delta.relationships),
        delta.chapter,
    )
    return result.delta_hash
