"""Grounding stage: keep only the extracted facts the scene's own words support.

Every entity, trait, relationship and status change an extraction returns carries a quote.
A fact is kept when (core.grounding):
- its names can be names (no loops like `Lina-Lina-Lina`, no titles or headings, no
  sentences) and the scene names them, or they are names of the cast the scene refers to;
- its quote is in the scene (normalised, fuzzily enough for a small model's copying), and
  an entity's or relationship's quote names it;
- a relationship's ends are entities of the scene (kept above), cast members the scene
  refers to, or names its own quote gives.

Everything else is dropped and counted per scene, with why: the log line, the chapter's
quality table and the grounding report say so. The extraction as the model returned it
stays in the content store (`extracted/`), and the grounded one is stored beside it
(`grounded/`), with the report (`grounding/`), so an audit can read all three.

Deterministic: the result depends only on the extraction, the scene text, the cast and the
titles, all inputs a replayed chapter has again, so a resumed run commits the same delta.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from prefect import get_run_logger
from pydantic import BaseModel, Field

from core.content import ContentRef
from core.grounding import KnownNames, SourceText, mentions, name_problem
from kg import vocabulary as vocab
from prompts.knowledge.models import ExtractedEntity, SceneExtraction
from tasks.policy import plain_task
from tasks.services import Services

FactKind = Literal["entity", "trait", "relationship", "status"]


class DroppedFact(BaseModel):
    scene: int = Field(ge=0)
    kind: FactKind
    fact: str = Field(description="the fact as the model stated it")
    reason: str


class SceneGrounding(BaseModel):
    scene: int = Field(ge=0)
    kept: int = Field(
        0, ge=0, description="facts kept: entities, traits, relationships, status changes"
    )
    dropped: list[DroppedFact] = Field(default_factory=list)


class GroundingReport(BaseModel):
    chapter: int
    scenes: list[SceneGrounding] = Field(default_factory=list)

    @property
    def kept(self) -> int:
        return sum(s.kept for s in self.scenes)

    @property
    def dropped(self) -> int:
        return sum(len(s.dropped) for s in self.scenes)

    def brief(self) -> str:
        """One line: kept and dropped facts, dropped per scene, the commonest reasons."""
        if not self.dropped:
            return f"kept all {self.kept} extracted facts"
        per_scene = ", ".join(
            f"scene {s.scene}: {len(s.dropped)}" for s in self.scenes if s.dropped
        )
        reasons = Counter(_reason_kind(d.reason) for s in self.scenes for d in s.dropped)
        common = "; ".join(f"{n} {why}" for why, n in reasons.most_common(4))
        return f"kept {self.kept} extracted facts, dropped {self.dropped} ({per_scene}): {common}"


class GroundedScenes(BaseModel):
    extractions: tuple[ContentRef, ...]
    report: GroundingReport


def _reason_kind(reason: str) -> str:
    return reason.split(" (", 1)[0].split(": ", 1)[0]


class _SceneGrounder:
    def __init__(self, text: str, scene: int, known: KnownNames, titles: Sequence[str]) -> None:
        self.source = SourceText(text)
        self.scene, self.known, self.titles = scene, known, titles
        self.report = SceneGrounding(scene=scene)
        self.entities: set[str] = set()

    def drop(self, kind: FactKind, fact: str, reason: str) -> None:
        self.report.dropped.append(
            DroppedFact(scene=self.scene, kind=kind, fact=fact[:200], reason=reason)
        )

    def name_problem(self, name: str) -> str | None:
        if self.known.is_known(name):
            return (
                None
                if self.known.referred(name, self.source)
                else "a cast name the scene does not mention"
            )
        problem = name_problem(name, self.titles)
        if problem is not None:
            return problem
        return None if self.source.names(name) else "name not in the scene"

    def quote_problem(self, quote: str, *named: str) -> str | None:
        """Why `quote` is no evidence here; with `named`, the quote must also name one of them."""
        problem = self.source.quote_problem(quote)
        if problem is None and named:
            said = SourceText(quote)
            if not any(mentions(said, name, self.known) for name in named):
                problem = "the quote does not name it"
        return problem

    def endpoint_problem(self, name: str, quote: str) -> str | None:
        if vocab.normalize_name(name) in self.entities:
            return None
        problem = self.name_problem(name)
        if problem is not None or self.known.is_known(name):
            return problem
        # A name the model did not list as an entity: its relationship's quote must give it.
        return None if mentions(SourceText(quote), name) else "not an entity of the scene"

    def entity(self, found: ExtractedEntity) -> ExtractedEntity | None:
        problem = self.name_problem(found.name) or self.quote_problem(found.quote, found.name)
        if problem is not None:
            self.drop("entity", f"{found.kind} {found.name!r}", problem)
            return None
        traits = []
        for trait in found.traits:
            trait_problem = self.quote_problem(trait.quote)
            if trait_problem is None:
                traits.append(trait)
            else:
                self.drop("trait", f"{found.name}: {trait.trait}", trait_problem)
        self.entities.add(vocab.normalize_name(found.name))
        self.report.kept += 1 + len(traits)
        return found.model_copy(update={"traits": traits})

    def ground(self, extraction: SceneExtraction) -> SceneExtraction:
        entities = [
            kept for found in extraction.entities if (kept := self.entity(found)) is not None
        ]
        relationships = []
        for rel in extraction.relationships:
            fact = f"{rel.source} -{rel.type}-> {rel.target}"
            problem = (
                self.endpoint_problem(rel.source, rel.quote)
                or self.endpoint_problem(rel.target, rel.quote)
                or self.quote_problem(rel.quote, rel.source, rel.target)
            )
            if problem is None:
                relationships.append(rel)
            else:
                self.drop("relationship", fact, problem)
        statuses = []
        for change in extraction.status_changes:
            problem = self.endpoint_problem(change.name, change.quote) or self.quote_problem(
                change.quote
            )
            if problem is None:
                statuses.append(change)
            else:
                self.drop("status", f"{change.name}: {change.status}", problem)
        self.report.kept += len(relationships) + len(statuses)
        return SceneExtraction(
            entities=entities, relationships=relationships, status_changes=statuses
        )


def ground_extraction(
    extraction: SceneExtraction,
    text: str,
    scene: int,
    known: KnownNames,
    titles: Sequence[str] = (),
) -> tuple[SceneExtraction, SceneGrounding]:
    """The facts of `extraction` that `text` supports, and what was dropped and why (pure)."""
    grounder = _SceneGrounder(text, scene, known, titles)
    grounded = grounder.ground(extraction)
    return grounded, grounder.report


@plain_task("ground_extraction")
def ground_scenes(
    services: Services,
    chapter: int,
    scenes: tuple[ContentRef, ...],
    extractions: tuple[ContentRef, ...],
    cast: tuple[str, ...],
    titles: tuple[str, ...],
) -> GroundedScenes:
    """Ground each scene's extraction in its text; store the grounded extractions and the report."""
    store = services.content
    known = KnownNames([name] for name in cast)
    refs: list[ContentRef] = []
    report = GroundingReport(chapter=chapter)
    for number, (scene_ref, extraction_ref) in enumerate(
        zip(scenes, extractions, strict=True), start=1
    ):
        grounded, scene_report = ground_extraction(
            store.get_model(extraction_ref, SceneExtraction),
            store.get_text(scene_ref),
            number,
            known,
            titles,
        )
        report.scenes.append(scene_report)
        refs.append(
            store.put_json(
                "grounded",
                f"chapter_{chapter:03d}/scene_{number:02d}_{extraction_ref.sha256[:12]}",
                grounded,
            )
        )
    store.put_json("grounding", f"chapter_{chapter:03d}/{_digest(refs)}", report)
    log = get_run_logger()
    (log.warning if report.dropped else log.info)(
        "chapter %d: grounding %s", chapter, report.brief()
    )
    return GroundedScenes(extractions=tuple(refs), report=report)


def _digest(refs: Sequence[ContentRef]) -> str:
    return hashlib.sha256("".join(r.sha256 for r in refs).encode()).hexdigest()[:16]
