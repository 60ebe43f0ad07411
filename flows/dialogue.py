"""`python -m flows.dialogue`: the dialogue memory sidecar (spec 000).

    serve    HTTP adapter for chat front ends, OpenAPI at /openapi.json:
               POST /api/kg-sidecar/memory/query        memory for PENDING messages (no writes; a turn in
                                                        pending_turns is recalled only with its new text)
               POST /api/kg-sidecar/turn/commit, /retry commit a finished turn
               POST /api/kg-sidecar/turn/replace        an edit or swipe: rewind the turn, commit the new text
               POST /api/kg-sidecar/conversation/rewind rewind to before turn N (exact)
               GET  /api/kg-sidecar/conversations/{id}/entities|relations|milestones|turns (paged), /search
             Security: a bearer token (SKALD_SIDECAR_TOKEN or --token-file; required to bind a
             non-loopback address), CORS for the origins given with --cors-origin.
    commit   one turn from a JSON file (`--prefect` runs it as the `dialogue-turn` flow)
    ingest   import whole transcripts (shared JSONL turn format) into turn memory, as the
             `dialogue-ingest` flow: batched embeddings, a progress bar (terminal and Prefect
             UI), resumable after a kill with every turn exactly once; `--extract` also runs
             the LLM slots and the commit gate on every turn
    rewind   rewind a conversation to before turn N (exact), as POST .../conversation/rewind does
    openapi  write the OpenAPI document without starting a server

The turn pipeline itself is plain Python (tasks.dialogue.pipeline): the HTTP server and the
regression batch call it directly, because a Prefect flow run per turn costs far more than
the turn's own non-LLM work (measured against the local API: ~1.05 s per turn as a flow
with six task runs vs ~0.1 s for the same turn called directly). `dialogue_turn_flow` wraps
the same pipeline for single turns from the Prefect UI or a deployment, each slot a task run.

HTTP status mapping (the body is always a TurnResult with `code` and a one-line `reason`):
200 COMMITTED (also an idempotent replay), or ROLLED_BACK and not retryable (the commit gate
blocked the turn; `committed: false`); 503 + Retry-After: ROLLED_BACK and retryable (LLM or
graph unavailable, timeout); 409 + Retry-After: IN_PROGRESS (another turn of the conversation
holds the lock past the wait); 400 INVALID_REQUEST (malformed, wrong types, non-UTF-8);
413 INVALID_REQUEST (body over the size limit); 422 INVALID_REQUEST (idempotency conflict:
the key is committed with a different payload).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from starlette.concurrency import run_in_threadpool

from core.cli import run_main, setup_logging
from core.errors import InvalidInputError, SkaldError
from core.settings import Settings, load_settings
from kg import vocabulary as vocab
from kg.dialogue import DialogueRepository
from tasks.dialogue.ingest import BATCH_SIZE as INGEST_BATCH_SIZE
from tasks.dialogue.models import (
    MAX_REQUEST_BYTES,
    EntityOut,
    EntityPage,
    MemoryQueryRequest,
    MemoryQueryResult,
    MilestoneOut,
    MilestonePage,
    PageInfo,
    RecalledTurnOut,
    RelationEventOut,
    RelationOut,
    RelationPage,
    RewindRequest,
    RewindResult,
    SearchResult,
    TurnCommitRequest,
    TurnOut,
    TurnPage,
    TurnResult,
    parse_request,
    parse_rewind,
)
from tasks.dialogue.pipeline import DialogueService, SidecarOptions

log = logging.getLogger("skald.dialogue")

T = TypeVar("T")
API_PREFIX = "/api/kg-sidecar"
COMMIT_PATH = f"{API_PREFIX}/turn/commit"
RETRY_PATH = f"{API_PREFIX}/turn/retry"
HEALTH_PATH = f"{API_PREFIX}/health"
REPLACE_PATH = f"{API_PREFIX}/turn/replace"
REWIND_PATH = f"{API_PREFIX}/conversation/rewind"
MEMORY_QUERY_PATH = f"{API_PREFIX}/memory/query"
CONVERSATIONS_PATH = f"{API_PREFIX}/conversations"
TOKEN_ENV = "SKALD_SIDECAR_TOKEN"
CORS_ENV = "SKALD_SIDECAR_CORS_ORIGINS"
# JSON structure around the message text (keys, escapes) on top of the text limit.
MAX_BODY_BYTES = MAX_REQUEST_BYTES + 64 * 1024
API_DESCRIPTION = (
    "Dialogue memory sidecar (spec 000). Each turn runs RECEIVED -> RETRIEVING -> INJECTING -> "
    "ACTING -> EXTRACTING -> JUDGING -> HISTORIANING -> PREPARED -> COMMITTING -> COMMITTED, or "
    "ends ROLLED_BACK with nothing written. The idempotency key is conversation_id:turn_id. "
    "Statuses: 200 committed (or an idempotent replay, or rolled back by the commit gate with "
    "committed=false); 503 rolled back and retryable; 409 IN_PROGRESS; 400/413/422 INVALID_REQUEST "
    "(malformed / too large / idempotency conflict)."
)
EXIT_CODES = {"COMMITTED": 0, "ROLLED_BACK": 1, "INVALID_REQUEST": 2, "IN_PROGRESS": 3}


# ----------------------------------------------------------------------------- Prefect
@task(name="dialogue-slot", cache_policy=NO_CACHE, persist_result=False)
def _slot_task(slot: str, work: Callable[[], Any]) -> Any:
    return work()


def prefect_slot_runner(slot: str, work: Callable[[], T]) -> T:
    """Run one slot as a Prefect task run named after the slot."""
    return _slot_task.with_options(name=slot)(slot, work)  # type: ignore[no-any-return]


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
    log.info("turn %s: %s%s", result.key, result.state.value, f" ({result.reason})" if result.reason else "")
    return result.model_dump(mode="json")


class IngestProgress:
    """A rich progress bar in the terminal and a Prefect progress artifact, per batch."""

    def __init__(self, total: int, description: str) -> None:
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
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), transient=False, console=Console(stderr=True))
        self._task = self._bar.add_task(description, total=total)
        self._artifact = create_progress_artifact(progress=0.0, key="dialogue-ingest",
                                                  description=f"{description}: turns handled, percent")
        self._reported = 0.0

    def __enter__(self) -> IngestProgress:
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
            if self._artifact is not None and (percent - self._reported >= 5 or self.done >= self.total):
                update_progress_artifact(self._artifact, progress=round(percent, 1))
                self._reported = percent
                log.info("ingest: %d/%d turns (%s)", self.done, self.total, conversation_id)


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
    from tasks.dialogue.replay import dialogue_files, load_dialogue

    specs = [load_dialogue(path) for path in dialogue_files([Path(d) for d in dialogues])]
    if conversation_id is not None and len(specs) > 1:
        raise InvalidInputError("--conversation-id names one conversation, but several dialogues were given",
                                hint="ingest one dialogue per --conversation-id, or leave it out")
    items = [(spec, conversation_id or spec.dialogue_id) for spec in specs]
    service = service_for(load_settings(project_dir))
    total = sum(len(spec.turns) for spec in specs)
    with IngestProgress(total, "extracting turns" if extract else "remembering turns") as progress:
        reports = ingest(service, items, extract=extract, batch_size=batch_size, concurrency=concurrency,
                         progress=progress)
    for report in reports:
        log.info("ingest %s -> %s: %d turns, %d added, %d already there, %.1f turns/s%s",
                 report.dialogue_id, report.conversation_id, report.turns, report.added, report.already,
                 report.turns_per_s, f", {report.extract_outcomes}" if report.extract_outcomes else "")
    return [r.model_dump(mode="json") for r in reports]


# ----------------------------------------------------------------------------- HTTP
def http_status(result: TurnResult) -> int:
    if result.ok:
        return 200
    if result.code == "INVALID_REQUEST":
        return {"conflict": 422, "too_large": 413}.get(result.error_kind or "", 400)
    if result.code == "IN_PROGRESS":
        return 409
    return 503 if result.retryable else 200


def _response(result: TurnResult) -> JSONResponse:
    status = http_status(result)
    headers = {"Retry-After": "1"} if status in (409, 503) else None
    return JSONResponse(result.model_dump(mode="json"), status_code=status, headers=headers)


async def _read_body(request: Request) -> bytes | TurnResult:
    """The body, read with a cap so an oversized upload is refused without buffering it all."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return TurnResult.invalid(
            f"request body is {int(declared)} bytes; the limit is {MAX_BODY_BYTES}", kind="too_large"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return TurnResult.invalid(f"request body is over the limit of {MAX_BODY_BYTES} bytes", kind="too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _openapi_schema(app: FastAPI, token_required: bool = False) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": f"the server's token ({TOKEN_ENV} or --token-file); required when one is set"}}
    if token_required:
        schema["security"] = [{"bearer": []}]
    request_schema = TurnCommitRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request_schema.pop("$defs", {}))
    components["TurnCommitRequest"] = request_schema
    for model in (MemoryQueryRequest, RewindRequest):
        extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(extra.pop("$defs", {}))
        components[model.__name__] = extra
    app.openapi_schema = schema
    return schema


