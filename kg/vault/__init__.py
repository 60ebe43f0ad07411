"""The story world as an Obsidian vault: a folder of Markdown notes a writer can keep
beside their own (`python -m kg vault --out DIR`).

- `notes`: the notes, built from the codex page of the book (kg.codex.novel reads the world
  as of a chapter: entities with their sheet, status, evidence and relationships, chapters
  with their scenes): one per character, place, item or other entry, chapter and scene, the
  story bible and an Index, each with YAML front matter and `[[links]]` that all resolve;
- `owned`: writing them by the story bible's ownership rule: a note is rewritten only while
  it holds what Skald last wrote, so the writer's edits and notes are never touched.

Why Markdown files and no Obsidian API: a vault is a plain folder (Obsidian's own format is
Markdown with YAML front matter and `[[wikilinks]]`), so the export needs no plugin and
works for any editor that reads the same conventions.
"""

from __future__ import annotations

from pathlib import Path

from kg.vault.notes import VaultNote, vault_notes
from kg.vault.owned import RECORD_FILE, VaultReport, write_vault

#: Where a project's vault goes unless `--out` says otherwise.
VAULT_DIR = Path("exports") / "vault"

__all__ = ["RECORD_FILE", "VAULT_DIR", "VaultNote", "VaultReport", "vault_notes", "write_vault"]
