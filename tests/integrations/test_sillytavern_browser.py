"""The memory extension in real SillyTavern, driven in headless chromium (opt-in).

Needs a SillyTavern source checkout with its npm dependencies, named by `SILLYTAVERN_DIR`
(skipped when unset, like NEO4J_URI), Debian's chromium (`apt-get install chromium`; or
`SKALD_CHROMIUM`), and the driver's own dependency (`npm ci --prefix tests/sillytavern`).
`make sillytavern-test` does the npm part and runs this file.

What runs, all on 127.0.0.1: SillyTavern from the checkout (a fresh data root, the extension
copied to its user's extensions folder, data/default-user/extensions/skald-memory/), the sidecar
(`python -m flows.dialogue serve`, bearer token, CORS for SillyTavern's exact origin) on the
session's graph, the scripted OpenAI-compatible server as the sidecar's LLM (5 s a call, so
every commit is slow), a second scripted server as SillyTavern's chat backend that logs every
prompt, and tests/sillytavern/drive.mjs driving chromium (playwright-core) through a chat with
Seraphina: a stated fact, small talk, the question, a swipe, an edit, a delete, a reload; then
the chat's lorebook, fetched from the sidecar and imported through SillyTavern's own World Info
import, its entries read back from the World Info editor; the extension's chatLorebook option,
ticked, binding the same book as the chat's lorebook; then the chat renamed (memory moves, the
book stays bound), branched with /branch-create (memory copied, the branch's missing turns
rewound, nothing written again) and the branch deleted with /delchat, which memory must
forget while the chat keeps its own.

The history test saves 60 exchanges into the chat behind the extension's back and reloads the
page, as a user who installs the extension on an old chat: the extension imports the older 40
turns at once (conversation/import) and writes the newest 20 through the sidecar's slots, and
the question after it gets the fact from the oldest turn.

The tiny-model test (`SKALD_ST_TINY=1` too: the default local model runs the sidecar's slots,
several minutes) chats ten ordinary messages and reads the badge log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core.graph_server import free_port
from core.settings import Settings
from tests.conftest import REPO_ROOT
from tests.support.cli import graph_vars
from tests.support.dialogue_script import DialogueScript
from tests.support.scripted_llm import ScriptedLLM, ScriptedRequest

ST_DIR = os.environ.get("SILLYTAVERN_DIR", "").strip()
pytestmark = pytest.mark.skipif(
    not ST_DIR,
    reason="SILLYTAVERN_DIR is not set: no SillyTavern checkout to test the extension in (see README)",
)
DRIVER = REPO_ROOT / "tests" / "sillytavern" / "drive.mjs"
TOKEN = "browser-test-token-0123456789"
MEMORY_LATENCY_S = 5.0
STATED_FACT = "Ilse moved to Bergen"
#: The imported book's name (SillyTavern names a book after its file).
LOREBOOK_NAME = "skald-memory-lorebook"


def _chromium() -> str:
    found = (
        os.environ.get("SKALD_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )
    assert found, (
        "chromium is needed: apt-get update && apt-get install -y chromium (or set SKALD_CHROMIUM)"
    )
    return found


def _wait_http(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers or {}), timeout=5
            ) as answer:
                if answer.status == 200:
                    return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f}s: {last}")


def _get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


class ChatBackend:
    """SillyTavern's chat backend: the scripted OpenAI-compatible server, replying per prompt
    and stamping when each reply left (the prompts themselves are in `llm.requests`)."""

    def __init__(self) -> None:
        self.llm = ScriptedLLM()
        self.replies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.llm.on(respond=self._reply)

    def _reply(self, request: ScriptedRequest) -> str:
        users = [m for m in request.messages if m.get("role") == "user"]
        last = str(users[-1].get("content", "")) if users else ""
        with self._lock:
            n = len(self.replies) + 1
            # Never echoing the user's words: the prompts' assertions are about what memory adds.
            text = f"(reply {n}) I hear you, Tester. {len(last.split())} words; tell me more."
            self.replies.append(
                {"at_ms": time.time() * 1000.0, "prompt": request.messages, "text": text}
            )
        return text

    def __enter__(self) -> ChatBackend:
        self.llm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.llm.__exit__(*exc)


def _stop(process: subprocess.Popen[Any] | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


class Stack:
    """SillyTavern + sidecar + chat backend, torn down in reverse."""

    def __init__(self, tmp: Path, graph_settings: Settings, memory_llm_url: str | None) -> None:
        self.tmp = tmp
        self.graph_settings = graph_settings
        self.memory_llm_url = memory_llm_url
        self.st_port, self.sidecar_port = free_port(), free_port()
        self.origin = f"http://127.0.0.1:{self.st_port}"
        self.sidecar_url = f"http://127.0.0.1:{self.sidecar_port}"
        self.processes: list[subprocess.Popen[Any]] = []

    def start_sidecar(self) -> None:
        env = {
            **os.environ,
            "SKALD_SIDECAR_TOKEN": TOKEN,
            **graph_vars(self.graph_settings),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("OPENAI_API_KEY", None)
        env.pop("OPENAI_BASE_URL", None)
        if self.memory_llm_url:
            env["OPENAI_BASE_URL"] = self.memory_llm_url
        project = self.tmp / "sidecar"
        project.mkdir()
        log = (self.tmp / "sidecar.log").open("w")
        self.processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flows.dialogue",
                    "serve",
                    "--project-dir",
                    str(project),
                    "--port",
                    str(self.sidecar_port),
                    "--cors-origin",
                    self.origin,
                ],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_http(
            f"{self.sidecar_url}/api/kg-sidecar/health", 300, {"Authorization": f"Bearer {TOKEN}"}
        )

    def start_sillytavern(self, backend_url: str) -> None:
        st = Path(ST_DIR)
        assert (st / "server.js").is_file(), f"SILLYTAVERN_DIR={ST_DIR} holds no server.js"
        assert (st / "node_modules").is_dir(), f"run `npm ci` in {ST_DIR} first"
        data = self.tmp / "st-data"
        log = (self.tmp / "sillytavern.log").open("w")
        self.processes.append(
            subprocess.Popen(
                [
                    "node",
                    "server.js",
                    "--port",
                    str(self.st_port),
                    "--listen",
                    "false",
                    "--autorun",
                    "false",
                    "--dataRoot",
                    str(data),
                ],
                cwd=st,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_http(self.origin + "/", 300)
        # SillyTavern 1.12+ keeps a user's third-party extensions in <data root>/<user>/extensions/
        # (served as /scripts/extensions/third-party/<name>/), read on every page load.
        shutil.copytree(
            REPO_ROOT / "integrations" / "sillytavern",
            data / "default-user" / "extensions" / "skald-memory",
            ignore=shutil.ignore_patterns("*.test.js", "*.py", "__pycache__"),
        )
        settings_file = data / "default-user" / "settings.json"
        settings = json.loads(settings_file.read_text(encoding="utf-8"))
        settings.update(firstRun=False, username="Tester", main_api="openai")
        settings["power_user"]["auto_connect"] = True
        settings["oai_settings"].update(
            chat_completion_source="custom",
            custom_url=backend_url,
            custom_model="scripted-model",
            stream_openai=False,
        )
        settings["extension_settings"]["skald_memory"] = {
            "baseUrl": self.sidecar_url,
            "token": TOKEN,
            "enabled": True,
        }
        settings_file.write_text(json.dumps(settings, indent=4), encoding="utf-8")

    def drive(self, scenario: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        shots = REPO_ROOT / "build" / "sillytavern-screenshots" / scenario["scenario"]
        shutil.rmtree(shots, ignore_errors=True)
        shots.mkdir(parents=True)
        config = {
            "url": self.origin + "/",
            "chromium": _chromium(),
            "profileDir": str(self.tmp / "chromium-profile"),
            "screenshots": str(shots),
            "out": str(self.tmp / "drive.json"),
            **scenario,
        }
        (self.tmp / "drive-config.json").write_text(json.dumps(config), encoding="utf-8")
        assert (
            REPO_ROOT / "tests" / "sillytavern" / "node_modules" / "playwright-core"
        ).is_dir(), "run `npm ci --prefix tests/sillytavern` first (make sillytavern-test does)"
        driver = subprocess.Popen(
            ["node", str(DRIVER), str(self.tmp / "drive-config.json")],
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        try:
            driver.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(driver)
            raise AssertionError(f"the browser driver took over {timeout_s:.0f}s") from None
        finally:
            _stop(driver)
        return json.loads((self.tmp / "drive.json").read_text(encoding="utf-8"))

    def close(self) -> None:
        for process in reversed(self.processes):
            _stop(process)


@pytest.fixture()
def backend() -> Iterator[ChatBackend]:
    with ChatBackend() as chat:
        yield chat


def _send_delays(result: dict[str, Any], backend: ChatBackend) -> list[float]:
    """Per generation: ms from the chat backend's reply to the send button shown again."""
    assert len(backend.replies) == len(result["generations"]), (
        len(backend.replies),
        len(result["generations"]),
    )
    return [
        round(_shown_again(reply, generation) - reply["at_ms"], 1)
        for reply, generation in zip(backend.replies, result["generations"], strict=True)
    ]