class SidecarSecurity:
    """Who may call the sidecar: a bearer token (None: no check, loopback only) and the browser
    origins CORS lets in."""

    def __init__(self, token: str | None = None, cors_origins: Sequence[str] = ()) -> None:
        if token is not None and len(token) < 16:
            raise InvalidInputError("the sidecar token is shorter than 16 characters",
                                    hint=f"set {TOKEN_ENV} to a long random string (e.g. `openssl rand -hex 24`)")
        self.token = token
        self.cors_origins = list(cors_origins)

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _paged(offset: int, limit: int, total: int) -> PageInfo:
    return PageInfo(offset=offset, limit=limit, total=total)


def _entity_out(e: Any) -> EntityOut:
    return EntityOut(**e.model_dump(exclude={"aliases"}), aliases=list(e.aliases))


def _json_body(schema: str) -> dict[str, Any]:
    """OpenAPI for a required JSON request body of the named component schema (the handlers
    read the raw body themselves, so FastAPI cannot infer it)."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def create_app(service: DialogueService, security: SidecarSecurity | None = None) -> FastAPI:
    """The sidecar's HTTP API over one DialogueService."""
    security = security or SidecarSecurity()
    app = FastAPI(
        title="Skald KG sidecar",
        version="1.1.0",
        description=API_DESCRIPTION,
    )
    body_spec = _json_body("TurnCommitRequest")
    responses: dict[int | str, dict[str, Any]] = {
        code: {"model": TurnResult, "description": text}
        for code, text in (
            (400, "INVALID_REQUEST: malformed request"),
            (401, "no or wrong bearer token"),
            (409, "IN_PROGRESS: the conversation is busy; retry after Retry-After seconds"),
            (413, "INVALID_REQUEST: request body too large"),
            (422, "INVALID_REQUEST: idempotency conflict"),
            (503, "ROLLED_BACK and retryable: nothing was written; retry"),
        )
    }

    @app.middleware("http")
    async def bearer_token(request: Request, call_next: Callable[[Request], Any]) -> Any:
        if not security.authorized(request.headers.get("authorization")):
            return JSONResponse({"code": "UNAUTHORIZED", "reason": "missing or wrong bearer token"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    # Added last, so outermost: a preflight (which carries no token) is answered here.
    app.add_middleware(
        CORSMiddleware,
        allow_origins=security.cors_origins,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type"],
        max_age=600,
    )

    async def read_json(request: Request) -> bytes | TurnResult:
        return await _read_body(request)

    async def handle(request: Request, attempt: Literal["commit", "retry"], replace: bool = False) -> JSONResponse:
        body = await read_json(request)
        if isinstance(body, TurnResult):
            return _response(body)
        parsed = parse_request(body)
        if isinstance(parsed, TurnResult):
            return _response(parsed)
        # The pipeline blocks (graph and LLM clients are synchronous): keep it off the loop.
        result = await run_in_threadpool(service.commit, parsed, attempt=attempt, replace=replace)
        return _response(result)

    @app.post(COMMIT_PATH, response_model=TurnResult, responses=responses, openapi_extra=body_spec,
              summary="Commit one conversation turn to the memory graph")
    async def commit_turn(request: Request) -> JSONResponse:
        return await handle(request, "commit")

    @app.post(RETRY_PATH, response_model=TurnResult, responses=responses, openapi_extra=body_spec,
              summary="Retry a rolled-back turn (same body; an already committed turn is returned as is)")
    async def retry_turn(request: Request) -> JSONResponse:
        return await handle(request, "retry")

    @app.post(REPLACE_PATH, response_model=TurnResult, responses=responses, openapi_extra=body_spec,
              summary="Replace a turn (an edit or a swipe): the old turn and every later one are rewound "
              "exactly, then the new text is committed; the same text again is an idempotent replay")
    async def replace_turn(request: Request) -> JSONResponse:
        return await handle(request, "commit", replace=True)

    @app.post(REWIND_PATH, response_model=RewindResult,
              responses={400: {"model": RewindResult}, 409: {"model": RewindResult}, 503: {"model": RewindResult}},
              openapi_extra=_json_body("RewindRequest"),
              summary="Rewind a conversation to before turn N: that turn and every later one are removed "
              "exactly (facts, relation events, milestones, memory), like a chapter rollback")
    async def rewind(request: Request) -> JSONResponse:
        body = await read_json(request)
        if isinstance(body, TurnResult):
            return _response(body)
        parsed = parse_rewind(body)
        if isinstance(parsed, str):
            result = RewindResult(ok=False, conversation_id="", before_turn="", code="INVALID_REQUEST", reason=parsed)
            return JSONResponse(result.model_dump(mode="json"), status_code=400)
        outcome = await run_in_threadpool(service.rewind, parsed.conversation_id, str(parsed.before_turn))
        status = 200 if outcome.ok else {"INVALID_REQUEST": 400, "IN_PROGRESS": 409}.get(outcome.code or "", 503)
        headers = {"Retry-After": "1"} if status in (409, 503) else None
        return JSONResponse(outcome.model_dump(mode="json"), status_code=status, headers=headers)

    @app.post(MEMORY_QUERY_PATH, response_model=MemoryQueryResult,
              responses={400: {"model": MemoryQueryResult}, 413: {"model": MemoryQueryResult},
                         503: {"model": MemoryQueryResult}},
              openapi_extra=_json_body("MemoryQueryRequest"),
              summary="Memory for PENDING messages before the model replies: the injection_packet a turn "
              "would get (the same retrieval and injector), nothing written")
    async def memory_query(request: Request) -> JSONResponse:
        body = await read_json(request)
        if isinstance(body, TurnResult):
            result = MemoryQueryResult.invalid(body.reason or "request body too large")
            return JSONResponse(result.model_dump(mode="json"), status_code=413)
        answer = await run_in_threadpool(service.memory_query, body)
        status = 200 if answer.ok else 400 if answer.code == "INVALID_REQUEST" else 503
        return JSONResponse(answer.model_dump(mode="json"), status_code=status,
                            headers={"Retry-After": "1"} if status == 503 else None)

    def repo() -> DialogueRepository:
        return DialogueRepository(service.store)

    page_offset = Query(0, ge=0, le=10_000_000, description="items to skip")
    page_limit = Query(50, ge=1, le=500, description="items per page")

    @app.get(f"{CONVERSATIONS_PATH}/{{conversation_id}}/entities", response_model=EntityPage,
             summary="A conversation's entities (bio, traits, aliases), oldest first")
    async def list_entities(conversation_id: str, offset: int = page_offset, limit: int = page_limit) -> EntityPage:
        total, items = await run_in_threadpool(repo().entity_page, conversation_id, offset, limit)
        return EntityPage(conversation_id=conversation_id, page=_paged(offset, limit, total),
                          items=[_entity_out(e) for e in items])

    @app.get(f"{CONVERSATIONS_PATH}/{{conversation_id}}/relations", response_model=RelationPage,
             summary="A conversation's relations, active and ended, each with its event history")
    async def list_relations(conversation_id: str, offset: int = page_offset, limit: int = page_limit) -> RelationPage:
        total, items = await run_in_threadpool(repo().relation_page, conversation_id, offset, limit)
        out = [
            RelationOut(**rel.model_dump(exclude={"raw_type"}),
                        events=[RelationEventOut(**{k: v for k, v in ev.items() if k in RelationEventOut.model_fields})
                                for ev in events])
            for rel, events in items
        ]
        return RelationPage(conversation_id=conversation_id, page=_paged(offset, limit, total), items=out)

    @app.get(f"{CONVERSATIONS_PATH}/{{conversation_id}}/milestones", response_model=MilestonePage,
             summary="A conversation's milestones in turn order")
    async def list_milestones(conversation_id: str, offset: int = page_offset, limit: int = page_limit) -> MilestonePage:
        total, items = await run_in_threadpool(repo().milestone_page, conversation_id, offset, limit)
        return MilestonePage(conversation_id=conversation_id, page=_paged(offset, limit, total),
                             items=[MilestoneOut(**m.model_dump()) for m in items])

    @app.get(f"{CONVERSATIONS_PATH}/{{conversation_id}}/turns", response_model=TurnPage,
             summary="A conversation's remembered turns in order (committed, or blocked by the commit gate)")
    async def list_turns(conversation_id: str, offset: int = page_offset, limit: int = page_limit) -> TurnPage:
        total, rows = await run_in_threadpool(repo().memory_page, conversation_id, offset, limit)
        items = [TurnOut(key=r["key"], turn_id=str(r["turn_id"]), seq=int(r["seq"]), speaker=r["speaker"] or "",
                         text=r["text"] or "", when=r["said_when"] or "", committed=bool(r["committed"]),
                         facts=list(r["facts"] or [])) for r in rows]
        return TurnPage(conversation_id=conversation_id, page=_paged(offset, limit, total), items=items)

    @app.get(f"{CONVERSATIONS_PATH}/{{conversation_id}}/search", response_model=SearchResult,
             summary="Search a conversation: turns by the turn pipeline's hybrid recall, entities by name or "
             "alias, milestones by words")
    async def search(conversation_id: str, q: str = Query(..., min_length=1, max_length=2000),
                     k: int = Query(10, ge=1, le=50)) -> SearchResult:
        def work() -> SearchResult:
            turns = service.recall(conversation_id, q, k)
            words = {w for w in vocab.normalize_name(q).split() if w}
            wanted = f" {vocab.normalize_name(q)} "
            _, entities = repo().entity_page(conversation_id, 0, 10_000)
            hits = [e for e in entities
                    if any(f" {vocab.normalize_name(n)} " in wanted or wanted.strip() in vocab.normalize_name(n)
                           for n in (e.name, *e.aliases))]
            _, milestones = repo().milestone_page(conversation_id, 0, 10_000)
            found = [m for m in milestones if words and words <= set(vocab.normalize_name(m.text).split())]
            return SearchResult(
                conversation_id=conversation_id, query=q,
                turns=[RecalledTurnOut(**t.model_dump(exclude={"signals"})) for t in turns],
                entities=[_entity_out(e) for e in hits], milestones=[MilestoneOut(**m.model_dump()) for m in found],
            )

        return await run_in_threadpool(work)

    @app.get(HEALTH_PATH, summary="Liveness, the graph served, and (deep=true) whether the LLM answers")
    async def health(deep: bool = Query(False, description="also ask the LLM endpoint (GET /models)")) -> JSONResponse:
        store = await run_in_threadpool(lambda: service.store)
        body: dict[str, Any] = {
            "status": "ok", "graph": store.endpoint.label,
            "rolled_back_turns": service.rolled_back_count,
            "conversation_locks": service.conversation_lock_count(),
        }
        status = 200
        if deep:
            try:
                body["llm"] = await run_in_threadpool(service.gateway.check_endpoint, "small")
            except SkaldError as exc:
                body.update(status="degraded", llm_error=str(exc))
                status = 503
        return JSONResponse(body, status_code=status)

    app.openapi = lambda: _openapi_schema(app, security.token is not None)  # type: ignore[method-assign]
    return app


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flows.dialogue",
        description="Dialogue memory sidecar: commit conversation turns to the knowledge graph.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--project-dir", type=Path, default=Path("."), help="project whose graph holds the memory (default .)")
    common.add_argument("--config", type=Path, default=None, help="TOML settings file (default <project-dir>/skald.toml)")
    common.add_argument("--lock-wait", type=float, default=None, help="seconds a turn waits for its conversation lock before IN_PROGRESS (default 30)")
    common.add_argument("--turn-timeout", type=float, default=None, help="seconds a turn may take before it is rolled back (default 300)")
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,commit,ingest,rewind,openapi}")

    serve = sub.add_parser("serve", parents=[common], help="run the HTTP adapter")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    serve.add_argument("--allow-request-db", action="store_true",
                       help="honour a request's config.db that names another graph or carries a password "
                       "(off: such requests are refused); credentials are never logged")
    serve.add_argument("--cors-origin", dest="cors_origins", action="append", default=None, metavar="ORIGIN",
                       help=f"browser origin allowed to call the API, e.g. http://127.0.0.1:8000 (repeatable; "
                       f"default: {CORS_ENV}, comma-separated; none: browsers are refused)")
    serve.add_argument("--token-file", type=Path, default=None,
                       help=f"file holding the bearer token callers must send (default: {TOKEN_ENV}); "
                       "required when --host is not a loopback address")
    serve.add_argument("--max-call-records", type=int, default=20_000,
                       help="LLM call records kept in memory; older ones go to Parquet under "
                       "<project>/.saga/runs/sidecar (default 20000)")

    commit = sub.add_parser("commit", parents=[common], help="commit one turn from a JSON file")
    commit.add_argument("--request", required=True, help="turn-commit request JSON file ('-' for stdin)")
    commit.add_argument("--retry", action="store_true", help="mark the attempt as a retry in the trace")
    commit.add_argument("--prefect", action="store_true", help="run as the dialogue-turn Prefect flow (slots as task runs)")

    ingest = sub.add_parser("ingest", parents=[common],
                            help="import whole transcripts into turn memory (resumable, exactly once)")
    ingest.add_argument("--dialogue", dest="dialogues", type=Path, nargs="+", required=True, metavar="FILE.jsonl",
                        help="transcripts in the shared JSONL turn format (a directory: its *.turns.jsonl)")
    ingest.add_argument("--conversation-id", default=None,
                        help="conversation to import into (default: each file's conversation_id)")
    ingest.add_argument("--extract", action="store_true",
                        help="also run the LLM slots and the commit gate on every turn (graph facts)")
    ingest.add_argument("--batch-size", type=int, default=INGEST_BATCH_SIZE,
                        help=f"turns per embedding call and transaction (default {INGEST_BATCH_SIZE})")
    ingest.add_argument("--concurrency", type=int, default=2,
                        help="with --extract: conversations processed at once (default 2)")

    rewind = sub.add_parser("rewind", parents=[common],
                            help="rewind a conversation to before a turn (that turn and later ones removed exactly)")
    rewind.add_argument("--conversation-id", required=True, help="the conversation")
    rewind.add_argument("--before-turn", required=True, help="the first turn id to remove")

    openapi = sub.add_parser("openapi", parents=[common], help="write the OpenAPI document")
    openapi.add_argument("--out", type=Path, default=None, help="file to write (default stdout)")
    return parser


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
    return SidecarOptions(**values)


