"""Held-out recall when the questions are worded as a chat front end's user words them.

    python -m bench.recall_chat [--dialogues DIR] [--cache DIR] [--ways NAME ...]

LoCoMo's questions are bare and well spelled ("What did Caroline research?"); a message in a
chat is rarely either. Each fold of the leave-one-dialogue-out protocol (bench.recall_protocol)
fits the learned fusion on its training dialogues' questions as LoCoMo words them, then asks
the held-out dialogue's questions reworded one way (`WAYS`): with a greeting, with
pleasantries, with chatter after, in lower case, with a typo, with a speaker's name mistyped,
in the second person as a chat asks its listener, after a role-play action (one of
`ROLE_PLAY_ACTIONS`), in quotes as a role play's speech, after a narrated action (one of
`NARRATIONS`). Each reworded
question goes the product's way (tasks.dialogue.retriever: `HybridIndex.spelled`, the
question's topical sentences embedded without the speakers' names, the same features). Prints
per way the held-out mean recall@10 over the folds, recall@5, the categories (every question
judged by the fold that held it out) and the ratio to the questions as they are.
Docs: docs/decisions/recall-fusion.md ("A chat message's pleasantries", "A chat question's
typos", "A role-play action before the question").
"""

from __future__ import annotations

import argparse
import re
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.recall_folds import (
    CATEGORIES,
    REFERENCE,
    Dialogue,
    add_dialogue_options,
    dialogue_paths,
    fit_fusion,
    load,
    pooled,
    scores,
)
from bench.recall_protocol import PRODUCT_PARTS
from core.embedder import EmbedderUnavailableError
from core.recall import STOP_WORDS, asked_about, asked_of, named_in


def typo(text: str) -> str:
    """`text` with two letters swapped in the middle of its longest word of five letters or
    more (not a stop word): "What did Caroline resaerch?"."""
    words = [w for w in re.findall(r"[A-Za-z]{5,}", text) if w.lower() not in STOP_WORDS]
    if not words:
        return text
    word = max(words, key=len)
    i = len(word) // 2
    return text.replace(word, word[: i - 1] + word[i] + word[i - 1] + word[i + 1 :], 1)


def _named(question: str, names: list[str]) -> list[str]:
    return [n for n in names if re.search(rf"\b{re.escape(n)}\b", question)]


def _listener(question: str, names: list[str]) -> str:
    """Whom a chat message asking `question` speaks to: the speaker it names, else the first."""
    named = _named(question, names)
    return named[0] if len(named) == 1 else names[0]


def _name_typo(question: str, names: list[str]) -> str:
    named = [n for n in _named(question, names) if len(n) >= 5]
    if not named:
        return question
    name = named[0]
    i = len(name) // 2
    mistyped = name[: i - 1] + name[i] + name[i - 1] + name[i + 1 :]
    return re.sub(rf"\b{re.escape(name)}\b", mistyped, question, count=1)


def _second_person(question: str, names: list[str]) -> str:
    """A question naming one speaker, asked by the other to them ("What did you research?",
    `core.recall.asked_of`), as the retriever words a chat message (`asked_about`); any other
    question as it is."""
    named = named_in(question, names)
    if len(named) != 1 or len(names) != 2:
        return question
    sender = next(n for n in names if n != named[0])
    return asked_about(sender, asked_of(question, names), names)


#: A role-play chat's stage directions (SillyTavern's convention: an action between asterisks),
#: in the first and the third person, some with a prop of the scene ("the book", "my coffee").
ROLE_PLAY_ACTIONS = (
    "*leans back in the chair and smiles*",
    "*tilts my head, curious*",
    "*sits down next to you with a soft sigh*",
    "*glances up from the book*",
    "*sips my coffee and looks at you thoughtfully*",
    "*grins and nudges you playfully*",
    "*nods slowly, taking it in*",
    "*brushes a strand of hair behind my ear*",
)


