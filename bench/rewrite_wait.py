"""`python -m bench.rewrite_wait`: what the SillyTavern extension's memory query waits for.

Before a generation, the extension waits for a pending rewrite (an edit, a swipe, a delete)
of a turn memory holds, up to `waitBoundMs`, and then asks anyway with `pending_turns` (the
sidecar holds the old text back). This measures the two sides of that bound on a real
sidecar pipeline (the graph, the local embedder) with the scripted OpenAI-compatible server
at a fixed latency per model call:

- replace: POST /turn/replace of an edited turn (rewind + the slots + the commit) - what the
  query would wait for; at a hosted model's latency it should land within the bound;
- rewind: POST /conversation/rewind of the last turn (a delete) - no model call;
- query: POST /memory/query (embedding + recall) - what every generation pays anyway.

Prints p50/p95/max per operation and latency.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.dialogue.pipeline import DialogueService

REPO_ROOT = Path(__file__).resolve().parent.parent


def _pcts(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):7.0f} ms  p95 {p95:7.0f} ms  max {ordered[-1]:7.0f} ms  (n={len(ordered)})"


def _turn(conv: str, n: int, text: str) -> dict[str, object]:
    return {
        "conversation_id": conv,
        "turn_id": n,
        "messages": [
            {"role": "user", "name": "Tester", "content": text},
            {
                "role": "assistant",
                "name": "Seraphina",
                "content": f"I see, Tester. ({n})",
            },
        ],
    }


def _edits(service: DialogueService, conv: str, last: int, edits: int) -> list[list[float]]:
    """Milliseconds of each replace of turn `last`, memory query and rewind, `edits` times."""
    replaces, rewinds, queries = [], [], []
    for i in range(edits):
        started = time.perf_counter()
        result = service.commit(
            _turn(conv, last, f"Edit {i}: it was sunny, so I hiked to the lighthouse."),
            replace=True,
        )
        replaces.append((time.perf_counter() - started) * 1000)
        assert result.code is None or result.code == "ROLLED_BACK", result.reason
        started = time.perf_counter()
        answer = service.memory_query(
            {
                "conversation_id": conv,
                "messages": [
                    {
                        "role": "user",
                        "name": "Tester",
                        "content": "What did I do when it was sunny?",
                    }
                ],
            }
        )
        queries.append((time.perf_counter() - started) * 1000)
        assert answer.ok, answer.reason
        started = time.perf_counter()
        assert service.rewind(conv, str(last)).ok
        rewinds.append((time.perf_counter() - started) * 1000)
        service.commit(_turn(conv, last, f"Day {last}: I walked to the harbour again, Seraphina."))
    return [replaces, rewinds, queries]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rewrite_wait", description=__doc__)
    parser.add_argument(
        "--latencies",
        type=float,
        nargs="+",
        default=[0.0, 0.2, 1.0],
        help="seconds per scripted model call (default 0 0.2 1)",
    )
    parser.add_argument(
        "--edits", type=int, default=10, help="edits measured per latency (default 10)"
    )
    parser.add_argument(
        "--history", type=int, default=20, help="turns in the conversation before (default 20)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from core.settings import load_settings
    from tasks.dialogue.pipeline import DialogueService
    from tests.support.dialogue_script import DialogueScript
    from tests.support.scripted_llm import ScriptedLLM

    project = Path(tempfile.mkdtemp(prefix="skald-bench-rewrite-"))
    try:
        for latency in args.latencies:
            with ScriptedLLM(latency_s=latency) as llm:
                DialogueScript(["Tester", "Seraphina"]).install(llm)
                # Chat slots on the scripted server; embeddings on the local model, as a user runs it.
                service = DialogueService(load_settings(project, openai_base_url=llm.base_url))
                try:
                    conv = f"bench-{uuid.uuid4().hex[:8]}"
                    for n in range(args.history):
                        service.commit(
                            _turn(
                                conv,
                                n,
                                f"Day {n}: I walked to the harbour and counted {n} boats, Seraphina.",
                            )
                        )
                    replaces, rewinds, queries = _edits(service, conv, args.history - 1, args.edits)
                    print(f"model latency {latency:g} s/call ({args.history} turns of history):")
                    print(f"  replace (edit) {_pcts(replaces)}")
                    print(f"  rewind (delete){_pcts(rewinds)}")
                    print(f"  memory query   {_pcts(queries)}")
                finally:
                    service.close()
    finally:
        shutil.rmtree(project, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
