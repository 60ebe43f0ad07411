"""Who may call the sidecar: a bearer token and the browser origins CORS lets in.

Without a token the sidecar serves loopback only (`serve_security` refuses any other bind);
with one, every call must carry `Authorization: Bearer <token>`, or gets 401 (an ApiError body,
with CORS headers, so a browser extension can say why). Preflights carry no token: CORS answers
them before the token is checked.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from api.schemas import ApiError
from core.errors import InvalidInputError

TOKEN_ENV = "SKALD_SIDECAR_TOKEN"
CORS_ENV = "SKALD_SIDECAR_CORS_ORIGINS"
MIN_TOKEN_CHARS = 16


class SidecarSecurity:
    """The bearer token (None: no check, loopback only) and the browser origins CORS lets in."""

    def __init__(self, token: str | None = None, cors_origins: Sequence[str] = ()) -> None:
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise InvalidInputError(
                f"the sidecar token is shorter than {MIN_TOKEN_CHARS} characters",
                hint=f"set {TOKEN_ENV} to a long random string (e.g. `openssl rand -hex 24`)",
            )
        self.token = token
        self.cors_origins = list(cors_origins)

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        )

    def install(self, app: FastAPI) -> None:
        """The token check (none without a token), and CORS around it (added last, so
        outermost: a preflight, which carries no token, is answered before the check)."""
        if self.token is not None:
            app.add_middleware(BearerTokenCheck, security=self)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=self.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )


class BearerTokenCheck:
    """Plain ASGI middleware answering 401 to an HTTP request without the token. Not
    Starlette's `@app.middleware("http")`: that runs every request's app in a task of its own
    behind memory streams, hops the memory query a person waits for pays on a busy event loop."""

    def __init__(self, app: ASGIApp, security: SidecarSecurity) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.security.authorized(
            Headers(scope=scope).get("authorization")
        ):
            await self.app(scope, receive, send)
            return
        body = ApiError(code="UNAUTHORIZED", reason="missing or wrong bearer token")
        response = JSONResponse(
            body.model_dump(mode="json"), status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def serve_security(
    host: str, token_file: Path | None, cors_origins: Sequence[str] | None
) -> SidecarSecurity:
    """The security of `serve`: the token from `token_file` (else SKALD_SIDECAR_TOKEN), the
    origins given (else SKALD_SIDECAR_CORS_ORIGINS, comma-separated). Refuses to serve a
    non-loopback address without a token."""
    token: str | None
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise InvalidInputError(
                f"cannot read --token-file {token_file}: {exc.strerror or exc}"
            ) from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip() or None
    if token is None and not is_loopback(host):
        raise InvalidInputError(
            f"refusing to serve on {host} without a bearer token (anyone on the network could read and "
            f"rewrite memory)",
            hint=f"set {TOKEN_ENV} or pass --token-file, or bind 127.0.0.1",
        )
    origins = cors_origins
    if origins is None:
        origins = [o.strip() for o in os.environ.get(CORS_ENV, "").split(",") if o.strip()]
    return SidecarSecurity(token, origins)


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket `serve` listens on, bound before anything starts: a port in use (another
    sidecar) is then one line and a non-zero exit before the graph starts, not uvicorn's
    error after it. Bound here and handed to uvicorn, so no other process takes the port
    between a check and the bind."""
    address = host.removeprefix("[").removesuffix("]")  # "[::1]", as in a URL
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise InvalidInputError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="another process serves that port (another sidecar?): stop it, or pass --port",
        ) from None
    return sock
