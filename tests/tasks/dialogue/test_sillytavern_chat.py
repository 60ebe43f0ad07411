"""A SillyTavern chat file read as the Skald extension writes its turns (tasks.dialogue.sillytavern)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from core.errors import InvalidInputError
from tasks.dialogue.benchmarks import load_dialogues
from tasks.dialogue.replay import turn_requests
from tasks.dialogue.sillytavern import is_sillytavern_chat, load_sillytavern_chat, message_bytes
from tests.conftest import DIALOGUES_DIR, REPO_ROOT

HEADER = {
    "user_name": "User",
    "character_name": "Seraphina",
    "create_date": "2023-05-08@13h00m00s",
    "chat_metadata": {},
}


def _chat(
    path: Path, messages: list[dict[str, Any]], header: dict[str, Any] | None = HEADER
) -> Path:
    """A chat file; `header` None: a group's chat (SillyTavern writes it without one)."""
    lines = messages if header is None else [header, *messages]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _edge_cases() -> list[dict[str, Any]]:
    """Messages at every corner the extension's conversion has."""
    long_text = "x" * 65_535 + "\U0001f600" + "y" * 10  # the emoji straddles the 65,536th unit
    return [
        {"name": "Seraphina", "is_user": False, "send_date": "May 8, 2023 1:56pm", "mes": "Hi."},
        {"name": "System", "is_system": True, "mes": "a note"},
        {"name": "User", "is_user": True, "send_date": 1683554160000, "mes": "\ufeff\u00a0 "},
        {"name": "User", "is_user": True, "send_date": "", "mes": "half \ud83d here"},
        {"name": "User", "is_user": True, "mes": 2.0},
        {"is_user": True, "mes": True},
        # What JSON escapes, and what it does not, as the message's bytes count them.
        {"name": 'Q"\\', "is_user": True, "mes": 'tab\tnl\n\x01\x1f"\\ \u2028\x7f é 東 \U0001f600'},
        {"name": "Sera" + "\U0001f600" * 120, "is_user": False, "mes": long_text},
        {"name": "User", "is_user": True, "mes": "\u200b"},  # a zero-width space is no space
        {"name": "Seraphina", "is_user": False, "mes": None, "send_date": 0},
        # Three pasted texts of 192 KB each before one reply: a write's body takes one of them.
        *({"name": "User", "is_user": True, "mes": f"{i}" + "東" * 65_535} for i in range(3)),
        {"name": "Seraphina", "is_user": False, "mes": "So much to read!"},
        # 250 messages before one reply: a request takes 200.
        *({"name": "User", "is_user": True, "mes": f"line {i}"} for i in range(250)),
        {"name": "Seraphina", "is_user": False, "mes": "Done?"},
        {"name": "User", "is_user": True, "mes": "not answered"},
    ]


