"""Reading an Obsidian vault as Obsidian does: a note's YAML front matter, and which
[[links]] name no note nor alias."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

#: A [[link]] not escaped by a backslash; its target is what comes before `|` or `#`.
LINK = re.compile(r"(?<!\\)\[\[([^\[\]]+?)\]\]")


def front(text: str) -> dict[str, object]:
    """A note's YAML front matter (the note must open with it)."""
    assert text.startswith("---\n"), text[:80]
    return yaml.safe_load(text.split("---\n", 2)[1])


def _targets(vault: Path) -> set[str]:
    """What a link may name: every note's file name and every alias of its front matter."""
    names = set()
    for path in vault.rglob("*.md"):
        names.add(path.stem)
        fields = front(path.read_text(encoding="utf-8"))
        names.update(str(a) for a in fields.get("aliases") or [])
    return names


def unresolved_links(vault: Path) -> tuple[int, list[str]]:
    """(links in the vault, the ones that name no note nor alias)."""
    targets = _targets(vault)
    found, bad = 0, []
    for path in sorted(vault.rglob("*.md")):
        for link in LINK.findall(path.read_text(encoding="utf-8")):
            found += 1
            target = re.split(r"[|#]", link, maxsplit=1)[0].strip()
            if target not in targets:
                bad.append(f"{path.relative_to(vault)}: [[{link}]]")
    return found, bad
