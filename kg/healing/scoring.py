"""Pair scoring. A pair is scored on

- name similarity: 1.0 for the same canonical tokens ("same", or "nickname" when only the
  nickname table makes them equal), CONTAINMENT_SCORE when one name's tokens are a subset
  of the other's ("contained": "John" in "John Smith"), else difflib's ratio of the
  canonical strings ("similar": typos); the best over names and aliases;
- shared story neighbours: distinct entities both relate to (the relationship overlap);
- description similarity: embedding cosine of the two descriptions (optional, through a
  caller-supplied embedder, only for pairs that passed the name test; the name is not
  embedded again, spec 003 merges on name + summary similarity).

A pair needs name >= settings.name_similarity and one of:
  (a) >= MIN_SHARED_NEIGHBOURS shared neighbours;
  (b) description cosine >= settings.embedding_similarity, plus one shared neighbour when
      the names are only "similar" ("Salt Hill" / "Salt Mill" is two places);
  (c) the same full name or a one-edit typo of it (ratio >= NEAR_IDENTICAL), one shared
      neighbour, and descriptions that do not disagree (cosine >= DESCRIPTION_FLOOR);
and no veto (kg/healing/vetoes.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from core.settings import HealingSettings
from kg.healing.models import Embedder, NameMatch, PairEvidence
from kg.healing.names import token_match
from kg.healing.snapshot import HealingSnapshot
from kg.healing.vetoes import veto_reason
from kg.models import Entity

#: Shared story neighbours that corroborate a name match without embeddings.
MIN_SHARED_NEIGHBOURS = 2
#: A "similar" (difflib) name at least this close is one edit in a full name: a typo.
NEAR_IDENTICAL = 0.9
#: Below this description cosine, two descriptions contradict a weakly corroborated match.
DESCRIPTION_FLOOR = 0.7


def name_match(snap: HealingSnapshot, a: str, b: str) -> tuple[float, NameMatch]:
    """Best match over both entities' names and aliases (an exact kind wins a tie). "same"
    only when the names agree without the nickname table: "Nora Venn" and "Eleanor Venn"
    may be one woman or two sisters, so a nickname match is weaker evidence."""
    order = {"same": 3, "nickname": 2, "contained": 1, "similar": 0}
    matches = [token_match(x, y) for x in snap.variants(a) for y in snap.variants(b)]
    score, kind = max(matches, key=lambda m: (m[0], order[m[1]]), default=(0.0, "similar"))
    if kind == "same":
        plain_a, plain_b = snap.plain_variants(a), snap.plain_variants(b)
        if not any(sorted(x) == sorted(y) for x in plain_a for y in plain_b):
            kind = "nickname"
    return score, kind


def name_score(snap: HealingSnapshot, a: str, b: str) -> float:
    return name_match(snap, a, b)[0]


def entity_text(e: Entity) -> str | None:
    """What is embedded: the description (spec 003 merges on name + summary similarity;
    the name is scored on its own, so embedding it again would double-count it)."""
    return f"{e.label}: {e.description.strip()}" if e.description.strip() else None


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def score_pairs(
    snap: HealingSnapshot,
    pairs: Iterable[tuple[str, str]],
    settings: HealingSettings,
    embed: Embedder | None = None,
) -> tuple[list[PairEvidence], int]:
    """Evidence for every pair passing the name test; returns (evidence, entities embedded)."""
    evidence: list[PairEvidence] = []
    for a, b in pairs:
        score, kind = name_match(snap, a, b)
        if score < settings.name_similarity:
            continue
        na, nb = snap.neighbours.get(a, set()) - {b}, snap.neighbours.get(b, set()) - {a}
        shared = len(na & nb)
        overlap = shared / len(na | nb) if na and nb else 0.0  # Jaccard: more shared, more overlap
        evidence.append(
            PairEvidence(
                a_id=a,
                b_id=b,
                a_name=snap.entities[a].name,
                b_name=snap.entities[b].name,
                name_score=round(score, 4),
                name_match=kind,
                shared_neighbours=shared,
                overlap=round(overlap, 4),
                veto=veto_reason(snap, a, b),
            )
        )
    embedded = 0
    if embed is not None:
        texts = {
            i: entity_text(snap.entities[i])
            for ev in evidence
            if ev.veto is None
            for i in (ev.a_id, ev.b_id)
        }
        ids = sorted(i for i, text in texts.items() if text)
        if ids:
            vectors = _unit_rows(np.asarray(embed([texts[i] for i in ids]), dtype=np.float32))
            row = {eid: n for n, eid in enumerate(ids)}
            embedded = len(ids)
            for ev in evidence:
                if ev.veto is None and ev.a_id in row and ev.b_id in row:
                    ev.embedding_score = round(
                        float(vectors[row[ev.a_id]] @ vectors[row[ev.b_id]]), 4
                    )
    for ev in evidence:
        # An embedding (of name + description) corroborates an exact or contained name on its
        # own; a merely similar name ("Salt Hill" / "Salt Mill") also needs a shared neighbour.
        similar_text = (
            ev.embedding_score is not None and ev.embedding_score >= settings.embedding_similarity
        )
        # The same full name ("Dr. Samuel Ashdown" / "Samuel Ashdown") or a one-letter typo of
        # it ("Hwzel Marsh") is strong evidence: one shared neighbour corroborates it unless
        # the descriptions say otherwise.
        full = min(len(snap.variants(ev.a_id)[0]), len(snap.variants(ev.b_id)[0])) > 1
        near_same = full and (
            ev.name_match == "same"
            or (ev.name_match == "similar" and ev.name_score >= NEAR_IDENTICAL)
        )
        described_alike = ev.embedding_score is None or ev.embedding_score >= DESCRIPTION_FLOOR
        corroborated = (
            ev.shared_neighbours >= MIN_SHARED_NEIGHBOURS
            or (similar_text and (ev.name_match != "similar" or ev.shared_neighbours >= 1))
            or (near_same and ev.shared_neighbours >= 1 and described_alike)
        )
        ev.accepted = ev.veto is None and corroborated
        ev.score = round(
            0.5 * ev.name_score + 0.3 * ev.overlap + 0.2 * max(ev.embedding_score or 0.0, 0.0), 4
        )
    return evidence, embedded
