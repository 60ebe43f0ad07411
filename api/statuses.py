"""Which HTTP status each answer gets, and the responses each operation documents.

Every body carries `code`, `error_kind` (finer) and a one-line `reason` when the call did not
succeed. The status follows from them:

| status | when | body |
|---|---|---|
| 200 | committed, an idempotent replay, or ROLLED_BACK by the commit gate (`committed: false`); rewound; memory found | the operation's result |
| 400 | INVALID_REQUEST, `malformed`: the body (or a path or query parameter) breaks the schema, is not JSON or not UTF-8 | the result, or ApiError |
| 401 | no or a wrong bearer token (only when the server has one) | ApiError |
| 403 | INVALID_REQUEST, `forbidden`: valid, but refused by this server's configuration (`config.db` naming another graph, or a password, without `--allow-request-db`) | the result |
| 404 | NOT_FOUND: a lorebook asked for a conversation the graph does not hold | ApiError |
| 409 | IN_PROGRESS (`busy`, retryable, Retry-After): another turn of the conversation holds its lock; or INVALID_REQUEST, `conflict`: the turn is committed with a different payload (use /turn/replace), or the conversation cannot be rewound | the result |
| 413 | INVALID_REQUEST, `too_large`: the body is over `MAX_BODY_BYTES` | the result |
| 500 | `internal`: a bug; the turn was rolled back, nothing written | the result, or ApiError |
| 503 | ROLLED_BACK or UNAVAILABLE and retryable (LLM or graph unavailable, a timeout; Retry-After); a deep health check whose LLM does not answer | the result, or ApiError, or HealthReport |

A conflict is 409, not 422: HTTP's 409 is "the request conflicts with the current state of the
target resource", which is what a different payload under a committed key is; 422 is for a
body the server cannot process as such, which this one can (it is valid, and valid again
through /turn/replace).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.schemas import ApiError, HealthReport
from core.errors import Err, Ok, Result
from tasks.dialogue.models import (
    MAX_BODY_BYTES,
    CopyResult,
    ForgetResult,
    ImportResult,
    MemoryQueryResult,
    RenameResult,
    RewindResult,
    TurnResult,
)

_INVALID = {"too_large": 413, "forbidden": 403, "conflict": 409}
RETRY_AFTER_S = "1"


def _status(ok: bool, code: str | None, kind: str | None, retryable: bool) -> int:
    if ok:
        return 200
    if code == "INVALID_REQUEST":
        return _INVALID.get(kind or "", 400)
    if code == "IN_PROGRESS":
        return 409
    if kind == "internal":
        return 500
    return 503 if retryable else 200


def turn_status(result: TurnResult) -> int:
    """200 also for a turn ROLLED_BACK and not retryable (the gate blocked it, or the LLM
    refused for good): the turn was handled, `committed: false` says how."""
    return _status(result.ok, result.code, result.error_kind, result.retryable)


def call_status(
    result: RewindResult
    | ForgetResult
    | RenameResult
    | CopyResult
    | ImportResult
    | MemoryQueryResult,
) -> int:
    """A rewind, a forget, a rename, a copy, an import or a memory query: unlike a turn, one that did not
    happen is never 200."""
    status = _status(result.ok, result.code, result.error_kind, result.retryable)
    return 503 if status == 200 and not result.ok else status


def answer(body: BaseModel, status: int, retryable: bool = False) -> JSONResponse:
    """The JSON response; Retry-After on a retryable 409 or 503."""
    headers = {"Retry-After": RETRY_AFTER_S} if status in (409, 503) and retryable else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


async def read_body(request: Request) -> Result[bytes, Literal["too_large"]]:
    """The body, read with a cap so an oversized upload is refused without buffering it all;
    Err(the one-line reason, too_large) when it was refused (413). A result, not an error:
    each route answers it with its own result model, as it answers every other refusal."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return Err(
            f"request body is {int(declared)} bytes; the limit is {MAX_BODY_BYTES}", "too_large"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return Err(f"request body is over the limit of {MAX_BODY_BYTES} bytes", "too_large")
        chunks.append(chunk)
    return Ok(b"".join(chunks))


# --- what each operation documents -----------------------------------------------------------

_RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before retrying (retryable answers only)",
        "schema": {"type": "string"},
    }
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _either(description: str, *models: type[BaseModel], headers: bool = False) -> dict[str, Any]:
    schema = _ref(models[0]) if len(models) == 1 else {"anyOf": [_ref(m) for m in models]}
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        out["headers"] = _RETRY_AFTER
    return out


