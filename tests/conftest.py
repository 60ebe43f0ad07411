"""Shared fixtures: one embedded ArcadeDB (or NEO4J_URI) and one Prefect test API per session.

Under pytest-xdist (`make test` runs `pytest -n 2`) each worker is a session of its own: its
own graph server and Prefect API on free ports, its own temporary folders (pytest gives each
worker a base folder), so no test depends on what or when the other worker runs. Workers take
whole modules, the modules with subprocess tests first (`subprocess_modules_first`).

Two session-wide checks run around every test run as well:

- Every Cypher text sent through the neo4j driver, by the session or by any Python
  subprocess it starts, is recorded with its parameter names (tests/record_hook); at the end
  the distinct texts, plus every statement only a Neo4j server receives (rendered by
  kg.dialect), go to build/cypher-statements.jsonl for tools/cypher-lint (run by .ci/run).
- No process the session started may outlive it (tests/support/process_guard.py): the session fails
  naming any that does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from core.interrupt import disarm_end_by_signal
from core.settings import Settings, load_settings
from kg.store import GraphStore

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from tasks.dialogue.pipeline import DialogueService
    from tests.support.scripted_llm import ScriptedLLM

REPO_ROOT = Path(__file__).resolve().parent.parent
DIALOGUES_DIR = REPO_ROOT.parent / "shared" / "data" / "dialogues"
RECORD_HOOK_DIR = Path(__file__).resolve().parent / "record_hook"
#: Where the session writes the statements for the linter (.ci/run lints this file).
STATEMENTS_FILE = REPO_ROOT / "build" / "cypher-statements.jsonl"
#: How long processes of the session get to exit after teardown before they count as left behind.
PROCESS_EXIT_GRACE_S = 60.0

# Tests never talk to a real provider by accident: each test that needs an LLM points
# OPENAI_BASE_URL at the scripted server (or, for smoke tests, the local llama-server).
for _var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "SKALD_EMBEDDING_BASE_URL"):
    os.environ.pop(_var, None)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
# No telemetry from the session's Prefect API: its heartbeat, written as the server starts,
# met the server's own start-up writes in SQLite ("database is locked", logged, harmless).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Every task run reaches the session's Prefect API as events that its server's services write to
# SQLite. Prefect's defaults read and insert task runs one at a time and evaluate each event for
# automations, which made that server the largest single consumer of CPU in the flow tests
# (91 of ~245 s in the novel-writer module; docs/decisions/test-suite-time.md). Batched, and
# without the automations' triggers (no test and no part of Skald defines an automation), it
# records the same runs: the novel-writer module went from 252 s to 188 s, the server from 91 s
# of CPU to 42 s. A test that reads task runs waits for them (they always arrived later).
for _var, _value in {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
}.items():
    os.environ.setdefault(_var, _value)

sys.path.insert(0, str(RECORD_HOOK_DIR))
import skald_cypher_recorder  # noqa: E402 - lives in RECORD_HOOK_DIR, put on the path just above

from tests.support import process_guard  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    from core.children import make_prefect_children_die_with_parent

    make_prefect_children_die_with_parent()  # the Prefect test API is a uvicorn child too
    config.stash[_SUBREAPER] = process_guard.become_subreaper()
    config.stash[_BEFORE] = {p.pid for p in process_guard.descendants(os.getpid())}
    record_dir = STATEMENTS_FILE.parent / "cypher-record"
    if not is_xdist_worker(
        config
    ):  # under xdist the controller clears it, before any worker records
        for old in record_dir.glob("*.jsonl"):
            old.unlink()
    # Subprocesses load tests/record_hook/sitecustomize.py and record into the same folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(RECORD_HOOK_DIR), os.environ.get("PYTHONPATH")) if p
    )
    skald_cypher_recorder.install(record_dir)
    config.stash[_RECORD_DIR] = record_dir


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.support.kinds import mark_kinds

    mark_kinds(items)
    if is_xdist_worker(config):
        items[:] = subprocess_modules_first(items)


#: The kinds whose tests start commands, servers or a browser in subprocesses: the minutes of
#: the suite. A module with any such test is scheduled before the modules of unit tests only.
SLOW_KINDS = frozenset({"e2e", "fuzz", "browser"})


def subprocess_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The collection with every module holding an e2e, fuzz or browser test moved ahead of the
    unit-only modules, each part in collection order and each module's tests kept together.

    Why: under `pytest -n 2` (pyproject: `--dist loadfile --no-loadscope-reorder`) a worker takes
    one whole test module at a time, in this order, and a free worker takes the next. Started
    first, the long modules (a scripted novel in a subprocess takes a minute or more) run beside
    each other, and the many short unit modules fill in at the end, so both workers finish close
    together; a long module left to the end would run alone on one worker while the other idles.
    Every worker collects the same order (the controller checks that), and a serial run keeps
    pytest's own order."""
    slow_modules = {
        item.path for item in items if any(item.get_closest_marker(kind) for kind in SLOW_KINDS)
    }
    return [item for item in items if item.path in slow_modules] + [
        item for item in items if item.path not in slow_modules
    ]


