"""`create_app`: the sidecar's FastAPI app over one DialogueService.

The routes are in api.turns (the service calls) and api.readback (reads and health). Here:
the app, its security (api.security), its document (api.openapi), and the exception handlers
that keep every answer documented, with a one-line reason:

- a path or query parameter breaking its rules: 400 ApiError (FastAPI's default is a 422
  with a list of errors);
- the graph or the LLM not answering a read (core.errors.classify: a timeout, an LLM or a graph
  failure): 503 ApiError, with its retryable flag (Retry-After when retryable);
- anything else raised: 500 ApiError (a bug; logged with its traceback).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api import readback, turns
from api.openapi import build_openapi
from api.schemas import ApiError
from api.security import SidecarSecurity
from api.statuses import RETRY_AFTER_S
from core.errors import SkaldError, classify, first_problem
from tasks.dialogue.pipeline import DialogueService

log = logging.getLogger("skald.dialogue")

API_VERSION = "1.3.0"
API_DESCRIPTION = (
    "Dialogue memory sidecar (spec 000). Each turn runs RECEIVED -> RETRIEVING -> INJECTING -> "
    "ACTING -> EXTRACTING -> JUDGING -> HISTORIANING -> PREPARED -> COMMITTING -> COMMITTED, or "
    "ends ROLLED_BACK with nothing written. The idempotency key is conversation_id:turn_id. "
    "Statuses: 200 committed (or an idempotent replay, or rolled back by the commit gate with "
    "committed=false); 400 INVALID_REQUEST (the request breaks this document's schema); 401 no or a "
    "wrong bearer token; 403 a valid request this server's configuration refuses (config.db); 404 the "
    "lorebook of a conversation the graph does not hold; 409 "
    "IN_PROGRESS (retry after Retry-After) or an idempotency conflict (error_kind conflict); 413 body "
    "too large; 500 a bug (nothing written); 503 rolled back or unavailable, retryable. Every answer "
    "that is not a success carries code, error_kind and a one-line reason."
)
#: The failure kinds (core.errors.classify) that answer 503 UNAVAILABLE: a service did not answer
#: in time or at all. Every other failure is the product's own: 500 INTERNAL.
_UNAVAILABLE_KINDS = frozenset({"timeout", "llm", "graph"})
#: What the handler of known failures sees; the rest reaches the catch-all handler, which
#: classifies them the same way (Starlette gives `Exception`'s handler to its outermost
#: middleware, which re-raises after answering, so the expected ones are caught before it).
_EXPECTED = (SkaldError, TimeoutError, ConnectionError)


def _parameter_reason(exc: RequestValidationError) -> str:
    """One line naming the first bad parameter (and how many more there are)."""
    if not exc.errors():
        return "invalid request"
    problem = first_problem(exc, "request")
    loc = problem.detail["loc"]  # (where, name...): `path parameter conversation_id`
    where = f"{loc[0]} parameter {'.'.join(map(str, loc[1:]))}" if len(loc) > 1 else problem.place
    return f"invalid {where}: {problem.message}{problem.got()}{problem.and_more()}"


def _error(code: str, reason: str, status: int, *, retryable: bool = False) -> JSONResponse:
    body = ApiError(code=code, reason=reason, retryable=retryable)  # type: ignore[arg-type]
    headers = {"Retry-After": RETRY_AFTER_S} if retryable else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def create_app(service: DialogueService, security: SidecarSecurity | None = None) -> FastAPI:
    """The sidecar's HTTP API over one DialogueService."""
    security = security or SidecarSecurity()
    app = FastAPI(title="Skald KG sidecar", version=API_VERSION, description=API_DESCRIPTION)
    app.state.service = service
    app.include_router(turns.router)
    app.include_router(readback.router)
    security.install(app)

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error("INVALID_REQUEST", _parameter_reason(exc), 400)

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        failure = classify(exc)
        if failure.kind in _UNAVAILABLE_KINDS:
            return _error("UNAVAILABLE", str(exc), 503, retryable=failure.retryable)
        log.error("%s %s failed unexpectedly", request.method, request.url.path, exc_info=exc)
        return _error("INTERNAL", f"internal error: {type(exc).__name__}: {exc}", 500)

    for expected in _EXPECTED:
        app.add_exception_handler(expected, failed)
    app.add_exception_handler(Exception, failed)

    app.openapi = lambda: build_openapi(app, security.token is not None)  # type: ignore[method-assign]
    return app
