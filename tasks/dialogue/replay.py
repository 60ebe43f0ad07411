"""Replay of recorded long dialogues through the sidecar, turn by turn, plus the recall probe.

Dialogue files use the JSONL turn format of ../shared/data/dialogues (one turn a line:
conversation_id, turn_id, session, session_time, dia_id, speaker, text[, image_caption]).
A sibling `<id>.qa.jsonl` (question, answer, evidence dia_ids, category) enables the recall
probe: after the replay, each question whose evidence lies within the replayed turns is
asked of the retriever, and recall@k is the share of its evidence turns in the top k.

A replay keeps a journal (one TurnRow a line, appended as each turn ends), so a batch killed
part way and started again with the same run id goes on from where it stopped: journaled
turns are not sent again, and a turn whose commit landed just before the kill (its journal
line did not) comes back as the sidecar's idempotent replay and is recorded as its original
commit. A turn the graph itself failed (unreachable, its serving process gone) is not a
result of the pipeline under test: it stops the replay with that error (the flow's retry, or
a re-run, resumes) instead of being counted as a rollback.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.content import USER_TEXT_ENCODING
from core.errors import GraphUnavailableError, InvalidInputError, first_error
from core.timex import parse_when
from kg.dialogue import DialogueRepository
from tasks.dialogue.evidence_audit import EvidenceAudit, corrected
from tasks.dialogue.models import (
    ChatMessage,
    TurnCommitRequest,
    TurnConfig,
    TurnResult,
)
from tasks.dialogue.parts import TurnState, TurnTrace
from tasks.dialogue.pipeline import DialogueService
from tasks.dialogue.retriever import RecalledTurn

SLOTS_TRACED = ("retriever", "injector", "actor", "extractor", "judge", "historian", "commit")
#: Where a user reads the format of a transcript as JSONL turns.
TURNS_FORMAT_HINT = "see 'Transcripts as JSONL turns' in Skald's README.md"


class DialogueTurnRow(BaseModel):
    model_config = ConfigDict(extra="ignore")

    conversation_id: str
    turn_id: int = Field(ge=0)
    session: int | None = None
    session_time: str | None = None
    dia_id: str | None = None
    session_id: str | None = Field(
        None, description="the benchmark's own session id (LongMemEval), when it has one"
    )
    speaker: str = Field(min_length=1)
    text: str
    image_caption: str | None = None
    messages: list[ChatMessage] = Field(
        default_factory=list,
        description="a chat front end's turn: its messages (tasks.dialogue.sillytavern); "
        "empty: the turn is the one message `speaker` said, `text`",
    )


class QAItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question: str
    answer: Any = None
    evidence: list[str] = Field(default_factory=list)
    category: int = 0
    question_id: str | None = None
    question_type: str | None = Field(
        None, description="the benchmark's question type (LongMemEval)"
    )
    evidence_sessions: list[str] = Field(
        default_factory=list, description="session-scored: the answer sessions"
    )
    abstention: bool = Field(
        False, description="no evidence by design (LongMemEval `_abs`): not scored"
    )
    asked_on: str | None = Field(
        None,
        description="when the question is asked (LongMemEval's `question_date`): its relative "
        'dates ("last Saturday") count from it',
    )

    @model_validator(mode="before")
    @classmethod
    def _adversarial_answer(cls, data: Any) -> Any:
        # LoCoMo gives category 5's answer as `adversarial_answer` (in its JSON and the JSONL).
        if isinstance(data, dict) and data.get("answer") is None and "adversarial_answer" in data:
            return {**data, "answer": data["adversarial_answer"]}
        return data


class DialogueSpec(BaseModel):
    dialogue_id: str
    path: str
    turns: list[DialogueTurnRow]
    qa: list[QAItem] = Field(default_factory=list)
    qa_path: str | None = None
    scoring: Literal["turn", "session"] = Field(
        "turn",
        description="turn: recall of evidence turns (LoCoMo); session: LongMemEval's session recall",
    )


def _read_jsonl(path: Path, model: type[BaseModel], limit: int | None = None) -> list[Any]:
    return [row for _, row in _read_jsonl_lines(path, model, limit)]


def _read_jsonl_lines(
    path: Path, model: type[BaseModel], limit: int | None = None
) -> list[tuple[int, Any]]:
    """Each non-blank line of `path` as `model`, with its line number."""
    rows: list[tuple[int, Any]] = []
    try:
        handle = path.open(encoding=USER_TEXT_ENCODING)
    except OSError as exc:
        raise InvalidInputError(
            f"cannot read dialogue file {path}: {exc.strerror or exc}"
        ) from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append((number, model.model_validate_json(line)))
            except ValidationError as exc:
                where, message = first_error(exc, "line")
                raise InvalidInputError(
                    f"{path}:{number}: {where}: {message}",
                    hint=TURNS_FORMAT_HINT,
                ) from None
            if limit is not None and len(rows) >= limit:
                break
    return rows


def load_dialogue(path: Path, max_turns: int | None = None) -> DialogueSpec:
    lines: list[tuple[int, DialogueTurnRow]] = _read_jsonl_lines(path, DialogueTurnRow, max_turns)
    if not lines:
        raise InvalidInputError(f"dialogue file {path} holds no turns")
    check_one_conversation(path, lines)
    turns = [turn for _, turn in lines]
    name = path.name
    qa_path = (
        path.with_name(name.removesuffix(".turns.jsonl") + ".qa.jsonl")
        if name.endswith(".turns.jsonl")
        else None
    )
    qa: list[QAItem] = (
        _read_jsonl(qa_path, QAItem) if qa_path is not None and qa_path.exists() else []
    )
    return DialogueSpec(
        dialogue_id=turns[0].conversation_id,
        path=str(path),
        turns=with_session_times(turns),
        qa=qa,
        qa_path=str(qa_path) if qa else None,
    )


def check_one_conversation(path: Path, lines: list[tuple[int, DialogueTurnRow]]) -> None:
    """A transcript file is one conversation, each turn once: a second `conversation_id` would
    be remembered under the first's, and a `turn_id` given again would be taken for the turn
    already remembered, its text dropped without a word."""
    first_line, first = lines[0]
    seen: dict[int, int] = {}
    for number, turn in lines:
        if turn.conversation_id != first.conversation_id:
            raise InvalidInputError(
                f"{path}:{number}: conversation_id {turn.conversation_id!r} is not the file's "
                f"{first.conversation_id!r} (line {first_line})",
                hint="one conversation per file: split the file by conversation_id",
            )
        if turn.turn_id in seen:
            raise InvalidInputError(
                f"{path}:{number}: turn_id {turn.turn_id} again (first on line {seen[turn.turn_id]})",
                hint="give each turn of the file its own turn_id",
            )
        seen[turn.turn_id] = number


def with_session_times(turns: list[DialogueTurnRow]) -> list[DialogueTurnRow]:
    """The turns, each without a `session_time` given its session's: the time of the nearest
    earlier turn of its session that has one, else of the first later one; a turn without a
    session takes the previous turn's. A transcript that dates each session once (its first
    turn) is then dated throughout, and no turn of it is taken as said on the day it was
    imported (a transcript's memory row without a time stays undated)."""
    first_in_session: dict[int, str] = {}
    for turn in turns:
        if turn.session is not None and turn.session_time:
            first_in_session.setdefault(turn.session, turn.session_time)
    latest_in_session: dict[int, str] = {}
    previous: str | None = None
    dated = []
    for turn in turns:
        said = turn.session_time or (
            previous
            if turn.session is None
            else latest_in_session.get(turn.session, first_in_session.get(turn.session))
        )
        if turn.session is not None and said:
            latest_in_session[turn.session] = said
        previous = said or previous
        dated.append(
            turn if said == turn.session_time else turn.model_copy(update={"session_time": said})
        )
    return dated


def _message(row: DialogueTurnRow, roles: dict[str, str]) -> ChatMessage:
    text = row.text
    if row.image_caption:
        text = f"{text} [shares a photo: {row.image_caption}]"
    return ChatMessage(
        role=roles.get(row.speaker, "assistant"),  # type: ignore[arg-type]
        name=row.speaker,
        content=text,
        message_id=row.dia_id,
        time=row.session_time,
    )


def turn_requests(
    spec: DialogueSpec, conversation_id: str, *, window: int = 6, config: TurnConfig | None = None
) -> list[TurnCommitRequest]:
    """One request per recorded turn: the turn's message (a front end's turn: its messages),
    the `window` messages before it as context."""
    first = spec.turns[0].speaker
    roles = {first: "user"}
    per_turn: list[list[ChatMessage]] = []
    for row in spec.turns:
        if row.messages:  # a chat front end's turn: its messages, roles and all
            per_turn.append(list(row.messages))
            continue
        roles.setdefault(row.speaker, "assistant")
        per_turn.append([_message(row, roles)])
    requests = []
    before: list[ChatMessage] = []
    for row, messages in zip(spec.turns, per_turn, strict=True):
        requests.append(
            TurnCommitRequest(
                conversation_id=conversation_id,
                turn_id=row.turn_id,
                messages=messages,
                window=before[-window:] if window else [],
                config=config or TurnConfig(),
                transcript=True,
            )
        )
        before.extend(messages)
    return requests


class TurnRow(BaseModel):
    """One replayed turn: a row of turns.parquet."""

    run_id: str
    dialogue_id: str
    conversation_id: str
    turn_id: int
    dia_id: str | None
    speaker: str
    session: int | None
    started_at: datetime
    state: str
    committed: bool
    idempotent_hit: bool
    code: str | None
    error_kind: str | None
    reason: str | None
    retryable: bool
    timed_out: bool
    wall_ms: float
    total_ms: float
    llm_ms: float
    overhead_ms: float
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    retriever_ms: float = 0.0
    injector_ms: float = 0.0
    actor_ms: float = 0.0
    extractor_ms: float = 0.0
    judge_ms: float = 0.0
    historian_ms: float = 0.0
    commit_ms: float = 0.0
    states: list[str]
    state_elapsed_ms: list[float]
    actions_evolve: int
    actions_replace: int
    actions_delete: int
    actions_skipped: int
    bio_patches: int
    milestones: int
    events: int
    entities: int
    identity_conflicts: int
    contradictions: int
    packet_tokens: int
    recalled_turns: int
    models: str


def turn_row(
    run_id: str,
    spec: DialogueSpec,
    row: DialogueTurnRow,
    result: TurnResult,
    started_at: datetime,
    wall_ms: float,
) -> TurnRow:
    trace = result.trace
    slots = {s.slot: s.latency_ms for s in trace.slots} if trace else {}
    applied = [a for a in result.actions if a.applied]
    packet = result.injection_packet
    return TurnRow(
        run_id=run_id,
        dialogue_id=spec.dialogue_id,
        conversation_id=result.conversation_id or "",
        turn_id=row.turn_id,
        dia_id=row.dia_id,
        speaker=row.speaker,
        session=row.session,
        started_at=started_at,
        state=result.state.value,
        committed=result.committed,
        idempotent_hit=result.idempotent_hit,
        code=result.code,
        error_kind=result.error_kind,
        reason=result.reason,
        retryable=result.retryable,
        timed_out=result.timed_out,
        wall_ms=round(wall_ms, 3),
        total_ms=trace.total_ms if trace else wall_ms,
        llm_ms=trace.llm_ms if trace else 0.0,
        overhead_ms=trace.overhead_ms if trace else wall_ms,
        llm_calls=trace.llm_calls if trace else 0,
        prompt_tokens=trace.prompt_tokens if trace else 0,
        completion_tokens=trace.completion_tokens if trace else 0,
        **{f"{slot}_ms": slots.get(slot, 0.0) for slot in SLOTS_TRACED},
        states=[s.state.value for s in trace.states] if trace else [result.state.value],
        state_elapsed_ms=[s.elapsed_ms for s in trace.states] if trace else [0.0],
        actions_evolve=sum(a.action == "EVOLVE" for a in applied),
        actions_replace=sum(a.action == "REPLACE" for a in applied),
        actions_delete=sum(a.action == "DELETE" for a in applied),
        actions_skipped=sum(not a.applied for a in result.actions),
        bio_patches=len(result.bio_patches),
        milestones=len(result.milestones) if result.committed else 0,
        events=len(result.events),
        entities=len(result.entities),
        identity_conflicts=len(result.judge.identity_conflicts) if result.judge else 0,
        contradictions=len(result.judge.contradictions) if result.judge else 0,
        packet_tokens=packet.used_tokens if packet else 0,
        recalled_turns=len(packet.recalled_turns) if packet else 0,
        models=json.dumps({s.slot: s.model for s in trace.slots} if trace else {}, sort_keys=True),
    )


def _read_journal(path: Path) -> dict[int, TurnRow]:
    """Turns journaled by an earlier start of the run, by turn id (a line torn by a kill is skipped)."""
    done: dict[int, TurnRow] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = TurnRow.model_validate_json(line)
        except ValidationError:
            continue
        done[row.turn_id] = row
    return done


def _original_commit(
    service: DialogueService, request: TurnCommitRequest, replayed: TurnResult
) -> TurnResult:
    """The result of the commit an earlier start of the run made (its own trace, not the replay's)."""
    stored = DialogueRepository(service.store).get_turn(request.key)
    if stored is None:
        return replayed
    original = TurnResult.model_validate_json(stored.result_json)
    trace = (
        TurnTrace.model_validate_json(stored.trace_json) if stored.trace_json else original.trace
    )
    return original.model_copy(update={"trace": trace, "idempotent_hit": False})


class ReplayStopped(Exception):
    """The run is shutting down (SIGTERM, Ctrl-C): the replay stopped before its next turn."""


def replay(
    service: DialogueService,
    spec: DialogueSpec,
    conversation_id: str,
    run_id: str,
    *,
    window: int = 6,
    config: TurnConfig | None = None,
    journal: Path | None = None,
    stop: threading.Event | None = None,
) -> list[TurnRow]:
    """Commit the dialogue's turns in order; a rolled-back turn is recorded and the replay goes on.

    With `journal` (a file per dialogue of the run), turns an earlier start of the same run
    journaled are taken from it, and every turn replayed now is appended to it. `stop` set:
    the replay ends before its next turn (ReplayStopped); journaled turns stay for a resume."""
    resumed = journal is not None and journal.exists()
    done = _read_journal(journal) if journal is not None and resumed else {}
    if journal is not None:
        journal.parent.mkdir(parents=True, exist_ok=True)
        journal.touch()  # before the first commit: a later start knows this dialogue was begun
    rows: list[TurnRow] = []
    for row, request in zip(
        spec.turns, turn_requests(spec, conversation_id, window=window, config=config), strict=True
    ):
        if row.turn_id in done:
            rows.append(done[row.turn_id])
            continue
        if stop is not None and stop.is_set():
            raise ReplayStopped(
                f"dialogue {spec.dialogue_id} stopped before turn {row.turn_id}: the run is stopping"
            )
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        result = service.commit(request)
        wall_ms = (time.perf_counter() - t0) * 1000.0
        if result.state == TurnState.ROLLED_BACK and result.error_kind == "graph":
            raise GraphUnavailableError(
                f"dialogue {spec.dialogue_id} turn {row.turn_id}: the graph failed, not the turn: {result.reason}"
            )
        if resumed and result.idempotent_hit:
            # Committed by the earlier start of this run, killed before its journal line.
            result = _original_commit(service, request, result)
        turn = turn_row(run_id, spec, row, result, started_at, wall_ms)
        if journal is not None:
            with journal.open("a", encoding="utf-8") as handle:
                handle.write(turn.model_dump_json() + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        rows.append(turn)
    return rows


class RecallRow(BaseModel):
    """One QA item of the recall probe: a row of recall.parquet."""

    run_id: str
    dialogue_id: str
    category: int
    question: str
    evidence: list[str]
    retrieved: list[str]
    k: int
    recall: float
    hit: bool


def recall_probe(
    service: DialogueService,
    spec: DialogueSpec,
    conversation_id: str,
    run_id: str,
    *,
    k: int,
    committed_refs: set[str],
) -> list[RecallRow]:
    """Ask each answerable question; recall@k = share of its evidence turns found in the top k.

    A question is probed only when all its evidence turns were replayed (`committed_refs`:
    the replayed turns' ids; memory holds them whether or not the gate let their facts in)."""
    rows: list[RecallRow] = []
    for item in spec.qa:
        evidence = [e for e in item.evidence if e]
        if not evidence or not set(evidence) <= committed_refs:
            continue
        hits: list[RecalledTurn] = service.recall(
            conversation_id, item.question, k, asked_on=_asked_on(item)
        )
        retrieved = [ref for hit in hits for ref in hit.source_refs]
        found = len(set(evidence) & set(retrieved))
        rows.append(
            RecallRow(
                run_id=run_id,
                dialogue_id=spec.dialogue_id,
                category=item.category,
                question=item.question,
                evidence=evidence,
                retrieved=retrieved,
                k=k,
                recall=round(found / len(evidence), 6),
                hit=found > 0,
            )
        )
    return rows


class ProbeRow(BaseModel):
    """One QA item of the whole-dialogue recall probe: a row of recall.parquet (ingest mode)."""

    run_id: str
    dialogue_id: str
    category: int
    question: str
    evidence: list[str]
    retrieved: list[str] = Field(description="source refs of the top-k turns, best first")
    recall_at_5: float | None = Field(
        description="share of the evidence turns among the first 5 turns retrieved"
    )
    recall_at_10: float | None
    question_type: str | None = None
    evidence_sessions: list[str] = Field(default_factory=list)
    retrieved_sessions: list[str] = Field(
        default_factory=list, description="session-scored: first 10 distinct"
    )
    session_recall_any_at_5: float | None = None
    session_recall_all_at_5: float | None = None
    session_recall_any_at_10: float | None = None
    session_recall_all_at_10: float | None = None
    # With an evidence audit (tasks.dialogue.evidence_audit): the error it names for this
    # question, the evidence it cites instead, and recall against that evidence (the
    # published recall where it re-cites nothing).
    audit_error: str | None = None
    audited_evidence: list[str] | None = None
    audited_recall_at_5: float | None = None
    audited_recall_at_10: float | None = None


#: Turns read for a session-scored question: deep enough to see 10 distinct sessions.
SESSION_PROBE_TURNS = 200


def _asked_on(item: QAItem) -> date | None:
    return parse_when(item.asked_on) if item.asked_on else None


def _recall(evidence: list[str], retrieved: list[str]) -> float:
    return round(len(set(evidence) & set(retrieved)) / len(set(evidence)), 6)


def distinct_sessions(turn_refs: list[str], session_of: dict[str, str]) -> list[str]:
    """Sessions in the order their first turn was ranked: LongMemEval's turn-to-session view."""
    return list(dict.fromkeys(session_of[ref] for ref in turn_refs if ref in session_of))


def session_recall(ranked_sessions: list[str], gold: list[str], k: int) -> tuple[float, float]:
    """(recall_any@k, recall_all@k) over the first k distinct sessions, as LongMemEval's
    `evaluate_retrieval_turn2session` scores a turn ranking (it reads turns until k distinct
    sessions are seen)."""
    top = set(ranked_sessions[:k])
    return float(any(s in top for s in gold)), float(all(s in top for s in gold))


def _skip_reason(
    item: QAItem, spec: DialogueSpec, evidence: list[str], refs: set[str], sessions: set[str]
) -> str | None:
    if spec.scoring == "session":
        if item.abstention:
            return "abstention question (no evidence by design; LongMemEval skips it too)"
        if not item.evidence_sessions:
            return "no evidence listed"
        if not set(item.evidence_sessions) <= sessions:
            return "evidence names sessions not in the dialogue's turns"
        return None
    if not evidence:
        return "no evidence listed"
    if not set(evidence) <= refs:
        return "evidence names turns not in the dialogue file"
    return None


def whole_dialogue_probe(
    service: DialogueService,
    spec: DialogueSpec,
    conversation_id: str,
    run_id: str,
    audit: EvidenceAudit | None = None,
) -> tuple[list[ProbeRow], dict[str, int]]:
    """Ask every QA item that has evidence; recall@k = share of its evidence turns among the
    first k turns retrieved (each hit is one turn, so k counts turns). A session-scored
    dialogue (LongMemEval) is also scored on the first k distinct sessions (`session_recall`).
    With `audit`, a turn-scored question is also scored against the evidence the audit cites
    instead, where it re-cites it (`_audited`).
    Returns the rows and the skipped questions counted by reason (nothing is skipped silently)."""
    refs = {row.dia_id for row in spec.turns if row.dia_id}
    session_of = {row.dia_id: row.session_id for row in spec.turns if row.dia_id and row.session_id}
    depth = min(len(spec.turns), SESSION_PROBE_TURNS) if spec.scoring == "session" else 10
    skipped: dict[str, int] = {}
    rows: list[ProbeRow] = []
    for number, item in enumerate(spec.qa):
        # Some items list two turns in one string ("D8:6; D9:17"): split them.
        evidence = list(
            dict.fromkeys(p for e in item.evidence for p in re.split(r"[;,\s]+", e) if p)
        )
        reason = _skip_reason(item, spec, evidence, refs, set(session_of.values()))
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        hits: list[RecalledTurn] = service.recall(
            conversation_id, item.question, depth, asked_on=_asked_on(item)
        )
        ranked = [hit.source_refs[0] if hit.source_refs else hit.key for hit in hits]
        retrieved = ranked[:10]
        turn_scores = (
            {
                "recall_at_5": _recall(evidence, retrieved[:5]),
                "recall_at_10": _recall(evidence, retrieved),
            }
            if evidence and set(evidence) <= refs
            else {"recall_at_5": None, "recall_at_10": None}
        )
        session_scores: dict[str, Any] = {}
        if spec.scoring == "session":
            sessions = distinct_sessions(ranked, session_of)
            for k in (5, 10):
                any_k, all_k = session_recall(sessions, item.evidence_sessions, k)
                session_scores[f"session_recall_any_at_{k}"] = any_k
                session_scores[f"session_recall_all_at_{k}"] = all_k
            session_scores["retrieved_sessions"] = sessions[:10]
        audited = (
            _audited(audit, number, item.question, evidence, refs, retrieved)
            if audit is not None and spec.scoring != "session"
            else {}
        )
        rows.append(
            ProbeRow(
                run_id=run_id,
                dialogue_id=spec.dialogue_id,
                category=item.category,
                question=item.question,
                evidence=evidence,
                retrieved=retrieved,
                question_type=item.question_type,
                evidence_sessions=item.evidence_sessions,
                **turn_scores,
                **session_scores,
                **audited,
            )
        )
    return rows, skipped


def _audited(
    audit: EvidenceAudit,
    number: int,
    question: str,
    evidence: list[str],
    refs: set[str],
    retrieved: list[str],
) -> dict[str, Any]:
    """A turn-scored question's ProbeRow fields for `audit`: what it disputes, and recall
    against the evidence it cites instead (the published evidence where it re-cites none)."""
    entry = audit.lookup(number, question)
    recited = corrected(entry, evidence, refs)
    scored = recited or evidence
    return {
        "audit_error": entry.error_type if entry is not None else None,
        "audited_evidence": recited,
        "audited_recall_at_5": _recall(scored, retrieved[:5]),
        "audited_recall_at_10": _recall(scored, retrieved),
    }