def _shown_again(reply: dict[str, Any], generation: dict[str, Any]) -> float:
    """When the send button was first shown again after the chat backend's reply."""
    shown = [t for t in generation["shown"] if t >= reply["at_ms"] - 5]
    assert shown, f"the send button never came back after {reply['text']!r}"
    return float(shown[0])


def _memory_waits(
    result: dict[str, Any], backend: ChatBackend, memory: ScriptedLLM
) -> list[tuple[float, float]]:
    """Per generation that the sidecar's LLM was asked anything after: (when the send button
    was back, the earliest that any of those calls could be answered). A front end that waited
    for the turn's commit, whose LLM calls are asked only after the reply, shows the button
    after that answer; one that does not shows it before, however slow the machine is until
    the memory answers (an order of events, not a time bound)."""
    latency_ms = memory.latency_s * 1000.0
    asked = sorted(r.received_ms for r in list(memory.requests))
    out = []
    for reply, generation in zip(backend.replies, result["generations"], strict=True):
        later = [t for t in asked if t >= reply["at_ms"]]
        if later:
            out.append((_shown_again(reply, generation), later[0] + latency_ms))
    return out


def _prompt_text(reply: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in reply["prompt"])


def _report(result: dict[str, Any], delays: list[float]) -> None:
    for generation, delay in zip(result["generations"], delays, strict=True):
        query = generation.get("query") or {}
        said = generation["text"] or "(swipe: a new alternative of the last reply)"
        print(
            f"  {generation['kind']:5} {said[:60]!r:64} send button back {delay:4.0f} ms after the reply; "
            f"query waited {query.get('waitedMs')} ms, window {query.get('window')} messages "
            f"(room for {query.get('chatTokens')} tokens), pending_turns "
            f"{[p['turn_id'] for p in query.get('pendingTurns', [])]}, held back {query.get('heldBack')}"
        )
        packet = generation.get("packet") or ""
        passages = (
            packet.split("## Related earlier passages")[-1].strip().splitlines()
            if "## Related" in packet
            else []
        )
        for line in [p for p in passages if p.startswith("- [turn")][:5]:
            print(f"        memory: {line[:110]}")
    print("  badge log:", [(b["status"], b["detail"][:70]) for b in result["badges"]])
    print(
        "  writes (since the last page load):",
        [(o["step"], o["turnId"], o["status"]) for o in result.get("outcomes", [])],
    )
    print("  screenshots:", *result["screenshots"], sep="\n    ")


