"""Turn-memory cost against conversation size: recall latency at 1k, 10k and 100k turns, and
bulk-ingest throughput.

    python -m bench.memory_retrieval [--only {retrieval,ingest,encode,reembed}] [--queries 600]
        [--ingest-turns 1000] [--ingest-runs 1] [--sizes 1000 10000 100000] [--embedder NAME]

Retrieval: one TurnMemoryIndex (the sidecar's per-conversation structure: tantivy BM25 +
usearch HNSW + fusion) holding N synthetic turns: the two shared LoCoMo dialogues' turns,
repeated with a numbered suffix, their real MiniLM vectors plus a little noise (embedding
100k turns for real would take the model ~20 minutes and measure the model, not the
memory). Each query is a LoCoMo question, embedded by the real model inside the timed call,
as the sidecar does; the sizes are timed interleaved, question by question. Prints p50/p95
per size and the 100k/1k ratio of p95. Each question is also asked with a chat front end's
window shown (the memory's last 200 turns, the most the SillyTavern extension sends,
`on_screen`: they go after every other turn), as a question about "yesterday" asked the day
after the busiest session day (every copy of that day's turns is then a candidate of its own),
with the names a long chat's graph knows (400 entities' names besides the speakers, as
the sidecar hands them to recall), and with a typo in its longest word (read as the memory's
word); the ratio of each to the plain question's p50 is printed per size.

Ingest: `tasks.dialogue.remember.remember_rows` (what `flows.dialogue ingest` runs) into a fresh embedded graph,
real embeddings, its default batches: turns/s, end to end, two ways: cold (a fresh project:
the graph's start and the model's load inside the clock, as a user's first `ingest` sees
it) and steady (graph up, model and JVM warmed on a throwaway conversation first).
`--only ingest` runs just this part (about a minute on 2 cores).

Re-embed (`--only reembed`): `reembed_conversation` (what `flows.dialogue reembed` runs after
the embedding model changed) against ingest, on one fresh embedded graph: the ingest turns
remembered (timed: ingest's turns/s), then marked as another model's, then re-embedded (timed:
turns/s), and the ratio of the two.

Encode (`--only encode`): the embedding model alone on the ingest turns, in calls of the
ingest's batch size (tasks.dialogue.remember.BATCH_SIZE): turns/s, the ceiling of ingest.

`--embedder NAME` (bench.embedders) times another embedding model in the retrieval and
encode parts (ingest runs the product's: core.embedder); `--sizes` picks the memory sizes.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import numpy as np

from bench.embedders import CANDIDATES, DEFAULT, Embedder, embedder
from bench.recall_chat import typo
from core.embedder import EmbedderUnavailableError
from core.recall import STOP_WORDS, embedded_text
from core.recall.lexical import english_words
from core.timex import parse_when
from kg.dialogue import MemoryRow
from tasks.dialogue.models import ChatMessage
from tasks.dialogue.retriever import TurnMemoryIndex, embedded_query, on_screen, query_texts

#: Messages a front end's window holds: the most the SillyTavern extension sends
#: (MAX_WINDOW_MESSAGES, the prompt's chat when it holds that much), the costliest to check.
WINDOW_MESSAGES = 200

DIALOGUES = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "dialogues"
SIZES = (1_000, 10_000, 100_000)


def _turns() -> list[dict[str, object]]:
    turns: list[dict[str, object]] = []
    for name in ("locomo-26", "locomo-30"):
        with (DIALOGUES / f"{name}.turns.jsonl").open(encoding="utf-8") as handle:
            turns += [json.loads(line) for line in handle if line.strip()]
    return turns


def _questions(limit: int) -> list[str]:
    questions: list[str] = []
    for name in ("locomo-26", "locomo-30"):
        with (DIALOGUES / f"{name}.qa.jsonl").open(encoding="utf-8") as handle:
            questions += [json.loads(line)["question"] for line in handle if line.strip()]
    # The 304 LoCoMo questions, cycled: a p95 over a few hundred samples moves by a
    # millisecond between runs at these latencies, so the default asks each about twice.
    return [questions[i % len(questions)] for i in range(limit)]


def _rows(
    turns: list[dict[str, object]], vectors: np.ndarray, n: int, rng: np.random.Generator
) -> list[MemoryRow]:
    rows = []
    for i in range(n):
        t = turns[i % len(turns)]
        copy = i // len(turns)
        v = vectors[i % len(turns)] + rng.normal(0, 0.02, vectors.shape[1]).astype(np.float32)
        v /= np.linalg.norm(v)
        rows.append(
            MemoryRow(
                key=f"bench:{i + 1}",
                conversation_id="bench",
                turn_id=str(i + 1),
                seq=i + 1,
                speaker=str(t["speaker"]),
                text=f"{t['speaker']}: {t['text']}" + (f" (retold {copy})" if copy else ""),
                when=str(t["session_time"]),
                group=f"{copy}-{t['session']}",
                source_refs=[str(t["dia_id"])],
                embedding=v.tolist(),
            )
        )
    return rows


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


#: How each question is asked: as it is; with a chat front end's window shown; about "yesterday";
#: with the names a long chat's graph knows (`ENTITY_NAMES` of them, besides the speakers);
#: with a typo (bench.recall_chat `typo`).
WAYS = ("plain", "shown", "yesterday", "entities", "typo")
#: The entities and aliases a long chat's graph knows: the sidecar hands recall every one of
#: them (tasks.dialogue.retriever `_names`), so each query is read against them all.
ENTITY_NAMES = 400


def _entity_names(turns: list[dict[str, object]], speakers: list[str]) -> list[str]:
    """`ENTITY_NAMES` names as an extractor would find them in the turns: their capitalised
    words, the most frequent first (the speakers and "I" aside)."""
    words = Counter(
        w
        for t in turns
        for w in re.findall(r"\b[A-Z][a-z]{2,}\b", str(t["text"]))
        if w not in speakers and w.lower() not in STOP_WORDS
    )
    return [w for w, _ in words.most_common(ENTITY_NAMES)]


def _asked_on(turns: list[dict[str, object]]) -> date:
    """The day the question about "yesterday" is asked: the day after the busiest session day,
    so the turns of that day (and of the weeks around it that speak of it) are candidates of their
    own and hold half the window (core.recall.index.HybridIndex.rank)."""
    said = Counter(day for t in turns if (day := parse_when(str(t["session_time"]))) is not None)
    return max(said, key=lambda day: (said[day], day)) + timedelta(days=1)


def _timed_ways(
    model: Embedder,
    questions: list[str],
    speakers: list[str],
    indexes: dict[int, TurnMemoryIndex],
    windows: dict[int, Callable[[str], bool]],
    asked_on: date,
    names: list[str],
) -> dict[str, dict[int, list[float]]]:
    """Milliseconds per way (`WAYS`) and memory size, each question asked every way; `names`:
    the speakers and the entities' names the `entities` way hands the search."""
    # Interleaved: each question is asked of every size in turn, so a slow spell of the
    # machine (another process, a frequency change) lands on all sizes alike instead of
    # on whichever size was being timed, and the ratio compares like with like. All three
    # memories are alive together, as a sidecar's conversations are.
    latencies: dict[str, dict[int, list[float]]] = {w: {size: [] for size in indexes} for w in WAYS}
    for i, question in enumerate(questions):
        yesterday = f"{question.rstrip(' ?')} yesterday?"
        typed = {"yesterday": yesterday, "typo": typo(question)}
        for size in indexes:
            # Rotating which way goes first, so none always finds another's caches.
            for way in WAYS[i % len(WAYS) :] + WAYS[: i % len(WAYS)]:
                asked = typed.get(way, question)
                shown = windows[size] if way == "shown" else None
                t0 = time.perf_counter()
                # As tasks.dialogue.retriever.recall asks: the question with its typos read as
                # the memory's words; then the question without the speakers' names, and a
                # two-event question's parts, in one call.
                asked = indexes[size].pinned().spelled(asked)
                texts = query_texts(asked, speakers)
                vector, plain_vector, parts = embedded_query(
                    asked, speakers, dict(zip(texts, model.queries(texts), strict=True))
                )
                hits = indexes[size].search(
                    asked,
                    vector,
                    10,
                    names if way == "entities" else speakers,
                    plain_vector=plain_vector,
                    parts=parts,
                    shown=shown,
                    asked_on=asked_on if way == "yesterday" else None,
                )
                elapsed = (time.perf_counter() - t0) * 1000
                latencies[way][size].append(elapsed)
                assert len(hits) == 10 and not (shown and any(shown(h.text) for h in hits))
    return latencies


