"""core.recall's hybrid index: each signal, its look-alike that must not fire, and `k`."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pytest

from core.recall import (
    HybridIndex,
    IndexRegistry,
    MemoryDoc,
    RecallParams,
    asked_about,
    embedded_text,
    plain_query,
    query_parts,
    says_something,
    topical_text,
)
from core.recall.documents import question_share
from core.recall.lexical import LexicalIndex
from core.timex import query_dates
from tasks.dialogue.retriever import embedded_query, query_texts


def _doc(i: int, speaker: str, text: str, *, group: str = "1", when: str = "") -> MemoryDoc:
    return MemoryDoc(
        key=f"t{i}",
        text=f"{speaker}: {text}",
        speaker=speaker,
        group=group,
        when=when,
        meta={"turn_id": str(i)},
    )


def _lexical(*docs: MemoryDoc) -> HybridIndex:
    """An index of `docs` with no vectors (recall by their words)."""
    index = HybridIndex(2)
    index.add(list(docs), None)
    return index


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_lexical_finds_a_stemmed_word_and_dense_finds_a_paraphrase() -> None:
    index = HybridIndex(3)
    docs = [
        _doc(1, "Ann", "We went camping by the lake"),
        _doc(2, "Bob", "The tax office was closed", group="2"),
        _doc(3, "Ann", "My cat sleeps all day", group="3"),
    ]
    index.add(docs, np.stack([_unit([1, 0, 0]), _unit([0, 1, 0]), _unit([0, 0, 1])]))
    assert index.search("camps", None, 1)[0].key == "t1"  # stemmed: camp
    # The reciprocal-rank fusion: in a three-turn memory every turn is in every ranker's top 3,
    # and the learned fusion (fitted on long dialogues) tells ranks 1 and 2 apart by little.
    rrf = RecallParams(fusion=None)
    assert (
        index.search("Where does the kitten nap?", _unit([0, 0.1, 1]), 1, params=rrf)[0].key == "t3"
    )
    hit = index.search("camping", _unit([1, 0, 0]), 1)[0]
    assert hit.meta == {"turn_id": "1"} and {"lexical", "dense"} <= set(hit.signals)
    assert index.search("", None, 3) == [] and index.search("camping", None, 0) == []


def test_k_counts_documents_and_keys_are_added_once() -> None:
    index = HybridIndex(2)
    docs = [_doc(i, "Ann", f"harbour story number {i}") for i in range(8)]
    assert index.add(docs, np.tile(_unit([1, 1]), (8, 1))) == 8
    assert index.add(docs[:3], np.tile(_unit([1, 1]), (3, 1))) == 0
    hits = index.search("harbour story", _unit([1, 1]), 5)
    assert len(hits) == 5 and len({h.key for h in hits}) == 5 and len(index) == 8


def test_the_one_named_speaker_is_boosted_and_two_names_boost_nobody() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(1, "Bob", "I painted a sunset over the lake"),
        _doc(2, "Ann", "I painted a sunset over the lake"),
    ]
    index.add(docs, np.tile(_unit([1, 0]), (2, 1)))
    names = ["Ann", "Bob"]
    assert index.search("What did Ann paint?", None, 1, names=names)[0].key == "t2"
    assert "graph" in index.search("What did Ann paint?", None, 1, names=names)[0].signals
    both = index.search("What did Ann and Bob paint?", None, 2, names=names)
    assert all("graph" not in h.signals for h in both)


def test_a_date_in_the_query_boosts_turns_of_that_month_only() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(1, "Ann", "we had a picnic", when="1:56 pm on 8 May, 2023", group="a"),
        _doc(2, "Ann", "we had a picnic", when="2:10 pm on 3 June, 2023", group="b"),
    ]
    index.add(docs, None)
    assert index.search("picnic in June 2023", None, 1)[0].key == "t2"
    assert index.search("picnic in May 2023", None, 1)[0].key == "t1"
    assert query_dates("no date here, maybe") == []  # "may" the verb is not a month
    assert "time" not in index.search("picnic", None, 2)[0].signals


def test_the_turn_after_a_strong_hit_gains_a_share_within_its_group_only() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(1, "Ann", "How was the marathon?", group="a"),
        _doc(2, "Bob", "Exhausting but great", group="a"),
        _doc(3, "Bob", "Exhausting but great", group="b"),
    ]
    index.add(docs, None)
    hits = {h.key: h for h in index.search("marathon", None, 3)}
    assert "neighbour" in hits["t2"].signals and "t3" not in hits


def test_a_turn_said_by_several_speakers_has_no_neighbours() -> None:
    """A front end's turn (the user's message and the reply) holds its exchange already: the
    turns around it are other exchanges. So the turns next to one that names Ilse neither
    hold her name nor gain from its match; only the two that name her are found by it."""
    texts = [
        "My sister Ilse moved to Bergen last spring.",
        "I baked sourdough bread this morning.",
        "Where did my sister Ilse move to?",
        "The weather has been sunny all week.",
    ]
    paired = HybridIndex(2)
    paired.add(
        [
            MemoryDoc(
                key=f"t{i}",
                text=f"Tester: {text}\nSeraphina: I hear you, Tester.",
                speaker="Tester, Seraphina",
                group="1",
            )
            for i, text in enumerate(texts, start=1)
        ],
        None,
    )
    hits = paired.search("Where does Ilse live now?", None, 4)
    assert {h.key for h in hits[:2]} == {"t1", "t3"}
    assert all("neighbour" not in h.signals and "lexical" not in h.signals for h in hits[2:])
    # The look-alike: the same lines said one speaker at a time keep their neighbours (a
    # reply names what it answers only through the turn before it).
    single = HybridIndex(2)
    single.add([_doc(i, "Tester", text) for i, text in enumerate(texts, start=1)], None)
    found = {h.key: h for h in single.search("Where does Ilse live now?", None, 4)}
    assert {"t2", "t4"} <= set(found) and "neighbour" in found["t2"].signals


class _Sized:
    def __init__(self) -> None:
        self.docs: list[str] = []

    def __len__(self) -> int:
        return len(self.docs)


def test_index_registry_count_bound_drops_the_least_recent_and_peek_does_not_refresh() -> None:
    registry = IndexRegistry(max_indexes=2)
    a = registry.get("g", "a", _Sized)
    b = registry.get("g", "b", _Sized)
    assert registry.peek("g", "a") is a  # a peek: "a" stays the least recently used
    registry.get("g", "c", _Sized)
    assert (
        registry.peek("g", "a") is None and registry.peek("g", "b") is b and registry.evictions == 1
    )
    # Look-alike: a look-up (not a peek) makes "b" recent, so "c" goes next.
    assert registry.get("g", "b", _Sized) is b
    registry.get("g", "d", _Sized)
    assert (
        registry.peek("g", "c") is None and registry.peek("g", "b") is b and registry.evictions == 2
    )
    # A bound of 0 still keeps the index just asked for.
    single = IndexRegistry(max_indexes=0)
    x = single.get("g", "x", _Sized)
    assert single.get("g", "x", _Sized) is x and len(single) == 1


def test_index_registry_evicts_least_recently_used_past_the_document_budget() -> None:
    registry = IndexRegistry(max_indexes=100, max_documents=10)
    a = registry.get("g", "a", _Sized)
    a.docs.extend(["x"] * 6)
    b = registry.get("g", "b", _Sized)
    b.docs.extend(["x"] * 4)
    # 10 documents: at the budget, nothing goes (the look-alike of the case below).
    assert registry.get("g", "a", _Sized) is a and registry.get("g", "b", _Sized) is b
    assert registry.evictions == 0 and registry.documents() == 10
    b.docs.append("x")  # 11 > 10: the least recently used (a) goes at the next look-up
    assert registry.get("g", "b", _Sized) is b
    assert registry.evictions == 1 and len(registry) == 1
    assert registry.get("g", "a", _Sized) is not a  # rebuilt empty
    # The index asked for stays even when it alone is over the budget.
    b.docs.extend(["x"] * 20)
    assert registry.get("g", "b", _Sized) is b and len(registry) == 1


def test_heap_trimmer_trims_every_n_ticks_only() -> None:
    from core.heap import HeapTrimmer

    trimmer = HeapTrimmer(every=3)
    for _ in range(2):
        trimmer.tick()
    assert trimmer.trims == 0
    for _ in range(4):
        trimmer.tick()
    assert trimmer.trims == 2


def test_an_index_built_before_the_embedder_loads_does_not_crash_the_process() -> None:
    # A fresh interpreter (nothing else imported first), as a sidecar's first recall: the
    # index (usearch) comes before the query's embedding (onnxruntime). Loaded in that order
    # the two crash the process with SIGSEGV (see core.recall); HybridIndex orders them.
    script = (
        "from core.recall import HybridIndex, MemoryDoc\n"
        "import numpy as np\n"
        "index = HybridIndex(4)\n"
        "index.add([MemoryDoc(key='a', text='the lighthouse')], np.ones((1, 4), dtype=np.float32))\n"
        "import onnxruntime\n"
        "print(len(index.search('lighthouse', np.ones(4, dtype=np.float32), 1)))\n"
    )
    # Without the suite's PYTHONPATH: its sitecustomize (the Cypher recorder) loads modules
    # that happen to mask the crash.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-400:]
    assert result.stdout.strip() == "1"


def test_a_cached_conversation_index_is_dropped_only_when_it_holds_the_committed_turn() -> None:
    from kg.dialogue import MemoryRow
    from tasks.dialogue.retriever import VectorIndexRegistry

    registry = VectorIndexRegistry()
    assert not registry.forget_if_held("g", "c", "c:1")  # nothing cached: nothing built either
    assert registry.turns() == 0
    row = MemoryRow(key="c:1", conversation_id="c", turn_id="1", seq=1, text="Ann: the lighthouse")
    registry.get("g", "c").sync([row], reset=False)
    assert not registry.forget_if_held("g", "c", "c:2")  # a new turn: the cache stays
    assert registry.turns() == 1
    assert registry.forget_if_held("g", "c", "c:1")  # a remembered turn committed later
    assert registry.turns() == 0


def test_a_question_about_yesterday_asked_on_a_day_recalls_what_was_said_that_day() -> None:
    """A chat's "What did you do yesterday?" asks about the turns said the day before it. The
    word "yesterday" in a turn of June speaks of another day: once the question's day is known
    it is no word to match, and the turns said on the day it means are candidates."""
    index = HybridIndex(2)
    index.add(
        [
            _doc(1, "Ann", "Yesterday was wild, I saw two films yesterday.", when="5 June, 2022"),
            _doc(2, "Ann", "I baked bread all afternoon.", when="18 March, 2022", group="2"),
            _doc(3, "Ann", "Rain again, so I stayed in.", when="10 March, 2022", group="3"),
        ],
        None,
    )
    question = "What did you do yesterday?"
    hits = index.search(question, None, 3, asked_on=date(2022, 3, 19))
    assert [h.key for h in hits][:1] == ["t2"] and "t1" not in [h.key for h in hits]
    # Look-alike: asked on no known day, "yesterday" is only a word, matched where it is said.
    assert [h.key for h in index.search(question, None, 3)] == ["t1"]


def test_the_turns_of_a_day_a_chat_question_names_hold_half_its_top_window() -> None:
    """ "What did we talk about yesterday?" matches by its words the turns that say "talk" on
    any day; the turns said yesterday, or said the day before or after about it, hold half the window
    (the best of them by the question's order), marked with a `date` signal."""
    index = HybridIndex(2)
    talk = [
        _doc(i, "Ann", f"We talk and talk about {topic}.", when=f"{i} March, 2022", group=str(i))
        for i, topic in enumerate(["ships", "rain", "tea", "books", "maps"], start=1)
    ]
    of_the_day = [
        _doc(10, "Ann", "I baked bread.", when="18 March, 2022", group="18"),
        _doc(11, "Bob", "The oven broke.", when="18 March, 2022", group="18"),
        _doc(12, "Ann", "I went hiking yesterday.", when="19 March, 2022", group="19"),
        _doc(13, "Bob", "I'm hiking tomorrow.", when="17 March, 2022", group="17"),
    ]
    # Look-alike: said the day before as well, but of its own day.
    other_day = _doc(14, "Bob", "I hiked today.", when="17 March, 2022", group="17b")
    index.add([*talk, *of_the_day, other_day], None)
    question = "What did we talk about yesterday?"
    hits = index.search(question, None, 4, asked_on=date(2022, 3, 19))
    days = [h for h in hits if h.key in {d.key for d in of_the_day}]
    assert len(hits) == 4 and len(days) == 2 and all("date" in h.signals for h in days)
    # Each of the four is of that day: asked for the day alone, they are all found.
    alone = index.search("What happened yesterday?", None, 5, asked_on=date(2022, 3, 19))
    assert {h.key for h in alone} == {d.key for d in of_the_day}
    # Look-alike: asked on no known day, the words decide ("yesterday" too, wherever it is said).
    plain = index.search(question, None, 4)
    assert not {"t10", "t11"} & {h.key for h in plain} and all(
        "date" not in h.signals for h in plain
    )


def test_a_when_question_reaches_the_turn_that_says_yesterday() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(
            1,
            "Caroline",
            "The support group folks are lovely, we talk a lot",
            when="1:14 pm on 25 May, 2023",
            group="2",
        ),
        _doc(
            2,
            "Caroline",
            "I went to the support group yesterday, so powerful",
            when="1:56 pm on 8 May, 2023",
            group="1",
        ),
    ]
    index.add(docs, None)
    assert [(s.start.isoformat(), s.phrase) for s in index.events(1)] == [
        ("2023-05-07", "yesterday")
    ]
    when = RecallParams(when_boost=0.6)
    hits = index.search("When did Caroline go to the support group?", None, 2, params=when)
    assert hits[0].key == "t2" and hits[0].signals["when"] == 0.6
    # Look-alike: the same words, not asking for a time: no turn is favoured for its date.
    hits = index.search("Why did Caroline go to the support group?", None, 2, params=when)
    assert all("when" not in h.signals for h in hits)


