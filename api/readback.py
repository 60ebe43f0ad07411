"""The read-only operations: the conversations memory holds; a conversation's entities,
relations (with their event history), milestones and remembered turns, paged with
offset/limit; search; its lorebook (a SillyTavern World Info book, tasks.dialogue.lorebook);
and health.

A conversation the graph does not know is no error for the pages: they are empty. Its
lorebook is a 404 (NOT_FOUND): there is no book to import. The conversation id
is the route's last-but-one part and may itself hold "/" (the regression batch names
conversations `regression-<run>/<dialogue>`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.convertors import PathConvertor, register_url_convertor

from api.paths import CONVERSATION_PATH, CONVERSATIONS_PATH, HEALTH_PATH
from api.schemas import (
    ApiError,
    ConversationOut,
    ConversationPage,
    EntityOut,
    EntityPage,
    HealthReport,
    Limit,
    MilestoneOut,
    MilestonePage,
    Offset,
    PageInfo,
    PathConversationId,
    RelationEventOut,
    RelationOut,
    RelationPage,
    SearchK,
    SearchResult,
    SearchText,
    TurnOut,
    TurnPage,
)
from api.statuses import HEALTH_RESPONSES, LOREBOOK_RESPONSES, READ_RESPONSES
from api.turns import Service
from core.errors import SkaldError
from kg import vocabulary as vocab
from kg.dialogue import DialogueEntity, DialogueRepository
from tasks.dialogue.lorebook import WorldInfoBook, conversation_lorebook
from tasks.dialogue.models import RecalledTurnOut


class ConversationConvertor(PathConvertor):
    """Starlette's `path` convertor, but matching line breaks too. With `path` (`.*`), an id
    holding a newline matched no route and answered an undocumented 404 (found by the
    generated-input tests); matched, the id's own rules refuse it with a 400 and the reason."""

    regex = r"[\s\S]*"


register_url_convertor("conversation", ConversationConvertor())


def one_value_each(request: Request) -> None:
    """Refuse a query parameter given twice: the document gives each one value, and FastAPI
    would silently take the last (`offset=M&offset=0` answered 200; found by the
    generated-input tests)."""
    seen: set[str] = set()
    for name, _value in request.query_params.multi_items():
        if name in seen:
            raise RequestValidationError(
                [{"loc": ("query", name), "msg": "given more than once", "type": "value_error"}]
            )
        seen.add(name)


router = APIRouter(dependencies=[Depends(one_value_each)])
_CONVERSATION = f"{CONVERSATIONS_PATH}/{{conversation_id:conversation}}"
#: How many entities and milestones search looks through (a conversation's whole cast, in practice).
SEARCH_SCAN = 10_000


def _page(offset: int, limit: int, total: int) -> PageInfo:
    return PageInfo(offset=offset, limit=limit, total=total)


def _entity_out(e: DialogueEntity) -> EntityOut:
    return EntityOut(**e.model_dump(exclude={"aliases"}), aliases=list(e.aliases))


@router.get(
    CONVERSATIONS_PATH,
    operation_id="list_conversations",
    response_model=ConversationPage,
    responses=READ_RESPONSES,
    summary="The conversations memory holds, in name order, each with its remembered turns",
)
async def list_conversations(
    service: Service, offset: Offset = 0, limit: Limit = 50
) -> ConversationPage:
    repo = DialogueRepository(service.store)
    total, rows = await run_in_threadpool(repo.conversation_page, offset, limit)
    return ConversationPage(
        page=_page(offset, limit, total),
        items=[ConversationOut(conversation_id=c, remembered_turns=n) for c, n in rows],
    )


@router.get(
    f"{_CONVERSATION}/entities",
    operation_id="list_entities",
    response_model=EntityPage,
    responses=READ_RESPONSES,
    summary="A conversation's entities (bio, traits, aliases), oldest first",
)
async def list_entities(
    conversation_id: PathConversationId, service: Service, offset: Offset = 0, limit: Limit = 50
) -> EntityPage:
    repo = DialogueRepository(service.store)
    total, items = await run_in_threadpool(repo.entity_page, conversation_id, offset, limit)
    return EntityPage(
        conversation_id=conversation_id,
        page=_page(offset, limit, total),
        items=[_entity_out(e) for e in items],
    )


@router.get(
    f"{_CONVERSATION}/relations",
    operation_id="list_relations",
    response_model=RelationPage,
    responses=READ_RESPONSES,
    summary="A conversation's relations, active and ended, each with its event history",
)
async def list_relations(
    conversation_id: PathConversationId, service: Service, offset: Offset = 0, limit: Limit = 50
) -> RelationPage:
    repo = DialogueRepository(service.store)
    total, items = await run_in_threadpool(repo.relation_page, conversation_id, offset, limit)
    out = [
        RelationOut(
            **rel.model_dump(exclude={"raw_type"}),
            events=[
                RelationEventOut(
                    **{k: v for k, v in ev.items() if k in RelationEventOut.model_fields}
                )
                for ev in events
            ],
        )
        for rel, events in items
    ]
    return RelationPage(
        conversation_id=conversation_id, page=_page(offset, limit, total), items=out
    )


