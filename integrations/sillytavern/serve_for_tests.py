"""A real sidecar on loopback for the extension's node tests (`node --test integrations/sillytavern/`).

Starts the scripted OpenAI-compatible server (tests/support/scripted_llm.py, with the dialogue
script) and the `api` package's HTTP app with a bearer token and a CORS origin, on free 127.0.0.1
ports, prints one JSON line {"url", "token", "origin", "graph", "project",
"embedding_base_url"}, and serves until its stdin closes (the node
test ends, or dies). The graph: NEO4J_URI when set (the pytest session passes its own), else
an embedded ArcadeDB in a temporary project directory.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

TOKEN = "node-test-token-0123456789"
ORIGIN = "http://127.0.0.1:8000"


def main() -> int:
    import uvicorn

    from api import SidecarSecurity, create_app
    from core.graph_server import free_port
    from core.settings import load_settings
    from tasks.dialogue.pipeline import DialogueService, SidecarOptions
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    project = Path(tempfile.mkdtemp(prefix="skald-st-test-"))
    try:
        with ScriptedLLM() as llm:
            DialogueScript(["User", "Seraphina"]).install(llm)
            settings = load_settings(
                project, openai_base_url=llm.base_url, embedding_base_url=llm.base_url
            )
            service = DialogueService(settings, options=SidecarOptions(lock_wait_s=5))
            graph = service.store.endpoint.label  # connect (and migrate) before announcing the URL
            port = free_port()
            server = uvicorn.Server(
                uvicorn.Config(
                    create_app(service, SidecarSecurity(TOKEN, [ORIGIN])),
                    host="127.0.0.1",
                    port=port,
                    log_level="warning",
                )
            )

            def announce_then_watch_stdin() -> None:
                while not server.started:
                    time.sleep(0.05)
                print(
                    json.dumps(
                        {
                            "url": f"http://127.0.0.1:{port}",
                            "token": TOKEN,
                            "origin": ORIGIN,
                            "graph": graph,
                            # For a test that imports a chat with the CLI into this memory: the
                            # project (its graph) and the embedding endpoint the sidecar uses.
                            "project": str(project),
                            "embedding_base_url": llm.base_url,
                        }
                    ),
                    flush=True,
                )
                sys.stdin.read()  # EOF: the test is over (or its process is gone)
                server.should_exit = True

            threading.Thread(target=announce_then_watch_stdin, daemon=True).start()
            try:
                server.run()
            finally:
                service.close()
    finally:
        shutil.rmtree(project, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