def test_a_question_naming_the_day_of_the_event_reaches_the_turn_said_the_day_after() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(
            1,
            "Maria",
            "my mom and I cooked dinner last night",
            when="3:18 pm on 4 May, 2023",
            group="a",
        ),
        _doc(
            2,
            "Maria",
            "my aunt and I cooked dinner at home",
            when="3:18 pm on 4 May, 2023",
            group="b",
        ),
    ]
    index.add(docs, None)
    event = RecallParams(event_boost=0.5)
    # Indexed by the date the dinner happened (3 May), not the one it was told (4 May).
    hit = index.search("Who did Maria cook dinner with on May 3, 2023?", None, 1)[0]
    assert hit.key == "t1"
    assert (
        index.search("Who did Maria cook dinner with on May 3, 2023?", None, 1, params=event)[
            0
        ].signals["event_time"]
        == 0.5
    )
    # Look-alike: the day it was told names no event of either turn: only the told date matches.
    hits = index.search("Who did Maria cook dinner with on May 4, 2023?", None, 2, params=event)
    assert all("event_time" not in h.signals and h.signals.get("time") for h in hits)


def test_a_session_that_matches_raises_its_turns() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(1, "Ann", "the pottery class starts on monday", group="a"),
        _doc(2, "Bob", "nice, I will bring snacks", group="a"),
        _doc(3, "Ann", "I will bring snacks", group="b"),
        _doc(4, "Bob", "the pottery class was fun", group="a"),
        _doc(5, "Ann", "weather is grey", group="b"),
    ]
    index.add(docs, None)
    spread = RecallParams(session_share=0.5, neighbour_share=0.0)
    hits = {h.key: h for h in index.search("pottery class snacks", None, 5, params=spread)}
    assert hits["t2"].score > hits["t3"].score and "session" in hits["t2"].signals
    # Look-alike: without session relevance the two snack turns are judged on their own.
    hits = {
        h.key: h
        for h in index.search(
            "pottery class snacks",
            None,
            5,
            params=RecallParams(neighbour_share=0.0, session_share=0.0),
        )
    }
    assert all("session" not in h.signals for h in hits.values())


