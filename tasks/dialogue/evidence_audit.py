"""LoCoMo's evidence as a published audit of its answer key corrects it.

Some of LoCoMo's gold evidence cites the wrong turn: the answer is in the turn after the one
cited, a list leaves out a turn that holds one of its items, or the evidence is another
speaker's words. Issue #34 counts those errors as a ceiling, not something to fit to. A public
audit, dial481/locomo-audit (CC BY-NC 4.0, as LoCoMo), lists them per conversation in
`audit/errors_conv_<k>.json`. Each entry holds:
- `question_id`, `locomo_<k>_qa<n>`: `k` is the sample's place in `locomo10.json`, `n` the
  question's place in its `qa` list, from 0 (the line of a converted .qa.jsonl);
- `question`, `category` and `error_type`;
- `cited_evidence` and `correct_evidence`.

`read_audit(folder)` reads those files. `EvidenceAudit.lookup(n, question)` finds the entry of
a question by its number and its words (case and spaces aside), whatever the sample: a
conversation converted to JSONL has lost `k`, and two questions with the same number and the
same words are the same question in practice. `corrected(entry, evidence, refs)` is the
evidence a question is scored against instead. It is used only when it is not empty, names
only turns of the dialogue and differs from what the question cites. Scoring against it never
changes what recall learns from or ranks: `flows.regression --evidence-audit DIR` reports it
beside the published figures, and `bench.recall_protocol --evidence-audit DIR` scores its folds
both ways. None of the audit's data ships with Skald.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from core.errors import InvalidInputError

#: The audit's file names, one per conversation.
AUDIT_FILES = "errors_conv_*.json"
_QUESTION_ID = re.compile(r"^locomo_(\d+)_qa(\d+)$")


class AuditEntry(BaseModel):
    """One disputed question, as the audit writes it (its other fields are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    question_id: str
    question: str
    category: int
    error_type: str
    cited_evidence: list[str]
    correct_evidence: list[str] = []

    @property
    def number(self) -> int:
        """The question's place in its conversation's QA list (from 0)."""
        match = _QUESTION_ID.match(self.question_id)
        assert match is not None  # checked when read (`read_audit`)
        return int(match.group(2))


_ENTRIES = TypeAdapter(list[AuditEntry])


def _words(question: str) -> str:
    return " ".join(question.lower().split())


class EvidenceAudit(BaseModel):
    """An audit's entries, found by question number and words (`lookup`)."""

    model_config = ConfigDict(frozen=True)

    folder: str
    entries: list[AuditEntry]

    def lookup(self, number: int, question: str) -> AuditEntry | None:
        words = _words(question)
        return next(
            (e for e in self.entries if e.number == number and _words(e.question) == words),
            None,
        )


def corrected(entry: AuditEntry | None, evidence: list[str], refs: set[str]) -> list[str] | None:
    """The audit's evidence for a question that cites `evidence` in a dialogue whose turns are
    `refs`, or None where the audit does not re-cite it (not listed, no evidence given, a turn
    the dialogue does not have, or the same turns)."""
    if entry is None:
        return None
    correct = list(dict.fromkeys(entry.correct_evidence))
    if not correct or not set(correct) <= refs or set(correct) == set(evidence):
        return None
    return correct


def read_audit(folder: Path) -> EvidenceAudit:
    """Every entry of the audit's files in `folder`; InvalidInputError (saying which file and
    what is wrong) if there are none or one is not the audit's layout."""
    files = sorted(folder.glob(AUDIT_FILES)) if folder.is_dir() else []
    if not files:
        raise InvalidInputError(
            f"{folder}: no {AUDIT_FILES} files (the audit/ folder of dial481/locomo-audit)"
        )
    entries: list[AuditEntry] = []
    for path in files:
        try:
            read = _ENTRIES.validate_python(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
            first = str(exc).splitlines()[0]
            raise InvalidInputError(f"{path}: not an evidence audit file ({first})") from None
        for entry in read:
            if not _QUESTION_ID.match(entry.question_id):
                raise InvalidInputError(
                    f"{path}: question_id {entry.question_id!r} is not locomo_<k>_qa<n>"
                )
        entries += read
    return EvidenceAudit(folder=str(folder), entries=entries)
