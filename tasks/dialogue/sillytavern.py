"""A SillyTavern chat file (`data/<user>/chats/<character>/<chat>.jsonl`, or a group's,
`data/<user>/group chats/<chat>.jsonl`) as a dialogue to ingest: its turns as the Skald memory
extension writes them, so a long chat is remembered in bulk (`python -m flows.dialogue ingest
--dialogue <chat>.jsonl`) instead of turn by turn.

The file: a header line (`user_name`, `character_name`, `chat_metadata`), then one message a
line (`name`, `is_user`, `is_system`, `send_date`, `mes`, ...; SillyTavern's chat format). A
group's chat has no header (SillyTavern keeps its metadata in the group's own file): every line
is a message, and the chat's messages are indexed from its first line.
The turns are cut exactly as the extension cuts them (integrations/sillytavern/sidecar-core.js,
`turnsOf` and `toSidecarMessage`): system notes and empty messages left out, a turn ending
with each reply, its id the reply's index among the chat's messages, each message's id its
index, its text as the extension sends it (at most 64K UTF-16 units, no half character), a
turn's messages the newest that one request's body takes (`newest_that_fit`).
So the extension, when it opens the chat, finds every imported turn held with the text it
would have written, and writes only what comes after. Trailing messages with no reply are
not a turn yet (the extension writes them once answered).

The conversation id is the one the extension uses: the id its record in the chat's metadata
names (`chat_metadata.skald_memory.conversation_id`: a renamed chat keeps its memory's id),
else the chat's file name without `.jsonl` (SillyTavern's chat id; a group's chat always).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.content import USER_TEXT_ENCODING
from core.errors import InvalidInputError, first_error
from tasks.dialogue.models import JS_BLANK_PATTERN, MAX_MESSAGE_CHARS, ChatMessage
from tasks.dialogue.replay import DialogueSpec, DialogueTurnRow

#: What the extension lets one request's messages take of the sidecar's body, in the bytes of
#: their JSON, and how many it sends at most (sidecar-core.js MAX_QUERY_TEXT_BYTES,
#: MAX_WINDOW_MESSAGES).
MAX_TURN_BYTES = 280 * 1024
MAX_TURN_MESSAGES = 200
#: The header's keys that tell a SillyTavern chat from the other layouts.
HEADER_KEYS = frozenset({"user_name", "character_name", "chat_metadata"})
#: The keys every message line has: a group's chat file starts with one (it has no header).
MESSAGE_KEYS = frozenset({"mes", "is_user"})
#: Where the extension records a chat's memory in its metadata (index.js CHAT_MEMORY_KEY).
CHAT_MEMORY_KEY = "skald_memory"
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_BLANK = re.compile(JS_BLANK_PATTERN)


def is_sillytavern_chat(path: Path) -> bool:
    """Whether `path` is a SillyTavern chat file: its first line a header object with the
    chat's keys, or (a group's chat) a message (a file that cannot be read is no chat: the
    other loaders report it)."""
    try:
        with path.open(encoding=USER_TEXT_ENCODING) as handle:
            first = handle.readline()
        header = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(header, dict) and (
        HEADER_KEYS <= header.keys() or MESSAGE_KEYS <= header.keys()
    )


def load_sillytavern_chat(path: Path, max_turns: int | None = None) -> DialogueSpec:
    """The chat's turns (see the module docstring); InvalidInputError naming the line of a
    line that is not a message."""
    lines = _read_lines(path)
    grouped = not HEADER_KEYS <= lines[0].keys()  # a group's chat: no header line
    header, messages = ({}, lines) if grouped else (lines[0], lines[1:])
    record = (header.get("chat_metadata") or {}).get(CHAT_MEMORY_KEY) or {}
    recorded = record.get("conversation_id") if isinstance(record, dict) else None
    conversation_id = recorded if isinstance(recorded, str) and recorded else path.stem
    turns: list[DialogueTurnRow] = []
    held: list[ChatMessage] = []
    for index, message in enumerate(messages):
        converted = _message(message, index, path)
        if converted is None or _BLANK.match(converted.content):
            continue
        held.append(converted)
        if converted.role == "assistant":
            turns.append(_turn(conversation_id, index, held))
            held = []
            if max_turns is not None and len(turns) >= max_turns:
                break
    if not turns:
        raise InvalidInputError(
            f"SillyTavern chat {path} holds no turn yet (no reply to any message)",
            hint="ingest it once the character has answered",
        )
    return DialogueSpec(dialogue_id=conversation_id, path=str(path), turns=turns)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        handle = path.open(encoding=USER_TEXT_ENCODING)
    except OSError as exc:
        raise InvalidInputError(f"cannot read chat file {path}: {exc.strerror or exc}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise InvalidInputError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(value, dict):
                raise InvalidInputError(f"{path}:{number}: a chat line must be a JSON object")
            out.append(value)
    if not out:
        raise InvalidInputError(f"chat file {path} is empty")
    return out


def _message(message: dict[str, Any], index: int, path: Path) -> ChatMessage | None:
    """The extension's `toSidecarMessage`: None for a system note."""
    if message.get("is_system"):
        return None
    fields: dict[str, Any] = {
        "role": "user" if message.get("is_user") else "assistant",
        "content": _clipped(_js_string(message.get("mes"))),
        "message_id": str(index),
    }
    if message.get("name"):
        name = _clipped(_js_string(message["name"]))
        fields["name"] = _LONE_SURROGATE.sub("", _utf16_prefix(name, 200))
    if message.get("send_date"):
        fields["time"] = _utf16_prefix(_js_string(message["send_date"]), 200)
    try:
        return ChatMessage.model_validate(fields)
    except ValidationError as exc:
        raise InvalidInputError(f"{path}: message {index}: {first_error(exc)}") from None


