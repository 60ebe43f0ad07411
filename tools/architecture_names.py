"""`python tools/architecture_names.py`: list the modules docs/ARCHITECTURE.md does not name.

A module counts as named when the page has, in backticks, its path (from the repository or
from its package, `core/recall/index.py`, `recall/index.py`), or its file name or bare name on
a line that names its directory (`dialogue/` ... `lease`; `tasks/dialogue/` ... `actor.py`),
or its file name in a section whose heading names its directory (`core/llm/` ... `sampling.py`).
`__init__.py` files are named by their package. Exit status 1 when any module is not named.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PACKAGES = (
    "core",
    "kg",
    "prompts",
    "tasks",
    "api",
    "flows",
    "deployments",
    "bench",
    "integrations",
)


def sections(doc: str) -> list[tuple[str, str]]:
    """(heading line, text) of each `###` section."""
    out = []
    for chunk in re.split(r"^### ", doc, flags=re.MULTILINE)[1:]:
        heading, _, body = chunk.partition("\n")
        out.append((heading, body))
    return out


def is_named(path: Path, doc: str, lines: list[str], by_section: list[tuple[str, str]]) -> bool:
    parts = path.parts
    paths = {path.as_posix(), "/".join(parts[1:]), "/".join(parts[-2:])}
    if any(re.search(rf"`[^`\n]*\b{re.escape(p)}\b[^`\n]*`", doc) for p in paths):
        return True
    tokens = (f"`{path.name}`", f"`{path.stem}`")
    directories = {"/".join(parts[i:-1]) + "/" for i in range(len(parts) - 1)}
    if any(
        any(d in line for d in directories) and any(t in line for t in tokens) for line in lines
    ):
        return True
    parent = "/".join(parts[:-1]) + "/"
    return any(
        f"`{parent}`" in heading and f"`{path.name}`" in body for heading, body in by_section
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="List the modules docs/ARCHITECTURE.md does not name."
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the repository (default: this file's)",
    )
    args = parser.parse_args(argv)
    doc = (args.root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    lines, by_section = doc.splitlines(), sections(doc)
    missing = [
        path.as_posix()
        for package in PACKAGES
        for path in sorted(p.relative_to(args.root) for p in (args.root / package).rglob("*.py"))
        if path.name != "__init__.py"
        and "node_modules" not in path.parts
        and not is_named(path, doc, lines, by_section)
    ]
    for name in missing:
        print(name)
    print(f"{len(missing)} modules not named in docs/ARCHITECTURE.md", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