def bench_retrieval(
    queries: int, model_name: str = DEFAULT, sizes: tuple[int, ...] = SIZES
) -> dict[int, tuple[float, float, float]]:
    model = embedder(model_name)
    turns = _turns()
    names = {str(t["speaker"]) for t in turns}
    # Each turn embedded as the product embeds a memory row (core.recall.embedded_text).
    vectors = model.passages([embedded_text(f"{t['speaker']}: {t['text']}", names) for t in turns])
    questions = _questions(queries)
    rng = np.random.default_rng(7)
    speakers = sorted({str(t["speaker"]) for t in turns})
    model.queries(questions[:8])  # warm the model
    english_words()  # loaded before the sidecar serves, as flows.dialogue serve does
    indexes: dict[int, TurnMemoryIndex] = {}
    build_rate: dict[int, float] = {}
    windows: dict[int, Callable[[str], bool]] = {}
    for size in sizes:
        rows = _rows(turns, vectors, size, rng)
        windows[size] = on_screen(
            [
                ChatMessage(role="user", name=row.speaker, content=row.text.split(": ", 1)[1])
                for row in rows[-WINDOW_MESSAGES:]
            ]
        )
        index = TurnMemoryIndex()
        started = time.perf_counter()
        for start in range(0, size, 1000):  # incremental, as a growing conversation adds turns
            index.sync(rows[start : start + 1000], reset=False)
        build_rate[size] = size / (time.perf_counter() - started)
        indexes[size] = index
        # The index holds what recall needs; the rows (100k Python lists of 384 floats, ~1 GB)
        # are the bench's own input, dropped before timing as the sidecar drops a synced batch.
        del rows
        gc.collect()
    latencies = _timed_ways(
        model,
        questions,
        speakers,
        indexes,
        windows,
        _asked_on(turns),
        [*speakers, *_entity_names(turns, speakers)],
    )
    results: dict[int, tuple[float, float, float]] = {}
    for size in sizes:
        results[size] = (
            _percentile(latencies["plain"][size], 50),
            _percentile(latencies["plain"][size], 95),
            build_rate[size],
        )
        shown_p50 = _percentile(latencies["shown"][size], 50)
        yesterday_p50 = _percentile(latencies["yesterday"][size], 50)
        entities_p50 = _percentile(latencies["entities"][size], 50)
        typo_p50 = _percentile(latencies["typo"][size], 50)
        print(
            f"{size:>7} turns: recall p50 {results[size][0]:6.1f} ms, p95 {results[size][1]:6.1f} ms "
            f"(index built at {results[size][2]:,.0f} turns/s); with a {WINDOW_MESSAGES}-message "
            f"window shown p50 {shown_p50:.1f} ms, p95 "
            f"{_percentile(latencies['shown'][size], 95):.1f} ms (p50 ratio "
            f"{shown_p50 / results[size][0]:.2f}); asked about yesterday p50 {yesterday_p50:.1f} "
            f"ms, p95 {_percentile(latencies['yesterday'][size], 95):.1f} ms (p50 ratio "
            f"{yesterday_p50 / results[size][0]:.2f}); with {ENTITY_NAMES} entities' names p50 "
            f"{entities_p50:.1f} ms, p95 {_percentile(latencies['entities'][size], 95):.1f} ms "
            f"(p50 ratio {entities_p50 / results[size][0]:.2f}); with a typo p50 {typo_p50:.1f} "
            f"ms, p95 {_percentile(latencies['typo'][size], 95):.1f} ms (p50 ratio "
            f"{typo_p50 / results[size][0]:.2f})",
            flush=True,
        )
    return results