def test_documents_the_graph_links_to_the_query_are_found_without_a_shared_word() -> None:
    index = HybridIndex(2)
    docs = [
        _doc(1, "Nate", "Look at this little guy!", group="a"),
        _doc(2, "Jo", "I like tea", group="b"),
        _doc(3, "Jo", "Max is a tea drinker", group="c"),
    ]
    index.add(docs, None)
    hits = index.search("When did Jo adopt Max?", None, 3, linked=["t1"])
    assert any(h.key == "t1" and "linked" in h.signals for h in hits)
    # Look-alike: a key the memory does not hold links nothing.
    hits = index.search("When did Jo adopt Max?", None, 3, linked=["t9"])
    assert all("linked" not in h.signals for h in hits) and "t1" not in {h.key for h in hits}


def test_plain_query_drops_the_speakers_names_and_their_possessive_only() -> None:
    assert (
        plain_query("What is Melanie's bowl a reminder of?", {"Melanie", "Caroline"})
        == "What is bowl a reminder of?"
    )
    assert plain_query("How do Jon and Gina destress?", ["Jon", "Gina"]) == "How do and destress?"
    assert plain_query("Did Jonathan call?", ["Jon"]) == "Did Jonathan call?"  # whole words only


def _two_among_fillers(first: MemoryDoc, second: MemoryDoc, filler_speaker: str) -> HybridIndex:
    """An index of `first` and `second` (sessions 1 and 2) and nine sessions of small talk."""
    index = HybridIndex(3)
    fillers = (
        _doc(i, filler_speaker, f"Filler number {i} about the weather", group=str(i))
        for i in range(3, 12)
    )
    index.add([first, second, *fillers], None)
    return index


def test_the_learned_fusion_puts_the_named_speakers_turn_above_the_others() -> None:
    index = _two_among_fillers(
        _doc(1, "Bob", "I painted a lake sunrise", group="1"),
        _doc(2, "Ann", "I painted a lake sunrise", group="2"),
        "Bob",
    )
    hits = index.search("What did Ann paint?", None, 2, names=["Ann", "Bob"])
    assert [h.key for h in hits] == ["t2", "t1"]
    # The other speaker's turn pays for it (log-odds), the named one's hardly moves.
    assert hits[1].signals["graph"] < -2 < hits[0].signals["graph"]


def test_the_turn_that_tells_ranks_above_the_one_that_only_asks_with_the_same_words() -> None:
    index = _two_among_fillers(
        _doc(1, "Bob", "Which game won you the tournament?", group="1"),
        _doc(2, "Bob", "Chess won me the tournament, Ann.", group="2"),
        "Ann",
    )
    hits = index.search("Which game won the tournament?", None, 2, names=["Ann", "Bob"])
    # The asking turn matches more of the question's words, and is older (ties go to it).
    assert hits[1].signals["lexical"] > hits[0].signals["lexical"]
    assert [h.key for h in hits] == ["t2", "t1"]
    assert hits[1].signals["question"] < 0 and "question" not in hits[0].signals


@pytest.mark.parametrize(
    ("text", "share"),
    [
        ("Joanna: Wow, congrats! What game was it?", 4 / 7),  # the asking sentence's words
        ("Nate: I won. It was great.", 0.0),
        ("What? No way!", 1 / 3),
        ('I asked him "why?" and he laughed.', 0.0),  # a quoted question inside a statement
        ("Tester: hi there\nSeraphina: What is up?", 4 / 7),  # a front end's row: a line each
        ("", 0.0),
    ],
)
def test_question_share_counts_the_words_of_the_sentences_that_ask(text: str, share: float) -> None:
    assert question_share(text) == pytest.approx(share)


def test_a_turn_said_by_several_speakers_is_said_by_each_of_them() -> None:
    """A chat front end's turn is a user's message and the reply ("Tester, Seraphina"): a
    question naming either speaker treats it as theirs. The look-alike: a third speaker's."""
    index = HybridIndex(3)
    docs = [
        _doc(1, "Seraphina", "Welcome, traveller, rest by the fire", group="1"),
        _doc(2, "Tester, Seraphina", "The forest to the north hides a moon shrine", group="2"),
        _doc(3, "Ann", "The forest to the north hides a moon shrine", group="3"),
        *(
            _doc(i, "Ann", f"Filler number {i} about the weather", group=str(i))
            for i in range(4, 12)
        ),
    ]
    index.add(docs, None)
    names = ["Seraphina", "Tester", "Ann"]

    def ranked(named: str) -> dict[str, tuple[int, float]]:
        hits = index.search(f"What did {named} say about the forest shrine?", None, 11, names=names)
        return {h.key: (rank, h.signals["graph"]) for rank, h in enumerate(hits)}

    for named in ("Seraphina", "Tester"):
        hits = ranked(named)
        assert hits["t2"][0] == 0 and hits["t2"][1] > -2, named
        assert hits["t3"][1] < -2, named  # the same words, said by Ann
    hits = ranked("Ann")
    assert hits["t3"][0] == 0 and hits["t2"][1] < -2
    # The reciprocal-rank fusion's boost (scenes) reads the same speakers.
    rrf = RecallParams(fusion=None)
    boosted = index.search("What did Tester say?", None, 11, names=names, params=rrf)
    assert {h.key for h in boosted if "graph" in h.signals} == {"t2"}