@contextmanager
def _scripted_stack(
    tmp_path: Path, graph_settings: Settings, backend: ChatBackend, latency_s: float = 0.0
) -> Iterator[tuple[Stack, ScriptedLLM]]:
    """SillyTavern and the sidecar running, the sidecar's LLM the scripted server playing the
    chat of Tester and Seraphina (`latency_s` a call), and that server."""
    with ScriptedLLM(latency_s=latency_s) as memory_llm:
        DialogueScript(["Tester", "Seraphina"]).install(memory_llm)
        stack = Stack(tmp_path, graph_settings, memory_llm.base_url)
        try:
            stack.start_sidecar()
            stack.start_sillytavern(backend.llm.base_url)
            yield stack, memory_llm
        finally:
            stack.close()


def test_real_sillytavern_never_blocks_on_a_slow_sidecar_and_memory_follows_edits(
    graph_settings: Settings, backend: ChatBackend, tmp_path: Path
) -> None:
    with _scripted_stack(tmp_path, graph_settings, backend, latency_s=MEMORY_LATENCY_S) as (
        stack,
        memory_llm,
    ):
        lorebook = {
            "sidecarUrl": stack.sidecar_url,
            "token": TOKEN,
            "fact": STATED_FACT,
            "file": str(tmp_path / f"{LOREBOOK_NAME}.json"),
        }
        result = stack.drive({"scenario": "full", "lorebook": lorebook}, timeout_s=1500)
        print(
            (tmp_path / "sillytavern.log").read_text(errors="replace")[-1500:]
            if not result.get("ok")
            else ""
        )
        assert result.get("ok"), result["errors"]
        delays = _send_delays(result, backend)
        print(f"\nreal SillyTavern, sidecar LLM at {MEMORY_LATENCY_S:g} s a call:")
        _report(result, delays)

        # Never blocked: after every reply the send button is back before the sidecar's
        # LLM answered anything it was asked after that reply (the turn's commit).
        waits = _memory_waits(result, backend, memory_llm)
        assert len(waits) >= 5, waits  # the commits did ask the memory's LLM
        assert all(shown < answered for shown, answered in waits), (waits, delays)

        generations = result["generations"]
        question, during_edit, after_edit = generations[3], generations[5], generations[6]
        # SillyTavern gave the interceptor its prompt's size and the extension read the card:
        # the window is what fits of the chat (this one is short: all of it fits).
        for generation in generations:
            query = generation.get("query") or {}
            assert (query.get("chatTokens") or 0) > 0, query
        # The panel's numbers, typed out of the sidecar's bounds, keep the nearest bound.
        assert result["numberSettings"] == {
            "recallK": 50,
            "tokenBudget": 64,
            "shown": ["50", "64"],
        }, result["numberSettings"]
        # The recall prompt holds the stated fact (from memory, not only from the chat history).
        assert question["packet"] and STATED_FACT in question["packet"]
        assert question["packet"] in _prompt_text(backend.replies[3])
        # Asked after the reload, calling Seraphina by name: the turn that told of Ilse is
        # recalled first (not the lines around the one that asked about her, nor the
        # addressed character's).
        final = generations[-1]["packet"] or ""
        recalled = [line for line in final.splitlines() if line.startswith("- [turn")]
        assert recalled and STATED_FACT in recalled[0], final
        # Asked while the edit was still being written: the old text is never injected.
        prompt = _prompt_text(backend.replies[5])
        assert "sunny all week" in prompt and "rainy all week" not in prompt
        assert "rainy" not in (during_edit["packet"] or "")
        assert [p["turn_id"] for p in during_edit["query"]["pendingTurns"]]
        # Once the replace landed, recall returns the new text and never the old.
        assert after_edit["packet"] and "sunny all week" in after_edit["packet"]
        assert "rainy all week" not in _prompt_text(backend.replies[6])
        assert not [b for b in result["badges"] if b["status"] in ("error", "rollback")], result[
            "badges"
        ]

        # After the delete and the reload, memory held exactly the chat's turns.
        assert [(t["turnId"], t["text"]) for t in result["memoryTurns"]] == [
            (t["turnId"], t["text"]) for t in result["chatTurns"]
        ]

        _check_lorebook(result, tmp_path)
        _check_chat_renamed(result, stack)
        _check_chat_branched(result)
        _check_chat_deleted(result, stack, tmp_path)


