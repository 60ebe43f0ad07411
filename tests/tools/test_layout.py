"""tools/layout.py: docs/ARCHITECTURE.md names every module, every function over 80 lines has
a reason in docs/decisions/long-functions.md, and each check catches what it is for."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.layout import long_functions, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("check", ["modules", "functions"])
def test_the_tree_passes(check: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([check, "--root", str(ROOT)]) == 0, capsys.readouterr().out


def test_a_module_the_page_does_not_name_is_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "ARCHITECTURE.md", tmp_path / "docs" / "ARCHITECTURE.md")
    (tmp_path / "core" / "recall").mkdir(parents=True)
    (tmp_path / "core" / "recall" / "index.py").write_text("")  # named on the page
    (tmp_path / "core" / "recall" / "unnamed_part.py").write_text("")
    assert main(["modules", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == ["core/recall/unnamed_part.py"]


def test_a_long_function_without_a_reason_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "core").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(85))
    (tmp_path / "core" / "big.py").write_text(f"class A:\n    def grown(self):\n{body}\n")
    (tmp_path / "core" / "small.py").write_text("def short():\n    return 1\n")
    assert long_functions(tmp_path) == [(86, "core/big.py:A.grown")]
    assert main(["functions", "--root", str(tmp_path)]) == 1
    assert "core/big.py:A.grown  (no reason given)" in capsys.readouterr().out
    (tmp_path / "docs" / "decisions").mkdir(parents=True)
    (tmp_path / "docs" / "decisions" / "long-functions.md").write_text(
        "- `core/big.py:A.grown`: a reason\n"
    )
    assert main(["functions", "--root", str(tmp_path)]) == 0
