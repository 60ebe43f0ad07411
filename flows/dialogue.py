"""`python -m flows.dialogue`: the dialogue memory sidecar (spec 000).

    serve    the HTTP API for chat front ends (the `api` package; OpenAPI at /openapi.json and
             /docs): POST turn/commit, turn/retry, turn/replace, conversation/rewind,
             conversation/forget, conversation/rename, conversation/copy, memory/query;
             GET conversations, conversations/{id}/entities|relations|milestones|turns|search,
             conversation/{id}/lorebook, health. Security: a bearer token (SKALD_SIDECAR_TOKEN
             or --token-file; required to bind a non-loopback address), CORS for the origins
             given with --cors-origin.
    commit   one turn from a JSON file (`--prefect` runs it as the `dialogue-turn` flow)
    ingest   import whole transcripts (shared JSONL turn format, LoCoMo or LongMemEval JSON,
             a SillyTavern chat file) into turn memory, as the
             `dialogue-ingest` flow: batched embeddings, a progress bar (terminal and Prefect
             UI), resumable after a kill with every turn exactly once; `--extract` also runs
             the LLM slots and the commit gate on every turn
    reembed  give every remembered turn the embedding model's vector after the model changed
             (settings `embedding_base_url` / `embedding_model`), as the `dialogue-reembed` flow:
             until then a turn another model embedded is recalled by its words only
             (tasks.dialogue.reembed); resumable after a kill
    rewind   rewind a conversation to before turn N (exact), as POST .../conversation/rewind does
    forget   forget a conversation (its chat was deleted): every turn, memory row, entity,
             relation and milestone it holds, as POST .../conversation/forget does
    rename   move a conversation to another id (its chat was renamed), as POST
             .../conversation/rename does
    copy     copy a conversation to another id (its chat was branched), as POST
             .../conversation/copy does
    conversations  list the conversations memory holds, one JSON line each (its id and
             remembered turns), as GET .../conversations does
    query    what memory recalls for a message: the injection packet a front end would put in
             its next prompt (`--json`: the whole answer, recalled turns with their scores), as
             POST .../memory/query does; nothing is written
    lorebook write a conversation's memory as a SillyTavern World Info book (the same JSON as
             GET .../conversation/{id}/lorebook), to import through SillyTavern's World Info panel
    openapi  write the OpenAPI document without starting a server

The turn pipeline itself is plain Python (tasks.dialogue.pipeline): the HTTP server and the
regression batch call it directly, because a Prefect flow run per turn costs far more than
the turn's own non-LLM work (measured: docs/decisions/dialogue-turn-not-a-flow.md). `dialogue_turn_flow` wraps
the same pipeline for single turns from the Prefect UI or a deployment, each slot a task run.

Exit codes of `commit`, `rewind`, `forget`, `rename` and `copy`: 0 COMMITTED (or rewound,
forgotten, renamed, copied, or nothing to forget, rename or copy), 1 ROLLED_BACK,
2 INVALID_REQUEST, 3 IN_PROGRESS. The HTTP statuses are api.statuses'.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from api import CORS_ENV, TOKEN_ENV, create_app, listening_socket, serve_security
from core.cli import add_settings_options, project_prefect_settings, run_main, setup_logging
from core.embedder import EmbedderUnavailableError, local_embedder
from core.errors import InvalidInputError
from core.graph_server import exit_cleanly_on_termination, prefer_clients
from core.heap import freeze_startup_objects
from core.recall.lexical import english_words
from core.settings import Settings, load_settings, require_project, require_project_dir
from core.timex import parse_when
from kg.dialogue import DialogueRepository
from tasks.dialogue.lorebook import conversation_lorebook
from tasks.dialogue.models import (
    MAX_BODY_BYTES,
    CopyResult,
    ForgetResult,
    RenameResult,
    RewindResult,
    TurnCommitRequest,
    TurnResult,
    parse_request,
)
from tasks.dialogue.pipeline import DialogueService, SidecarOptions
from tasks.dialogue.reembed import BATCH_SIZE as REEMBED_BATCH_SIZE
from tasks.dialogue.reembed import reembed_conversation
from tasks.dialogue.remember import BATCH_SIZE as INGEST_BATCH_SIZE
from tasks.dialogue.replay import DialogueSpec
from tasks.dialogue.retriever import remembered_window

log = logging.getLogger("skald.dialogue")

T = TypeVar("T")
EXIT_CODES = {"COMMITTED": 0, "ROLLED_BACK": 1, "INVALID_REQUEST": 2, "IN_PROGRESS": 3}
#: Conversations `conversations` reads per page.
CONVERSATIONS_PAGE = 500


# ----------------------------------------------------------------------------- Prefect
@task(name="dialogue-slot", cache_policy=NO_CACHE, persist_result=False)
def _slot_task(work: Callable[[], Any]) -> Any:
    return work()


def prefect_slot_runner(slot: str, work: Callable[[], T]) -> T:
    """Run one slot as a Prefect task run named after the slot (the name is all the run needs
    of it: the slot's inputs are in `work`)."""
    return _slot_task.with_options(name=slot)(work)  # type: ignore[no-any-return]


_services: dict[tuple[str, str], DialogueService] = {}
_services_lock = threading.Lock()


def service_for(settings: Settings, options: SidecarOptions | None = None) -> DialogueService:
    """One DialogueService per project (and options) per process: connections are reused."""
    options = options or SidecarOptions()
    key = (str(settings.project_dir), options.model_dump_json())
    with _services_lock:
        if key not in _services:
            _services[key] = DialogueService(settings, options=options)
        return _services[key]


def close_services() -> None:
    """Close the cached services (end of a CLI run or a test)."""
    with _services_lock:
        services = list(_services.values())
        _services.clear()
    for service in services:
        service.close()


@flow(name="dialogue-turn", log_prints=True)
def dialogue_turn_flow(
    request: TurnCommitRequest,
    project_dir: str = ".",
    attempt: Literal["commit", "retry"] = "commit",
    options: SidecarOptions | None = None,
) -> dict[str, Any]:
    """One turn through the six slots, each slot a task run. Returns the TurnResult as JSON."""
    service = service_for(load_settings(project_dir), options)
    result = service.commit(request, attempt=attempt, run_slot=prefect_slot_runner)
    log.info(
        "turn %s: %s%s",
        result.key,
        result.state.value,
        f" ({result.reason})" if result.reason else "",
    )
    return result.model_dump(mode="json")


class TurnProgress:
    """A rich progress bar in the terminal and a Prefect progress artifact (`key`), per batch."""

    def __init__(self, total: int, description: str, key: str = "dialogue-ingest") -> None:
        from prefect.artifacts import create_progress_artifact
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.total, self.done = max(total, 1), 0
        self._lock = threading.Lock()
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=False,
            console=Console(stderr=True),
        )
        self._task = self._bar.add_task(description, total=total)
        self._artifact = create_progress_artifact(
            progress=0.0,
            key=key,
            description=f"{description}: turns handled, percent",
        )
        self._reported = 0.0
        self._description = description

    def __enter__(self) -> TurnProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def __call__(self, conversation_id: str, turns: int) -> None:
        from prefect.artifacts import update_progress_artifact

        with self._lock:
            self.done += turns
            self._bar.advance(self._task, turns)
            percent = 100.0 * self.done / self.total
            if self._artifact is not None and (
                percent - self._reported >= 5 or self.done >= self.total
            ):
                update_progress_artifact(self._artifact, progress=round(percent, 1))
                self._reported = percent
                log.info(
                    "%s: %d/%d turns (%s)",
                    self._description,
                    self.done,
                    self.total,
                    conversation_id,
                )