def child_pythonpath() -> str:
    """PYTHONPATH for a test's Python subprocess: this checkout first, then the session's
    (which carries the Cypher recorder's start-up hook)."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)


_SUBREAPER = pytest.StashKey[bool]()
_BEFORE = pytest.StashKey[set[int]]()
_RECORD_DIR = pytest.StashKey[Path]()


def is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker (`pytest -n 2`): the controller process
    then owns the session-wide checks. Each worker records its statements into the shared
    folder and is a subreaper too; what a worker leaves behind is re-parented to the
    controller when the worker exits, so the controller's guard, which runs once every worker
    has exited (xdist's own sessionfinish waits for them), sees it."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)  # after the runner's own sessionfinish has torn every fixture down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _RECORD_DIR not in config.stash:
        return
    from core.llm_server import stop_local_servers

    if is_xdist_worker(config):
        stop_local_servers()
        return
    report = config.pluginmanager.get_plugin("terminalreporter")
    if report is not None:
        report.write("\n")  # the progress line may still be open

    def say(line: str) -> None:
        if report is not None:
            report.write_line(line)
        else:
            print(line)

    say(_write_statements(config.stash[_RECORD_DIR]))
    stop_local_servers()  # what an atexit hook would stop later: the session's own servers
    started = {p.pid for p in process_guard.descendants(os.getpid())} - config.stash[_BEFORE]
    left = process_guard.wait_until_gone(started, PROCESS_EXIT_GRACE_S)
    how = (
        "orphans re-parented to this session included"
        if config.stash[_SUBREAPER]
        else "direct descendants only"
    )
    if left:
        say(
            f"process guard: FAILED: {len(left)} process(es) started by the test session outlived it ({how}):"
        )
        for info in left:
            say(f"  pid {info.pid} (parent {info.ppid}): {info.cmdline[:200]}")
        process_guard.kill(left)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        say(f"process guard: no process started by the test session is left ({how})")


def _write_statements(record_dir: Path) -> str:
    from kg import vocabulary as vocab
    from kg.dialect import neo4j_only_statements

    recorded = skald_cypher_recorder.merge(record_dir)
    every_rendered = neo4j_only_statements()
    rendered = [r for r in every_rendered if r.text not in recorded]
    STATEMENTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with STATEMENTS_FILE.open("w", encoding="utf-8") as out:
        vocabulary = {
            "labels": sorted(vocab.ALL_LABELS),
            "relationship_types": sorted(vocab.ALL_REL_TYPES),
        }
        out.write(json.dumps({"vocabulary": True, **vocabulary}) + "\n")
        for text, param_sets in recorded.items():
            out.write(
                json.dumps({"text": text, "param_sets": param_sets, "origin": "recorded"}) + "\n"
            )
        for r in rendered:
            line = {
                "text": r.text,
                "param_sets": [list(r.parameters)],
                "origin": f"neo4j-only: {r.path}",
            }
            out.write(json.dumps(line) + "\n")
    return (
        f"cypher record: {len(recorded)} distinct statements sent, {len(every_rendered)} Neo4j-only "
        f"rendered ({len(every_rendered) - len(rendered)} of them also sent here) -> {STATEMENTS_FILE} "
        f"(lint: node tools/cypher-lint/lint.js {STATEMENTS_FILE})"
    )


@pytest.fixture(scope="session")
def graph_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project dir whose embedded graph lives for the whole test session."""
    return tmp_path_factory.mktemp("graph-project")


