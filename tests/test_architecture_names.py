"""docs/ARCHITECTURE.md names every module (tools/architecture_names.py), and the check
catches a module it does not name."""

from __future__ import annotations

import shutil
from pathlib import Path

from tools.architecture_names import main

ROOT = Path(__file__).resolve().parent.parent


def test_every_module_is_named(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--root", str(ROOT)]) == 0, capsys.readouterr().out


def test_a_module_the_page_does_not_name_is_listed(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "ARCHITECTURE.md", tmp_path / "docs" / "ARCHITECTURE.md")
    (tmp_path / "core" / "recall").mkdir(parents=True)
    (tmp_path / "core" / "recall" / "index.py").write_text("")  # named on the page
    (tmp_path / "core" / "recall" / "unnamed_part.py").write_text("")
    assert main(["--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == ["core/recall/unnamed_part.py"]
