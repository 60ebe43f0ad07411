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
from tasks.runtime import runtime

CommitOutcome = Literal["committed", "unchanged", "deferred"]


@graph_task("commit_initialization_to_graph")
def commit_initialization(artifacts: InitArtifacts, genre: str) -> str:
    """The initialization phase is committed as chapter 0 (outline entities are canonical)."""
    rt = runtime()
    store = rt.content
    delta = initialization_delta(
        store.get_model(artifacts.characters, CharacterSheets), store.get_model(artifacts.global_outline, GlobalOutline),
        store.get_model(artifacts.relationships, OutlineRelationships), genre=genre,
    )
    result = rt.graph.commit_chapter(delta)
    get_run_logger().info("init: graph %s (%d nodes, %d relationships created)",
                          "unchanged" if result.noop else "committed", result.created_nodes,
                          result.created_relationships)
    return result.delta_hash


@graph_task("chapter_commit_state")
def chapter_commit_state(number: int) -> str | None:
    """The delta hash committed for this chapter, or None."""
    return runtime().graph.committed_hash(number)


@graph_task("commit_to_graph")
def commit_chapter(delta_ref: ContentRef, committed_before: str | None) -> CommitOutcome:
    """Commit the chapter delta in one transaction.

    `committed_before` is the hash found in the graph when the chapter started. If it is
    another delta, a later iteration was accepted on an earlier run and this one was
    rejected: its decisions replay from cache, so the graph is left alone ("deferred").
    """
    rt = runtime()
    delta = rt.content.get_model(delta_ref, ChapterDelta)
    digest = delta.delta_hash()
    if committed_before is not None and committed_before != digest:
        get_run_logger().info("chapter %d: this draft was rejected on an earlier run; replaying its review from cache "
                              "without touching the graph", delta.chapter)
        return "deferred"
    result = rt.graph.commit_chapter(delta)
    get_run_logger().info("chapter %d: graph %s in %.2fs (%d nodes, %d relationships created, %d nodes updated)",
                          delta.chapter, "unchanged" if result.noop else "committed", result.seconds,
                          result.created_nodes, result.created_relationships, result.updated_nodes)
    return "unchanged" if result.noop else "committed"


@graph_task("commit_accepted_chapter")
def commit_accepted_chapter(delta_ref: ContentRef) -> CommitOutcome:
    """Make the graph hold exactly this (accepted) delta, replacing any other one."""
    rt = runtime()
    result = rt.graph.commit_chapter(rt.content.get_model(delta_ref, ChapterDelta), replace=True)
    return "unchanged" if result.noop else "committed"


@graph_task("rollback_chapter")
def rollback_chapter(number: int) -> None:
    result = runtime().graph.rollback_chapter(number)
    get_run_logger().info("chapter %d: rolled back exactly (%d nodes and %d relationships removed, %d nodes restored)",
                          number, result.deleted_nodes, result.deleted_relationships, result.restored_nodes)


@graph_task("store_chapter_summary")
def store_chapter_summary(number: int, summary: ChapterSummary) -> None:
    runtime().graph.set_chapter_summary(number, summary.summary, summary.key_events)


@graph_task("chapter_history")
def chapter_history(number: int) -> str:
    """The fingerprint of the graph a chapter is written on (everything committed before it,
    healing's amendments included): the stages that read the graph "as of chapter N - 1" are
    cached under it, so a replayed chapter reads what it read the first time, and asks the
    LLM nothing, whatever was committed or healed after it."""
    return runtime().graph.history_fingerprint(number)


@graph_task("maintenance_due")
def maintenance_due(number: int) -> bool:
    """Whether healing and QA are still to run after the chapter as it is committed now."""
    return not runtime().graph.maintained(number)


@graph_task("record_maintenance")
def record_maintenance(number: int) -> None:
    runtime().graph.mark_maintained(number)
