"""The long-memory benchmarks as their authors publish them, read into dialogue specs.

`load_dialogues(path)` picks the format from the file itself:

- `*.jsonl`: the turn format of ../shared/data/dialogues (tasks.dialogue.replay.load_dialogue,
  with its sibling `<id>.qa.jsonl`).
- LoCoMo's released JSON (`locomo10.json`): a list of samples, each with `sample_id`,
  `conversation` (`speaker_a`, `speaker_b`, `session_N` lists of turns with `speaker`,
  `dia_id`, `text` and, for a shared image, `blip_caption`; `session_N_date_time`) and `qa`
  (`question`, `answer` or `adversarial_answer`, `evidence` dia_ids, `category`). A sample
  becomes the dialogue `locomo-<number>` with the same turns, ids, session times and captions
  as the converted JSONL, so both give the same recall figures.
- LongMemEval's JSON (`longmemeval_s.json`, `_m`, `_oracle`): a list of question instances, each
  with its own haystack (`haystack_sessions` of `{role, content, has_answer}` turns,
  `haystack_session_ids`, `haystack_dates`) and `answer_session_ids`. An instance becomes one
  dialogue holding its haystack and its one question, scored at session level
  (`DialogueSpec.scoring == "session"`): the probe scores it as the authors'
  `evaluate_retrieval_turn2session` does (LongMemEval, src/retrieval/eval_utils.py): turns
  ranked, then read down until k distinct sessions are seen; recall_any@k is 1 when one answer
  session is among them, recall_all@k when all are. Abstention instances (`_abs` in the
  question id) have no evidence by design and are skipped, as the authors skip them.
- A SillyTavern chat file (`<chat>.jsonl`, a header line then one message a line): its turns
  as the Skald memory extension writes them (tasks.dialogue.sillytavern), no questions.

The standard library's `json` reads both (a whole file at once: LongMemEval-M is ~2.7 GB, so
read it on a machine with the memory for it); the layouts are checked by pydantic models, so a
file in neither layout stops with one line naming the file and the first field that failed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.content import USER_TEXT_ENCODING
from core.errors import InvalidInputError, first_error
from tasks.dialogue.replay import DialogueSpec, DialogueTurnRow, QAItem, load_dialogue
from tasks.dialogue.sillytavern import is_sillytavern_chat, load_sillytavern_chat

Layout = Literal["turns-jsonl", "locomo", "longmemeval"]

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_HINT = (
    "give turns as JSONL (README.md, 'Transcripts as JSONL turns'), LoCoMo's locomo10.json "
    "layout or LongMemEval's longmemeval_*.json layout"
)


class LocomoTurn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speaker: str = Field(min_length=1)
    dia_id: str = Field(min_length=1)
    text: str
    blip_caption: str | None = None


class LocomoSample(BaseModel):
    model_config = ConfigDict(extra="ignore")

    sample_id: str | int
    conversation: dict[str, Any]
    qa: list[QAItem] = Field(default_factory=list)


class LongMemEvalTurn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str = Field(min_length=1)
    content: str
    has_answer: bool = False


class LongMemEvalInstance(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question_id: str = Field(min_length=1)
    question_type: str = ""
    question: str
    answer: Any = None
    question_date: str | None = None
    haystack_session_ids: list[str]
    haystack_dates: list[str]
    haystack_sessions: list[list[LongMemEvalTurn]]
    answer_session_ids: list[str] = Field(default_factory=list)


def detect_layout(path: Path, data: Any) -> Layout:
    """Which published layout a parsed JSON file is in, from its first record's keys."""
    records = data if isinstance(data, list) else [data]
    first = records[0] if records and isinstance(records[0], dict) else None
    if first is None:
        raise InvalidInputError(
            f"{path}: expected a JSON list of LoCoMo samples or LongMemEval instances", hint=_HINT
        )
    if "conversation" in first and "qa" in first:
        return "locomo"
    if "haystack_sessions" in first:
        return "longmemeval"
    keys = ", ".join(sorted(first)[:8])
    raise InvalidInputError(
        f"{path}: a record with keys {keys} is in no layout Skald reads", hint=_HINT
    )


def _validate(path: Path, place: str, model: type[BaseModel], record: Any) -> Any:
    try:
        return model.model_validate(record)
    except ValidationError as exc:
        field, message = first_error(exc, "value")
        raise InvalidInputError(f"{path}: {place}: {field}: {message}", hint=_HINT) from None


def locomo_dialogue_id(sample_id: str | int) -> str:
    """`conv-26` (LoCoMo's sample id) -> `locomo-26`, the id the converted JSONL files carry."""
    digits = re.findall(r"\d+", str(sample_id))
    return f"locomo-{digits[-1]}" if digits else f"locomo-{sample_id}"