def _conversation(n: int) -> tuple[list[MemoryDoc], np.ndarray]:
    """n turns in sessions of 7, with repeated texts (exact BM25 and cosine ties) and vectors
    from a seeded generator, some of them equal."""
    rng = np.random.default_rng(5)
    topics = [
        "the lake and the boat",
        "my sister's painting class",
        "a trip to the mountains",
        "adopting a puppy",
        "the new job at the bakery",
    ]
    docs = [
        _doc(
            i,
            ("Ann", "Bob")[i % 2],
            f"Talking about {topics[i % len(topics)]} again",
            group=f"session {i // 7}",
            when=f"1:00 pm on {1 + i // 7} May, 2023",
        )
        for i in range(n)
    ]
    vectors = rng.normal(size=(n, 8)).astype(np.float32)
    vectors[1::5] = vectors[0]  # equal cosines for every query
    return docs, vectors


def test_an_index_built_at_once_ranks_exactly_as_one_grown_turn_by_turn() -> None:
    # A restarted sidecar rebuilds a conversation's index from the graph in one call; the running
    # one grew it a turn at a time. Every ranking must be the same, ties included.
    docs, vectors = _conversation(60)
    grown, rebuilt, batched = HybridIndex(8), HybridIndex(8), HybridIndex(8)
    for i in range(len(docs)):
        grown.add(docs[i : i + 1], vectors[i : i + 1])
    rebuilt.add(docs, vectors)
    for start in range(0, len(docs), 13):
        batched.add(docs[start : start + 13], vectors[start : start + 13])
    rng = np.random.default_rng(9)
    queries = [
        "the lake boat",
        "painting class with my sister",
        "mountains trip in May",
        "puppy",
        "bakery job",
        "the bakrey jbo",  # a typo, read as the memory's word (`spelled`)
    ]
    for query in queries:
        assert grown.spelled(query) == rebuilt.spelled(query) == batched.spelled(query)
        vector = rng.normal(size=8).astype(np.float32)
        expected = [
            (h.key, h.score, h.signals)
            for h in rebuilt.search(query, vector, 20, names=["Ann", "Bob"])
        ]
        for other in (grown, batched):
            assert [
                (h.key, h.score, h.signals)
                for h in other.search(query, vector, 20, names=["Ann", "Bob"])
            ] == expected
        prepared = rebuilt.prepare(query, vector)
        assert prepared.lexical == grown.prepare(query, vector).lexical
        assert prepared.dense == grown.prepare(query, vector).dense


@pytest.mark.parametrize(
    ("typed", "read"),
    [
        ("What did Ann resaerch?", "What did Ann research?"),  # two letters swapped
        # Of the words one edit away, the swapped letters' first, then the memory's, then the
        # dictionary's commonest.
        ("How many letters has Ann recieved?", "How many letters has Ann received?"),
        ("Her pottry class", "Her pottery class"),
        ("The limited hoodies", "The limited hoodie"),
        ("Which Tournamnet?", "Which Tournament?"),  # the capital kept
        ("Playing Xenoblade", "Playing Xeonoblade"),  # no English word: the memory's own
        # Look-alikes that stay: English words the memory does not hold, a word of four
        # letters, a word with a digit, a name one edit from nothing, a word the memory holds.
        ("Her status and whose write-up?", "Her status and whose write-up?"),
        ("The bkae sale", "The bkae sale"),
        ("Room potter2", "Room potter2"),
        ("Kaelith came", "Kaelith came"),
        # ... and every word of a text mostly of words neither the dictionary nor the memory
        # knows: another language's ("parque" is no typo of "parquet").
        (
            "Recuerdas cuando fuimos juntas al parque grande?",
            "Recuerdas cuando fuimos juntas al parque grande?",
        ),
        ("Relived it", "Relived it"),
        # ... and a word of another alphabet or with an accent: the word list is English.
        ("\u0441\u043e\u0431\u0430\u043a\u0438", "\u0441\u043e\u0431\u0430\u043a\u0438"),
        ("caf\u00e9s", "caf\u00e9s"),
    ],
)
def test_a_queries_typos_are_read_as_the_words_they_mean(typed: str, read: str) -> None:
    index = _lexical(
        _doc(1, "Ann", "I love pottery, research and my limited hoodie.", group="1"),
        _doc(2, "Bob", "I was relieved. I relived the Xeonoblade night.", group="2"),
        _doc(3, "Ann", "The bake sale and the tournament.", group="3"),
        _doc(4, "Bob", "\u0441\u043e\u0431\u0430\u043a\u0430 and the caf\u00e9", group="4"),
    )
    assert index.spelled(typed) == read


def test_a_question_with_a_typo_recalls_what_the_word_it_means_does() -> None:
    """Held out, a typo in each question's longest word cost recall@10 0.066: BM25 matched
    nothing for it and the embedding drifted."""
    index = HybridIndex(2)
    index.add(
        [
            _doc(1, "Bob", "The weather was grey.", group="1"),
            _doc(2, "Ann", "I researched adoption agencies all week.", group="2"),
        ],
        None,
    )
    typed = "What was resaerched?"
    assert [h.key for h in index.search(index.spelled(typed), None, 1)] == ["t2"]
    assert index.search(typed, None, 1) == []  # as typed, no word matches


def test_a_word_the_last_document_no_longer_holds_is_no_word_to_read_a_typo_as() -> None:
    lexical = LexicalIndex()
    lexical.index(0, "Xeonoblade night", reindex=False)
    assert lexical.spelled("the Xenoblade") == "the Xeonoblade"
    lexical.index(0, "night", reindex=True)
    assert lexical.spelled("the Xenoblade") == "the Xenoblade"


def test_equal_scores_rank_oldest_first() -> None:
    index = HybridIndex(2)
    same = [_doc(i, "Ann", "We adopted a puppy", group=str(i)) for i in range(6)]
    index.add(same, np.tile(_unit([1, 1]), (6, 1)))
    prepared = index.prepare("puppy", _unit([1, 0]))
    assert prepared.lexical == [0, 1, 2, 3, 4, 5] and prepared.dense == [0, 1, 2, 3, 4, 5]


def test_a_different_memory_ranks_differently() -> None:
    # The look-alike: the comparison above is not vacuous; one changed turn changes the ranking.
    docs, vectors = _conversation(60)
    one, other = HybridIndex(8), HybridIndex(8)
    one.add(docs, vectors)
    changed = [
        *docs[:30],
        _doc(30, "Ann", "adopting a puppy, the puppy, a puppy!", group="session 4"),
        *docs[31:],
    ]
    other.add(changed, vectors)
    assert one.prepare("puppy", None).lexical != other.prepare("puppy", None).lexical


