"""Gateway overhead benchmark: `python -m bench.llm_gateway [--calls N]`.

Times N identical structured calls through (a) a bare `openai` client call plus
`Model.model_validate_json(content)` and (b) `LLMGateway.structured`, against the scripted
server with zero latency, so the difference is the gateway's own cost (ordering, retry
bookkeeping, record keeping). The two paths run in alternating blocks (ABBA) in one
process, after a warm-up, so drift in CPU clock or connection state hits both alike.

The gateway asks for streamed answers by default (`limits.llm_stream`), which costs more per
call than a whole answer against a server with no latency (the events, the chunks put
together). So the overhead is measured with the gateway asking for whole answers, as the bare
call does, and a second ABBA run compares the gateway's two ways: streamed over whole, the
price of streaming where the model's own time is zero (any real model's dwarfs it).

By default the scripted server runs in a child process so its request handling does not
compete with the client for the GIL; `--in-process` runs it in a thread instead.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection

import httpx
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

from core.llm import NO_API_KEY, LLMGateway, response_format_for
from core.settings import RunLimits, Settings
from tests.support.scripted_llm import STATS_PATH, ScriptedLLM

GOAL_RATIO = 1.10
TIER = "small"
MESSAGES = [
    {"role": "system", "content": "You plan scenes for a novel. Reply with JSON only."},
    {"role": "user", "content": "Plan the opening scene: a lighthouse keeper finds a letter."},
]


class Beat(BaseModel):
    summary: str
    intensity: float = Field(ge=0.0, le=1.0)


class ScenePlan(BaseModel):
    title: str
    pov: str | None = None
    location: str
    beats: list[Beat] = Field(min_length=1)
    word_target: int = Field(ge=100, le=5000)


def _serve(conn: Connection) -> None:
    """Child process: run the scripted server until the parent says stop."""
    with ScriptedLLM(latency_s=0.0) as server:
        conn.send(server.base_url)
        conn.recv()


@contextmanager
def scripted_server(in_process: bool) -> Iterator[str]:
    if in_process:
        with ScriptedLLM(latency_s=0.0) as server:
            yield server.base_url
        return
    parent, child = mp.get_context("spawn").Pipe()
    process = mp.get_context("spawn").Process(target=_serve, args=(child,), daemon=True)
    process.start()
    try:
        if not parent.poll(30):
            raise RuntimeError("the scripted server process did not start within 30 s")
        yield parent.recv()
    finally:
        parent.send("stop")
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()


def _time_block(call: Callable[[], object], n: int, out: list[float]) -> None:
    clock = time.perf_counter
    for _ in range(n):
        started = clock()
        call()
        out.append(clock() - started)


def _describe(samples: Sequence[float]) -> tuple[float, float, float]:
    ms = sorted(s * 1000.0 for s in samples)
    return statistics.fmean(ms), statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]


def _abba(
    bare: Callable[[], object], through_gateway: Callable[[], object], calls: int, block: int
) -> tuple[list[float], list[float]]:
    """`calls` of each path timed in blocks of `block`, alternating which goes first (ABBA)."""
    bare_s: list[float] = []
    gateway_s: list[float] = []
    gc.collect()
    done = 0
    flip = False
    while done < calls:
        n = min(block, calls - done)
        # ABBA: alternate which path goes first in each block.
        first, second = (
            ((through_gateway, gateway_s), (bare, bare_s))
            if flip
            else ((bare, bare_s), (through_gateway, gateway_s))
        )
        _time_block(first[0], n, first[1])
        _time_block(second[0], n, second[1])
        done += n
        flip = not flip
    return bare_s, gateway_s


def run(calls: int, block: int, warmup: int, in_process: bool) -> float:
    with scripted_server(in_process) as base_url:
        settings = Settings(
            openai_base_url=base_url,
            embedding_base_url=base_url,
            limits=RunLimits(llm_stream=False),
        )
        tier = settings.tier(TIER)
        gateway = LLMGateway(settings, run_id="bench")
        streamed_gateway = LLMGateway(
            settings.model_copy(update={"limits": RunLimits(llm_stream=True)}), run_id="bench"
        )
        client = OpenAI(
            base_url=base_url,
            api_key=NO_API_KEY,
            max_retries=0,
            timeout=settings.limits.llm_timeout_s,
        )
        # The bare caller gets the same (precomputed) request a careful hand-written call
        # would send, so only the gateway's own work differs.
        response_format = response_format_for(ScenePlan)

        def bare() -> ScenePlan:
            reply = client.chat.completions.create(
                model=settings.default_model,
                messages=MESSAGES,  # type: ignore[arg-type]
                response_format=response_format,  # type: ignore[arg-type]
                max_tokens=tier.max_tokens,
                temperature=tier.temperature,
            )
            return ScenePlan.model_validate_json(reply.choices[0].message.content or "")

        def through_gateway() -> ScenePlan:
            return gateway.structured(TIER, MESSAGES, ScenePlan, purpose="bench")

        def streamed() -> ScenePlan:
            return streamed_gateway.structured(TIER, MESSAGES, ScenePlan, purpose="bench")

        assert bare() == through_gateway() == streamed(), "every path must return the same object"
        for _ in range(warmup):
            bare()
            through_gateway()
            streamed()

        bare_s, gateway_s = _abba(bare, through_gateway, calls, block)
        whole_s, streamed_s = _abba(through_gateway, streamed, calls, block)
        stats = httpx.get(base_url.rstrip("/") + STATS_PATH, timeout=30).json()
        client.close()
        gateway.close()
        streamed_gateway.close()

    bare_mean, bare_median, bare_p90 = _describe(bare_s)
    gw_mean, gw_median, gw_p90 = _describe(gateway_s)
    ratio = gw_mean / bare_mean
    records = [r for g in (gateway, streamed_gateway) for r in g.records if r.purpose == "bench"]
    assert all(r.outcome == "ok" and r.attempts == 1 for r in records)

    where = "in-process thread" if in_process else "child process"
    print(
        f"LLM gateway overhead: {calls} structured calls per path, blocks of {block} (ABBA), "
        f"{warmup} warm-up calls each"
    )
    print(
        f"python {platform.python_version()}, openai {openai.__version__}, "
        f"scripted server in a {where}, latency 0"
    )
    print(f"{'path':<28}{'mean ms':>10}{'median ms':>12}{'p90 ms':>10}")
    print(f"{'bare openai + validate':<28}{bare_mean:>10.3f}{bare_median:>12.3f}{bare_p90:>10.3f}")
    print(f"{'LLMGateway.structured':<28}{gw_mean:>10.3f}{gw_median:>12.3f}{gw_p90:>10.3f}")
    print(
        f"overhead per call: {gw_mean - bare_mean:+.3f} ms (mean), "
        f"{gw_median - bare_median:+.3f} ms (median)"
    )
    verdict = "OK" if ratio <= GOAL_RATIO else "ABOVE GOAL"
    print(
        f"ratio gateway/bare: {ratio:.3f} (mean), {gw_median / bare_median:.3f} (median); "
        f"goal <= {GOAL_RATIO:.2f}: {verdict}"
    )
    _print_streamed(whole_s, streamed_s, stats)
    return ratio


def _print_streamed(
    whole_s: Sequence[float], streamed_s: Sequence[float], stats: dict[str, int]
) -> None:
    """The gateway's streamed answers against its whole ones (their own ABBA run), and the
    connections the server accepted over the whole run (`stats`)."""
    whole_mean, whole_median, _ = _describe(whole_s)
    st_mean, st_median, st_p90 = _describe(streamed_s)
    print(
        f"{'LLMGateway, streamed':<28}{st_mean:>10.3f}{st_median:>12.3f}{st_p90:>10.3f}"
        f"   (its own ABBA run against the whole answers: {whole_mean:.3f} ms mean)"
    )
    print(
        f"ratio streamed/whole: {st_mean / whole_mean:.3f} (mean), "
        f"{st_median / whole_median:.3f} (median): {st_mean - whole_mean:+.3f} ms per call"
    )
    print(
        f"connections the server accepted: {stats['connections']} for {stats['requests']} calls "
        "(three clients that keep theirs alive, and this count's probe, open four)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.llm_gateway", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=300, help="timed calls per path (default 300)")
    parser.add_argument(
        "--block", type=int, default=25, help="calls per alternating block (default 25)"
    )
    parser.add_argument(
        "--warmup", type=int, default=50, help="untimed calls per path first (default 50)"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="run the server in a thread, not a process"
    )
    parser.add_argument(
        "--fail-above", type=float, default=None, help="exit 1 when the mean ratio exceeds this"
    )
    args = parser.parse_args(argv)
    if args.calls < 1 or args.block < 1 or args.warmup < 0:
        parser.error("--calls and --block must be >= 1, --warmup >= 0")
    ratio = run(args.calls, args.block, args.warmup, args.in_process)
    return 1 if args.fail_above is not None and ratio > args.fail_above else 0


if __name__ == "__main__":
    sys.exit(main())
