"""The protocol's questions re-cited by a published audit of LoCoMo's answer key
(tasks/dialogue/evidence_audit.py reads it and says what it is).

`apply_audit` sets `Question.audited` on the loaded dialogues, so that `scores(...,
audited=True)` scores a ranking against the audit's evidence where it re-cites a question
(`python -m bench.recall_protocol --evidence-audit DIR`). The fusion is fitted on the
published evidence either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.recall_folds import Dialogue
from tasks.dialogue.evidence_audit import EvidenceAudit, corrected


@dataclass(frozen=True)
class AuditMatch:
    """What an audit changed in the loaded dialogues."""

    disputed: int  # questions of these dialogues the audit lists
    recited: int  # of them, those whose evidence it changes


def apply_audit(dialogues: list[Dialogue], audit: EvidenceAudit) -> AuditMatch:
    """Set `Question.audited` where `audit` re-cites a question of `dialogues`."""
    disputed = recited = 0
    for dialogue in dialogues:
        # Figures scored against an earlier audit are stale.
        dialogue.cache = {k: v for k, v in dialogue.cache.items() if not k[-1]}
        refs = set(dialogue.refs)
        for question in dialogue.questions:
            entry = audit.lookup(question.number, question.published)
            disputed += entry is not None
            evidence = corrected(entry, sorted(question.evidence), refs)
            question.audited = set(evidence) if evidence is not None else None
            recited += evidence is not None
    return AuditMatch(disputed, recited)
