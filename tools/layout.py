"""`python tools/layout.py {modules,functions}`: the tree's layout checked against its pages.

- `modules`: the modules docs/ARCHITECTURE.md does not name. A module counts as named when the
  page has, in backticks, its path (from the repository or from its package,
  `core/recall/index.py`, `recall/index.py`), or its file name or bare name on a line that
  names its directory (`dialogue/` ... `lease`; `tasks/dialogue/` ... `actor.py`), or its file
  name in a section whose heading names its directory (`core/llm/` ... `sampling.py`).
  `__init__.py` files are named by their package.
- `functions`: the functions over 80 lines outside tests (from `def` to the last line,
  docstring included), as `path:qualified name`, each marked when
  docs/decisions/long-functions.md gives no reason for it (names it as `` `path:name` ``).

Exit status 1 when a module is not named or a long function has no reason.
"""

from __future__ import annotations

import argparse
import ast
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
    "tools",
)
LIMIT = 80
ARCHITECTURE = Path("docs") / "ARCHITECTURE.md"
LONG_FUNCTIONS = Path("docs") / "decisions" / "long-functions.md"


def python_files(root: Path) -> list[Path]:
    """The .py files under the packages, relative to `root`, in path order."""
    return [
        path.relative_to(root)
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if "node_modules" not in path.parts
    ]


def unnamed_modules(root: Path) -> list[str]:
    """The modules (not `__init__.py`) the architecture page does not name."""
    doc = (root / ARCHITECTURE).read_text(encoding="utf-8")
    lines = doc.splitlines()
    sections = [
        chunk.partition("\n")[::2] for chunk in re.split(r"^### ", doc, flags=re.MULTILINE)[1:]
    ]
    return [
        path.as_posix()
        for path in python_files(root)
        if path.name != "__init__.py" and not _named(path, doc, lines, sections)
    ]


def _named(path: Path, doc: str, lines: list[str], sections: list[tuple[str, str]]) -> bool:
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
    return any(f"`{parent}`" in heading and f"`{path.name}`" in body for heading, body in sections)


def long_functions(root: Path, limit: int = LIMIT) -> list[tuple[int, str]]:
    """(lines, `path:qualified name`) of every function longer than `limit`, longest first."""
    found: list[tuple[int, str]] = []
    for path in python_files(root):
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        found.extend(_functions(tree, path.as_posix(), "", limit))
    return sorted(found, key=lambda row: (-row[0], row[1]))


def _functions(node: ast.AST, path: str, prefix: str, limit: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    out.append((length, f"{path}:{name}"))
            out.extend(_functions(child, path, f"{name}.", limit))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The tree's layout checked against its pages.")
    parser.add_argument(
        "check",
        choices=("modules", "functions"),
        help=f"modules: those {ARCHITECTURE.as_posix()} does not name; functions: those over "
        f"{LIMIT} lines, marked where {LONG_FUNCTIONS.as_posix()} gives no reason",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the repository (default: this file's)",
    )
    args = parser.parse_args(argv)
    if args.check == "modules":
        missing = unnamed_modules(args.root)
        for name in missing:
            print(name)
        print(f"{len(missing)} modules not named in {ARCHITECTURE.as_posix()}", file=sys.stderr)
        return 1 if missing else 0
    page_path = args.root / LONG_FUNCTIONS
    page = page_path.read_text(encoding="utf-8") if page_path.exists() else ""
    unexplained = 0
    for length, name in long_functions(args.root):
        explained = f"`{name}`" in page
        unexplained += not explained
        print(f"{length:4d}  {name}{'' if explained else '  (no reason given)'}")
    print(
        f"{unexplained} function(s) over {LIMIT} lines without a reason in {LONG_FUNCTIONS.as_posix()}",
        file=sys.stderr,
    )
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