def test_real_sillytavern_imports_an_old_chat_at_once_and_writes_its_newest_turns(
    graph_settings: Settings, backend: ChatBackend, tmp_path: Path
) -> None:
    with _scripted_stack(tmp_path, graph_settings, backend) as (stack, _):
        scenario = {
            "scenario": "history",
            "exchanges": 60,
            "fact": f"My sister {STATED_FACT} to study marine biology last spring.",
            "question": "Where did my sister Ilse move to?",
        }
        result = stack.drive(scenario, timeout_s=1500)
        assert result.get("ok"), result["errors"]
        steps = [(o["step"], o["status"]) for o in result["outcomes"]]
        print("\nreal SillyTavern, an old chat of 60 exchanges met:", steps[:3], len(steps))
        # Since the reload: one import of the oldest 40 of the 60 turns memory lacked (it
        # held the greeting), then the newest 20 through the slots, then the question's turn.
        assert steps == [("import", "committed")] + [("commit", "committed")] * 21, steps
        assert result["outcomes"][0]["detail"].endswith("as text (no facts): 40 added")
        importing = [b for b in result["badges"] if "importing" in b["detail"]]
        assert importing and importing[0]["detail"].startswith(
            "60 pending; importing 40 older turn(s) as text"
        ), importing
        # Memory held the chat as it is, every turn, before the question.
        assert len(result["chatTurns"]) == 61
        assert [(t["turnId"], t["text"]) for t in result["memoryTurns"]] == [
            (t["turnId"], t["text"]) for t in result["chatTurns"]
        ]
        # The question's prompt holds the fact the oldest imported turn told.
        packet = result["generations"][-1]["packet"] or ""
        assert STATED_FACT in packet, packet
        assert packet in _prompt_text(backend.replies[-1])


