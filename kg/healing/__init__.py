"""Graph healing: duplicate detection and merging, graduation, enrichment writes.

One concern per module, in the order a healing run uses them:

- `snapshot`: what detection, graduation and enrichment read, in one read transaction;
- `names`: canonical name tokens, nicknames, token matching, the phonetic key;
- `blocking`: candidate pairs from shared name blocks (never all pairs);
- `scoring`: name, shared-neighbour and description evidence for a pair, and when it is enough;
- `vetoes`: why two entities can never be one, whatever their scores;
- `planning`: ambiguity, constrained clustering and the survivor: `detect_duplicates`;
- `merge`: the merge transaction (`merge_tx`) and its audit trail;
- `graduation`, `enrichment`: confirming provisional entities, storing enrichment summaries;
- `models`: the pydantic records the stages above hand to tasks/healing.py.

The names below are the package's API (`from kg.healing import detect_duplicates`).
"""

from kg.healing.blocking import MAX_BLOCK_SIZE, block_keys, candidate_pairs, naive_pairs
from kg.healing.enrichment import enrich_tx, enrichment_targets
from kg.healing.graduation import (
    AGE_FULL,
    CONNECTIVITY_FULL,
    W_AGE,
    W_COMPLETENESS,
    W_CONNECTIVITY,
    graduate_tx,
    graduation_candidates,
    graduation_score,
)
from kg.healing.merge import merge_audit_id, merge_audits, merge_tx, merged_entity
from kg.healing.models import (
    DetectionResult,
    DetectionStats,
    Embedder,
    EnrichmentResult,
    EnrichmentTarget,
    Graduation,
    MergePlan,
    MergeResult,
    NameMatch,
    PairEvidence,
)
from kg.healing.names import (
    CONTAINMENT_SCORE,
    NICKNAMES,
    TITLES,
    canonical_tokens,
    soundex,
    token_match,
    token_similarity,
)
from kg.healing.node_writes import HEALER
from kg.healing.planning import cluster_pairs, detect_duplicates, drop_ambiguous, names_conflict
from kg.healing.scoring import (
    DESCRIPTION_FLOOR,
    MIN_SHARED_NEIGHBOURS,
    NEAR_IDENTICAL,
    entity_text,
    name_match,
    name_score,
    score_pairs,
)
from kg.healing.snapshot import (
    HealingSnapshot,
    ensure_schema,
    key_index,
    load_snapshot,
    resolve_scene_refs,
)
from kg.healing.vetoes import CANONICAL_SOURCES, veto_reason

__all__ = [
    "AGE_FULL",
    "CANONICAL_SOURCES",
    "CONNECTIVITY_FULL",
    "CONTAINMENT_SCORE",
    "DESCRIPTION_FLOOR",
    "HEALER",
    "MAX_BLOCK_SIZE",
    "MIN_SHARED_NEIGHBOURS",
    "NEAR_IDENTICAL",
    "NICKNAMES",
    "TITLES",
    "W_AGE",
    "W_COMPLETENESS",
    "W_CONNECTIVITY",
    "DetectionResult",
    "DetectionStats",
    "Embedder",
    "EnrichmentResult",
    "EnrichmentTarget",
    "Graduation",
    "HealingSnapshot",
    "MergePlan",
    "MergeResult",
    "NameMatch",
    "PairEvidence",
    "block_keys",
    "candidate_pairs",
    "canonical_tokens",
    "cluster_pairs",
    "detect_duplicates",
    "drop_ambiguous",
    "enrich_tx",
    "enrichment_targets",
    "ensure_schema",
    "entity_text",
    "graduate_tx",
    "graduation_candidates",
    "graduation_score",
    "key_index",
    "load_snapshot",
    "merge_audit_id",
    "merge_audits",
    "merge_tx",
    "merged_entity",
    "naive_pairs",
    "name_match",
    "name_score",
    "names_conflict",
    "resolve_scene_refs",
    "score_pairs",
    "soundex",
    "token_match",
    "token_similarity",
    "veto_reason",
]
