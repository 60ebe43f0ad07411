"""`make run` and `make doctor` hand the premise and the folder to the command as written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

# The command the recipe runs, replaced by one that prints the arguments it was given.
_PRINT_ARGV = f"{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))'"


def _make(*args: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        # -o install: the recipe alone, without (re)installing anything.
        ["make", "-s", "-o", "install", *args, f"PY={_PRINT_ARGV}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def test_a_premise_with_quotes_backquotes_and_a_dollar_reaches_the_novel_as_written() -> None:
    premise = 'She finds "the letter" and `date` costs $5'
    # Make's own syntax: a literal $ is written $$ on its command line; the shell adds nothing.
    argv = _make("run", f"PREMISE={premise.replace('$', '$$')}", "PROJECT=/tmp/my novel")
    assert argv == [
        "-m",
        "flows.novel",
        "--project-dir",
        "/tmp/my novel",
        "--premise",
        premise,
        "--chapters",
        "2",
    ]


def test_the_default_premise_and_a_doctors_folder_are_passed_whole() -> None:
    argv = _make("run")
    assert argv[argv.index("--premise") + 1].startswith("A lighthouse keeper on a storm-bound")
    assert _make("doctor", 'PROJECT=/tmp/a "b"')[-1] == '/tmp/a "b"'