def _turns_under(stack: Stack, conversation_id: str) -> dict[str, Any]:
    return _get_json(
        f"{stack.sidecar_url}/api/kg-sidecar/conversations/"
        f"{urllib.request.quote(conversation_id, safe='')}/turns?limit=500"
    )


def _check_chat_renamed(result: dict[str, Any], stack: Stack) -> None:
    """The chat renamed with SillyTavern's renameChat: the extension moved its memory to the
    new name (found through the chat's metadata) and wrote no turn again; the old name holds
    nothing, and the chat's lorebook stays the book it is bound to. (What memory held under
    the new name is `memoryTurns`, checked above.)"""
    renamed = result["renamedChat"]
    print("  chat renamed:", renamed)
    assert renamed["to"] != renamed["from"] and result["chatId"] == renamed["to"], renamed
    steps = [(o["step"], o["status"]) for o in renamed["outcomes"]]
    assert steps == [("rename", "idle")], steps
    moved = len(result["memoryTurns"])
    assert f"{moved} remembered turn(s) moved" in renamed["outcomes"][0]["detail"], renamed
    assert _turns_under(stack, renamed["from"])["page"]["total"] == 0
    # The chat's lorebook (bound before the rename): the same book, offered again and bound.
    book = renamed["lorebook"]
    assert book["chatId"] == renamed["to"] and book["status"] == "offered", book
    assert book["name"] == result["chatLorebook"]["name"] == book["bound"], book


def _check_chat_branched(result: dict[str, Any]) -> None:
    """The chat branched at its second turn with SillyTavern's /branch-create: the extension
    copied the chat's memory and rewound the turns the branch lacks, with no turn written (no
    LLM call); memory then held exactly the branch's turns."""
    branched = result["branchedChat"]
    print("  chat branched:", branched["outcomes"])
    assert branched["from"] == result["chatId"] != branched["chatId"], branched
    steps = [(o["step"], o["status"]) for o in branched["outcomes"]]
    assert steps == [("copy", "idle"), ("rewind", "idle")], steps
    copied = len(result["memoryTurns"])
    assert f"{copied} remembered turn(s) copied" in branched["outcomes"][0]["detail"], branched
    assert len(branched["chatTurns"]) == 2 < copied, branched
    assert [(t["turnId"], t["text"]) for t in branched["memoryTurns"]] == [
        (t["turnId"], t["text"]) for t in branched["chatTurns"]
    ]


def _check_chat_deleted(result: dict[str, Any], stack: Stack, tmp_path: Path) -> None:
    """The branch deleted with SillyTavern's /delchat: another chat is open, memory holds
    nothing of the deleted one (the extension forgot it on CHAT_DELETED) and World Info no
    longer has the branch's own lorebook, and the chat it was branched from keeps its memory
    and its book."""
    deleted = result["deletedChat"]
    print("  chat deleted:", deleted)
    assert deleted["openChat"] != deleted["chatId"] == result["branchedChat"]["chatId"], deleted
    forget = deleted["forget"]
    assert [o["status"] for o in forget] == ["idle"], forget
    branch_turns = len(result["branchedChat"]["memoryTurns"])
    assert f"{branch_turns} remembered turn(s)" in forget[0]["detail"], forget
    turns = _turns_under(stack, deleted["chatId"])
    assert turns["page"]["total"] == 0 and turns["items"] == [], turns
    parent = _turns_under(stack, result["chatId"])
    assert parent["page"]["total"] == len(result["memoryTurns"]), parent
    worlds = tmp_path / "st-data" / "default-user" / "worlds"
    branch_book = result["branchedChat"]["lorebook"]["name"]
    assert branch_book != result["chatLorebook"]["name"], branch_book
    assert forget[0]["detail"].endswith(f'; its lorebook "{branch_book}" deleted'), forget
    assert not (worlds / f"{branch_book}.json").exists()
    assert (worlds / f"{result['chatLorebook']['name']}.json").exists()


