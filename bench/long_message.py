"""What reading a memory query's text costs against its length: every function a query's text
goes through before any index is asked, at two lengths of the worst texts we know for each.

    python -m bench.long_message [--chars 16000 64000] [--repeats 3]

A chat message may hold up to 64 KB (tasks.dialogue.models.MAX_MESSAGE_CHARS), and what a
query reads runs regular expressions over all of it: one pattern whose cost grows with the
square of the text's length turns a long paste into seconds of a person's wait. Each function
is timed on texts made to defeat it (repetitions of what its patterns look for, and a newline
near the end that makes a match fail late), at the two lengths, its best of `--repeats`
runs; the ratio of the two times is printed. Four times the length should cost about four
times as much (a linear cost); sixteen is the square.

Measured 2026-11-30, each the square of the length before its mend: `query_dates` over
"2023-2023-..." (1.5 s at 60 KB: each new match scanned every earlier one), `order_choice`
("what first, a or a or ...": 4 s at 40 KB; it now reads only a question's length),
`unaddressed` and `says_something` over "Hi Ann! Hi Ann! ..." (0.26 s at 64 KB: the spaces
before a mark were tried from every space of a run), core.sentences over "a. a. a. ..."
(the text before each mark copied whole). `HybridIndex.prepare` runs them all on a query.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import date

from core.recall import HybridIndex, MemoryDoc
from core.recall.documents import EventCalendar
from core.recall.query import (
    embedded_text,
    query_parts,
    says_something,
    spoken_topic,
    topical_text,
    unaddressed,
)
from core.sentences import finish_cut_text, tail_from_sentence
from core.timex import asks_when, event_anchors, order_choice, query_dates, resolve

SAID = date(2023, 5, 8)
NAMES = ["Ann", "Bob"]

#: The worst texts we know, as a unit repeated to the length asked (then a newline and a word).
UNITS = (
    "what first, a or ",
    "did a or ",
    "the day after the ",
    "a. ",
    "since the race ",
    "Ann, ",
    "Hi Ann! ",
    "last ",
    "for the past ",
    "2023-",
    "1/",
    "the week before the wedding, ",
    "between a and ",
    "Which came first, ",
    "*a ",
    "*nods* ",
    "*shows the a* b ",
    "! *a ",
    '. "a, ',
    'a. "a',
)


def _calendar(text: str) -> object:
    return EventCalendar().spans(text, SAID, resolve(text, SAID))


def _small_index() -> HybridIndex:
    """Fifty turns, no vectors: what `prepare` asks of a small memory is the query's reading."""
    index = HybridIndex(2)
    index.add(
        [
            MemoryDoc(
                key=f"t{i}",
                text=f"Ann: I ran a charity race last weekend, number {i}.",
                speaker="Ann",
                group=str(i // 10),
                when="1:00 pm on 8 May, 2023",
            )
            for i in range(50)
        ],
        None,
    )
    return index


INDEX = _small_index()


FUNCTIONS: dict[str, Callable[[str], object]] = {
    "asks_when": asks_when,
    "order_choice": order_choice,
    "query_dates": query_dates,
    "resolve": lambda text: resolve(text, SAID),
    "event_anchors": event_anchors,
    "EventCalendar.spans": _calendar,
    "query_parts": lambda text: query_parts(text, NAMES),
    "unaddressed": lambda text: unaddressed(text, NAMES),
    "says_something": lambda text: says_something(text, NAMES),
    "spoken_topic": lambda text: spoken_topic(text, NAMES),
    "topical_text": lambda text: topical_text(text, NAMES),
    "embedded_text": lambda text: embedded_text(text, NAMES),
    "HybridIndex.prepare": lambda text: INDEX.prepare(text, None, names=NAMES),
    "finish_cut_text": finish_cut_text,
    "tail_from_sentence": lambda text: tail_from_sentence(text, len(text) // 2),
}


def worst_seconds(function: Callable[[str], object], chars: int, repeats: int) -> float:
    """The slowest of the texts for `function`, each timed as its best of `repeats` runs."""
    worst = 0.0
    for unit in UNITS:
        text = (unit * (chars // len(unit) + 1))[:chars] + "\nx?"
        best = min(_timed(function, text) for _ in range(repeats))
        worst = max(worst, best)
    return worst


def _timed(function: Callable[[str], object], text: str) -> float:
    start = time.perf_counter()
    function(text)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.long_message",
        description="What reading a memory query's text costs at two lengths (see the docstring).",
    )
    parser.add_argument("--chars", type=int, nargs=2, default=[16_000, 64_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    short, long = args.chars
    print(f"worst text per function: seconds at {short:,} and {long:,} characters, and their ratio")
    print(f"(a linear cost: about {long / short:.0f}; the square: about {(long / short) ** 2:.0f})")
    for name, function in FUNCTIONS.items():
        at_short = worst_seconds(function, short, args.repeats)
        at_long = worst_seconds(function, long, args.repeats)
        ratio = at_long / at_short if at_short > 0 else float("nan")
        print(f"{name:20s} {at_short:8.4f} s {at_long:8.4f} s  ratio {ratio:5.1f}")


if __name__ == "__main__":
    main()