@pytest.mark.parametrize(
    ("question", "parts"),
    [
        (
            "What subject have Caroline and Melanie both painted?",
            ["What subject have Caroline painted?", "What subject have Melanie painted?"],
        ),
        (
            "Which city have both Jean and John visited?",
            ["Which city have Jean visited?", "Which city have John visited?"],
        ),
        (
            "How many weeks passed between Maria adopting Coco and Shadow?",
            [
                "How many weeks passed between Maria adopting Coco?",
                "How many weeks passed between Maria adopting Shadow?",
            ],
        ),
        (
            "How long was it between the wedding and the move to Lisbon?",
            ["the wedding", "the move to Lisbon"],
        ),
        # The second event said by its ordinal alone is the first with that ordinal.
        (
            "How long between adopting the first dog and the second?",
            ["adopting the first dog", "adopting the second dog"],
        ),
        # ... and two ordinals before the noun they share are each that noun, the owner kept.
        (
            "How many months passed between Sam's first and second doctor's appointment?",
            ["Sam's first doctor's appointment", "Sam's second doctor's appointment"],
        ),
        (
            "How long was it between the first and the second marathon?",
            ["the first marathon", "the second marathon"],
        ),
        # "How long" names no event: the cue's object and the clause after it are the two.
        (
            "How long after the wedding did they move to Boston?",
            ["they move to Boston", "the wedding"],
        ),
        (
            "How many weeks after the move did John open the studio?",
            ["John open the studio", "the move"],
        ),
        # "before or after" is one cue.
        (
            "Did Caroline go to the parade before or after the support group?",
            ["Did Caroline go to the parade", "the support group"],
        ),
        # A thing of a kind or a place ordered against a name: the name's turn is the other event.
        ("Which city was she in before Lisbon?", ["Which city was she in", "Lisbon"]),
        ("Where did Caroline live before New York?", ["Where did Caroline live", "New York"]),
        # A length of time or an age up to an event: the clause and the event, both ends.
        (
            "How long had Caroline been volunteering when she got the award?",
            ["Caroline been volunteering", "she got the award"],
        ),
        (
            "How long did it take John to finish his first game after buying a computer?",
            ["John to finish his first game", "buying a computer"],
        ),
        (
            "How old was Maria's son when they moved to Texas?",
            ["Maria's son", "they moved to Texas"],
        ),
        # A choice between two names.
        (
            "Which pet did Maria adopt first, Coco or Shadow?",
            ["Which pet did Maria adopt first, Coco?", "Which pet did Maria adopt first, Shadow?"],
        ),
        # A choice between two events by their order.
        ("Which came first, the yoga class or the marathon?", ["the yoga class", "the marathon"]),
        (
            "Which did Maria do first, volunteer at the shelter or start her blog?",
            ["volunteer at the shelter", "start her blog"],
        ),
    ],
)
def test_a_question_about_two_entities_or_events_is_split_into_its_parts(
    question: str, parts: list[str]
) -> None:
    assert query_parts(question, ["Caroline", "Melanie", "John", "Maria"]) == parts


@pytest.mark.parametrize(
    "message",
    [
        "",
        "...",
        "\U0001f44d",
        "lol yeah",
        "Haha, yesss!",
        "hahahaha",
        "Thanks!",
        "Me too",
        "I see.",
        "Wow, amazing!",
        "That's great!",
        "I'm good",
        "OK",
        "Tell me more!",
        "No problem! Catch you later!",
        "Yea, no worries! It was great catching up. Take it easy!",
    ],
)
def test_a_message_of_acknowledgement_reaction_or_greeting_says_nothing(message: str) -> None:
    assert not says_something(message)


def test_a_name_the_message_only_addresses_is_not_its_topic() -> None:
    names = ["Joanna", "Nate"]
    assert not says_something("Bye Joanna! Take care!", names)
    assert not says_something("Good night, Nate!", names)
    # The look-alikes: the name is what it asks about, or another name is there.
    assert says_something("Joanna?", names)
    assert says_something("What about Nate?", names)
    assert says_something("Bye Joanna! Say hi to Max!", names)
    # Without the chat's names, a name is a word like any other.
    assert says_something("Bye Joanna! Take care!")


@pytest.mark.parametrize(
    "message",
    # One word of a topic, a number, a word of another script: each says something.
    [
        "Support?",
        "lol the bear was huge",
        "Thanks for the recipe!",
        "Yes, Paris",
        "2023?",
        "\u041f\u0440\u0438\u0432\u0435\u0442",
        "Ha! Hilarious",
        "Good luck",
        "Take care of Max for me!",
        "Let's talk about Paris",
    ],
)
def test_a_short_message_that_names_anything_says_something(message: str) -> None:
    assert says_something(message)


def test_a_chat_questions_pleasantries_are_not_what_it_asks_the_memory() -> None:
    """ "Hey Bob, hope you're doing well! Quick question: what did Ann research?" asks about
    research: its opening matched, by "hope", "well" and "quick", the memory's own greetings,
    above the one turn about research (held out, such an opening cost recall@10 0.044)."""
    index = HybridIndex(2)
    index.add(
        [
            _doc(
                1,
                "Ann",
                "Hey Bob, hope you're doing well! I'm doing well, quick update.",
                group="1",
            ),
            _doc(2, "Bob", "Hope you're well too! Well well, quick hello from me.", group="2"),
            _doc(3, "Ann", "I researched adoption agencies all week.", group="3"),
            _doc(4, "Bob", "The weather was grey.", group="4"),
        ],
        None,
    )
    asked = "Hey Bob, hope you're doing well! Quick question: what did Ann research?"
    names = ["Ann", "Bob"]
    hits = [h.key for h in index.search(asked, None, 4, names=names)]
    assert hits[0] == "t3" and "t2" not in hits
    assert hits == [h.key for h in index.search("What did Ann research?", None, 4, names=names)]
    # What the dense model embeds for it is the question's own text.
    assert query_texts(asked, names) == query_texts("what did Ann research?", names)


@pytest.mark.parametrize(
    ("message", "topical"),
    [
        ("Hey Bob, hope you're doing well! Where is Ann?", "Where is Ann?"),
        ("Ann: Hi! How are you? I went to the park.", "Ann: I went to the park."),
        ("Thanks, Max! Where is Max now?", "Where is Max now?"),
        # Look-alikes: a label of a word that is no speaker's is a sentence like any other; a
        # sentence with one word of a topic stays; so does a message that names none at all.
        ("Favourite book: Dune. Thanks!", "Favourite book: Dune."),
        ("Good luck! Thanks!", "Good luck!"),
        ("Thanks, Max!", "Thanks, Max!"),
        ("Hope you're well! Where is he?", "Hope you're well! Where is he?"),
    ],
)
def test_topical_text_keeps_the_sentences_that_name_a_topic(message: str, topical: str) -> None:
    assert topical_text(message, ["Ann", "Bob", "Max"]) == topical