def _check_lorebook(result: dict[str, Any], tmp_path: Path) -> None:
    """The chat's lorebook, imported through SillyTavern's World Info import: SillyTavern holds
    the book as the sidecar gave it, and its editor shows the stated fact, keyed by the
    speaker's name; the edited turn's old text is in no entry (the look-alike)."""
    book = result["lorebook"]
    stored = tmp_path / "st-data" / "default-user" / "worlds" / f"{LOREBOOK_NAME}.json"
    assert json.loads(stored.read_text(encoding="utf-8")) == book
    shown = result["lorebookShown"]
    print("  lorebook in SillyTavern's World Info editor:")
    for entry in shown:
        print(
            f"    uid {entry['uid']} {entry['comment']!r} keys {entry['keys']}: {entry['content'][:300]!r}"
        )
    print("  lorebook screenshot:", result["lorebookScreenshot"])
    # Every entry, as the sidecar wrote it (the editor sorts them its own way).
    assert {e["uid"]: (e["comment"], e["content"]) for e in shown} == {
        uid: (e["comment"], e["content"]) for uid, e in book["entries"].items()
    }
    holding = [e for e in shown if STATED_FACT in e["content"]]
    assert holding and holding[0]["uid"] == result["lorebookOpened"], shown
    assert "Tester" in holding[0]["keys"], holding
    everything = "\n".join(e["content"] for e in shown)
    assert "sunny all week" in everything and "rainy all week" not in everything

    # The extension's option, ticked at the end: the same book saved as World Info and bound
    # as the chat's lorebook.
    offered = result["chatLorebook"]
    print("  chat lorebook (the extension's option):", offered)
    assert offered["status"] == "offered" and offered["bound"] == offered["name"], offered
    assert offered["entries"] == len(book["entries"])
    saved = tmp_path / "st-data" / "default-user" / "worlds" / f"{offered['name']}.json"
    assert json.loads(saved.read_text(encoding="utf-8")) == book


@pytest.mark.skipif(
    not os.environ.get("SKALD_ST_TINY"),
    reason="SKALD_ST_TINY=1 runs the tiny local model (minutes)",
)
def test_real_sillytavern_ordinary_chat_with_the_tiny_model_shows_no_participant_conflicts(
    graph_settings: Settings, backend: ChatBackend, tmp_path: Path
) -> None:
    messages = [
        "Hi Seraphina, thanks for finding me in the forest.",
        "I am feeling much better now, really.",
        "What is this place? It looks so peaceful.",
        "I love the smell of the pine trees here.",
        "Do you live here all alone, Seraphina?",
    ]
    stack = Stack(tmp_path, graph_settings, None)
    try:
        stack.start_sidecar()
        stack.start_sillytavern(backend.llm.base_url)
        result = stack.drive({"scenario": "ordinary", "messages": messages}, timeout_s=2400)
        assert result.get("ok"), result["errors"]
        delays = _send_delays(result, backend)
        print("\nreal SillyTavern, the tiny default model in the sidecar:")
        _report(result, delays)
        turns = _get_json(
            f"{stack.sidecar_url}/api/kg-sidecar/conversations/"
            f"{urllib.request.quote(result['chatId'], safe='')}/turns?limit=500"
        )["items"]
        print("  memory:", [(t["turn_id"], t["committed"]) for t in turns])

        def persona_conflict(event: dict[str, Any]) -> bool:
            """A rollback blaming the identity conflict of the character and the persona."""
            detail = event["detail"]
            return event["status"] == "rollback" and all(
                part in detail for part in ("identity conflicts", "Seraphina", "Tester")
            )

        shown = [b for b in result["badges"] if persona_conflict(b)]
        written = [o for o in result["outcomes"] if persona_conflict(o)]
        assert shown == [] and written == [], (shown, written)
        assert len(turns) == len(result["chatTurns"])
    finally:
        stack.close()
