"""Candidate generation: detection never compares all pairs. Entities are *blocked* by their
normalised name tokens (titles dropped, nicknames mapped to the formal name: Johnny -> john,
Bill -> william) plus a phonetic key of the first token (catches "Jonh" / "John"), per
label; only pairs sharing a block are scored."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from kg.healing.names import soundex
from kg.healing.snapshot import HealingSnapshot

#: Blocks larger than this carry too little evidence to pair everyone (a very common
#: surname in a huge cast); their members still meet through their other keys.
MAX_BLOCK_SIZE = 400


def block_keys(snap: HealingSnapshot, eid: str) -> set[str]:
    label = snap.entities[eid].label
    keys: set[str] = set()
    for tokens in snap.variants(eid):
        keys.update(f"{label}|t|{t}" for t in tokens if len(t) > 1)
        keys.add(f"{label}|s|{soundex(tokens[0])}")
    return keys


def candidate_pairs(snap: HealingSnapshot) -> tuple[set[tuple[str, str]], int]:
    """Pairs sharing a block (and a label); returns (pairs, number of blocks)."""
    blocks: dict[str, list[str]] = defaultdict(list)
    for eid in snap.entities:
        for key in block_keys(snap, eid):
            blocks[key].append(eid)
    pairs: set[tuple[str, str]] = set()
    for members in blocks.values():
        if 1 < len(members) <= MAX_BLOCK_SIZE:
            ordered = sorted(members)
            pairs.update(combinations(ordered, 2))
    return pairs, len(blocks)


def naive_pairs(snap: HealingSnapshot) -> set[tuple[str, str]]:
    """Every same-label pair: the all-pairs baseline the benchmark compares against."""
    by_label: dict[str, list[str]] = defaultdict(list)
    for eid, e in snap.entities.items():
        by_label[e.label].append(eid)
    return {pair for ids in by_label.values() for pair in combinations(sorted(ids), 2)}
