"""The kind of every test, as a pytest marker (`pytest -m unit`, `-m "not e2e"`, ...).

Kinds (registered in pyproject.toml's [tool.pytest.ini_options] markers):

- unit: runs in the test process: functions, models, the in-process services over the session
  graph and the scripted LLM server.
- e2e: runs a command or server of ours as a user does, in a subprocess (`python -m flows.novel`,
  `python -m kg`, `python -m flows.dialogue serve`, `python -m core.doctor`, ...).
- browser: a real browser (Chromium) opens a page.
- fuzz: generated inputs (schemathesis) against the sidecar's API.

The kind is given here, per test module, with the tests of a mixed module named where they
differ from it, so the test files themselves need no marker lines; a test in a module not
listed is a unit test. A test may have more than one kind (a browser test whose page a
subprocess wrote is e2e too). `make test` runs every kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

KINDS = ("unit", "e2e", "browser", "fuzz")

E2E = frozenset({"e2e"})
E2E_BROWSER = frozenset({"e2e", "browser"})

#: Module name -> kinds of its tests (modules not listed: unit).
MODULE_KINDS: dict[str, frozenset[str]] = {
    "test_crash_novel": E2E,
    "test_codex_browser": E2E,
    "test_crash_detection": E2E,
    "test_dialogue_concurrency": E2E,
    "test_dialogue_lease": E2E,
    "test_doctor": E2E,
    "test_graph_service": E2E,
    "test_grounding_e2e": E2E,
    "test_kg_cli": E2E,
    "test_kg_sigkill": E2E,
    "test_long_story": E2E,
    "test_no_orphans": E2E,
    "test_novel_e2e": E2E,
    "test_novel_writer_e2e": E2E,
    "test_prefect_yaml": E2E,
    "test_prose_guard_e2e": E2E,
    "test_regression_deploy": E2E,
    "test_sidecar_crash": E2E,
    "test_sidecar_fuzz": frozenset({"fuzz"}),
    "test_sillytavern_browser": E2E_BROWSER,
    "test_smoke_local_model": E2E,
    "test_worker": E2E,
}

#: "module::test function" -> kinds, where a test differs from its module's kind.
TEST_KINDS: dict[str, frozenset[str]] = {
    "test_evidence_audit::test_the_protocol_refuses_a_bad_audit_folder_in_one_line_before_embedding": E2E,
    "test_codex::test_kg_codex_writes_the_file_and_refuses_bad_requests_in_one_line": E2E,
    "test_codex::test_the_sidecar_codex_shows_a_conversations_entities_relations_and_milestones": E2E_BROWSER,
    "test_crash_detection::test_the_automation_watches_only_runs_that_beat_often_enough": frozenset(
        {"unit"}
    ),
    "test_codex_browser::test_the_codex_opens_offline_in_chromium_with_the_world": E2E_BROWSER,
    "test_codex_browser::test_the_canvas_draws_long_relationship_types_short_and_the_panel_tells_them_whole": E2E_BROWSER,
    "test_dialogue_concurrency::test_threads_and_two_service_instances_in_one_process_serialise_too": frozenset(
        {"unit"}
    ),
    "test_dialogue_http::test_serve_runs_a_real_http_server": E2E,
    "test_dialogue_http::test_cli_commit_and_help": E2E,
    "test_dialogue_ingest::test_a_killed_ingest_run_again_leaves_every_turn_exactly_once": E2E,
    "test_doctor::test_doctor_probes_a_node_type_the_graph_schema_declares": frozenset({"unit"}),
    "test_ebook::test_same_manuscript_same_bytes_in_another_process_and_hash_seed": E2E,
    "test_maintenance::test_cli_help_and_one_line_errors": E2E,
    "test_maintenance::test_cli_qa_exits_1_on_errors_when_asked": E2E,
    "test_regression::test_the_batch_over_both_dialogues_passes_and_writes_its_report": E2E,
    "test_vault::test_kg_vault_reports_what_it_did_and_refuses_bad_requests_in_one_line": E2E,
}


def kinds_of(item: pytest.Item) -> frozenset[str]:
    """The kinds of one collected test (parametrized cases share their function's)."""
    module = (
        item.module.__name__.rpartition(".")[2]
        if isinstance(item, pytest.Function)
        else item.path.stem
    )
    function = item.originalname if isinstance(item, pytest.Function) else item.name
    return (
        TEST_KINDS.get(f"{module}::{function}") or MODULE_KINDS.get(module) or frozenset({"unit"})
    )


def mark_kinds(items: list[pytest.Item]) -> None:
    """Put each test's kind markers on it (conftest's pytest_collection_modifyitems). An entry of
    TEST_KINDS naming a function its (collected) module does not have is a usage error: a renamed
    test would otherwise silently fall back to its module's kind."""
    on_disk = {path.stem for path in Path(__file__).parents[1].rglob("test_*.py")}
    stale = sorted({*MODULE_KINDS, *(key.partition("::")[0] for key in TEST_KINDS)} - on_disk)
    if stale:  # a renamed module would otherwise silently become "unit" and be scheduled last
        raise pytest.UsageError(f"tests/support/kinds.py names no test module {stale}")
    modules = {
        item.module.__name__.rpartition(".")[2]: item.module
        for item in items
        if isinstance(item, pytest.Function)
    }
    for key in TEST_KINDS:
        module, _, function = key.partition("::")
        if module in modules and not hasattr(modules[module], function):
            raise pytest.UsageError(
                f"tests/support/kinds.py: TEST_KINDS names {key}, "
                f"which {modules[module].__name__} does not define"
            )
    for item in items:
        for kind in sorted(kinds_of(item)):
            item.add_marker(getattr(pytest.mark, kind))