@pytest.fixture(scope="session")
def graph_settings(graph_project: Path) -> Iterator[Settings]:
    """Settings for the session graph: NEO4J_URI when set, else embedded ArcadeDB."""
    from core.graph_server import graph_endpoint

    settings = load_settings(graph_project)
    graph_endpoint(settings)  # start once, up front
    yield settings


@pytest.fixture(autouse=True)
def _test_process_exits_normally() -> Iterator[None]:
    """A test that runs a command's signal path in this process (a SIGTERM handler, run_main
    catching KeyboardInterrupt) arms the command's end by that signal (core.interrupt); the
    test process itself must still exit as pytest decides."""
    yield
    disarm_end_by_signal()


@pytest.fixture(scope="module")
def graph(graph_settings: Settings) -> Iterator[GraphStore]:
    """One connection to the session graph per test module."""
    store = GraphStore.open(graph_settings)
    yield store
    store.close()


@pytest.fixture
def store(graph: GraphStore) -> GraphStore:
    """The session graph, wiped: every test using it starts from an empty (migrated) graph."""
    graph.wipe()
    return graph


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> Path:
    """A Prefect home per test module, for the flows its tests run in subprocesses. Those flows
    report to the session's Prefect API (`prefect_api`, passed on by `prefect_api_env`)."""
    return tmp_path_factory.mktemp("prefect-home")


# --- The sidecar over HTTP, in-process (tests/api/test_dialogue_http.py,
# tests/api/test_sidecar_api.py): a module names its speakers (`sidecar_speakers`) and uses
# `scripted`, `settings`, `service` and `client`; a module defining fixtures of those names uses
# its own instead.


@pytest.fixture(scope="module")
def sidecar_speakers() -> list[str]:
    """Who speaks in the module's dialogues (the scripted model recognises them)."""
    return ["Caroline", "Melanie"]


@pytest.fixture(scope="module")
def scripted(sidecar_speakers: list[str]) -> Iterator[ScriptedLLM]:
    """The scripted OpenAI-compatible server, playing the dialogue script for those speakers."""
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    with ScriptedLLM() as llm:
        DialogueScript(sidecar_speakers).install(llm)
        yield llm


@pytest.fixture(scope="module")
def settings(graph_settings: Settings, scripted: ScriptedLLM) -> Settings:
    """The session graph, with chat and embeddings on the scripted server."""
    return load_settings(
        graph_settings.project_dir,
        openai_base_url=scripted.base_url,
        embedding_base_url=scripted.base_url,
    )


@pytest.fixture(scope="module")
def service(settings: Settings) -> Iterator[DialogueService]:
    from tasks.dialogue.pipeline import DialogueService, SidecarOptions

    svc = DialogueService(settings, options=SidecarOptions(lock_wait_s=0.3))
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def client(service: DialogueService) -> Iterator[TestClient]:
    """The sidecar's FastAPI app around `service`, through Starlette's test client."""
    from fastapi.testclient import TestClient

    from api import create_app

    with TestClient(create_app(service)) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """One temporary Prefect API (its URL) for every test that runs real flows, in-process or in
    a Python subprocess given `prefect_api_env()`. A subprocess without it starts Prefect's
    temporary server of its own, which costs it tens of seconds on a loaded machine: more than
    the scripted flow it serves."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=600):
        yield str(PREFECT_API_URL.value())


def prefect_api_env() -> dict[str, str]:
    """The environment that points a Python subprocess at the session's Prefect API; for tests
    that use the `prefect_api` fixture (or `prefect_home`, which starts it)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise RuntimeError(
            "prefect_api_env() outside the prefect_api fixture: no session Prefect API is up"
        )
    return {"PREFECT_API_URL": str(url)}
