"""Merge planning: from scored pairs to one MergePlan per cluster.

An entity whose best match is no better supported than a match with someone who cannot be
the same person is ambiguous: both are refused. Accepted pairs are joined into clusters
greedily, best evidence first, and a join is refused when any cross pair is vetoed or
carries two conflicting full names ("John Smith" vs "John Baker"), so a first-name-only
"John" joins one John, never two. The survivor is the user/outline entity first, then the
confirmed one, then the most complete name.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from core.settings import HealingSettings
from kg.healing.blocking import candidate_pairs
from kg.healing.models import DetectionResult, DetectionStats, Embedder, MergePlan, PairEvidence
from kg.healing.names import canonical_tokens
from kg.healing.scoring import name_score, score_pairs
from kg.healing.snapshot import HealingSnapshot
from kg.healing.vetoes import veto_reason


def names_conflict(snap: HealingSnapshot, a: str, b: str, threshold: float) -> bool:
    """Two different full names ("John Smith" / "John Baker") cannot share a cluster."""
    full_a = len(canonical_tokens(snap.entities[a].name, snap.entities[a].label)) > 1
    full_b = len(canonical_tokens(snap.entities[b].name, snap.entities[b].label)) > 1
    return full_a and full_b and name_score(snap, a, b) < threshold


def _survivor_rank(snap: HealingSnapshot, eid: str) -> tuple[Any, ...]:
    e = snap.entities[eid]
    return (
        any(s.type == "user" for s in e.sources),
        any(s.type == "outline" for s in e.sources),
        not e.is_provisional,
        len(canonical_tokens(e.name, e.label)),
        snap.rel_counts.get(eid, 0),
        len(e.sources),
        len(e.name),
        # Deterministic last resort: the smaller id wins (negated for max()).
        tuple(-ord(c) for c in eid),
    )


def _incompatible(snap: HealingSnapshot, x: str, y: str, settings: HealingSettings) -> bool:
    return veto_reason(snap, x, y) is not None or names_conflict(
        snap, x, y, settings.name_similarity
    )


def drop_ambiguous(
    snap: HealingSnapshot, accepted: list[PairEvidence], settings: HealingSettings
) -> list[PairEvidence]:
    """Refuse an entity's matches when its best one is not better supported than a match
    with someone who cannot be the same (a "Maeve" whose friends are also those of two
    namesake Maeve Garnets): guessing would merge the wrong person. The refused pairs get
    a `veto` saying so and stay in the report."""
    edges: dict[str, list[tuple[PairEvidence, str]]] = defaultdict(list)
    for ev in accepted:
        edges[ev.a_id].append((ev, ev.b_id))
        edges[ev.b_id].append((ev, ev.a_id))
    refused: dict[int, str] = {}
    for node, mine in sorted(edges.items()):
        if len(mine) < 2:
            continue
        mine.sort(key=lambda t: (-t[0].shared_neighbours, -t[0].score, t[1]))
        best, partner = mine[0]
        for ev, other in mine[1:]:
            if ev.shared_neighbours >= best.shared_neighbours and _incompatible(
                snap, partner, other, settings
            ):
                name = snap.entities[node].name
                refused[id(best)] = refused[id(ev)] = (
                    f"ambiguous: {name!r} matches two different entities"
                )
    for ev in accepted:
        if id(ev) in refused:
            ev.accepted, ev.veto = False, refused[id(ev)]
    return [ev for ev in accepted if ev.accepted]


def cluster_pairs(
    snap: HealingSnapshot, accepted: list[PairEvidence], settings: HealingSettings
) -> list[list[str]]:
    """Greedy constrained clustering, best evidence first (see the module docstring)."""
    parent: dict[str, str] = {}
    members: dict[str, list[str]] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        members.setdefault(x, [x])
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for ev in sorted(accepted, key=lambda e: (-e.score, -e.shared_neighbours, e.a_id, e.b_id)):
        ra, rb = find(ev.a_id), find(ev.b_id)
        if ra == rb:
            continue
        if any(_incompatible(snap, x, y, settings) for x in members[ra] for y in members[rb]):
            continue
        parent[rb] = ra
        members[ra] += members.pop(rb)
    return [sorted(group) for group in members.values() if len(group) > 1]


def detect_duplicates(
    snap: HealingSnapshot,
    settings: HealingSettings,
    embed: Embedder | None = None,
    *,
    pairs: set[tuple[str, str]] | None = None,
) -> DetectionResult:
    """Merge plans for the snapshot (blocked candidates unless `pairs` is given)."""
    started = time.perf_counter()
    blocks = 0
    if pairs is None:
        pairs, blocks = candidate_pairs(snap)
    evidence, embedded = score_pairs(snap, sorted(pairs), settings, embed)
    accepted = drop_ambiguous(snap, [ev for ev in evidence if ev.accepted], settings)
    plans: list[MergePlan] = []
    for group in cluster_pairs(snap, accepted, settings):
        survivor = max(group, key=lambda eid: _survivor_rank(snap, eid))
        merged = sorted(eid for eid in group if eid != survivor)
        inside = set(group)
        plans.append(
            MergePlan(
                label=snap.entities[survivor].label,
                survivor_id=survivor,
                survivor_name=snap.entities[survivor].name,
                merged_ids=merged,
                merged_names=[snap.entities[m].name for m in merged],
                evidence=[ev for ev in accepted if ev.a_id in inside and ev.b_id in inside],
            )
        )
    plans.sort(key=lambda p: p.survivor_id)
    vetoed = [ev for ev in evidence if ev.veto is not None]
    stats = DetectionStats(
        entities=len(snap.entities),
        blocks=blocks,
        candidate_pairs=len(pairs),
        name_matches=len(evidence),
        accepted_pairs=len(accepted),
        vetoed_pairs=len(vetoed),
        embedded_entities=embedded,
        seconds=round(time.perf_counter() - started, 4),
    )
    return DetectionResult(
        plans=plans, stats=stats, vetoed=vetoed, latest_chapter=snap.latest_chapter
    )