def serve_security(args: argparse.Namespace) -> SidecarSecurity:
    """The token and CORS origins of `serve`; refuses a non-loopback bind without a token."""
    token: str | None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise InvalidInputError(f"cannot read --token-file {args.token_file}: {exc.strerror or exc}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip() or None
    if token is None and not is_loopback(args.host):
        raise InvalidInputError(
            f"refusing to serve on {args.host} without a bearer token (anyone on the network could read and "
            f"rewrite memory)",
            hint=f"set {TOKEN_ENV} or pass --token-file, or bind 127.0.0.1",
        )
    origins = args.cors_origins
    if origins is None:
        origins = [o.strip() for o in os.environ.get(CORS_ENV, "").split(",") if o.strip()]
    return SidecarSecurity(token, origins)


def _read_request_file(spec: str) -> bytes:
    if spec == "-":
        return sys.stdin.buffer.read(MAX_BODY_BYTES + 1)
    path = Path(spec)
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_BODY_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(f"cannot read request file {path}: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    settings = load_settings(args.project_dir, args.config)
    options = _options(args)

    if args.command == "openapi":
        service = DialogueService(settings, options=options)
        text = json.dumps(create_app(service).openapi(), indent=2, sort_keys=True) + "\n"
        if args.out is None:
            sys.stdout.write(text)
        else:
            args.out.write_text(text, encoding="utf-8")
        return 0

    if args.command == "serve":
        import uvicorn

        security = serve_security(args)  # before anything starts: a refused bind costs nothing
        service = DialogueService(settings, options=options)
        try:
            log.info("graph: %s", service.store.endpoint.label)  # connect (and migrate) before serving
            log.info("auth: %s; CORS origins: %s", "bearer token" if security.token else "none (loopback only)",
                     ", ".join(security.cors_origins) or "none")
            uvicorn.run(create_app(service, security), host=args.host, port=args.port, log_level="info")
        finally:
            service.close()
        return 0

    if args.command == "rewind":
        parsed_rewind = parse_rewind({"conversation_id": args.conversation_id, "before_turn": args.before_turn})
        if isinstance(parsed_rewind, str):
            raise InvalidInputError(parsed_rewind)
        service = DialogueService(settings, options=options)
        try:
            outcome = service.rewind(parsed_rewind.conversation_id, str(parsed_rewind.before_turn))
        finally:
            service.close()
        print(outcome.model_dump_json(indent=2))
        if not outcome.ok:
            print(f"dialogue: {outcome.code}: {outcome.reason}", file=sys.stderr)
            return EXIT_CODES.get(outcome.code or "ROLLED_BACK", 1)
        return 0

    if args.command == "ingest":
        if args.batch_size < 1 or args.concurrency < 1:
            raise InvalidInputError("--batch-size and --concurrency must be at least 1")
        from core.cli import project_prefect_settings

        try:
            with project_prefect_settings(settings.project_dir):
                reports = dialogue_ingest_flow(
                    [str(p) for p in args.dialogues], str(settings.project_dir), args.conversation_id,
                    args.extract, args.batch_size, args.concurrency,
                )
        finally:
            close_services()
        print(json.dumps(reports, indent=2))
        return 0

    raw = _read_request_file(args.request)
    attempt: Literal["commit", "retry"] = "retry" if args.retry else "commit"
    if args.prefect:
        parsed = parse_request(raw)
        if isinstance(parsed, TurnResult):
            result = parsed
        else:
            from core.cli import project_prefect_settings

            with project_prefect_settings(settings.project_dir):
                data = dialogue_turn_flow(parsed, str(settings.project_dir), attempt, options)
            result = TurnResult.model_validate(data)
        close_services()
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


if __name__ == "__main__":
    run_main(main, "dialogue", sys.argv[1:])