def locomo_spec(path: Path, sample: LocomoSample, max_turns: int | None) -> DialogueSpec:
    """One LoCoMo sample as the dialogue the converted JSONL files hold: sessions in number
    order, turn ids 1..N across them, `blip_caption` as the turn's image caption."""
    dialogue_id = locomo_dialogue_id(sample.sample_id)
    sessions = sorted(
        (int(m.group(1)), key) for key in sample.conversation if (m := _SESSION_KEY.match(key))
    )
    turns: list[DialogueTurnRow] = []
    for number, key in sessions:
        raw = sample.conversation[key]
        if not isinstance(raw, list):
            raise InvalidInputError(
                f"{path}: sample {sample.sample_id}: {key} is not a list of turns", hint=_HINT
            )
        when = sample.conversation.get(f"{key}_date_time")
        for index, record in enumerate(raw):
            turn = _validate(path, f"sample {sample.sample_id}, {key}.{index}", LocomoTurn, record)
            turns.append(
                DialogueTurnRow(
                    conversation_id=dialogue_id,
                    turn_id=len(turns) + 1,
                    session=number,
                    session_time=str(when) if when is not None else None,
                    dia_id=turn.dia_id,
                    speaker=turn.speaker,
                    text=turn.text,
                    image_caption=turn.blip_caption or None,
                )
            )
            if max_turns is not None and len(turns) >= max_turns:
                break
        if max_turns is not None and len(turns) >= max_turns:
            break
    if not turns:
        raise InvalidInputError(f"{path}: sample {sample.sample_id} holds no turns", hint=_HINT)
    return DialogueSpec(
        dialogue_id=dialogue_id,
        path=str(path),
        turns=turns,
        qa=sample.qa,
        qa_path=str(path) if sample.qa else None,
    )


def longmemeval_spec(
    path: Path, instance: LongMemEvalInstance, max_turns: int | None
) -> DialogueSpec:
    """One LongMemEval instance: its haystack as one dialogue (sessions in the given order, each
    turn's dia_id `<session id>_<turn number>` as the authors number them) and its question,
    with the answer sessions as evidence and the `has_answer` turns as turn-level evidence."""
    if (
        not len(instance.haystack_session_ids)
        == len(instance.haystack_dates)
        == len(instance.haystack_sessions)
    ):
        raise InvalidInputError(
            f"{path}: {instance.question_id}: haystack_session_ids, haystack_dates and haystack_sessions differ in "
            "length",
            hint=_HINT,
        )
    dialogue_id = f"longmemeval-{instance.question_id}"
    turns: list[DialogueTurnRow] = []
    answer_turns: list[str] = []
    marked: set[str] = set()
    for number, (session_id, when, session) in enumerate(
        zip(
            instance.haystack_session_ids,
            instance.haystack_dates,
            instance.haystack_sessions,
            strict=True,
        ),
        start=1,
    ):
        for index, turn in enumerate(session, start=1):
            dia_id = f"{session_id}_{index}"
            turns.append(
                DialogueTurnRow(
                    conversation_id=dialogue_id,
                    turn_id=len(turns) + 1,
                    session=number,
                    session_time=when,
                    dia_id=dia_id,
                    session_id=session_id,
                    speaker=turn.role,
                    text=turn.content,
                )
            )
            if turn.has_answer:
                answer_turns.append(dia_id)
                marked.add(session_id)
            if max_turns is not None and len(turns) >= max_turns:
                break
        if max_turns is not None and len(turns) >= max_turns:
            break
    if not turns:
        raise InvalidInputError(f"{path}: {instance.question_id} has an empty haystack", hint=_HINT)
    # The authors' gold sessions are the answer sessions holding a `has_answer` turn (their
    # turn ids, stripped to the session); a file without turn marks falls back to the list.
    gold = [s for s in instance.answer_session_ids if s in marked] or list(
        instance.answer_session_ids
    )
    qa = [
        QAItem(
            question=instance.question,
            answer=instance.answer,
            evidence=answer_turns,
            category=0,
            question_id=instance.question_id,
            question_type=instance.question_type,
            evidence_sessions=gold,
            abstention="_abs" in instance.question_id,
            asked_on=instance.question_date,
        )
    ]
    return DialogueSpec(
        dialogue_id=dialogue_id,
        path=str(path),
        turns=turns,
        qa=qa,
        qa_path=str(path),
        scoring="session",
    )


def load_benchmark_json(path: Path, max_turns: int | None = None) -> list[DialogueSpec]:
    """Every dialogue of a LoCoMo or LongMemEval JSON file, in file order."""
    try:
        data = json.loads(path.read_text(encoding=USER_TEXT_ENCODING))
    except OSError as exc:
        raise InvalidInputError(
            f"cannot read dialogue file {path}: {exc.strerror or exc}"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON: {exc}", hint=_HINT) from None
    records = data if isinstance(data, list) else [data]
    layout = detect_layout(path, data)
    if layout == "locomo":
        return [
            locomo_spec(path, _validate(path, f"record {i}", LocomoSample, r), max_turns)
            for i, r in enumerate(records)
        ]
    return [
        longmemeval_spec(path, _validate(path, f"record {i}", LongMemEvalInstance, r), max_turns)
        for i, r in enumerate(records)
    ]


def load_dialogues(path: Path, max_turns: int | None = None) -> list[DialogueSpec]:
    """The dialogues a file holds, whichever of the layouts it is in: the shared JSONL turns,
    LoCoMo's or LongMemEval's JSON, or a SillyTavern chat (tasks.dialogue.sillytavern)."""
    if path.suffix.lower() == ".json":
        return load_benchmark_json(path, max_turns)
    if is_sillytavern_chat(path):
        return [load_sillytavern_chat(path, max_turns)]
    return [load_dialogue(path, max_turns)]


def dialogue_files(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for its `*.turns.jsonl` and `*.json` files."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted([*path.glob("*.turns.jsonl"), *path.glob("*.json")])
            if not found:
                raise InvalidInputError(
                    f"directory {path} holds no *.turns.jsonl or *.json dialogue files"
                )
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise InvalidInputError(
                f"dialogue file {path} does not exist",
                hint="pass --dialogues FILE.turns.jsonl, locomo10.json or longmemeval_s.json",
            )
    return files
