"""Benchmark of the codex: what writing `exports/codex.html` costs at two sizes of book.

    python -m bench.codex_build [--small 20] [--large 100] [--rounds 3] [--out big.html]

The novel flow writes the codex after every chapter, so its cost is paid once per chapter
and must not grow with the book faster than the page itself does. This starts its own
embedded ArcadeDB in a temporary project, writes a synthetic book through the real commit
path (per chapter: three scenes, six returning characters and four new entities, each with
its quoted evidence; ten relationships, some turning into their opposite; a death now and
then; a quality table), and at `--small` and `--large` chapters times, median of `--rounds`:

- read: the page model from the graph and the project files (`build_novel_codex`);
- render: the HTML text (`render_codex`);

and prints both, the page's size and entity and relationship counts, and the large/small
ratios. Linear growth means a time ratio near the size ratio (the page holds the whole
world); a ratio well above it would mean work per pair of things, which the codex must not do.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from core.graph_server import graph_endpoint
from core.settings import load_settings
from kg.codex import build_novel_codex, render_codex
from kg.models import ChapterDelta, Entity, EntitySource, Relationship, SceneDelta, StatusChange
from kg.store import GraphStore

REL_TYPES = [
    "FRIEND_OF",
    "ENEMY_OF",
    "KNOWS",
    "LOVES",
    "HATES",
    "ALLY_OF",
    "TRUSTS",
    "SERVES",
    "PROTECTS",
]
TRAITS = ["brave", "stubborn", "kind", "curious", "loyal", "proud", "quiet", "reckless"]


def _quote(rng: random.Random, *names: str) -> str:
    filler = " ".join(
        rng.choice(
            [
                "the",
                "tide",
                "turned",
                "slowly",
                "under",
                "a",
                "grey",
                "sky",
                "while",
                "gulls",
                "cried",
                "over",
                "harbour",
                "stones",
            ]
        )
        for _ in range(12)
    )
    return f"{' and '.join(names)} stood there as {filler}."


def _entities(
    number: int, rng: random.Random, present: list[str], place: str, item: str
) -> list[Entity]:
    """The chapter's characters (a trait each, quoted), its place and its item."""
    entities = []
    for name in present:
        q = _quote(rng, name)
        entities.append(
            Entity(
                label="Character",
                name=name,
                traits=[rng.choice(TRAITS)],
                sources=[
                    EntitySource(
                        type="extraction", chapter=number, scene=rng.randint(1, 3), quote=q
                    ),
                    EntitySource(
                        type="extraction",
                        chapter=number,
                        scene=1,
                        quote=q,
                        fact="trait",
                        value=rng.choice(TRAITS),
                    ),
                ],
            )
        )
    for label, name in (("Location", place), ("Item", item)):
        entities.append(
            Entity(
                label=label,
                name=name,
                sources=[
                    EntitySource(
                        type="extraction", chapter=number, scene=2, quote=_quote(rng, name)
                    )
                ],
            )
        )
    return entities


def _relationships(
    rng: random.Random, present: list[str], place: str, item: str
) -> list[Relationship]:
    """Where the first is, what the second owns, and eight relationships among those present."""
    relationships = [
        Relationship(
            source=present[0],
            target=place,
            type="LOCATED_IN",
            scene=2,
            quote=_quote(rng, present[0], place),
        ),
        Relationship(
            source=present[1],
            target=item,
            type="OWNS",
            scene=3,
            quote=_quote(rng, present[1], item),
        ),
    ]
    for _ in range(8):
        a, b = rng.sample(present, 2)
        relationships.append(
            Relationship(
                source=a,
                target=b,
                type=rng.choice(REL_TYPES),
                scene=rng.randint(1, 3),
                quote=_quote(rng, a, b),
            )
        )
    return relationships


def chapter_delta(number: int, rng: random.Random, cast: list[str]) -> ChapterDelta:
    """One synthetic chapter: new people, a place and an item, returning characters, relationships."""
    new = [f"Person {number}-{i}" for i in range(2)]
    place, item = f"Place {number}", f"Relic {number}"
    present = rng.sample(cast, min(6, len(cast))) + new
    entities = _entities(number, rng, present, place, item)
    relationships = _relationships(rng, present, place, item)
    statuses = []
    if number % 7 == 0:
        who = present[-3]
        statuses.append(StatusChange(entity=who, status="dead", scene=3, quote=_quote(rng, who)))
    scenes = [
        SceneDelta(index=i, title=f"Scene {number}.{i}", location=place, characters=present[:4])
        for i in (1, 2, 3)
    ]
    cast.extend(new)
    return ChapterDelta(
        chapter=number,
        title=f"Chapter {number}",
        summary=f"What happens in chapter {number}.",
        entities=entities,
        relationships=relationships,
        status_changes=statuses,
        scenes=scenes,
    )