@pytest.mark.parametrize(
    ("message", "topical"),
    [
        # Stage business in any inflection, first person or third: gone.
        ("*leans back in the chair and smiles* Where is Ann?", "Where is Ann?"),
        ("*tilts my head, curious* Where did Ann go?", "Where did Ann go?"),
        ("*nods slowly, taking it in* And the museum?", "And the museum?"),
        ("*glancing at you, brushes a strand of hair behind her ear* Who won?", "Who won?"),
        # ... in an irregular past too, even when the speech points (stage business is no prop).
        ("*sat down beside you and took a deep breath* Who won it?", "Who won it?"),
        ("*shook her head, then stood* Who won it?", "Who won it?"),
        # An action with a thing in it, when the speech names a topic and points at nothing
        # outside itself: the thing is the scene, the speech the question.
        (
            "*glances up from the book* Did Ann finish the screenplay?",
            "Did Ann finish the screenplay?",
        ),
        # Look-alikes that stay: the speech points at what the action shows, or says nothing
        # without it; a bold word, a product, an unclosed asterisk; a message that is only
        # stage business (nothing names a topic: the message as it is).
        (
            "*hands you the letter* Where did you find this?",
            "*hands you the letter* Where did you find this?",
        ),
        (
            "*shows you the photo of the turtles* Look!",
            "*shows you the photo of the turtles* Look!",
        ),
        ("**Dune** is the best book", "**Dune** is the best book"),
        # Italics that are no action: a title (in Title Case) and an emphasis inside a sentence.
        ("*Dune* is the best book", "*Dune* is the best book"),
        ("*The Lord of the Rings*. Did Ann see it?", "*The Lord of the Rings*. Did Ann see it?"),
        ("Did Ann see *Inception*?", "Did Ann see *Inception*?"),
        ("I *love* pottery", "I *love* pottery"),
        # An action after a sentence or another action is one; so is one a name opens.
        ("Thanks! *hugs you* *sits* Where is Ann?", "Where is Ann?"),
        ("*Bob glances up from the book* Where is Ann?", "Where is Ann?"),
        ("Is 5*3*2 thirty?", "Is 5*3*2 thirty?"),
        ("*sigh I lost the race", "*sigh I lost the race"),
        ("*nods*", "*nods*"),
    ],
)
def test_a_role_play_actions_stage_business_is_not_what_it_asks(message: str, topical: str) -> None:
    assert topical_text(message, ["Ann", "Bob"]) == topical


@pytest.mark.parametrize(
    ("message", "topical"),
    [
        # Narrated prose: a sentence of stage business goes, and so does a prop when the
        # quoted speech names a topic of its own; the speech is asked without its marks.
        ('She leans back and smiles. "Where is Ann?"', "Where is Ann?"),
        (
            'She glances up from the book. "Did Ann finish the screenplay?"',
            "Did Ann finish the screenplay?",
        ),
        ('"Where is Ann?" she asks, glancing up from the book.', "Where is Ann?"),
        ('"Did Ann finish the screenplay?"', "Did Ann finish the screenplay?"),
        ("She sits down. Where is Ann?", "Where is Ann?"),
        # Look-alikes that stay: the speech points at the narration (its marks go); a quoted
        # title; reported speech inside a sentence; speech after "says,"; a word that only
        # ends like a gesture's inflection ("find" is no "fine").
        (
            'He hands you the letter. "Where did you find this?"',
            "He hands you the letter. Where did you find this?",
        ),
        ('Have you read "The Road"?', 'Have you read "The Road"?'),
        ('I said "no way!" to Ann about the trip', 'I said "no way!" to Ann about the trip'),
        ('He says, "Where is Ann?"', 'He says, "Where is Ann?"'),
    ],
)
def test_a_narrated_role_plays_speech_is_what_it_asks(message: str, topical: str) -> None:
    assert topical_text(message, ["Ann", "Bob"]) == topical


def test_a_message_of_stage_business_alone_says_nothing() -> None:
    assert not says_something("*nods slowly*")
    assert not says_something("*smiles warmly at you* Thanks!")
    # The look-alikes: an action that names a thing, the same words outside an action.
    assert says_something("*hands you the letter*")
    assert says_something("nods slowly")
    # A word that only starts with a gesture's ("laptop": lap, "bowl": bow) is a thing.
    assert says_something("*closes the laptop*") and says_something("*hands you a bowl*")
    assert not says_something("*nodding, she tilted her head and hugged you*")
    # Irregular pasts are stage business too; the look-alike names a thing ("piano").
    assert not says_something("*shook her head*") and not says_something("*knelt, then rose*")
    assert says_something("*sat at the piano*") and says_something("*took the photo*")


def test_a_role_play_message_is_asked_about_whom_its_speech_is_about() -> None:
    """The sender's own stage business ("*tilts my head*") does not make a question to the
    other speaker one about the sender."""
    names = ["Ann", "Bob"]
    asked = "*tilts my head* What did you research?"
    assert asked_about("Bob", asked, names) == f"Ann: {asked}"
    # The look-alike: an action the speech points at is part of what it asks ("my letter" and
    # "you": about both, so under no name).
    pointing = "*hands you my letter* Did you read it?"
    assert asked_about("Bob", pointing, names) == pointing


def test_a_role_play_question_recalls_what_its_speech_asks() -> None:
    """ "*leans back in the chair and smiles* Did Ann finish the screenplay?" asks about the
    screenplay: its chairs and smiles matched the memory's own (held out, such an action before
    each question cost recall@10 0.032)."""
    index = _lexical(
        _doc(1, "Ann", "*leans back in her chair and smiles* The chair is comfy.", group="1"),
        _doc(2, "Bob", "*smiles back and leans in* You look happy in that chair.", group="2"),
        _doc(3, "Ann", "I finished my screenplay last night!", group="3"),
        _doc(4, "Bob", "The weather was grey.", group="4"),
    )
    names = ["Ann", "Bob"]
    asked = "*leans back in the chair and smiles* Did Ann finish the screenplay?"
    hits = [h.key for h in index.search(asked, None, 4, names=names)]
    assert hits[0] == "t3"
    bare = "Did Ann finish the screenplay?"
    assert hits == [h.key for h in index.search(bare, None, 4, names=names)]
    assert query_texts(asked, names) == query_texts(bare, names)


def test_an_ordinal_alone_borrows_only_from_an_event_with_an_ordinal() -> None:
    speakers = ["Maria"]
    # The first event has no ordinal to replace: the second stays as said.
    assert query_parts("How long between the wedding and the second?", speakers) == [
        "the wedding",
        "the second",
    ]
    # A second event with words of its own is not an ordinal alone.
    assert query_parts("How long between the first dog and the second turtle?", speakers) == [
        "the first dog",
        "the second turtle",
    ]


@pytest.mark.parametrize(
    "question",
    [
        "What encouragement does Nate give to Joanna?",  # two speakers, named apart: one event
        "What did John do the week before August 3, 2023?",  # "before" a date, not an event
        "What did Melanie realize?",  # no cue word
        "I went to the lake and then to the shop after lunch.",  # not a question (a chat turn)
        "When did Caroline and her mom go hiking?",  # "and" joins no two names
        "How long after that?",  # "How long" and a pronoun: no event named
        # "X after E" asks about X: E is its context, not a second event to find.
        "When did Melanie go on a hike after the roadtrip?",
        "How did Melanie feel after the accident?",
        "What did Jon do after Paris?",  # ... and a name as E, when the question asks what X did
        "Which gifts did Melanie get after Christmas?",  # a holiday is a time, not a second event
        "Which book did Joanna read after May?",  # ... and a month
        "Is it raining or snowing?",  # "or" joins no two names
        "How long after the wedding?",  # one event: nothing after it to split off
        "Which do you prefer, the lake or the sea?",  # a choice, but not of an order
        "How long has Melanie been painting since 2016?",  # a length up to a date, not an event
        "How long had Joanna been writing when?",  # "when" with no event after it
        "How long has Nate had his turtles?",  # a length with no event to measure it up to
        "When did Nate, the gamer, win his first tournament?",  # "when" alone is no second event
    ],
)
def test_look_alikes_of_two_event_questions_are_not_split(question: str) -> None:
    assert query_parts(question, ["Nate", "Joanna", "John", "Melanie", "Caroline"]) == []


WEDDING_QUESTION = "How long was it between the wedding and the move to Lisbon city?"


