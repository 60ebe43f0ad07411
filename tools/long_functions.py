"""`python tools/long_functions.py`: the functions over 80 lines outside tests, and whether
docs/decisions/long-functions.md gives each a reason.

A function is listed as `path:qualified name` with its length in lines (decorators left out,
docstring included); it has a reason when the page names it as `` `path:name` ``. Exit status
1 when a function over the limit has no reason on the page.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

LIMIT = 80
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
    "tools",
)
PAGE = Path("docs") / "decisions" / "long-functions.md"


def long_functions(root: Path, limit: int = LIMIT) -> list[tuple[int, str]]:
    """(lines, `path:qualified name`) of every function longer than `limit`, longest first."""
    found: list[tuple[int, str]] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            relative = path.relative_to(root).as_posix()
            found.extend(_walk(ast.parse(path.read_text(encoding="utf-8")), relative, "", limit))
    return sorted(found, key=lambda row: (-row[0], row[1]))


def _walk(node: ast.AST, path: str, prefix: str, limit: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    out.append((length, f"{path}:{name}"))
            out.extend(_walk(child, path, f"{name}.", limit))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"List the functions over {LIMIT} lines outside tests "
        f"and whether {PAGE.as_posix()} gives each a reason."
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the repository (default: this file's)",
    )
    args = parser.parse_args(argv)
    page_path = args.root / PAGE
    page = page_path.read_text(encoding="utf-8") if page_path.exists() else ""
    unexplained = 0
    for length, name in long_functions(args.root):
        explained = f"`{name}`" in page
        unexplained += not explained
        print(f"{length:4d}  {name}{'' if explained else '  (no reason given)'}")
    print(
        f"{unexplained} function(s) over {LIMIT} lines without a reason in {PAGE.as_posix()}",
        file=sys.stderr,
    )
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