def ingest_items(
    dialogues: Sequence[str | Path], conversation_id: str | None
) -> list[tuple[DialogueSpec, str]]:
    """The transcripts read and checked, each with the conversation it goes into; a file that
    is missing or malformed raises InvalidInputError naming it."""
    from tasks.dialogue.benchmarks import dialogue_files, load_dialogues

    specs = [
        spec
        for path in dialogue_files([Path(d) for d in dialogues])
        for spec in load_dialogues(path)
    ]
    if conversation_id is not None and len(specs) > 1:
        raise InvalidInputError(
            "--conversation-id names one conversation, but several dialogues were given",
            hint="ingest one dialogue per --conversation-id, or leave it out",
        )
    return [(spec, conversation_id or spec.dialogue_id) for spec in specs]


@flow(name="dialogue-ingest", log_prints=True)
def dialogue_ingest_flow(
    dialogues: list[str],
    project_dir: str = ".",
    conversation_id: str | None = None,
    extract: bool = False,
    batch_size: int = INGEST_BATCH_SIZE,
    concurrency: int = 2,
) -> list[dict[str, Any]]:
    """Import whole transcripts into turn memory (tasks.dialogue.ingest). Returns one report
    per dialogue."""
    from tasks.dialogue.ingest import ingest

    items = ingest_items(dialogues, conversation_id)
    specs = [spec for spec, _ in items]
    service = service_for(load_settings(project_dir))
    total = sum(len(spec.turns) for spec in specs)
    with TurnProgress(total, "extracting turns" if extract else "remembering turns") as progress:
        reports = ingest(
            service,
            items,
            extract=extract,
            batch_size=batch_size,
            concurrency=concurrency,
            progress=progress,
        )
    for report in reports:
        log.info(
            "ingest %s -> %s: %d turns, %d added, %d already there, %.3g turns/s%s",
            report.dialogue_id,
            report.conversation_id,
            report.turns,
            report.added,
            report.already,
            report.turns_per_s,
            f", {report.extract_outcomes}" if report.extract_outcomes else "",
        )
    return [r.model_dump(mode="json") for r in reports]


