"""Persist the initialization artifacts as human-editable files, and parse them back.

`characters/<name>.yaml`, `outline/global_outline.md`, `outline/chapters.yaml`,
`world/locations.yaml`, `world/relationships.yaml`. Parsing them back validates that
what a user would open is complete and well-formed.
"""

from __future__ import annotations

import re

import yaml
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from core.content import ContentRef, write_if_changed
from core.errors import ContentIntegrityError
from core.runtime import runtime
from prompts.initialization.models import (
    ActOutline,
    ChapterOutlines,
    CharacterSheet,
    CharacterSheets,
    GlobalOutline,
    OutlineLocation,
    OutlineRelationship,
    OutlineRelationships,
)


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


@task(name="persist_initialization_files", cache_policy=NO_CACHE, persist_result=False)
def persist_initialization_files(artifacts: InitArtifacts) -> list[str]:
    rt = runtime()
    root = rt.settings.project_dir
    store = rt.content
    written: list[str] = []
    sheets = store.get_model(artifacts.characters, CharacterSheets)
    for character in sheets.characters:
        path = root / "characters" / f"{slug(character.name)}.yaml"
        write_if_changed(path, _yaml(character.model_dump()))
        written.append(str(path))
    outline = store.get_model(artifacts.global_outline, GlobalOutline)
    acts = [store.get_model(ref, ActOutline) for ref in artifacts.act_outlines]
    md = [f"# {outline.title}\n", f"*{outline.logline}*\n", f"**Setting:** {outline.setting}\n",
          f"**Themes:** {', '.join(outline.themes)}\n"]
    for act, detail in zip(outline.acts, acts, strict=True):
        md.append(f"## Act {act.number}\n\n{detail.summary}\n")
        md.extend(f"- {event}" for event in detail.key_events)
        md.append("")
    write_if_changed(root / "outline" / "global_outline.md", "\n".join(md))
    chapters = [c.model_dump() for ref in artifacts.chapter_outlines for c in store.get_model(ref, ChapterOutlines).chapters]
    write_if_changed(root / "outline" / "chapters.yaml", _yaml(chapters))
    rels = store.get_model(artifacts.relationships, OutlineRelationships)
    write_if_changed(root / "world" / "locations.yaml", _yaml([loc.model_dump() for loc in rels.locations]))
    write_if_changed(root / "world" / "relationships.yaml", _yaml([r.model_dump() for r in rels.relationships]))
    written += [str(root / p) for p in ("outline/global_outline.md", "outline/chapters.yaml",
                                        "world/locations.yaml", "world/relationships.yaml")]
    return written


@task(name="run_initialization_parsers", cache_policy=NO_CACHE, persist_result=False)
def run_initialization_parsers(expected_chapters: int) -> int:
    """Parse the persisted files back; raise if anything a later stage needs is missing."""
    root = runtime().settings.project_dir
    try:
        for path in sorted((root / "characters").glob("*.yaml")):
            CharacterSheet.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        chapters = ChapterOutlines.model_validate(
            {"chapters": yaml.safe_load((root / "outline" / "chapters.yaml").read_text(encoding="utf-8"))}
        )
        for item in yaml.safe_load((root / "world" / "locations.yaml").read_text(encoding="utf-8")) or []:
            OutlineLocation.model_validate(item)
        for item in yaml.safe_load((root / "world" / "relationships.yaml").read_text(encoding="utf-8")) or []:
            OutlineRelationship.model_validate(item)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ContentIntegrityError(f"initialization files under {root} are invalid: {exc}",
                                    hint="delete the outline/ and characters/ folders and run again") from exc
    numbers = [c.number for c in chapters.chapters]
    if numbers[:expected_chapters] != list(range(1, expected_chapters + 1)):
        raise ContentIntegrityError(f"outline/chapters.yaml numbers chapters {numbers}, expected 1..{expected_chapters}",
                                    hint="fix the file or delete it and run again")
    return len(numbers)
