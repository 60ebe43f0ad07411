"""The OpenAPI document: what FastAPI derives from the routes, plus what it cannot know.

- The request bodies: the handlers read the raw body themselves (to cap its size before it is
  buffered and to give one-line reasons), so the bodies' schemas are added from the request
  models (tasks.dialogue.models), with every constraint the server enforces.
- No 422: FastAPI documents one for every operation with parameters, but the sidecar answers a
  bad parameter with 400 and an ApiError body (api.app), so those entries are dropped.
- Links between operations, for clients and for stateful tests: a committed turn links to its
  rewind, its replacement, another commit under the same key, the memory query and the
  read-back of its conversation; a rewind links to the read-back. Nothing links to the forget,
  the rename, the copy or the import: a stateful run that forgot or moved its conversations
  along the way would test little else, and one that imported into them would mostly find its
  turns held.
- The bearer scheme, required for every operation when the server has a token.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from api.security import TOKEN_ENV
from tasks.dialogue.models import (
    CopyRequest,
    ForgetRequest,
    ImportRequest,
    MemoryQueryRequest,
    RenameRequest,
    RewindRequest,
    TurnCommitRequest,
)

REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    TurnCommitRequest,
    MemoryQueryRequest,
    RewindRequest,
    ForgetRequest,
    RenameRequest,
    CopyRequest,
    ImportRequest,
)

_CONVERSATION = "$response.body#/conversation_id"
# The lorebook (get_lorebook) is not among them: linked from the turn operations, or only from
# the rewind, it changed the seeded stateful run so that the CI-sized fuzz sent no conflicting
# commit at all (no 409 seen, twice); the fuzzing phase still reaches it with known ids (200).
_READ_BACK = {
    "read_entities": ("list_entities", "entities"),
    "read_relations": ("list_relations", "relations"),
    "read_milestones": ("list_milestones", "milestones"),
    "read_turns": ("list_turns", "remembered turns"),
    "search": ("search_conversation", "search"),
}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a required JSON request body of `model`'s component schema."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _read_back_links(description: str) -> dict[str, Any]:
    return {
        name: {
            "operationId": operation,
            "parameters": {"path.conversation_id": _CONVERSATION},
            "description": f"{description}: the conversation's {what}",
        }
        for name, (operation, what) in _READ_BACK.items()
    }


def _turn_links() -> dict[str, Any]:
    this_turn = {"conversation_id": _CONVERSATION, "turn_id": "$response.body#/turn_id"}
    return {
        "rewind_from_here": {
            "operationId": "rewind_conversation",
            "requestBody": {
                "conversation_id": _CONVERSATION,
                "before_turn": "$response.body#/turn_id",
            },
            "description": "remove this turn and every later one",
        },
        "replace_this_turn": {
            "operationId": "replace_turn",
            "requestBody": this_turn,
            "description": "an edit or a swipe of this turn",
        },
        "commit_again": {
            "operationId": "commit_turn",
            "requestBody": this_turn,
            "description": "the same key again: a replay, or a conflict when the payload differs",
        },
        "query_memory": {
            "operationId": "query_memory",
            "requestBody": {"conversation_id": _CONVERSATION},
            "description": "memory for the next pending message of this conversation",
        },
        **_read_back_links("after the turn"),
    }


_LINKS: dict[str, dict[str, Any]] = {
    "commit_turn": _turn_links(),
    "retry_turn": _turn_links(),
    "replace_turn": _turn_links(),
    "rewind_conversation": _read_back_links("after the rewind"),
    "query_memory": {
        "commit_a_turn": {
            "operationId": "commit_turn",
            "requestBody": {"conversation_id": _CONVERSATION},
            "description": "commit the turn the memory was asked for",
        },
    },
}


def build_openapi(app: FastAPI, token_required: bool) -> dict[str, Any]:
    """The document served at /openapi.json (built once per app)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {})
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": f"the server's token ({TOKEN_ENV} or --token-file); required when one is set",
        }
    }
    if token_required:
        schema["security"] = [{"bearer": []}]
    models = components.setdefault("schemas", {})
    for model in REQUEST_MODELS:
        extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
        models.update(extra.pop("$defs", {}))
        models[model.__name__] = extra
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            operation.get("responses", {}).pop("422", None)
            links = _LINKS.get(operation.get("operationId", ""))
            if links and "200" in operation.get("responses", {}):
                operation["responses"]["200"]["links"] = links
    for unused in ("HTTPValidationError", "ValidationError"):
        models.pop(unused, None)
    app.openapi_schema = schema
    return schema