def reembed_targets(repo: DialogueRepository, conversation_ids: list[str] | None) -> dict[str, int]:
    """Conversation id -> remembered turns, for the named conversations (None: every one memory
    holds). A named one memory holds no turn of is an InvalidInputError: the CLI asks this
    before Prefect starts, so a mistyped id is one line, not a failed flow run."""
    ids = list(dict.fromkeys(conversation_ids)) if conversation_ids else repo.conversation_ids()
    heads = {conversation_id: repo.memory_head(conversation_id) for conversation_id in ids}
    if conversation_ids and (empty := [c for c in ids if not heads[c]]):
        raise InvalidInputError(
            f"no remembered turns in conversation {', '.join(map(repr, empty))}",
            hint="check the conversation id (leave --conversation-id out to re-embed them all)",
        )
    return heads


@flow(name="dialogue-reembed", log_prints=True)
def dialogue_reembed_flow(
    project_dir: str = ".",
    conversation_ids: list[str] | None = None,
    batch_size: int = REEMBED_BATCH_SIZE,
) -> list[dict[str, Any]]:
    """Give every remembered turn the current embedding model's vector (tasks.dialogue.reembed),
    in the named conversations (None: every conversation). Returns one report per conversation."""
    service = service_for(load_settings(project_dir))
    heads = reembed_targets(DialogueRepository(service.store), conversation_ids)
    ids = list(heads)
    with TurnProgress(
        sum(heads.values()), "re-embedding turns", key="dialogue-reembed"
    ) as progress:
        reports = [
            reembed_conversation(service, c, batch_size=batch_size, progress=progress) for c in ids
        ]
    for report in reports:
        log.info(
            "reembed %s: %d turns, %d from another model, %d re-embedded (%.1f s), model %s",
            report.conversation_id,
            report.rows,
            report.stale,
            report.reembedded,
            report.seconds,
            report.embedded_by,
        )
    return [r.model_dump(mode="json") for r in reports]


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.dialogue",
        description="Dialogue memory sidecar: commit conversation turns to the knowledge graph.",
    )
    common = _common_options()
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{serve,commit,ingest,reembed,rewind,forget,rename,copy,conversations,query,lorebook,"
        "openapi}",
    )
    _serve_parser(sub.add_parser("serve", parents=[common], help="run the HTTP adapter"))
    _commit_parser(
        sub.add_parser("commit", parents=[common], help="commit one turn from a JSON file")
    )
    _ingest_parser(
        sub.add_parser(
            "ingest",
            parents=[common],
            help="import whole transcripts into turn memory (resumable, exactly once)",
        )
    )
    _reembed_parser(
        sub.add_parser(
            "reembed",
            parents=[common],
            help="give remembered turns the current embedding model's vectors (after a change)",
        )
    )
    _rewind_parser(
        sub.add_parser(
            "rewind",
            parents=[common],
            help="rewind a conversation to before a turn (that turn and later ones removed exactly)",
        )
    )
    forget = sub.add_parser(
        "forget",
        parents=[common],
        help="forget a conversation: everything memory holds of it, in one transaction",
    )
    forget.add_argument("--conversation-id", required=True, help="the conversation")
    rename = sub.add_parser(
        "rename",
        parents=[common],
        help="move a conversation to another id (its chat was renamed), in one transaction",
    )
    copy = sub.add_parser(
        "copy",
        parents=[common],
        help="copy a conversation to another id (its chat was branched), in one transaction",
    )
    for carry in (rename, copy):
        carry.add_argument("--conversation-id", required=True, help="the conversation")
        carry.add_argument("--new-conversation-id", required=True, help="the id it goes to")
    sub.add_parser(
        "conversations",
        parents=[common],
        help="list the conversations memory holds (JSON lines: id and remembered turns)",
    )
    _query_parser(
        sub.add_parser(
            "query",
            parents=[common],
            help="print what memory recalls for a message: the injection packet (writes nothing)",
        )
    )
    _lorebook_parser(
        sub.add_parser(
            "lorebook",
            parents=[common],
            help="write a conversation's memory as a SillyTavern World Info book (JSON)",
        )
    )
    openapi = sub.add_parser("openapi", parents=[common], help="write the OpenAPI document")
    openapi.add_argument("--out", type=Path, default=None, help="file to write (default stdout)")
    return parser


