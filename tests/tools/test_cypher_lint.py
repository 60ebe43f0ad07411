"""The Neo4j linter step (tools/cypher-lint) and what feeds it (kg.dialect, the recorder).

The lint itself runs in .ci/run after the whole suite, over everything the suite recorded;
these tests prove it fails, naming the statement, on what Neo4j would refuse, and passes the
look-alike Neo4j accepts. They need the pinned npm package (`npm ci --prefix tools/cypher-lint`,
which .ci/run does first).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kg import cypher
from kg import vocabulary as vocab
from kg.dialect import ServerInfo, neo4j_only_statements
from tests.conftest import REPO_ROOT

LINT_DIR = REPO_ROOT / "tools" / "cypher-lint"
NODE = shutil.which("node")
needs_linter = pytest.mark.skipif(
    NODE is None or not (LINT_DIR / "node_modules" / "@neo4j-cypher" / "language-support").is_dir(),
    reason="Neo4j's linter is not installed: npm ci --prefix tools/cypher-lint (.ci/run does)",
)


def lint(
    tmp_path: Path, *statements: tuple[str, list[str]], accepted: list[dict[str, str]] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "statements.jsonl"
    lines = [
        {
            "vocabulary": True,
            "labels": sorted(vocab.ALL_LABELS),
            "relationship_types": sorted(vocab.ALL_REL_TYPES),
        }
    ]
    lines += [
        {"text": text, "param_sets": [params], "origin": "recorded"} for text, params in statements
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    accepted_path = tmp_path / "accepted.json"
    accepted_path.write_text(json.dumps(accepted or []))
    assert NODE is not None
    return subprocess.run(
        [NODE, str(LINT_DIR / "lint.js"), str(path), "--accepted", str(accepted_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_linter
def test_a_broken_pattern_fails_naming_the_statement(tmp_path: Path) -> None:
    broken = "MATCH (n:`Entity` WHERE n.id IN $ids RETURN n.id AS id"
    result = lint(tmp_path, (broken, ["ids"]))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ERROR" in result.stdout
    assert f"FAILED: 1 statement(s) Neo4j would refuse or warn about:\n  {broken}" in result.stdout

    fixed = cypher.read_nodes(vocab.ENTITY)
    result = lint(tmp_path, (fixed, ["ids"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 distinct statements" in result.stdout and "0 errors" in result.stdout


@needs_linter
def test_what_only_arcadedb_accepts_or_an_undeclared_parameter_fails(tmp_path: Path) -> None:
    # Both run on ArcadeDB 26.10 (checked over Bolt); Neo4j has no `format()` and insists
    # that an expression in WITH is aliased.
    arcadedb_only = "MATCH (c:`Chapter`) RETURN c.number AS n, format(date(), 'yyyy') AS year"
    result = lint(tmp_path, (arcadedb_only, []))
    assert result.returncode == 1 and "Function format is not present" in result.stdout
    assert arcadedb_only in result.stdout
    unaliased = "MATCH (c:`Chapter`) WITH c, c.number RETURN c.number AS n"
    result = lint(tmp_path, (unaliased, []))
    assert (
        result.returncode == 1 and "must be aliased" in result.stdout and unaliased in result.stdout
    )

    # The same text sent without the parameter it uses: Neo4j would refuse to run it.
    result = lint(tmp_path, (cypher.read_nodes(vocab.ENTITY), []))
    assert result.returncode == 1 and "Parameter $ids is not defined" in result.stdout

    neo4j_has_it = "MATCH (c:`Chapter`) WITH c, c.number AS n RETURN n, toString(date()) AS today"
    assert lint(tmp_path, (neo4j_has_it, [])).returncode == 0


@needs_linter
def test_a_deprecation_fails_unless_listed_with_a_reason(tmp_path: Path) -> None:
    deprecated = "MATCH (c:`Chapter`) CALL { WITH c RETURN c.number AS n } RETURN n"
    result = lint(tmp_path, (deprecated, []))
    assert result.returncode == 1 and "deprecated" in result.stdout and deprecated in result.stdout

    reason = "kept for a server that lacks the scope clause"
    accepted = [
        {"message": "CALL subquery without a variable scope clause is deprecated", "reason": reason}
    ]
    result = lint(tmp_path, (deprecated, []), accepted=accepted)
    assert result.returncode == 0, result.stdout
    assert reason in result.stdout and "1 accepted warnings" in result.stdout

    scoped = "MATCH (c:`Chapter`) CALL (c) { RETURN c.number AS n } RETURN n"
    assert lint(tmp_path, (scoped, [])).returncode == 0


def test_the_server_decides_the_neo4j_only_paths() -> None:
    arcadedb = ServerInfo("Neo4j/5.26.0 compatible (ArcadeDB 26.10.2)", "x")
    neo4j = ServerInfo("Neo4j/5.26.0", "x")
    assert not arcadedb.locks_reads and not arcadedb.may_have_vector_index
    assert neo4j.locks_reads and neo4j.may_have_vector_index


def test_neo4j_only_statements_are_rendered_for_every_label() -> None:
    rendered = neo4j_only_statements()
    texts = {r.text for r in rendered}
    for label in vocab.ALL_LABELS:
        assert cypher.lock_nodes(label) in texts and cypher.row_lock_node(label) in texts
    assert cypher.QUERY_SCENE_VECTOR_INDEX in texts and cypher.VECTOR_INDEX_STATE in texts
    assert any(t.startswith("CREATE VECTOR INDEX") for t in texts)
    query = next(r for r in rendered if r.text == cypher.QUERY_SCENE_VECTOR_INDEX)
    assert query.parameters == ("as_of", "candidates", "embedded_by", "embedding", "k")