@pytest.mark.parametrize("grouped", [False, True], ids=["character", "group"])
def test_its_turns_are_cut_and_worded_as_the_extension_cuts_and_words_them(
    tmp_path: Path, grouped: bool
) -> None:
    node = shutil.which("node")
    assert node, "node (>= 20) is needed to compare with integrations/sillytavern"
    path = _chat(tmp_path / "chat.jsonl", _edge_cases(), None if grouped else HEADER)
    script = tmp_path / "turns.mjs"
    script.write_text(
        "import { readFileSync } from 'node:fs';\n"
        f"import {{ messageBytes, turnsOf }} from '{REPO_ROOT / 'integrations/sillytavern/sidecar-core.js'}';\n"
        "const chat = readFileSync(process.argv[2], 'utf8').split('\\n').filter((l) => l.trim())"
        f".slice({0 if grouped else 1}).map((l) => JSON.parse(l));\n"
        "console.log(JSON.stringify(turnsOf(chat).map((t) => [t.turnId, t.text, t.messages.map("
        "(m) => [m.role, m.name ?? null, m.content, m.message_id, m.time ?? null, messageBytes(m)])])));\n"
    )
    done = subprocess.run(
        [node, str(script), str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    extension = json.loads(done.stdout)
    spec = load_sillytavern_chat(path)
    ours = [
        [
            t.turn_id,
            t.text,
            [
                [m.role, m.name, m.content, m.message_id, m.time, message_bytes(m)]
                for m in t.messages
            ],
        ]
        for t in spec.turns
    ]
    assert ours == extension
    # What the corners came to: the system note, the blank message and the empty reply left
    # out, the half character as U+FFFD, the long text cut before the emoji, the messages
    # after the last reply no turn yet.
    assert [t.turn_id for t in spec.turns] == [0, 7, 13, 264]
    assert "half \ufffd here" in spec.turns[1].text
    assert spec.turns[1].messages[-1].content == "x" * 65_535
    # A turn holds the newest messages a write's body takes: the last pasted text and the
    # reply; the last 199 lines and the reply.
    assert [m.content[:1] for m in spec.turns[2].messages] == ["2", "S"]
    assert len(spec.turns[3].messages) == 200
    assert spec.turns[3].messages[0].content == "line 51"


def test_the_conversation_is_the_one_the_extension_recorded_else_the_chats_file_name(
    tmp_path: Path,
) -> None:
    messages = [{"name": "User", "is_user": True, "mes": "Hi"}, {"name": "Sera", "mes": "Hello"}]
    named = _chat(tmp_path / "Sera - 2023-5-8@13h00m00s.jsonl", messages)
    assert load_sillytavern_chat(named).dialogue_id == "Sera - 2023-5-8@13h00m00s"
    renamed = {**HEADER, "chat_metadata": {"skald_memory": {"conversation_id": "old name"}}}
    assert load_sillytavern_chat(_chat(tmp_path / "new.jsonl", messages, renamed)).dialogue_id == (
        "old name"
    )
    # Picked from the file by the loaders the CLI and the regression use; the shared JSONL
    # turns (a look-alike: JSON lines too) are not a SillyTavern chat.
    (spec,) = load_dialogues(named)
    assert [t.speaker for t in spec.turns] == ["User, Sera"]
    assert is_sillytavern_chat(named)
    assert not is_sillytavern_chat(DIALOGUES_DIR / "locomo-26.turns.jsonl")
    # A group's chat has no header: every line a message, the chat's id its file name.
    group = _chat(tmp_path / "1715176560000.jsonl", messages, None)
    assert is_sillytavern_chat(group)
    (spec,) = load_dialogues(group)
    assert spec.dialogue_id == "1715176560000"
    assert [(t.turn_id, t.text) for t in spec.turns] == [(1, "User: Hi\nSera: Hello")]


def test_a_front_end_turn_is_committed_with_its_messages_and_the_messages_before_it(
    tmp_path: Path,
) -> None:
    # `ingest --extract` runs the turn pipeline on each turn: the turn's own messages.
    spec = load_sillytavern_chat(_chat(tmp_path / "c.jsonl", _edge_cases()[:8]))
    first, second = turn_requests(spec, "c", window=2)
    assert [m.message_id for m in first.messages] == ["0"] and first.window == []
    assert [m.message_id for m in second.messages] == ["3", "4", "5", "6", "7"]
    assert [m.message_id for m in second.window] == ["0"]
    # A chat log's turns, said earlier: one without a time is stored undated, not dated now.
    assert first.transcript and second.transcript


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (
            '{"user_name": "U", "character_name": "S", "chat_metadata": {}}\nnot json\n',
            ":2: not JSON",
        ),
        (
            '{"user_name": "U", "character_name": "S", "chat_metadata": {}}\n'
            '{"name": "U", "is_user": true, "mes": "unanswered"}\n',
            "holds no turn yet",
        ),
        (
            '{"user_name": "U", "character_name": "S", "chat_metadata": {}}\n[1, 2]\n',
            ":2: a chat line must be a JSON object",
        ),
    ],
)
def test_a_chat_file_that_is_no_chat_is_one_line_naming_it(
    tmp_path: Path, lines: str, says: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(lines)
    with pytest.raises(InvalidInputError, match=says):
        load_sillytavern_chat(path)