def _common_options() -> argparse.ArgumentParser:
    """The options every sub-command takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--project-dir",
        type=Path,
        default=Path("."),
        help="project whose graph holds the memory (default .)",
    )
    common.add_argument(
        "--lock-wait",
        type=float,
        default=None,
        help="seconds a turn waits for its conversation lock before IN_PROGRESS (default 30)",
    )
    common.add_argument(
        "--turn-timeout",
        type=float,
        default=None,
        help="seconds a turn may take before it is rolled back (default 300)",
    )
    add_settings_options(common)
    return common


def _serve_parser(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    serve.add_argument(
        "--allow-request-db",
        action="store_true",
        help="honour a request's config.db that names another graph or carries a password "
        "(off: such requests are refused); credentials are never logged",
    )
    serve.add_argument(
        "--cors-origin",
        dest="cors_origins",
        action="append",
        default=None,
        metavar="ORIGIN",
        help=f"browser origin allowed to call the API, e.g. http://127.0.0.1:8000 (repeatable; "
        f"default: {CORS_ENV}, comma-separated; none: browsers are refused)",
    )
    serve.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file holding the bearer token callers must send (default: {TOKEN_ENV}); "
        "required when --host is not a loopback address",
    )
    serve.add_argument(
        "--max-call-records",
        type=int,
        default=20_000,
        help="LLM call records kept in memory; older ones go to Parquet under "
        "<project>/.saga/runs/sidecar (default 20000)",
    )
    serve.add_argument(
        "--flush-call-records-s",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="at most this many seconds between an LLM call and its record on disk under "
        "<project>/.saga/runs/sidecar, so a server killed with kill -9 loses no older record "
        "(default 300)",
    )
    # How much nicer (OS priority, Linux per thread) than the memory queries a front end
    # waits for: SidecarOptions' fields of the same names say why each default is what it is.
    niced = {
        "background": ("the threads running a turn's slots", ""),
        "turn": ("the threads running turn writes (commit, retry, replace, rewind)", ""),
        "graph": (
            "the embedded graph's threads",
            "; only when serve starts it: no effect on Neo4j",
        ),
    }
    for what, (threads, note) in niced.items():
        default = SidecarOptions.model_fields[f"{what}_nice"].default
        serve.add_argument(
            f"--{what}-nice",
            type=int,
            default=None,
            choices=range(20),
            metavar="0-19",
            help=f"how much nicer (OS priority) {threads} are than the memory queries "
            f"(default {default}; 0: the same{note})",
        )
    serve.add_argument(
        "--yield-to-queries-ms",
        type=float,
        default=None,
        metavar="MS",
        help="longest a turn's background step waits for the memory queries in flight before it "
        f"starts (default {SidecarOptions.model_fields['yield_to_queries_ms'].default:g}; 0: no waiting)",
    )


def _commit_parser(commit: argparse.ArgumentParser) -> None:
    commit.add_argument(
        "--request", required=True, help="turn-commit request JSON file ('-' for stdin)"
    )
    commit.add_argument(
        "--retry", action="store_true", help="mark the attempt as a retry in the trace"
    )
    commit.add_argument(
        "--prefect",
        action="store_true",
        help="run as the dialogue-turn Prefect flow (slots as task runs)",
    )


def _ingest_parser(ingest: argparse.ArgumentParser) -> None:
    ingest.add_argument(
        "--dialogue",
        dest="dialogues",
        type=Path,
        nargs="+",
        required=True,
        metavar="FILE.jsonl",
        help="transcripts in the shared JSONL turn format (a directory: its *.turns.jsonl), "
        "LoCoMo's or LongMemEval's JSON, or a SillyTavern chat file (its turns as the Skald "
        "extension writes them, under the chat's id)",
    )
    ingest.add_argument(
        "--conversation-id",
        default=None,
        help="conversation to import into (default: each file's conversation_id; a "
        "SillyTavern chat's: the id the extension recorded in it, else its file name)",
    )
    ingest.add_argument(
        "--extract",
        action="store_true",
        help="also run the LLM slots and the commit gate on every turn (graph facts)",
    )
    ingest.add_argument(
        "--batch-size",
        type=int,
        default=INGEST_BATCH_SIZE,
        help=f"turns per embedding call and transaction (default {INGEST_BATCH_SIZE})",
    )
    ingest.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="with --extract: conversations processed at once (default 2)",
    )


def _reembed_parser(reembed: argparse.ArgumentParser) -> None:
    reembed.add_argument(
        "--conversation-id",
        dest="conversation_ids",
        action="append",
        default=None,
        help="a conversation to re-embed (repeat for several; default: every conversation)",
    )
    reembed.add_argument(
        "--batch-size",
        type=int,
        default=REEMBED_BATCH_SIZE,
        help=f"turns per embedding call and write transaction (default {REEMBED_BATCH_SIZE})",
    )


def _rewind_parser(rewind: argparse.ArgumentParser) -> None:
    rewind.add_argument("--conversation-id", required=True, help="the conversation")
    rewind.add_argument("--before-turn", required=True, help="the first turn id to remove")


def _query_parser(query: argparse.ArgumentParser) -> None:
    query.add_argument(
        "message", help="the message memory is asked about (the next one in the chat)"
    )
    query.add_argument("--conversation-id", required=True, help="the conversation")
    query.add_argument("--speaker", default=None, help="who says the message (default: user)")
    query.add_argument(
        "--time",
        default=None,
        help='when it is said ("1:56 pm on 8 May, 2023", ISO 8601): resolves "yesterday" in it',
    )
    query.add_argument(
        "--recall-k", type=int, default=None, help="earlier turns recalled (default 5, at most 50)"
    )
    query.add_argument(
        "--token-budget", type=int, default=None, help="tokens for the packet (default 1024)"
    )
    query.add_argument(
        "--window",
        type=int,
        default=0,
        metavar="N",
        help="ask as a chat front end showing the last N remembered messages (the SillyTavern "
        "extension shows 12): the turns they show go last, and a message with no topic of its "
        "own asks about theirs (default 0: no window)",
    )
    query.add_argument(
        "--json",
        action="store_true",
        help="print the whole answer as JSON: the packet, the recalled turns and their scores",
    )


def _lorebook_parser(lorebook: argparse.ArgumentParser) -> None:
    lorebook.add_argument(
        "--conversation",
        "--conversation-id",
        dest="conversation_id",
        required=True,
        help="the conversation",
    )
    lorebook.add_argument(
        "--out",
        type=Path,
        default=None,
        help="file to write (default stdout); SillyTavern names the imported book after it",
    )


def _options(args: argparse.Namespace) -> SidecarOptions:
    values: dict[str, Any] = {}
    if args.lock_wait is not None:
        values["lock_wait_s"] = args.lock_wait
    if args.turn_timeout is not None:
        values["turn_timeout_s"] = args.turn_timeout
    if getattr(args, "allow_request_db", False):
        values["allow_request_db"] = True
    if getattr(args, "max_call_records", None) is not None:
        values["max_call_records"] = args.max_call_records
    if getattr(args, "flush_call_records_s", None) is not None:
        if args.flush_call_records_s <= 0:
            raise InvalidInputError(
                f"--flush-call-records-s must be more than 0 seconds (got {args.flush_call_records_s:g})"
            )
        values["flush_call_records_s"] = args.flush_call_records_s
    for knob in ("background_nice", "turn_nice", "graph_nice", "yield_to_queries_ms"):
        if getattr(args, knob, None) is not None:
            values[knob] = getattr(args, knob)
    return SidecarOptions(**values)


def _read_request_file(spec: str) -> bytes:
    if spec == "-":
        return sys.stdin.buffer.read(MAX_BODY_BYTES + 1)
    path = Path(spec)
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_BODY_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(f"cannot read request file {path}: {exc.strerror or exc}") from None


def _write_text(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot write {out}: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    if args.command not in _MAY_START_A_PROJECT:
        require_project_dir(args.project_dir)
    settings = load_settings(args.project_dir, args.config)
    if args.command not in _MAY_START_A_PROJECT:
        require_project(settings)
    return _COMMANDS[args.command](args, settings, _options(args))


#: Commands that need no existing project: the first to touch one creates its memory graph
#: (openapi needs none). The rest read or change what a project holds, and a missing project
#: directory is an error for them.
_MAY_START_A_PROJECT = frozenset({"serve", "commit", "ingest", "openapi"})


def _openapi(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    service = DialogueService(
        settings, options=options
    )  # never connects: the document needs no graph
    try:
        text = json.dumps(create_app(service).openapi(), indent=2, sort_keys=True) + "\n"
    finally:
        service.close()
    _write_text(text, args.out)
    return 0


def _lorebook(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    service = DialogueService(settings, options=options)
    try:
        book = conversation_lorebook(DialogueRepository(service.store), args.conversation_id)
    finally:
        service.close()
    if book is None:
        raise InvalidInputError(
            f"no conversation {args.conversation_id!r} in the graph ({settings.project_dir})"
        )
    _write_text(book.model_dump_json(indent=2) + "\n", args.out)
    return 0


def _serve(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    import uvicorn

    # Before anything starts: a refused bind costs nothing.
    security = serve_security(args.host, args.token_file, args.cors_origins)
    sock = listening_socket(args.host, args.port)
    prefer_clients(settings, options.graph_nice)  # before the graph starts (below)
    # uvicorn stops gracefully on SIGTERM and then raises it again under the handler it found:
    # the default one ended the process before `service.close()` (whose gateway writes the
    # calls still in memory) whenever the graph was not this process's own.
    exit_cleanly_on_termination()
    service = DialogueService(settings, options=options)
    try:
        log.info("graph: %s", service.store.endpoint.label)  # connect (and migrate) before serving
        if settings.embedding_base_url is None:
            _warm_up_embedder()
        english_words()  # read a typo's words from the first query on (core.recall.lexical)
        log.info(
            "heap: %d startup objects frozen out of the collector's scans", freeze_startup_objects()
        )
        log.info(
            "auth: %s; CORS origins: %s",
            "bearer token" if security.token else "none (loopback only)",
            ", ".join(security.cors_origins) or "none",
        )
        config = uvicorn.Config(
            create_app(service, security), host=args.host, port=args.port, log_level="info"
        )
        server = uvicorn.Server(config)
        # uvicorn names its address only for a socket it bound itself; this one is bound above.
        logging.getLogger("uvicorn.error").info(
            "Uvicorn running on http://%s:%d (OpenAPI at /docs; Press CTRL+C to quit)",
            args.host,
            args.port,
        )
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # as uvicorn.run: Ctrl-C is a stop, not an error
            pass
        started = server.started
    finally:
        sock.close()
        service.close()
    # uvicorn.run's exit when the app did not start (its lifespan failed): 3.
    return 0 if started else 3


def _warm_up_embedder() -> None:
    """Start the embedded model's ONNX and tokenizer threads here, at the server's priority:
    threads inherit their creator's, and a first embedding asked for by a turn's slot (niced,
    core.priority) would leave the queries' embeddings on niced threads."""
    try:
        local_embedder().encode(["warm up", "the embedder"])
    except EmbedderUnavailableError as exc:  # each request that embeds says so, as before
        log.warning("embedder: %s", exc)


