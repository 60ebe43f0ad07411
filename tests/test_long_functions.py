"""Every function over 80 lines outside tests has a reason in docs/decisions/long-functions.md
(tools/long_functions.py), and the check catches one without."""

from __future__ import annotations

from pathlib import Path

from tools.long_functions import long_functions, main

ROOT = Path(__file__).resolve().parent.parent


def test_every_long_function_has_a_reason(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--root", str(ROOT)]) == 0, capsys.readouterr().out


def test_a_long_function_without_a_reason_is_reported(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "core").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (tmp_path / "core" / "big.py").write_text(f"class A:\n  def grown(self):\n{body}\n")
    (tmp_path / "core" / "small.py").write_text("def short():\n    return 1\n")
    assert long_functions(tmp_path) == [(86, "core/big.py:A.grown")]
    assert main(["--root", str(tmp_path)]) == 1
    assert "core/big.py:A.grown  (no reason given)" in capsys.readouterr().out
    (tmp_path / "docs" / "decisions").mkdir(parents=True)
    (tmp_path / "docs" / "decisions" / "long-functions.md").write_text("- `core/big.py:A.grown`: a reason\n")
    assert main(["--root", str(tmp_path)]) == 0
