"""LoCoMo's evidence as a published audit corrects it: the protocol's figures re-scored.

Some of LoCoMo's gold evidence cites the wrong turn: the answer is in the turn after the one
cited, a list leaves out a turn that holds one of its items, or a question is about another
speaker's words. Issue #34 asks to count these errors as a ceiling and not to fit to them.
A public audit of the answer key, dial481/locomo-audit (CC BY-NC 4.0, as LoCoMo itself), lists
them per conversation in `audit/errors_conv_<k>.json`. Each entry holds:
- `question_id`, `locomo_<k>_qa<n>` (`n`: the question's place in the conversation's `qa`
  list, from 0, the line of our .qa.jsonl);
- `question`, `category` and `error_type`;
- `cited_evidence` and `correct_evidence`.

`python -m bench.recall_protocol --evidence-audit DIR` reads those files and re-scores each
fold's held-out and tuned-on questions against `correct_evidence` where it differs from what
the question cites. The fusion is still fitted on the published evidence: the audit only
changes what a ranking is scored against, never what it learns from. An entry applies to a
question only if both its number and its words match, so a file of another conversation
re-cites nothing. None of the audit's data is shipped here: give the folder its files are in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from bench.recall_folds import Dialogue
from core.errors import InvalidInputError

#: The audit's file names, one per conversation.
AUDIT_FILES = "errors_conv_*.json"
_QUESTION_ID = re.compile(r"^locomo_(\d+)_qa(\d+)$")


class AuditEntry(BaseModel):
    """One disputed question, as the audit writes it (its other fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

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


def read_audit(folder: Path) -> list[AuditEntry]:
    """Every entry of the audit's files in `folder`; InvalidInputError (saying which file and
    what is wrong) if there are none or one is not the audit's layout."""
    files = sorted(folder.glob(AUDIT_FILES)) if folder.is_dir() else []
    if not files:
        raise InvalidInputError(
            f"{folder}: no {AUDIT_FILES} files (the audit folder of dial481/locomo-audit)"
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
    return entries


def _words(question: str) -> str:
    return " ".join(question.lower().split())


@dataclass(frozen=True)
class AuditMatch:
    """What an audit changed in the loaded dialogues."""

    disputed: int  # questions of these dialogues the audit lists
    recited: int  # of them, those whose evidence it changes


def apply_audit(dialogues: list[Dialogue], entries: list[AuditEntry]) -> AuditMatch:
    """Set `Question.audited` where an entry re-cites a question of `dialogues` (its number
    and words match): the audit's `correct_evidence`, if it is not empty, names only turns of
    the dialogue and differs from the evidence scored."""
    by_number: dict[int, list[AuditEntry]] = {}
    for entry in entries:
        by_number.setdefault(entry.number, []).append(entry)
    disputed = recited = 0
    for dialogue in dialogues:
        # Figures scored against an earlier audit are stale.
        dialogue.cache = {k: v for k, v in dialogue.cache.items() if not k[-1]}
        refs = set(dialogue.refs)
        for question in dialogue.questions:
            question.audited = None
            entry = next(
                (
                    e
                    for e in by_number.get(question.number, [])
                    if _words(e.question) == _words(question.published)
                ),
                None,
            )
            if entry is None:
                continue
            disputed += 1
            correct = set(entry.correct_evidence)
            if correct and correct <= refs and correct != question.evidence:
                question.audited = correct
                recited += 1
    return AuditMatch(disputed, recited)