def message_bytes(message: ChatMessage) -> int:
    """The extension's `messageBytes`: the UTF-8 bytes of the message's JSON as JavaScript
    writes it (its keys in the extension's order, no spaces, the same escapes), and a comma."""
    fields: dict[str, str] = {
        "role": message.role,
        "content": message.content,
        "message_id": message.message_id or "",
    }
    if message.name:
        fields["name"] = message.name
    if message.time:
        fields["time"] = message.time
    return len(json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")) + 1


def newest_that_fit(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The extension's `newestThatFit`: the newest of `messages` that one request's body
    takes (MAX_TURN_MESSAGES, MAX_TURN_BYTES), the newest always."""
    kept: list[ChatMessage] = []
    room = MAX_TURN_BYTES
    for message in reversed(messages):
        if len(kept) >= MAX_TURN_MESSAGES:
            break
        room -= message_bytes(message)
        if room < 0 and kept:
            break
        kept.append(message)
    return kept[::-1]


def _turn(conversation_id: str, index: int, messages: list[ChatMessage]) -> DialogueTurnRow:
    messages = newest_that_fit(messages)
    return DialogueTurnRow(
        conversation_id=conversation_id,
        turn_id=index,
        speaker=", ".join(dict.fromkeys(m.speaker for m in messages)),
        text="\n".join(m.line() for m in messages),
        session_time=messages[-1].time,
        messages=list(messages),
    )


def _js_string(value: Any) -> str:
    """JavaScript's String(value ?? '') for what JSON holds."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict):
        return "[object Object]"
    if isinstance(value, list):
        return ",".join(_js_string(v) for v in value)
    return str(value)


def _clipped(text: str) -> str:
    """The extension's `clipContent`: a half character as U+FFFD, then at most
    MAX_MESSAGE_CHARS UTF-16 units without half a character at the cut."""
    text = _LONE_SURROGATE.sub("\ufffd", text)
    return _utf16_prefix(text, MAX_MESSAGE_CHARS)


def _utf16_prefix(text: str, units: int) -> str:
    """The longest start of `text` of at most `units` UTF-16 units that ends on a whole
    character (JavaScript's slice, less a half character at the end)."""
    count = 0
    for position, char in enumerate(text):
        count += 2 if ord(char) > 0xFFFF else 1
        if count > units:
            return text[:position]
    return text