def _ingest_rows(turn_count: int, conversation_id: str) -> list[MemoryRow]:
    turns = _turns()
    return [
        MemoryRow(
            key=f"{conversation_id}:{i + 1}",
            conversation_id=conversation_id,
            turn_id=str(i + 1),
            speaker=str(turns[i % len(turns)]["speaker"]),
            text=f"{turns[i % len(turns)]['speaker']}: {turns[i % len(turns)]['text']}",
            when=str(turns[i % len(turns)]["session_time"]),
            source_refs=[str(turns[i % len(turns)]["dia_id"])],
        )
        for i in range(turn_count)
    ]


def bench_ingest(turn_count: int, *, cold: bool = False) -> float:
    """turns/s of `remember_rows` into a fresh project; `cold`: the graph starts inside the clock."""
    from core.settings import load_settings
    from tasks.dialogue.pipeline import DialogueService
    from tasks.dialogue.remember import remember_rows

    rows = _ingest_rows(turn_count, "ingest")
    with tempfile.TemporaryDirectory() as project:
        service = DialogueService(load_settings(Path(project)))
        try:
            if not cold:
                _ = service.store.endpoint  # start and migrate the graph before the clock starts
                # Warm the model and the embedded graph's JIT on a throwaway conversation: the
                # figure is steady-state ingest, not JVM start-up.
                remember_rows(service, "warm", _ingest_rows(256, "warm"))
            started = time.perf_counter()
            added, _ = remember_rows(service, "ingest", rows)
            seconds = time.perf_counter() - started
        finally:
            service.close()
    assert added == turn_count
    return turn_count / seconds


