"""Healing stages: detect duplicates, merge them, enrich busy entities, graduate provisional ones.

Graph tasks (never cached: each looks at the graph as it is now; retried only on
transient errors). The logic lives in kg/healing/; these stages add the ports they are
handed (`services`, tasks/services.py): the LLM for enrichment and for name+description
embeddings, which are cached on disk under `<project>/.saga/healing/` so a nightly run
embeds only new texts.
Healing is best effort (spec 001 section 15.6): when embeddings or the LLM are
unavailable it logs a warning and heals with what it has.

What healing writes to the graph is stamped with story time, never the wall clock (issue 33:
the same inputs and LLM answers give the same graph export, codex and bible whenever and
however often the run was interrupted): `StoryMoment` is the chapter healing runs after and
the change-set its writes amend. The wall-clock time of a run (when did the nightly
deployment heal) is kept where it is useful and compared with nothing: the log, the Prefect
artifacts and the run's history file `.saga/healing/heal-<UTC time>.json`.

The summary's vetoed look-alikes table is f-string Markdown on purpose: the merges
themselves go through Prefect's table artifact, and a table library (tabulate) would pad
the columns and so change the Markdown artifact operators already read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, ConfigDict, Field

from core.content import atomic_write
from core.errors import EmbeddedServiceError, LLMBadOutputError, LLMError
from kg.healing.enrichment import enrich_tx, enrichment_busy_ids, enrichment_targets
from kg.healing.graduation import graduate_tx, graduation_candidates
from kg.healing.merge import merge_tx
from kg.healing.models import (
    DetectionResult,
    DetectionStats,
    Embedder,
    EnrichmentResult,
    EnrichmentTarget,
    Graduation,
    MergePlan,
    MergeResult,
    PairEvidence,
)
from kg.healing.planning import detect_duplicates
from kg.healing.snapshot import ensure_schema, load_snapshot, provisional_ids
from prompts import template
from prompts.knowledge.models import EntityEnrichment
from tasks.policy import graph_task, llm_task
from tasks.services import Services

ENRICHMENT_TIER = "medium"


def now_iso() -> str:
    """The wall clock, for run logs and Prefect artifacts only: never written to the graph."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class StoryMoment(BaseModel):
    """Where in the story a maintenance run happens: after `chapter`, amending change-set
    `change_set` (kg.commit.history), the stamp its graph writes carry instead of a time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chapter: int = 0
    change_set: int = 0

    @property
    def stamp(self) -> str:
        return f"after chapter {self.chapter}, change-set {self.change_set}"


@graph_task("story_moment")
def story_moment(services: Services) -> StoryMoment:
    """The graph's newest chapter and change-set now (healing amends, never adds, change-sets,
    so a healing run resumed after a crash reads the same moment)."""
    graph = services.graph_reader
    return StoryMoment(chapter=graph.latest_chapter(), change_set=graph.history_head()[0])


class EmbeddingCache:
    """Embeddings by text, persisted per embedding model (fingerprint) as one .npz file."""

    def __init__(self, directory: Path, fingerprint: str, embed: Embedder) -> None:
        tag = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
        self.path = directory / f"embeddings-{tag}.npz"
        self._embed = embed
        self._lock = threading.Lock()
        self._vectors: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0
        if self.path.exists():
            try:
                with np.load(self.path, allow_pickle=False) as data:
                    self._vectors = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))
            except (OSError, ValueError, KeyError):
                self._vectors = {}  # a damaged cache only costs recomputation

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        with self._lock:
            todo = list(dict.fromkeys(k for k in keys if k not in self._vectors))
            self.hits += len(keys) - len(todo)
            self.misses += len(todo)
            if todo:
                text_of = dict(zip(keys, texts, strict=True))
                fresh = np.asarray(self._embed([text_of[k] for k in todo]), dtype=np.float32)
                self._vectors.update(zip(todo, fresh, strict=True))
                self._save()
            return (
                np.stack([self._vectors[k] for k in keys])
                if keys
                else np.zeros((0, 0), dtype=np.float32)
            )

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._vectors), dtype=str)
        vectors = np.stack(list(self._vectors.values())).astype(np.float32)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, keys=keys, vectors=vectors)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _embedder(services: Services) -> Embedder:
    llm = services.llm
    return EmbeddingCache(
        services.settings.saga_dir / "healing",
        llm.embedding_fingerprint(),
        lambda texts: llm.embed(list(texts), purpose="healing"),
    )


class HealReport(BaseModel):
    """What one healing run did (also written to `.saga/healing/heal-<time>.json`, a run log:
    its wall-clock `started_at` and `seconds` say when a scheduled run happened and are part
    of nothing compared; `story_at` is the story stamp its graph writes carry)."""

    model_config = ConfigDict(extra="forbid")

    project_dir: str
    started_at: str
    story_at: str = ""
    seconds: float = 0.0
    dry_run: bool = False
    detection: DetectionStats
    planned: list[MergePlan] = Field(default_factory=list)
    merges: list[MergeResult] = Field(default_factory=list)
    vetoed: list[PairEvidence] = Field(default_factory=list)
    enriched: list[EnrichmentResult] = Field(default_factory=list)
    enrichment_failures: list[str] = Field(default_factory=list)
    graduated: list[Graduation] = Field(default_factory=list)

    @property
    def nodes_merged(self) -> int:
        return sum(1 for m in self.merges if m.skipped is None)

    @property
    def nodes_removed(self) -> int:
        return sum(len(m.merged_ids) for m in self.merges if m.skipped is None)

    def counts(self) -> dict[str, int]:
        return {
            "nodes_merged": self.nodes_merged,
            "nodes_removed": self.nodes_removed,
            "nodes_enriched": len(self.enriched),
            "nodes_graduated": len(self.graduated),
            "vetoed_pairs": len(self.vetoed),
        }


@graph_task("detect_duplicates")
def find_duplicates(services: Services, use_embeddings: bool = True) -> DetectionResult:
    """Blocked candidate pairs -> scored evidence -> merge plans (no writes)."""
    log = get_run_logger()
    ensure_schema(services.graph_writer)
    snap = load_snapshot(services.graph_reader)
    embed: Embedder | None = _embedder(services) if use_embeddings else None
    try:
        result = detect_duplicates(snap, services.settings.healing, embed)
    except (LLMError, EmbeddedServiceError) as exc:
        log.warning(
            "healing: embeddings unavailable, matching on names and relationships only: %s", exc
        )
        result = detect_duplicates(snap, services.settings.healing, None)
    s = result.stats
    log.info(
        "healing: %d entities, %d blocks, %d candidate pairs, %d name matches, %d accepted, %d vetoed, %d merges planned",
        s.entities,
        s.blocks,
        s.candidate_pairs,
        s.name_matches,
        s.accepted_pairs,
        s.vetoed_pairs,
        len(result.plans),
    )
    return result


@graph_task("merge_duplicates")
def merge_duplicates(
    services: Services, plans: list[MergePlan], moment: StoryMoment
) -> list[MergeResult]:
    """One write transaction per plan, so one failed merge leaves the others done.
    `moment` (the latest committed chapter) tags the revision, the `merge` sources and the audit."""
    log = get_run_logger()
    results = []
    for plan in plans:
        result = services.graph_writer.execute_write(merge_tx, plan, moment.stamp, moment.chapter)
        if result.skipped:
            log.warning("healing: merge into %s skipped: %s", plan.survivor_id, result.skipped)
        else:
            log.info(
                "healing: merged %s into %s %r (%d relationships moved, %d duplicates dropped)",
                ", ".join(plan.merged_ids),
                plan.survivor_id,
                result.name,
                result.relationships_moved,
                result.relationships_deduplicated,
            )
        results.append(result)
    return results


def enrichment_messages(target: EnrichmentTarget) -> list[dict[str, str]]:
    """prompts/knowledge/enrichment.j2 rendered for one entity.

    `prompts.render_messages(name, **context)` cannot take the template's own `name`
    variable as a keyword (it collides with the template-name parameter), so the two
    blocks are rendered here the same way it does.
    """
    tmpl = template("knowledge/enrichment")
    ctx = tmpl.new_context(
        {
            "name": target.name,
            "label": target.label,
            "description": target.description or "(none yet)",
            "relationships": target.relationships,
        }
    )
    messages = []
    for role in ("system", "user"):
        text = "".join(tmpl.blocks[role](ctx)).strip()
        if text:
            messages.append({"role": role, "content": text})
    return messages


@llm_task("enrichment_summary", tier=ENRICHMENT_TIER, retries=0)
def enrichment_summary(services: Services, target: EnrichmentTarget) -> EntityEnrichment:
    """The LLM's summary of one entity, cached by what it is shown: healing again on the same
    graph (after a rollback, say) asks nothing."""
    return services.llm.structured(
        ENRICHMENT_TIER, enrichment_messages(target), EntityEnrichment, purpose="enrichment"
    )


@graph_task("enrich_entities")
def enrich_entities(
    services: Services, moment: StoryMoment, max_entities: int = 20
) -> tuple[list[EnrichmentResult], list[str]]:
    """LLM summaries for entities whose relationship count crossed the threshold.

    Returns (enriched, failures). An unreachable LLM stops the stage (the rest would fail
    the same way); a bad answer for one entity skips only that entity.
    """
    log = get_run_logger()
    counts = load_snapshot(
        services.graph_reader, ids=[]
    )  # relationship counts only (the story mirror's)
    snap = load_snapshot(
        services.graph_reader, ids=enrichment_busy_ids(counts, services.settings.healing)
    )
    targets = enrichment_targets(services.graph_reader, snap, services.settings.healing)[
        :max_entities
    ]
    enriched: list[EnrichmentResult] = []
    failures: list[str] = []
    for target in targets:
        try:
            answer = enrichment_summary(services, target)
        except LLMBadOutputError as exc:
            failures.append(f"{target.id}: {exc}")
            log.warning("healing: no valid enrichment for %s: %s", target.name, exc)
            continue
        except (LLMError, EmbeddedServiceError) as exc:
            failures.append(f"{target.id}: {exc}")
            log.warning("healing: enrichment stopped, the LLM is unavailable: %s", exc)
            break
        result = EnrichmentResult(
            id=target.id,
            name=target.name,
            relationship_count=target.relationship_count,
            summary=answer.summary,
            facets=list(answer.facets),
            confidence=answer.confidence,
        )
        if services.graph_writer.execute_write(enrich_tx, result, moment.stamp, moment.chapter):
            enriched.append(result)
    if targets:
        log.info(
            "healing: enriched %d of %d entities over the relationship threshold",
            len(enriched),
            len(targets),
        )
    return enriched, failures


@graph_task("graduate_provisional")
def graduate_provisional(services: Services, dry_run: bool = False) -> list[Graduation]:
    """Confirm provisional entities whose confidence reached settings.healing.graduation_confidence."""
    snap = load_snapshot(services.graph_reader, ids=provisional_ids(services.graph_reader))
    candidates = graduation_candidates(snap, services.settings.healing)
    if dry_run or not candidates:
        return candidates
    done = services.graph_writer.execute_write(graduate_tx, candidates, snap.latest_chapter or 0)
    get_run_logger().info("healing: graduated %d provisional entities", len(done))
    return done


def write_heal_history(report: HealReport, saga_dir: Path) -> Path:
    """The healing history (spec 001 section 8.1): one JSON file per run."""
    stamp = report.started_at.replace(":", "").replace("-", "").replace("+0000", "Z")
    path = saga_dir / "healing" / f"heal-{stamp}.json"
    atomic_write(path, report.model_dump_json(indent=2).encode("utf-8"))
    return path


def publish_heal_artifacts(report: HealReport) -> None:
    """A merges table and a Markdown summary in the Prefect UI."""
    rows = [
        {
            "survivor": m.survivor_id,
            "name": m.name,
            "merged": ", ".join(m.merged_names),
            "relationships_moved": m.relationships_moved,
            "audit": m.audit_id or "",
            "skipped": m.skipped or "",
        }
        for m in report.merges
    ] or [
        {
            "survivor": p.survivor_id,
            "name": p.survivor_name,
            "merged": ", ".join(p.merged_names),
            "relationships_moved": 0,
            "audit": "",
            "skipped": "dry run",
        }
        for p in report.planned
    ]
    if rows:
        create_table_artifact(
            key="graph-healing-merges", table=rows, description="Entities merged by healing"
        )
    counts = report.counts()
    lines = [
        f"# Graph healing{' (dry run)' if report.dry_run else ''}",
        "",
        f"- project: `{report.project_dir}`",
        f"- started: {report.started_at}, took {report.seconds:.1f}s; graph writes stamped {report.story_at!r}",
        f"- candidates: {report.detection.candidate_pairs} pairs from {report.detection.blocks} blocks "
        f"over {report.detection.entities} entities; {report.detection.accepted_pairs} accepted, "
        f"{report.detection.vetoed_pairs} vetoed",
        *(f"- {k.replace('_', ' ')}: {v}" for k, v in counts.items()),
    ]
    if report.vetoed:
        lines += [
            "",
            "## Vetoed look-alikes",
            "",
            "| a | b | name | why not |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {v.a_name} (`{v.a_id}`) | {v.b_name} (`{v.b_id}`) | {v.name_score:.2f} | {v.veto} |"
            for v in report.vetoed[:50]
        ]
    if report.graduated:
        lines += ["", "## Graduated", ""] + [
            f"- {g.name} (`{g.id}`): {g.confidence:.2f}" for g in report.graduated
        ]
    if report.enrichment_failures:
        lines += ["", "## Enrichment failures", ""] + [f"- {f}" for f in report.enrichment_failures]
    create_markdown_artifact(
        key="graph-healing-summary",
        markdown="\n".join(lines),
        description="What the last healing run merged, enriched and graduated",
    )
