"""Graph write stages: initialization commit, chapter commit, rollback, chapter summary, and
the change-set bookkeeping around them (the history a chapter is written on, maintenance marks).

These tasks are never cached: they look at the graph itself, so a chapter rolled back
with `python -m kg rollback` is written again on the next run (from cached artifacts).
Every write is idempotent: committing the same delta twice leaves the graph unchanged.
"""

from __future__ import annotations

from typing import Literal

from prefect import get_run_logger

from core.content import ContentRef
from kg.models import ChapterDelta
from prompts.initialization.models import CharacterSheets, GlobalOutline, OutlineRelationships
from prompts.knowledge.models import ChapterSummary
from tasks.consolidation import initialization_delta
from tasks.persist import InitArtifacts
from tasks.policy import graph_task
from tasks.services import Services

CommitOutcome = Literal["committed", "unchanged", "deferred"]


@graph_task("commit_initialization_to_graph")
def commit_initialization(services: Services, artifacts: InitArtifacts, genre: str) -> str:
    """The initialization phase is committed as chapter 0 (outline entities are canonical)."""
    store = services.content
    delta = initialization_delta(
        store.get_model(artifacts.characters, CharacterSheets),
        store.get_model(artifacts.global_outline, GlobalOutline),
        store.get_model(artifacts.relationships, OutlineRelationships),
        genre=genre,
    )
    result = services.graph_writer.commit_chapter(delta)
    get_run_logger().info(
        "init: graph %s (%d nodes, %d relationships created)",
        "unchanged" if result.noop else "committed",
        result.created_nodes,
        result.created_relationships,
    )
    return result.delta_hash


@graph_task("chapter_commit_state")
def chapter_commit_state(services: Services, number: int) -> str | None:
    """The delta hash committed for this chapter, or None."""
    return services.graph_reader.committed_hash(number)


@graph_task("commit_to_graph")
def commit_chapter(
    services: Services, delta_ref: ContentRef, committed_before: str | None
) -> CommitOutcome:
    """Commit the chapter delta in one transaction.

    `committed_before` is the hash found in the graph when the chapter started. If it is
    another delta, a later iteration was accepted on an earlier run and this one was
    rejected: its decisions replay from cache, so the graph is left alone ("deferred").
    """
    delta = services.content.get_model(delta_ref, ChapterDelta)
    digest = delta.delta_hash()
    if committed_before is not None and committed_before != digest:
        get_run_logger().info(
            "chapter %d: this draft was rejected on an earlier run; replaying its review from cache "
            "without touching the graph",
            delta.chapter,
        )
        return "deferred"
    result = services.graph_writer.commit_chapter(delta)
    get_run_logger().info(
        "chapter %d: graph %s in %.2fs (%d nodes, %d relationships created, %d nodes updated)",
        delta.chapter,
        "unchanged" if result.noop else "committed",
        result.seconds,
        result.created_nodes,
        result.created_relationships,
        result.updated_nodes,
    )
    return "unchanged" if result.noop else "committed"


@graph_task("commit_accepted_chapter")
def commit_accepted_chapter(services: Services, delta_ref: ContentRef) -> CommitOutcome:
    """Make the graph hold exactly this (accepted) delta, replacing any other one."""
    delta = services.content.get_model(delta_ref, ChapterDelta)
    result = services.graph_writer.commit_chapter(delta, replace=True)
    return "unchanged" if result.noop else "committed"


@graph_task("rollback_chapter")
def rollback_chapter(services: Services, number: int) -> None:
    result = services.graph_writer.rollback_chapter(number)
    get_run_logger().info(
        "chapter %d: rolled back exactly (%d nodes and %d relationships removed, %d nodes restored)",
        number,
        result.deleted_nodes,
        result.deleted_relationships,
        result.restored_nodes,
    )


@graph_task("store_chapter_summary")
def store_chapter_summary(services: Services, number: int, summary: ChapterSummary) -> None:
    services.graph_writer.set_chapter_summary(number, summary.summary, summary.key_events)


@graph_task("maintenance_due")
def maintenance_due(services: Services, number: int) -> bool:
    """Whether healing and QA are still to run after the chapter as it is committed now."""
    return not services.graph_reader.maintained(number)


@graph_task("record_maintenance")
def record_maintenance(services: Services, number: int) -> None:
    services.graph_writer.mark_maintained(number)