def _wedding_and_lisbon() -> tuple[list[MemoryDoc], HybridIndex]:
    """Every turn speaks of the wedding; WEDDING_QUESTION's other words favour the Lisbon turns,
    so the turn about the wedding alone (t1, the best for the part "the wedding") ranks last."""
    docs = [
        _doc(1, "Ann", "the wedding", group="1"),
        *(
            _doc(i, "Ann", f"wedding then the move to Lisbon city, note {i}", group=str(i))
            for i in range(2, 8)
        ),
    ]
    index = HybridIndex(2)
    index.add(docs, None)
    return docs, index


def test_each_part_of_a_two_event_question_gets_a_slot_in_the_top_k() -> None:
    _, index = _wedding_and_lisbon()
    question = WEDDING_QUESTION
    parts = [(p, None) for p in query_parts(question, ["Ann"])]
    rrf = RecallParams(fusion=None, neighbour_share=0.0)
    without = index.search(question, None, 3, params=rrf, parts=parts)
    assert "t1" not in {h.key for h in without}
    own_best = rrf.model_copy(update={"part_budget": 1, "part_depth": 1})
    hits = index.search(question, None, 3, params=own_best, parts=parts)
    assert [h.key for h in hits] == [h.key for h in without][:2] + ["t1"]  # it takes the last place
    assert hits[-1].signals.get("part") == 1.0 and all("part" not in h.signals for h in hits[:2])
    # Look-alike: filled from the part's best ten, the part's slot goes to the one the question
    # ranks highest, already in the top 3: nothing changes.
    agreeing = rrf.model_copy(update={"part_budget": 1, "part_depth": 10})
    assert [h.key for h in index.search(question, None, 3, params=agreeing, parts=parts)] == [
        h.key for h in without
    ]


def test_documents_the_asker_shows_come_after_every_other_and_a_parts_slot_skips_them() -> None:
    docs, index = _wedding_and_lisbon()
    question = WEDDING_QUESTION
    rrf = RecallParams(fusion=None, neighbour_share=0.0)
    ranked = [h.key for h in index.search(question, None, 7, params=rrf)]
    on_screen = {d.text for d in docs if d.key in ranked[:2]}
    shown = [
        h.key for h in index.search(question, None, 7, params=rrf, shown=on_screen.__contains__)
    ]
    assert shown == ranked[2:] + ranked[:2]  # both kept in their order, the shown ones last
    # k smaller than what is not shown: the shown ones are not recalled at all.
    assert [
        h.key for h in index.search(question, None, 3, params=rrf, shown=on_screen.__contains__)
    ] == ranked[2:5]
    # A part's slot: the wedding alone (t1) is its best; shown, the slot goes to its next best.
    parts = [(p, None) for p in query_parts(question, ["Ann"])]
    own_best = rrf.model_copy(update={"part_budget": 1, "part_depth": 1})
    assert "t1" in {h.key for h in index.search(question, None, 3, params=own_best, parts=parts)}
    wedding = {docs[0].text}.__contains__
    hits = index.search(question, None, 3, params=own_best, parts=parts, shown=wedding)
    assert "t1" not in {h.key for h in hits} and len(hits) == 3


def test_recall_embeds_a_two_event_questions_parts_in_the_same_call_and_hands_them_to_the_index() -> (
    None
):
    speakers = {"Ann", "Bob"}
    question = "What have Ann and Bob both painted?"
    with_parts = RecallParams(part_budget=1)
    texts = query_texts(question, speakers, with_parts)
    # The question is embedded once, without the speakers' names; the two parts differ by the
    # speaker only: their text without the names is one (one embedding).
    assert texts == ["What have and both painted?", "What have painted?"]
    known = {text: np.full(2, float(i + 1), dtype=np.float32) for i, text in enumerate(texts)}
    vector, plain_vector, parts = embedded_query(question, speakers, known, with_parts)
    assert vector is known["What have and both painted?"] and plain_vector is None
    assert [(p, v[0]) for p, v in parts] == [
        ("What have Ann painted?", 2.0),
        ("What have Bob painted?", 2.0),
    ]
    # Look-alikes: one event, one speaker: the question asked of that speaker ("you": the
    # stored turns say "I"), alone; and no parts are embedded where the fusion gives them no
    # slots.
    assert query_texts("What did Ann paint?", speakers, with_parts) == ["What did you paint?"]
    assert query_texts("What is Ann's dog called?", speakers) == ["What is your dog called?"]
    assert query_texts("What does Ann like?", speakers) == ["What do you like?"]
    assert (
        embedded_query(
            "What did Ann paint?", speakers, {"What did you paint?": np.ones(2)}, with_parts
        )[2]
        == []
    )
    assert query_texts(question, speakers, RecallParams(part_budget=0)) == texts[:1]
    # A query of nothing but a name is embedded as it is (removing the name leaves nothing);
    # one without a name is its own plain form.
    assert query_texts("Ann", speakers) == ["Ann"]
    assert query_texts("What did she paint?", speakers) == ["What did she paint?"]


def test_exact_cosines_are_each_rows_own_float64_dot_product_whatever_its_block() -> None:
    from core.recall.dense import COSINE_BLOCK_ROWS, exact_cosines

    rng = np.random.default_rng(3)
    rows = rng.normal(size=(2 * COSINE_BLOCK_ROWS + 5, 384)).astype(np.float32)
    unit = rng.normal(size=384).astype(np.float32)
    own = np.array([np.sum(row.astype(np.float64) * unit.astype(np.float64)) for row in rows])
    assert np.array_equal(exact_cosines(rows, unit), own)
    some = np.array([0, 7, COSINE_BLOCK_ROWS - 1, COSINE_BLOCK_ROWS, len(rows) - 1])
    assert np.array_equal(exact_cosines(rows[some], unit), own[some])


def test_dense_ranking_is_the_same_with_every_vector_held_and_with_one_missing() -> None:
    from core.recall.dense import DenseIndex

    rng = np.random.default_rng(5)
    vectors = list(rng.normal(size=(300, 16)).astype(np.float32))
    query = rng.normal(size=16).astype(np.float32)
    units = np.array([v / np.linalg.norm(v) for v in vectors], dtype=np.float32)
    cosine = units.astype(np.float64) @ (query / np.linalg.norm(query)).astype(np.float64)
    order = [int(i) for i in np.argsort(-cosine, kind="stable")]
    missing = order[3]  # a vector that would rank: the gapped index must skip it, not others
    full, gapped = DenseIndex(16), DenseIndex(16)
    full.append(vectors)
    gapped.append([None if i == missing else v for i, v in enumerate(vectors)])
    assert full.ranking(query, 20) == order[:20]
    assert gapped.ranking(query, 20) == [i for i in order if i != missing][:20]
    assert gapped.ranking(query, 300) == [i for i in order if i != missing]  # never the gap


