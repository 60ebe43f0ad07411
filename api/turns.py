"""The operations that run the service: commit, retry and replace a turn, rewind, forget,
rename, copy or import (a chat's history, in bulk) a conversation, and the memory query before
a reply.

Each reads the raw body (capped, api.statuses.read_body), hands it to the service, which
validates it against the request model and never raises for bad input, and answers with the
service's result and the status it calls for (api.statuses). The service blocks (graph and
LLM clients are synchronous), so it runs off the event loop: the memory query on the thread
pool, at the server's priority (a person waits for it before the reply); a turn's write on
the service's turn-write pool, a few steps nicer (`DialogueService.submit_turn_write`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.openapi import json_body
from api.paths import (
    COMMIT_PATH,
    COPY_PATH,
    FORGET_PATH,
    IMPORT_PATH,
    MEMORY_QUERY_PATH,
    RENAME_PATH,
    REPLACE_PATH,
    RETRY_PATH,
    REWIND_PATH,
)
from api.statuses import (
    COPY_RESPONSES,
    FORGET_RESPONSES,
    IMPORT_RESPONSES,
    MEMORY_RESPONSES,
    RENAME_RESPONSES,
    REWIND_RESPONSES,
    TURN_RESPONSES,
    answer,
    call_status,
    read_body,
    turn_status,
)
from core.errors import Err
from core.priority import QUERIES
from tasks.dialogue.models import (
    CallRequest,
    CallResult,
    CopyRequest,
    CopyResult,
    ForgetRequest,
    ForgetResult,
    ImportRequest,
    ImportResult,
    MemoryQueryRequest,
    MemoryQueryResult,
    RenameRequest,
    RenameResult,
    RewindRequest,
    RewindResult,
    TurnCommitRequest,
    TurnResult,
    parse_copy,
    parse_forget,
    parse_import,
    parse_rename,
    parse_rewind,
    refused_call,
)
from tasks.dialogue.pipeline import DialogueService


async def service_of(request: Request) -> DialogueService:
    """The app's DialogueService (api.app.create_app puts it on the app's state). A coroutine:
    FastAPI runs a plain function dependency on the thread pool, one more hop per request."""
    service: DialogueService = request.app.state.service
    return service


Service = Annotated[DialogueService, Depends(service_of)]
router = APIRouter()


async def _turn(
    request: Request,
    service: DialogueService,
    attempt: Literal["commit", "retry"],
    replace: bool = False,
) -> JSONResponse:
    body = await read_body(request)
    if isinstance(body, Err):
        result = TurnResult.invalid(body.reason, kind=body.kind)
    else:
        result = await asyncio.wrap_future(
            service.submit_turn_write(service.commit, body.value, attempt=attempt, replace=replace)
        )
    return answer(result, turn_status(result), result.retryable)


@router.post(
    COMMIT_PATH,
    operation_id="commit_turn",
    response_model=TurnResult,
    responses=TURN_RESPONSES,
    openapi_extra=json_body(TurnCommitRequest),
    summary="Commit one conversation turn to the memory graph",
)
async def commit_turn(request: Request, service: Service) -> JSONResponse:
    return await _turn(request, service, "commit")


@router.post(
    RETRY_PATH,
    operation_id="retry_turn",
    response_model=TurnResult,
    responses=TURN_RESPONSES,
    openapi_extra=json_body(TurnCommitRequest),
    summary="Retry a rolled-back turn (same body; an already committed turn is returned as is)",
)
async def retry_turn(request: Request, service: Service) -> JSONResponse:
    return await _turn(request, service, "retry")


@router.post(
    REPLACE_PATH,
    operation_id="replace_turn",
    response_model=TurnResult,
    responses=TURN_RESPONSES,
    openapi_extra=json_body(TurnCommitRequest),
    summary="Replace a turn (an edit or a swipe): the old turn and every later one are rewound "
    "exactly, then the new text is committed; the same text again is an idempotent replay",
)
async def replace_turn(request: Request, service: Service) -> JSONResponse:
    return await _turn(request, service, "commit", replace=True)


@router.post(
    REWIND_PATH,
    operation_id="rewind_conversation",
    response_model=RewindResult,
    responses=REWIND_RESPONSES,
    openapi_extra=json_body(RewindRequest),
    summary="Rewind a conversation to before turn N: that turn and every later one are removed "
    "exactly (facts, relation events, milestones, memory), like a chapter rollback",
)
async def rewind_conversation(request: Request, service: Service) -> JSONResponse:
    return await _conversation_call(request, RewindResult, parse_rewind, service.rewind, service)


@router.post(
    FORGET_PATH,
    operation_id="forget_conversation",
    response_model=ForgetResult,
    responses=FORGET_RESPONSES,
    openapi_extra=json_body(ForgetRequest),
    summary="Forget a conversation (its chat was deleted): every turn, memory row, entity, "
    "relation, event and milestone it holds is removed in one transaction; `found: false` "
    "when memory held nothing of it",
)
async def forget_conversation(request: Request, service: Service) -> JSONResponse:
    return await _conversation_call(request, ForgetResult, parse_forget, service.forget, service)


@router.post(
    RENAME_PATH,
    operation_id="rename_conversation",
    response_model=RenameResult,
    responses=RENAME_RESPONSES,
    openapi_extra=json_body(RenameRequest),
    summary="Rename a conversation (its chat was renamed): every turn, memory row, entity, "
    "relation, event and milestone moves to `new_conversation_id` in one transaction, as if "
    "committed under it; `found: false` when memory held nothing of it",
)
async def rename_conversation(request: Request, service: Service) -> JSONResponse:
    return await _conversation_call(request, RenameResult, parse_rename, service.rename, service)


@router.post(
    COPY_PATH,
    operation_id="copy_conversation",
    response_model=CopyResult,
    responses=COPY_RESPONSES,
    openapi_extra=json_body(CopyRequest),
    summary="Copy a conversation (its chat was branched): every turn, memory row, entity, "
    "relation, event and milestone is copied to `new_conversation_id` in one transaction, as if "
    "committed under it, and the conversation stays as it was; `found: false` when memory held "
    "nothing of it",
)
async def copy_conversation(request: Request, service: Service) -> JSONResponse:
    return await _conversation_call(request, CopyResult, parse_copy, service.copy, service)


@router.post(
    IMPORT_PATH,
    operation_id="import_conversation",
    response_model=ImportResult,
    responses=IMPORT_RESPONSES,
    openapi_extra=json_body(ImportRequest),
    summary="Import turns of a chat's history in bulk: each is remembered as text (no LLM slot "
    "runs, so no facts), appended in the order given; a turn memory holds already is left as "
    "it is (`already`)",
)
async def import_conversation(request: Request, service: Service) -> JSONResponse:
    return await _conversation_call(
        request, ImportResult, parse_import, service.import_turns, service
    )


async def _conversation_call(
    request: Request,
    result: type[CallResult],
    parse: Callable[[bytes], CallRequest | CallResult],
    call: Callable[[CallRequest], CallResult],
    service: DialogueService,
) -> JSONResponse:
    """A call on a whole conversation: the body read and parsed, the call on the turn-write pool."""
    body = await read_body(request)
    if isinstance(body, Err):
        outcome = refused_call(result, body.reason, body.kind)
    else:
        parsed = parse(body.value)
        if isinstance(parsed, result):
            outcome = parsed
        else:
            outcome = await asyncio.wrap_future(service.submit_turn_write(call, parsed))
    return answer(outcome, call_status(outcome), outcome.retryable)


@router.post(
    MEMORY_QUERY_PATH,
    operation_id="query_memory",
    response_model=MemoryQueryResult,
    responses=MEMORY_RESPONSES,
    openapi_extra=json_body(MemoryQueryRequest),
    summary="Memory for PENDING messages before the model replies: the injection_packet a turn "
    "would get (the same retrieval and injector), nothing written",
)
async def query_memory(request: Request, service: Service) -> JSONResponse:
    # In flight from its body to its answer, hand-overs included: the turns' background steps
    # wait for it meanwhile (core.priority).
    with QUERIES.serving():
        body = await read_body(request)
        if isinstance(body, Err):
            result = MemoryQueryResult.invalid(body.reason, kind=body.kind)
        else:
            result = await run_in_threadpool(service.memory_query, body.value)
        return answer(result, call_status(result), result.retryable)
