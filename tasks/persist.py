"""Persist the initialization artifacts as the editable story bible, and parse it back.

`characters/<name>.yaml`, `outline/global_outline.md`, `outline/chapters.yaml`,
`world/locations.yaml`, `world/relationships.yaml`. A file the writer changed is never
overwritten (tasks.bible.write_owned); parsing the files back validates them strictly.
"""

from __future__ import annotations

import re

import yaml
from prefect import get_run_logger
from pydantic import BaseModel

from core.content import ContentRef
from core.errors import ContentIntegrityError
from prompts.initialization.models import (
    ActOutline,
    ChapterOutlines,
    CharacterSheets,
    GlobalOutline,
    OutlineRelationships,
)
from tasks.bible import StoryBible, load_story_bible, write_owned
from tasks.policy import plain_task
from tasks.services import Services


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:60] or "unnamed"


def _yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


class InitArtifacts(BaseModel):
    characters: ContentRef
    global_outline: ContentRef
    act_outlines: tuple[ContentRef, ...]
    chapter_outlines: tuple[ContentRef, ...]
    relationships: ContentRef


def initial_bible(services: Services, artifacts: InitArtifacts) -> StoryBible:
    """The story bible as initialization writes it: the baseline of the writer's edits."""
    store = services.content
    rels = store.get_model(artifacts.relationships, OutlineRelationships)
    chapters = [
        c
        for ref in artifacts.chapter_outlines
        for c in store.get_model(ref, ChapterOutlines).chapters
    ]
    return StoryBible.model_validate(
        {
            "characters": [
                c.model_dump()
                for c in store.get_model(artifacts.characters, CharacterSheets).characters
            ],
            "locations": [loc.model_dump() for loc in rels.locations],
            "relationships": [r.model_dump() for r in rels.relationships],
            "chapters": [c.model_dump() for c in chapters],
            "global_outline": global_outline_markdown(services, artifacts),
        }
    )


def global_outline_markdown(services: Services, artifacts: InitArtifacts) -> str:
    store = services.content
    outline = store.get_model(artifacts.global_outline, GlobalOutline)
    acts = [store.get_model(ref, ActOutline) for ref in artifacts.act_outlines]
    md = [f"# {outline.title}\n", f"*{outline.logline}*\n", f"**Setting:** {outline.setting}\n"]
    if outline.themes:
        md.append(f"**Themes:** {', '.join(outline.themes)}\n")
    for act, detail in zip(outline.acts, acts, strict=True):
        md.append(f"## Act {act.number}\n\n{detail.summary}\n")
        md.extend(f"- {event}" for event in detail.key_events)
        md.append("")
    return "\n".join(md)


@plain_task("persist_initialization_files")
def persist_initialization_files(services: Services, artifacts: InitArtifacts) -> list[str]:
    """Write the bible files Skald still owns; returns the files left to the writer's edits."""
    root, saga = services.settings.project_dir, services.settings.saga_dir
    bible = initial_bible(services, artifacts)
    files: dict[str, str] = {
        f"characters/{slug(c.name)}.yaml": _yaml(c.model_dump()) for c in bible.characters
    }
    files["outline/global_outline.md"] = bible.global_outline
    files["outline/chapters.yaml"] = _yaml([c.model_dump() for c in bible.chapters])
    files["world/locations.yaml"] = _yaml([loc.model_dump() for loc in bible.locations])
    files["world/relationships.yaml"] = _yaml([r.model_dump() for r in bible.relationships])
    kept = [rel for rel, text in files.items() if not write_owned(root, saga, rel, text)]
    if kept:
        get_run_logger().info(
            "story bible: left the writer's edits in %s untouched", ", ".join(kept)
        )
    return kept


@plain_task("run_initialization_parsers")
def run_initialization_parsers(services: Services, expected_chapters: int) -> int:
    """Parse the bible back (strictly: a bad edit stops the run with one line)."""
    root = services.settings.project_dir
    bible = load_story_bible(root)
    numbers = [c.number for c in bible.chapters]
    if numbers[:expected_chapters] != list(range(1, expected_chapters + 1)):
        raise ContentIntegrityError(
            f"outline/chapters.yaml numbers chapters {numbers}, expected 1..{expected_chapters}",
            hint="fix the file or delete it and run again",
        )
    return len(numbers)