@router.get(
    f"{_CONVERSATION}/milestones",
    operation_id="list_milestones",
    response_model=MilestonePage,
    responses=READ_RESPONSES,
    summary="A conversation's milestones in turn order",
)
async def list_milestones(
    conversation_id: PathConversationId, service: Service, offset: Offset = 0, limit: Limit = 50
) -> MilestonePage:
    repo = DialogueRepository(service.store)
    total, items = await run_in_threadpool(repo.milestone_page, conversation_id, offset, limit)
    return MilestonePage(
        conversation_id=conversation_id,
        page=_page(offset, limit, total),
        items=[MilestoneOut(**m.model_dump()) for m in items],
    )


@router.get(
    f"{_CONVERSATION}/turns",
    operation_id="list_turns",
    response_model=TurnPage,
    responses=READ_RESPONSES,
    summary="A conversation's remembered turns in order (committed, or blocked by the commit gate)",
)
async def list_turns(
    conversation_id: PathConversationId, service: Service, offset: Offset = 0, limit: Limit = 50
) -> TurnPage:
    repo = DialogueRepository(service.store)
    total, rows = await run_in_threadpool(repo.memory_page, conversation_id, offset, limit)
    items = [
        TurnOut(
            key=r["key"],
            turn_id=str(r["turn_id"]),
            seq=int(r["seq"]),
            speaker=r["speaker"] or "",
            text=r["text"] or "",
            when=r["said_when"] or "",
            committed=bool(r["committed"]),
            facts=list(r["facts"] or []),
        )
        for r in rows
    ]
    return TurnPage(conversation_id=conversation_id, page=_page(offset, limit, total), items=items)


@router.get(
    f"{_CONVERSATION}/search",
    operation_id="search_conversation",
    response_model=SearchResult,
    responses=READ_RESPONSES,
    summary="Search a conversation: turns by the turn pipeline's hybrid recall, entities by name or "
    "alias, milestones by words",
)
async def search_conversation(
    conversation_id: PathConversationId, service: Service, q: SearchText, k: SearchK = 10
) -> SearchResult:
    def work() -> SearchResult:
        repo = DialogueRepository(service.store)
        turns = service.recall(conversation_id, q, k)
        words = {w for w in vocab.normalize_name(q).split() if w}
        wanted = f" {vocab.normalize_name(q)} "
        _, entities = repo.entity_page(conversation_id, 0, SEARCH_SCAN)
        hits = [
            e
            for e in entities
            if any(
                f" {vocab.normalize_name(n)} " in wanted
                or wanted.strip() in vocab.normalize_name(n)
                for n in (e.name, *e.aliases)
            )
        ]
        _, milestones = repo.milestone_page(conversation_id, 0, SEARCH_SCAN)
        found = [
            m for m in milestones if words and words <= set(vocab.normalize_name(m.text).split())
        ]
        return SearchResult(
            conversation_id=conversation_id,
            query=q,
            turns=[RecalledTurnOut(**t.model_dump(exclude={"signals"})) for t in turns],
            entities=[_entity_out(e) for e in hits],
            milestones=[MilestoneOut(**m.model_dump()) for m in found],
        )

    return await run_in_threadpool(work)


@router.get(
    f"{CONVERSATION_PATH}/{{conversation_id:conversation}}/lorebook",
    operation_id="get_lorebook",
    response_model=WorldInfoBook,
    responses=LOREBOOK_RESPONSES,
    summary="A conversation's memory as a SillyTavern World Info book (the layout its World Info import "
    "accepts): an entry per entity (names and aliases as keys, its current facts as content) and per "
    "related pair (each relation in its latest state)",
)
async def get_lorebook(
    conversation_id: PathConversationId, service: Service
) -> WorldInfoBook | JSONResponse:
    book = await run_in_threadpool(
        conversation_lorebook, DialogueRepository(service.store), conversation_id
    )
    if book is None:
        missing = ApiError(
            code="NOT_FOUND", reason=f"no conversation {conversation_id!r} in the graph"
        )
        return JSONResponse(missing.model_dump(mode="json"), status_code=404)
    return book


@router.get(
    HEALTH_PATH,
    operation_id="health",
    response_model=HealthReport,
    response_model_exclude_none=True,
    responses=HEALTH_RESPONSES,
    summary="Liveness, the graph served, and (deep=true) whether the LLM answers",
)
async def health(
    service: Service,
    deep: Annotated[bool, Query(description="also ask the LLM endpoint (GET /models)")] = False,
) -> JSONResponse:
    store = await run_in_threadpool(lambda: service.store)
    report: dict[str, Any] = {
        "status": "ok",
        "graph": store.endpoint.label,
        "rolled_back_turns": service.rolled_back_count,
        "conversation_locks": service.conversation_lock_count(),
        "turns_without_usable_vectors": service.vectors.foreign_vectors(),
        "graph_write_lock": service.write_lock_totals(),
        "yielded_to_queries": service.yielded_to_queries(),
    }
    status = 200
    if deep:
        try:
            report["llm"] = await run_in_threadpool(service.gateway.check_endpoint, "small")
        except SkaldError as exc:
            report.update(status="degraded", llm_error=str(exc))
            status = 503
    body = HealthReport.model_validate(report)
    return JSONResponse(body.model_dump(mode="json", exclude_none=True), status_code=status)
