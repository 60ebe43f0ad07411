"""The dialogue sidecar's HTTP API (spec 000): a FastAPI app over tasks.dialogue's
DialogueService, served by `python -m flows.dialogue serve`.

- `app`: `create_app`, its exception handlers (every answer documented, one-line reasons);
- `turns`: POST turn/commit, turn/retry, turn/replace, conversation/rewind,
  conversation/forget, conversation/rename, conversation/copy, conversation/import,
  memory/query;
- `readback`: GET conversations/{id}/entities|relations|milestones|turns (paged), /search,
  conversation/{id}/lorebook (a SillyTavern World Info book), health;
- `security`: the bearer token and CORS, and the rules `serve` applies to them;
- `schemas`: the HTTP-only models (read-back pages, search, health, ApiError) and parameters;
- `statuses`: the status each answer gets, and the responses each operation documents;
- `openapi`: the document (request bodies from the request models, links, the bearer scheme);
- `paths`: the paths.

The request models, with every rule the server enforces, are the service's own
(tasks.dialogue.models); the OpenAPI document publishes them unchanged.
"""

from api.app import create_app
from api.paths import (
    API_PREFIX,
    COMMIT_PATH,
    CONVERSATION_PATH,
    CONVERSATIONS_PATH,
    COPY_PATH,
    FORGET_PATH,
    HEALTH_PATH,
    IMPORT_PATH,
    MEMORY_QUERY_PATH,
    RENAME_PATH,
    REPLACE_PATH,
    RETRY_PATH,
    REWIND_PATH,
)
from api.security import (
    CORS_ENV,
    TOKEN_ENV,
    SidecarSecurity,
    is_loopback,
    listening_socket,
    serve_security,
)
from api.statuses import call_status, turn_status

__all__ = [
    "API_PREFIX",
    "COMMIT_PATH",
    "CONVERSATION_PATH",
    "CONVERSATIONS_PATH",
    "COPY_PATH",
    "CORS_ENV",
    "HEALTH_PATH",
    "IMPORT_PATH",
    "MEMORY_QUERY_PATH",
    "RENAME_PATH",
    "REPLACE_PATH",
    "RETRY_PATH",
    "REWIND_PATH",
    "FORGET_PATH",
    "TOKEN_ENV",
    "SidecarSecurity",
    "call_status",
    "create_app",
    "is_loopback",
    "listening_socket",
    "serve_security",
    "turn_status",
]