def bench_encode(turn_count: int, model_name: str = DEFAULT, runs: int = 3) -> float:
    """turns/s of the embedding model alone on the ingest's turns, in the ingest's calls (median of `runs`)."""
    from tasks.dialogue.remember import BATCH_SIZE

    model = embedder(model_name)
    texts = [row.text for row in _ingest_rows(turn_count, "encode")]
    model.passages(texts[:BATCH_SIZE])  # warm
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        for start in range(0, len(texts), BATCH_SIZE):
            model.passages(texts[start : start + BATCH_SIZE])
        rates.append(turn_count / (time.perf_counter() - started))
    rate = statistics.median(rates)
    print(
        f"encode alone ({model_name}): {rate:.0f} turns/s (median of {runs}: "
        + ", ".join(f"{r:.0f}" for r in rates)
        + f"; {turn_count} turns in calls of {BATCH_SIZE})",
        flush=True,
    )
    return rate


def bench_reembed(turn_count: int) -> tuple[float, float]:
    """(ingest turns/s, re-embed turns/s) on one fresh graph, steady state (graph up, model and
    JVM warmed first): `turn_count` turns remembered, then their vectors renamed as another
    model's (the same numbers: a cheap write), then `reembed_conversation` in the clock."""
    from core.settings import load_settings
    from kg.dialogue import DialogueRepository, VectorWrite
    from tasks.dialogue.pipeline import DialogueService
    from tasks.dialogue.reembed import reembed_conversation
    from tasks.dialogue.remember import remember_rows

    rows = _ingest_rows(turn_count, "reembed")
    with tempfile.TemporaryDirectory() as project:
        service = DialogueService(load_settings(Path(project)))
        try:
            _ = service.store.endpoint
            remember_rows(service, "warm", _ingest_rows(256, "warm"))
            started = time.perf_counter()
            remember_rows(service, "reembed", rows)
            ingest = turn_count / (time.perf_counter() - started)
            repo = DialogueRepository(service.store)
            stored = repo.memory_rows("reembed", 1, turn_count)
            writes = [VectorWrite(key=r.key, text=r.text, embedding=r.embedding) for r in stored]
            repo.replace_vectors("reembed", writes, "bench|another model")
            started = time.perf_counter()
            report = reembed_conversation(service, "reembed")
            reembed = report.reembedded / (time.perf_counter() - started)
        finally:
            service.close()
    assert report.reembedded == turn_count, report
    return ingest, reembed