_UNAUTHORIZED = {
    "model": ApiError,
    "description": "no or a wrong bearer token (the server has one)",
}


def call_responses(
    result: type[BaseModel], *, forbidden: bool, conflict: str | None
) -> dict[int | str, dict[str, Any]]:
    """The responses of an operation whose body is parsed into a service call (403 and 409 only
    where the operation can answer them)."""
    responses: dict[int | str, dict[str, Any]] = {
        400: {
            "model": result,
            "description": "INVALID_REQUEST (malformed): the body breaks the schema, or is "
            "not JSON or not UTF-8; `reason` names the first bad field",
        },
        401: _UNAUTHORIZED,
        413: {
            "model": result,
            "description": f"INVALID_REQUEST (too_large): the body is over {MAX_BODY_BYTES} bytes",
        },
        500: _either("internal error (a bug): nothing was written", result, ApiError),
        503: {
            "model": result,
            "headers": _RETRY_AFTER,
            "description": "rolled back or unavailable, retryable (LLM or graph unavailable, a timeout): "
            "nothing was written; retry after Retry-After seconds",
        },
    }
    if conflict is not None:
        responses[409] = {"model": result, "headers": _RETRY_AFTER, "description": conflict}
    if forbidden:
        responses[403] = {
            "model": result,
            "description": "INVALID_REQUEST (forbidden): config.db names another "
            "graph than the served one, or carries a password, and the server runs without "
            "--allow-request-db",
        }
    return dict(sorted(responses.items(), key=lambda item: str(item[0])))


TURN_CONFLICT = (
    "IN_PROGRESS (busy, retryable, Retry-After): another turn of the conversation holds its lock; "
    "or INVALID_REQUEST (conflict): the turn is committed with a different payload (/turn/replace "
    "changes it), or the conversation has turns committed before rewinds were possible and cannot "
    "be rewound"
)
REWIND_CONFLICT = (
    "IN_PROGRESS (busy, retryable, Retry-After): another turn of the conversation holds its lock; "
    "or INVALID_REQUEST (conflict): the conversation has turns committed before rewinds were "
    "possible and cannot be rewound"
)

TURN_RESPONSES = call_responses(TurnResult, forbidden=True, conflict=TURN_CONFLICT)
REWIND_RESPONSES = call_responses(RewindResult, forbidden=False, conflict=REWIND_CONFLICT)
FORGET_RESPONSES = call_responses(
    ForgetResult,
    forbidden=False,
    conflict="IN_PROGRESS (busy, retryable, Retry-After): a turn of the conversation holds its lock",
)
RENAME_RESPONSES = call_responses(
    RenameResult,
    forbidden=False,
    conflict="IN_PROGRESS (busy, retryable, Retry-After): a turn of either conversation holds "
    "its lock; or INVALID_REQUEST (conflict): the new id already holds memory, or the "
    "conversation has turns committed before renames were possible",
)
COPY_RESPONSES = call_responses(
    CopyResult,
    forbidden=False,
    conflict="IN_PROGRESS (busy, retryable, Retry-After): a turn of either conversation holds "
    "its lock; or INVALID_REQUEST (conflict): the new id already holds memory, or the "
    "conversation has turns committed before copies were possible",
)
IMPORT_RESPONSES = call_responses(
    ImportResult,
    forbidden=False,
    conflict="IN_PROGRESS (busy, retryable, Retry-After): a turn of the conversation holds its lock",
)
MEMORY_RESPONSES = call_responses(MemoryQueryResult, forbidden=True, conflict=None)

READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ApiError,
        "description": "INVALID_REQUEST: a path or query parameter breaks its rules",
    },
    401: _UNAUTHORIZED,
    500: {"model": ApiError, "description": "internal error (a bug)"},
    503: {
        "model": ApiError,
        "headers": _RETRY_AFTER,
        "description": "UNAVAILABLE: the graph (or, for search, the embedding model) does not answer; retry",
    },
}
LOREBOOK_RESPONSES: dict[int | str, dict[str, Any]] = dict(
    sorted(
        {
            **READ_RESPONSES,
            404: {
                "model": ApiError,
                "description": "NOT_FOUND: the graph holds no such conversation",
            },
        }.items(),
        key=lambda item: str(item[0]),
    )
)
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    **READ_RESPONSES,
    503: _either(
        "deep=true and the LLM endpoint does not answer (HealthReport, status degraded), or the graph "
        "does not answer (ApiError)",
        HealthReport,
        ApiError,
        headers=True,
    ),
}