#: The same stage directions as a role play's narrated prose (no asterisks; the speech in
#: quotes).
NARRATIONS = (
    "She leans back in the chair and smiles.",
    "I tilt my head, curious.",
    "He sits down next to you with a soft sigh.",
    "She glances up from the book.",
    "I sip my coffee and look at you thoughtfully.",
    "He grins and nudges you playfully.",
    "She nods slowly, taking it in.",
    "I brush a strand of hair behind my ear.",
)


def _picked(options: tuple[str, ...], question: str) -> str:
    """One of `options` by the question's CRC-32 (the same on every run, whatever the hash
    seed)."""
    return options[zlib.crc32(question.encode()) % len(options)]


def _role_play(question: str, names: list[str]) -> str:
    """`question` after one of `ROLE_PLAY_ACTIONS`."""
    return f"{_picked(ROLE_PLAY_ACTIONS, question)} {question}"


#: How a held-out question is asked (question, the speakers' names -> the message).
WAYS: dict[str, Callable[[str, list[str]], str]] = {
    "as they are": lambda q, names: q,
    "greeting": lambda q, names: f"Hey {_listener(q, names)}! {q}",
    "pleasantries": lambda q, names: (
        f"Hey {_listener(q, names)}, hope you're doing well! Quick question: {q}"
    ),
    "chatter after": lambda q, names: f"{q} Just curious, thanks!",
    "lower case": lambda q, names: q.lower().rstrip("?"),
    "typo": lambda q, names: typo(q),
    "name typo": _name_typo,
    "second person": _second_person,
    "role-play action": _role_play,
    "in quotes": lambda q, names: f'"{q}"',
    "narrated": lambda q, names: f'{_picked(NARRATIONS, q)} "{q}"',
}


def held_out(
    paths: list[Path], cache_dir: Path | None, ways: list[str]
) -> dict[str, dict[str, float]]:
    """Per way: the held-out mean recall@10 over the folds, recall@5 and the categories."""
    clean = [load(path, cache_dir) for path in paths]
    fusions = [fit_fusion([d for d in clean if d is not held]) for held in clean]
    figures: dict[str, dict[str, float]] = {}
    for way in ways:
        asked: list[Dialogue] = (
            clean if way == "as they are" else [load(p, cache_dir, WAYS[way]) for p in paths]
        )
        rows = [
            scores(d, REFERENCE.model_copy(update={"fusion": fusion, **PRODUCT_PARTS}))
            for d, fusion in zip(asked, fusions, strict=True)
        ]
        every = [r for fold in rows for r in fold]
        figures[way] = {
            "recall_at_10": float(np.mean([pooled(fold) for fold in rows])),
            "recall_at_5": pooled(every, 1),
            **{f"c{c}": pooled(every, 2, c) for c in CATEGORIES},
        }
        example = asked[0].questions[3].text
        base = figures.get("as they are", figures[way])["recall_at_10"]
        print(
            f"{way:>17} | {figures[way]['recall_at_10']:.3f} | "
            f"{figures[way]['recall_at_10'] / base:.3f} | {figures[way]['recall_at_5']:.3f} | "
            + " | ".join(f"{figures[way][f'c{c}']:.3f}" for c in CATEGORIES)
            + f" | {example}",
            flush=True,
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recall_chat",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
    add_dialogue_options(parser)
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=list(WAYS),
        default=list(WAYS),
        metavar="WAY",
        help=f"the ways to ask (default all: {', '.join(WAYS)})",
    )
    args = parser.parse_args()
    paths = dialogue_paths(parser, args.dialogues)
    ways = ["as they are", *(w for w in args.ways if w != "as they are")]
    started = time.perf_counter()
    print(
        "asked as | held-out mean r@10 | ratio to as they are | r@5 | "
        + " | ".join(f"c{c}" for c in CATEGORIES)
        + " | example (fold 1, as recall reads it)"
    )
    try:
        held_out(paths, args.cache, ways)
    except EmbedderUnavailableError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"\n(done in {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