def run_ingest(turn_count: int, runs: int) -> None:
    cold = bench_ingest(turn_count, cold=True)
    print(
        f"ingest without LLM, cold (graph start + model load in the clock): {cold:.0f} turns/s "
        f"({turn_count} turns)",
        flush=True,
    )
    rates = []
    for _ in range(runs):
        rates.append(bench_ingest(turn_count))
        print(
            f"ingest without LLM: {rates[-1]:.0f} turns/s ({turn_count} turns, embeddings + graph writes, "
            "steady state)",
            flush=True,
        )
    if runs > 1:
        print(f"ingest without LLM, median of {runs}: {statistics.median(rates):.0f} turns/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory_retrieval",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog="Figures vary with load: run on a quiet machine (`uptime`) and compare runs of one session.",
    )
    parser.add_argument(
        "--only",
        choices=("retrieval", "ingest", "encode", "reembed"),
        default=None,
        help="run one part: `ingest` for the throughput figures alone (fast), `retrieval` for "
        "the latency per size, `encode` for the model alone, `reembed` for re-embedding "
        "against ingest (default: ingest and retrieval)",
    )
    parser.add_argument(
        "--queries",
        type=int,
        default=600,
        help="queries timed per size, cycling through the 304 LoCoMo questions (default 600)",
    )
    parser.add_argument(
        "--ingest-turns",
        type=int,
        default=1000,
        help="turns ingested for throughput (default 1000)",
    )
    parser.add_argument(
        "--ingest-runs",
        type=int,
        default=1,
        help="steady-state ingest runs (each on a fresh graph); several print their median (default 1)",
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(SIZES),
        metavar="N",
        help="memory sizes (turns) the retrieval part times (default "
        + " ".join(map(str, SIZES))
        + ")",
    )
    parser.add_argument(
        "--embedder",
        choices=sorted(CANDIDATES),
        default=DEFAULT,
        help=f"the embedding model of the retrieval and encode parts (bench.embedders; default "
        f"{DEFAULT}, the product's)",
    )
    args = parser.parse_args()
    if any(size < 10 for size in args.sizes):
        parser.error("--sizes: each memory needs at least 10 turns (recall returns 10)")
    sizes = tuple(sorted(set(args.sizes)))
    try:
        if (
            args.embedder != DEFAULT
        ):  # a candidate's package may be missing; the product's loads in the clock of cold ingest
            embedder(args.embedder)
    except EmbedderUnavailableError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.only == "reembed":
        ingest, reembed = bench_reembed(args.ingest_turns)
        print(
            f"re-embed: {reembed:.0f} turns/s against ingest {ingest:.0f} turns/s "
            f"(ratio {reembed / ingest:.2f}; {args.ingest_turns} turns, steady state)",
            flush=True,
        )
        return
    if args.only == "encode":
        bench_encode(args.ingest_turns, args.embedder)
    if args.only in (None, "ingest"):
        run_ingest(args.ingest_turns, max(args.ingest_runs, 1))
    if args.only in (None, "retrieval"):
        results = bench_retrieval(args.queries, args.embedder, sizes)
        small, large = results[sizes[0]][1], results[sizes[-1]][1]
        print(
            f"p95 {sizes[-1]:,}/{sizes[0]:,} ratio: {large / small:.2f} (p95 at {sizes[-1]:,} {large:.1f} ms)"
        )
        print(f"median of p50s: {statistics.median(r[0] for r in results.values()):.1f} ms")


if __name__ == "__main__":
    main()