def _rewind(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    return _one_call(settings, options, lambda s: s.rewind(args.conversation_id, args.before_turn))


def _forget(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    return _one_call(settings, options, lambda s: s.forget(args.conversation_id))


def _rename(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    return _one_call(
        settings, options, lambda s: s.rename(args.conversation_id, args.new_conversation_id)
    )


def _copy(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    return _one_call(
        settings, options, lambda s: s.copy(args.conversation_id, args.new_conversation_id)
    )


def _conversations(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    service = DialogueService(settings, options=options)
    try:
        repo = DialogueRepository(service.store)
        offset = 0
        while True:
            total, rows = repo.conversation_page(offset, CONVERSATIONS_PAGE)
            for conversation_id, turns in rows:
                print(json.dumps({"conversation_id": conversation_id, "remembered_turns": turns}))
            offset += len(rows)
            if not rows or offset >= total:
                return 0
    finally:
        service.close()


def _query(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    message: dict[str, Any] = {"role": "user", "content": args.message}
    if args.speaker:
        message["name"] = args.speaker
    if args.time:
        if parse_when(args.time) is None:
            # The API takes an undated time as no time; asked for here, it would be ignored
            # without a word and "yesterday" left unresolved.
            raise InvalidInputError(
                f"--time {args.time!r} names no date",
                hint='give a date with its year: "1:56 pm on 8 May, 2023", 2023-05-08T13:56, '
                "or Unix time",
            )
        message["time"] = args.time
    config = {
        field: value
        for field, value in (("recall_k", args.recall_k), ("token_budget", args.token_budget))
        if value is not None
    }
    if args.window < 0:
        raise InvalidInputError(f"--window must be 0 or more (got {args.window})")
    request = {"conversation_id": args.conversation_id, "messages": [message], "config": config}
    # A look at what memory would inject: its one embedding is no run worth a call log file.
    service = DialogueService(settings, options=options, call_log=False)
    try:
        if args.window:
            shown = remembered_window(
                DialogueRepository(service.store), args.conversation_id, args.window
            )
            request["window"] = [m.model_dump(mode="json", exclude_none=True) for m in shown]
        result = service.memory_query(request)
    finally:
        service.close()
    if not result.ok:
        print(f"dialogue: {result.code}: {result.reason}", file=sys.stderr)
        return EXIT_CODES.get(result.code or "INVALID_REQUEST", 1)
    if not result.stored_turns:
        # An empty packet would look like a memory that recalls nothing; most often the id is
        # mistyped.
        raise InvalidInputError(
            f"no remembered turns in conversation {args.conversation_id!r} "
            f"({settings.project_dir}): `python -m flows.dialogue conversations` lists the "
            "ones memory holds"
        )
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        assert result.injection_packet is not None  # an answer that is ok carries one
        print(result.injection_packet.text)
    return 0


def _one_call(
    settings: Settings,
    options: SidecarOptions,
    call: Callable[[DialogueService], RewindResult | ForgetResult | RenameResult | CopyResult],
) -> int:
    """One service call from the command line: its result as JSON on stdout, a failure's one
    line on stderr, and the exit code of its code."""
    service = DialogueService(settings, options=options)
    try:
        outcome = call(service)
    finally:
        service.close()
    print(outcome.model_dump_json(indent=2))
    if not outcome.ok:
        print(f"dialogue: {outcome.code}: {outcome.reason}", file=sys.stderr)
        return EXIT_CODES.get(outcome.code or "ROLLED_BACK", 1)
    if not outcome.found:
        # Still exit 0: done twice, a call finds nothing the second time (as the API answers),
        # and a script may repeat it. A person who mistyped an id is told so.
        print(f"dialogue: note: {_nothing_done(outcome)}", file=sys.stderr)
    return 0


def _nothing_done(outcome: RewindResult | ForgetResult | RenameResult | CopyResult) -> str:
    """Why a call that succeeded changed nothing, in words."""
    conversation = outcome.conversation_id
    if isinstance(outcome, RewindResult):
        return (
            f"conversation {conversation!r} remembers no turn {outcome.before_turn!r}; nothing "
            "was rewound"
        )
    if isinstance(outcome, RenameResult | CopyResult) and (
        outcome.new_conversation_id == conversation
    ):
        return f"{conversation!r} is the conversation's id already; nothing to carry over"
    return (
        f"memory holds nothing of conversation {conversation!r}; nothing changed "
        "(`python -m flows.dialogue conversations` lists what it holds)"
    )


def _ingest(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    if args.batch_size < 1 or args.concurrency < 1:
        raise InvalidInputError("--batch-size and --concurrency must be at least 1")
    # Fail fast on bad files, before Prefect starts (the flow reads them again).
    ingest_items(args.dialogues, args.conversation_id)
    try:
        with project_prefect_settings(settings.project_dir):
            reports = dialogue_ingest_flow(
                [str(p) for p in args.dialogues],
                str(settings.project_dir),
                args.conversation_id,
                args.extract,
                args.batch_size,
                args.concurrency,
            )
    finally:
        close_services()
    print(json.dumps(reports, indent=2))
    return 0


def _reembed(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    if args.batch_size < 1:
        raise InvalidInputError("--batch-size must be at least 1")
    try:
        if args.conversation_ids:
            # The flow reads the same (cached) service: the graph starts once.
            reembed_targets(DialogueRepository(service_for(settings).store), args.conversation_ids)
        with project_prefect_settings(settings.project_dir):
            reports = dialogue_reembed_flow(
                str(settings.project_dir), args.conversation_ids, args.batch_size
            )
    finally:
        close_services()
    print(json.dumps(reports, indent=2))
    return 0


def _commit(args: argparse.Namespace, settings: Settings, options: SidecarOptions) -> int:
    raw = _read_request_file(args.request)
    attempt: Literal["commit", "retry"] = "retry" if args.retry else "commit"
    if args.prefect:
        result = _commit_as_flow(raw, attempt, settings, options)
    else:
        service = DialogueService(settings, options=options)
        try:
            result = service.commit(raw, attempt=attempt)
        finally:
            service.close()
    print(result.model_dump_json(indent=2))
    if result.reason:
        print(f"dialogue: {result.code}: {result.reason}", file=sys.stderr)
    return EXIT_CODES.get(result.code or "COMMITTED", 1)


def _commit_as_flow(
    raw: bytes, attempt: Literal["commit", "retry"], settings: Settings, options: SidecarOptions
) -> TurnResult:
    """The turn as the `dialogue-turn` flow; a request that does not parse never starts it."""
    parsed = parse_request(raw)
    if isinstance(parsed, TurnResult):
        result = parsed
    else:
        with project_prefect_settings(settings.project_dir):
            data = dialogue_turn_flow(parsed, str(settings.project_dir), attempt, options)
        result = TurnResult.model_validate(data)
    close_services()
    return result


_COMMANDS: dict[str, Callable[[argparse.Namespace, Settings, SidecarOptions], int]] = {
    "openapi": _openapi,
    "lorebook": _lorebook,
    "serve": _serve,
    "rewind": _rewind,
    "forget": _forget,
    "rename": _rename,
    "copy": _copy,
    "conversations": _conversations,
    "query": _query,
    "ingest": _ingest,
    "reembed": _reembed,
    "commit": _commit,
}


if __name__ == "__main__":
    run_main(main, "dialogue", sys.argv[1:])