def test_a_memory_row_and_a_query_embed_their_words_without_the_speakers_names_and_labels() -> None:
    speakers = {"Caroline", "Melanie"}
    # A stored turn: its "Name:" label and the address at its start go with the names.
    assert (
        embedded_text("Caroline: Melanie, I went to a support group yesterday.", speakers)
        == "I went to a support group yesterday."
    )
    # A turn of several messages: each line loses its own label, the lines join with a space.
    assert embedded_text("Caroline: Hi Melanie!\nMelanie: Hey!", speakers) == "Hi! Hey!"
    # A question keeps everything but the names (as `plain_query` has it).
    assert (
        embedded_text("When did Caroline go to the LGBTQ support group?", speakers)
        == "When did go to the LGBTQ support group?"
    )
    # Look-alikes: a label that is not a speaker's stays; a line that is nothing but names
    # (no word left) is embedded as it is.
    assert embedded_text("Note: bring the map", speakers) == "Note: bring the map"
    assert embedded_text("Caroline: Melanie!", speakers) == "Caroline: Melanie!"


def test_a_phrase_relative_to_an_event_is_dated_by_the_turn_that_dated_the_event() -> None:
    index = HybridIndex(2)
    said = "2:00 pm on 20 June, 2023"
    docs = [
        _doc(1, "Ann", "Our wedding is on June 10th! So excited.", when="1:00 pm on 1 May, 2023"),
        _doc(2, "Ann", "I ran a charity race last weekend.", when="1:00 pm on 8 May, 2023"),
        _doc(3, "Ann", "The week before the wedding was chaos.", when=said),
        _doc(4, "Ann", "The day after the big race we slept in.", when=said),
        _doc(5, "Ann", "I have felt great since the race.", when=said),
        _doc(6, "Ann", "The weekend after my wedding we flew to Rome.", when=said),
        # Look-alikes: "since" as "because"; a greeting; an event no turn dated; a sentence
        # with two times dates nothing ("the party" is not dated by it).
        _doc(7, "Ann", "Since the race was hard, I rest.", when=said),
        _doc(8, "Ann", "Nothing new since our last chat!", when=said),
        _doc(9, "Ann", "The day after the concert was quiet.", when=said),
        _doc(10, "Ann", "The party was last Friday, not on June 10th.", when=said),
        _doc(11, "Ann", "The day after the party I slept.", when=said),
        _doc(12, "Ann", "We flew out right after the wedding.", when=said),
        # ... and "right after" followed by a clause: its subject is no event.
        _doc(13, "Ann", "Right after my race ended, I slept.", when=said),
    ]
    index.add(docs, None)

    def dated(position: int) -> list[tuple[str, str]]:
        return [(s.phrase, s.describe()) for s in index.events(position)]

    assert dated(2) == [("The week before the wedding", "3-9 June 2023")]
    assert dated(3) == [("The day after the big race", "Monday 8 May 2023")]
    assert dated(4) == [("since the race", "since 6-7 May 2023")]
    assert dated(5) == [("The weekend after my wedding", "17-18 June 2023")]
    assert dated(11) == [("right after the wedding", "11-17 June 2023")]
    assert dated(6) == dated(7) == dated(8) == dated(10) == dated(12) == []
    # The packet shows it, and a question naming the week reaches the turn through its date.
    hits = index.search("What happened in early June 2023?", None, 3)
    assert "t3" in [h.key for h in hits]
    assert (
        "The week before the wedding = 3-9 June 2023"
        in next(h for h in hits if h.key == "t3").events
    )


def test_so_many_days_or_weeks_from_a_dated_event_is_that_day() -> None:
    index = HybridIndex(2)
    said = "2:00 pm on 20 June, 2023"
    index.add(
        [
            _doc(
                1, "Ann", "Our wedding is on June 10th! So excited.", when="1:00 pm on 1 May, 2023"
            ),
            _doc(2, "Ann", "I ran a charity race last weekend.", when="1:00 pm on 8 May, 2023"),
            _doc(3, "Ann", "Two weeks after the wedding we unpacked at last.", when=said),
            _doc(4, "Ann", "A few days before the race I got sick.", when=said),
            _doc(5, "Ann", "Three days after the big race I felt fine.", when=said),
            # Look-alike: an event no turn dated.
            _doc(6, "Ann", "Two days before the concert I practiced.", when=said),
        ],
        None,
    )

    def dated(position: int) -> list[tuple[str, str]]:
        return [(s.phrase, s.describe()) for s in index.events(position)]

    assert dated(2) == [("Two weeks after the wedding", "Saturday 24 June 2023")]
    assert dated(3) == [("A few days before the race", "2-4 May 2023")]  # the race: 6-7 May
    assert dated(4) == [("Three days after the big race", "Wednesday 10 May 2023")]
    assert dated(5) == []


def _told(*said: tuple[str, str]) -> list[MemoryDoc]:
    """Ann's turns t1, t2, ...: (text, when said) each."""
    return [_doc(i, "Ann", text, when=when) for i, (text, when) in enumerate(said, 1)]


def test_a_question_relative_to_an_event_reaches_the_turn_of_those_days() -> None:
    # Three hikes "last weekend", told alike; the race dates the weekend the question means.
    docs = _told(
        ("I ran a charity race last weekend.", "1:00 pm on 8 May, 2023"),
        ("Last weekend I went hiking with my brother.", "1:00 pm on 15 May, 2023"),
        ("Last weekend I went hiking with my brother again.", "1:00 pm on 1 June, 2023"),
        ("This weekend I went hiking with my brother.", "1:00 pm on 24 April, 2023"),
    )
    index = HybridIndex(2)
    index.add(docs, None)
    question = "What did Ann do the weekend after the charity race?"
    assert [d.span.describe() for d in index.columns.question_dates(question) if d.span] == [
        "13-14 May 2023"
    ]
    assert index.search(question, None, 1)[0].key == "t2"
    # Look-alikes: an event no turn dated, "since" (every day from then on), no unit of time.
    for undated in (
        "What did Ann do the weekend after the bake sale?",
        "What has Ann done since the charity race?",
        "What did Ann do after the charity race?",
    ):
        assert index.columns.question_dates(undated) == [], undated


def test_a_question_naming_a_holiday_reaches_the_turn_about_that_day() -> None:
    # Three dinners told alike; the one of "yesterday", said the day after Thanksgiving 2022.
    docs = _told(
        ("Yesterday we had a big dinner with my parents.", "1:00 pm on 25 November, 2022"),
        ("Last night we had a big dinner with my parents.", "1:00 pm on 2 December, 2022"),
        ("We had a big dinner with my parents yesterday.", "1:00 pm on 14 October, 2022"),
    )
    index = HybridIndex(2)
    index.add(docs, None)
    assert index.search("What did Ann do on Thanksgiving?", None, 1)[0].key == "t1"
    # Look-alike: without the holiday the words favour another dinner.
    assert index.search("What did Ann do at dinner last night?", None, 1)[0].key != "t1"


def test_an_event_said_after_it_was_mentioned_does_not_date_an_earlier_phrase() -> None:
    # The index is built in the order the turns were said: an event dated only later dates
    # nothing before it, and an index rebuilt from the same turns holds the same spans.
    docs = [
        _doc(1, "Ann", "The week before the wedding was chaos.", when="1:00 pm on 1 June, 2023"),
        _doc(2, "Ann", "Our wedding is on June 10th!", when="1:00 pm on 2 June, 2023"),
    ]
    whole, turn_by_turn = HybridIndex(2), HybridIndex(2)
    whole.add(docs, None)
    for doc in docs:
        turn_by_turn.add([doc], None)
    assert whole.events(0) == turn_by_turn.events(0) == ()