def write_quality(saga_dir: Path, number: int, rng: random.Random) -> None:
    rows = [
        {"part": f"scene {i}", "words": rng.randint(300, 700), "plan_problems": ""}
        for i in (1, 2, 3)
    ]
    rows.append(
        {
            "part": "chapter",
            "words": rng.randint(1200, 2000),
            "distinct_trigrams": round(rng.uniform(0.8, 1), 2),
            "editor_mean": round(rng.uniform(0.5, 0.9), 3),
            "facts_kept": rng.randint(5, 20),
            "facts_dropped": rng.randint(0, 5),
            "clean": rng.random() > 0.1,
            "failures": "",
        }
    )
    path = saga_dir / "quality" / f"chapter_{number:03d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows), encoding="utf-8")


def measure(store: GraphStore, saga_dir: Path, rounds: int) -> dict[str, float]:
    reads, renders = [], []
    page, html = None, ""
    for _ in range(rounds):
        started = time.perf_counter()
        page = build_novel_codex(store, saga_dir)
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        html = render_codex(page)
        renders.append(time.perf_counter() - started)
    assert page is not None
    return {
        "chapters": page.stats.chapters,
        "entities": page.stats.entities,
        "relationships": page.stats.relationships,
        "read": statistics.median(reads),
        "render": statistics.median(renders),
        "kib": len(html.encode("utf-8")) / 1024,
    }


def _outline(store: GraphStore) -> list[str]:
    """The outline's six characters committed as chapter 0: the cast (grows with the book)."""
    cast = [
        "Mara Quill",
        "Tobias Venn",
        "Ilse Marrow",
        "Old Captain",
        "Harbour Master",
        "Ferry Girl",
    ]
    store.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                Entity(
                    label="Character",
                    name=n,
                    sources=[EntitySource(type="outline", chapter=0)],
                    first_chapter=0,
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                )
                for n in cast
            ],
        )
    )
    return cast


def _print_results(results: list[dict[str, float]]) -> None:
    print(
        f"{'chapters':>9} {'entities':>9} {'relationships':>14} {'read s':>8} {'render s':>9} {'total s':>8} "
        f"{'page KiB':>9}"
    )
    for r in results:
        print(
            f"{r['chapters']:>9.0f} {r['entities']:>9.0f} {r['relationships']:>14.0f} {r['read']:>8.3f} "
            f"{r['render']:>9.3f} {r['read'] + r['render']:>8.3f} {r['kib']:>9.0f}"
        )
    small, large = results
    size = large["entities"] + large["relationships"]
    print(
        f"ratio large/small: chapters {large['chapters'] / small['chapters']:.1f}, world (entities + relationships) "
        f"{size / (small['entities'] + small['relationships']):.2f}, page size {large['kib'] / small['kib']:.2f}, "
        f"time {(large['read'] + large['render']) / (small['read'] + small['render']):.2f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.codex_build", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--small", type=int, default=20, help="chapters of the small book (default 20)"
    )
    parser.add_argument(
        "--large", type=int, default=100, help="chapters of the large book (default 100)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed builds per size, median reported (default 3)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the large book's page here"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.small < args.large or args.rounds < 1:
        parser.error("need 1 <= --small < --large and --rounds >= 1")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="skald-bench-codex-") as tmp:
        settings = load_settings(tmp).model_copy(update={"neo4j_uri": None})
        endpoint = graph_endpoint(settings)
        store = GraphStore(endpoint).connect()
        store.migrate()
        try:
            print(f"graph: {endpoint.label} ({store.server.agent})")
            cast = _outline(store)
            results = []
            started = time.perf_counter()
            for number in range(1, args.large + 1):
                store.commit_chapter(chapter_delta(number, rng, cast))
                write_quality(settings.saga_dir, number, rng)
                if number in (args.small, args.large):
                    print(
                        f"wrote {number} chapters ({time.perf_counter() - started:.0f}s of commits so far)"
                    )
                    build_novel_codex(store, settings.saga_dir)  # warm: JIT, caches
                    results.append(measure(store, settings.saga_dir, args.rounds))
            if args.out is not None:
                args.out.write_text(
                    render_codex(build_novel_codex(store, settings.saga_dir)), encoding="utf-8"
                )
        finally:
            store.close()
    _print_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
