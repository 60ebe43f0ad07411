"""The codex page, built from the real graph: what it holds as of a chapter, the evidence it
shows, the QA findings it marks, the sidecar's version of it, the command that writes it,
and that it stays one self-contained, safe file.

The browser test of a scripted book is tests/kg/test_codex_browser.py.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings
from kg.codex import build_dialogue_codex, build_novel_codex, render_codex, write_codex
from kg.codex.models import CAPTION_LIMIT, ELLIPSIS, relationship_caption, shorten_label
from kg.codex.render import LIBRARY, LIBRARY_NAME
from kg.models import ChapterDelta, Entity, EntitySource, Relationship, SceneDelta, StatusChange
from kg.store import GraphStore
from tasks.codex import codex_due
from tasks.runtime import Runtime, set_runtime
from tests.conftest import DIALOGUES_DIR, REPO_ROOT, prefect_api_env
from tests.support.browser import chromium_path, open_page
from tests.support.cli import graph_env, run_module
from tests.support.dialogue_script import DialogueScript, participants
from tests.support.prefect_artifacts import artifact_keys
from tests.support.scripted_llm import ScriptedLLM
from tests.support.story_seed import MARY, plant_qa_problems, seed_story

ASSETS = REPO_ROOT / "tools" / "codex-assets"


def _src(chapter: int, scene: int, quote: str, **extra: Any) -> EntitySource:
    return EntitySource(type="extraction", chapter=chapter, scene=scene, quote=quote, **extra)


def write_story(store: GraphStore) -> None:
    """Bible, then three chapters: friends fall out, a newcomer with a key, a move, a death."""
    bible = EntitySource(type="outline", chapter=0)
    store.commit_chapter(
        ChapterDelta(
            chapter=0,
            source_type="outline",
            entities=[
                Entity(
                    label="Character",
                    name="Mara Quill",
                    traits=["brave"],
                    sources=[bible],
                    first_chapter=0,
                    attributes={
                        "role": "protagonist",
                        "motivation": "learn the truth",
                        "voice": "clipped",
                    },
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                Entity(
                    label="Character",
                    name="Tobias Venn",
                    sources=[bible],
                    first_chapter=0,
                    status_intervals=[{"status": "alive", "from_chapter": 0}],
                ),
                Entity(label="Location", name="Gull Rock", sources=[bible], first_chapter=0),
            ],
            relationships=[
                Relationship(source="Mara Quill", target="Gull Rock", type="LOCATED_IN", chapter=0)
            ],
            novel_info={
                "title": "The Drowned Letter",
                "logline": "A keeper chases a ghost's letter.",
                "genre": "gothic",
            },
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=1,
            title="The Letter",
            summary="Mara meets Tobias.",
            entities=[
                Entity(
                    label="Character",
                    name="Mara Quill",
                    sources=[_src(1, 1, "Mara Quill met Tobias Venn.")],
                ),
                Entity(
                    label="Character",
                    name="Tobias Venn",
                    sources=[_src(1, 1, "Mara Quill met Tobias Venn.")],
                ),
            ],
            relationships=[
                Relationship(
                    source="Mara Quill",
                    target="Tobias Venn",
                    type="FRIEND_OF",
                    scene=1,
                    quote="Mara Quill met Tobias Venn.",
                )
            ],
            scenes=[
                SceneDelta(
                    index=1,
                    title="Meeting",
                    location="Gull Rock",
                    characters=["Mara Quill", "Tobias Venn"],
                )
            ],
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=2,
            title="The Key",
            summary="Ilse and the key.",
            entities=[
                Entity(
                    label="Character",
                    name="Ilse Marrow",
                    sources=[_src(2, 1, "Ilse Marrow held the brass key.")],
                ),
                Entity(
                    label="Item",
                    name="brass key",
                    sources=[_src(2, 1, "Ilse Marrow held the brass key.")],
                ),
                Entity(
                    label="Location",
                    name="Sea Caves",
                    sources=[_src(2, 2, "Mara went down to the Sea Caves.")],
                ),
            ],
            relationships=[
                Relationship(
                    source="Ilse Marrow",
                    target="brass key",
                    type="OWNS",
                    scene=1,
                    quote="Ilse Marrow held the brass key.",
                ),
                Relationship(
                    source="Mara Quill",
                    target="Sea Caves",
                    type="LOCATED_IN",
                    scene=2,
                    quote="Mara went down to the Sea Caves.",
                ),
            ],
            scenes=[
                SceneDelta(index=1, title="Key"),
                SceneDelta(index=2, title="Caves", location="Sea Caves"),
            ],
        )
    )
    store.commit_chapter(
        ChapterDelta(
            chapter=3,
            title="The Betrayal",
            summary="Tobias turns; Ilse dies.",
            entities=[
                Entity(
                    label="Character",
                    name="Tobias Venn",
                    sources=[_src(3, 1, "Tobias Venn struck Mara.")],
                )
            ],
            relationships=[
                Relationship(
                    source="Tobias Venn",
                    target="Mara Quill",
                    type="ENEMY_OF",
                    scene=1,
                    quote="Tobias Venn struck Mara.",
                )
            ],
            status_changes=[
                StatusChange(
                    entity="Ilse Marrow",
                    status="dead",
                    scene=2,
                    quote="Ilse Marrow drowned in the caves.",
                )
            ],
            scenes=[SceneDelta(index=1, title="Blow"), SceneDelta(index=2, title="Drowning")],
        )
    )


def write_quality(saga_dir: Path, chapters: int = 3) -> None:
    (saga_dir / "quality").mkdir(parents=True, exist_ok=True)
    for n in range(1, chapters + 1):
        rows = [
            {
                "part": "scene 1",
                "words": 300,
                "plan_problems": "does not name Tobias" if n == 2 else "",
            },
            {
                "part": "chapter",
                "words": 600 + 50 * n,
                "distinct_trigrams": round(0.95 - 0.05 * n, 2),
                "editor_mean": 0.5 + n / 10,
                "facts_kept": 5 + n,
                "facts_dropped": n,
                "clean": n != 3,
                "failures": "one sentence repeated 4 times" if n == 3 else "",
            },
        ]
        (saga_dir / "quality" / f"chapter_{n:03d}.json").write_text(
            json.dumps(rows), encoding="utf-8"
        )


def _card(page: Any, name: str) -> Any:
    return next(c for s in page.sections for c in s.cards if c.name == name)


def _edge(page: Any, label: str, source: str) -> Any:
    ids = {n.name: n.id for n in page.graph.nodes}
    return next(e for e in page.graph.edges if e.label == label and e.source == ids[source])


def test_the_page_holds_the_world_as_of_the_latest_chapter(
    store: GraphStore, tmp_path: Path
) -> None:
    write_story(store)
    write_quality(tmp_path)
    page = build_novel_codex(store, tmp_path)
    assert (page.title, page.as_of, page.stats.chapters) == ("The Drowned Letter", 3, 3)
    assert [s.title for s in page.sections] == ["Characters", "Places", "Items"]
    mara = _card(page, "Mara Quill")
    assert (
        ("role", "protagonist") in mara.fields
        and mara.traits == ["brave"]
        and mara.first == "story bible"
    )
    assert mara.appears_in == [1, 2, 3]
    ilse = _card(page, "Ilse Marrow")
    assert ilse.first == "ch 2 sc 1" and ilse.first_quote == "Ilse Marrow held the brass key."
    assert [(s.status, s.start, s.end, s.quote) for s in ilse.statuses] == [
        ("dead", 3, None, "Ilse Marrow drowned in the caves.")
    ]
    # Every fact with its evidence: chapter, scene, quote.
    tobias = {(f.where, f.statement, f.quote) for f in _card(page, "Tobias Venn").facts}
    assert ("ch 3 sc 1", "ENEMY_OF \u2192 Mara Quill", "Tobias Venn struck Mara.") in tobias
    assert ("ch 1 sc 1", "FRIEND_OF \u2190 Mara Quill", "Mara Quill met Tobias Venn.") in tobias
    assert ("story bible", "in the story bible", None) in tobias
    # Relationships with their history: the friendship ended when Tobias turned enemy, Mara
    # left Gull Rock for the Sea Caves; the key stays Ilse's.
    friends = _edge(page, "FRIEND_OF", "Mara Quill")
    assert (
        friends.spans == [(1, 3)]
        and friends.ended_by == "Tobias Venn ENEMY_OF Mara Quill in chapter 3"
    )
    assert [(e.where, e.quote) for e in friends.events] == [
        ("ch 1 sc 1", "Mara Quill met Tobias Venn.")
    ]
    assert _edge(page, "ENEMY_OF", "Tobias Venn").spans == [(3, None)]
    homes = {e.events[-1].where: e.spans for e in page.graph.edges if e.label == "LOCATED_IN"}
    assert homes == {"story bible": [(0, 2)], "ch 2 sc 2": [(2, None)]}
    assert _edge(page, "OWNS", "Ilse Marrow").spans == [(2, None)]
    # The timeline: per chapter who appears and what changed.
    timeline = {e.heading: e for e in page.timeline}
    assert list(timeline) == ["Story bible", "Chapter 1", "Chapter 2", "Chapter 3"]
    three = timeline["Chapter 3"]
    assert (three.title, three.summary) == ("The Betrayal", "Tobias turns; Ilse dies.")
    assert [i.text for i in three.appears] == ["Ilse Marrow", "Mara Quill", "Tobias Venn"]
    assert [(i.text, i.quote) for i in three.status_changes] == [
        ("Ilse Marrow: dead", "Ilse Marrow drowned in the caves.")
    ]
    assert [i.text for i in three.new_relationships] == ["Tobias Venn ENEMY_OF Mara Quill"]
    assert [i.text for i in three.ended_relationships] == [
        "Mara Quill FRIEND_OF Tobias Venn ended (now Tobias Venn ENEMY_OF Mara Quill)"
    ]
    assert [i.text for i in timeline["Chapter 2"].new_entities] == [
        "brass key (Item)",
        "Ilse Marrow (Character)",
        "Sea Caves (Location)",
    ]
    assert timeline["Chapter 2"].flags == ["scene 1: does not name Tobias"]
    assert timeline["Chapter 3"].flags == ["one sentence repeated 4 times"]
    # The quality table, one row per chapter.
    assert [(q.chapter, q.values["editor_mean"], q.flagged) for q in page.quality] == [
        (1, 0.6, False),
        (2, 0.7, True),
        (3, 0.8, True),
    ]
    assert (
        page.quality_columns[:3] == ["words", "distinct_trigrams", "plan_problems"]
        or page.quality_columns[0] == "words"
    )


def test_the_page_as_of_an_earlier_chapter_knows_nothing_later(
    store: GraphStore, tmp_path: Path
) -> None:
    write_story(store)
    write_quality(tmp_path)
    page = build_novel_codex(store, tmp_path, as_of=2)
    assert page.as_of == 2 and [e.heading for e in page.timeline][-1] == "Chapter 2"
    assert {e.label for e in page.graph.edges} == {"FRIEND_OF", "LOCATED_IN", "OWNS"}
    assert _edge(page, "FRIEND_OF", "Mara Quill").spans == [(1, None)]
    assert _card(page, "Ilse Marrow").statuses == []
    assert [q.chapter for q in page.quality] == [1, 2]
    assert "drowned" not in render_codex(page)
    bible = build_novel_codex(store, tmp_path, as_of=0)
    assert {c.name for s in bible.sections for c in s.cards} == {
        "Mara Quill",
        "Tobias Venn",
        "Gull Rock",
    }
    assert [e.heading for e in bible.timeline] == ["Story bible"]


#: Relationship types as extraction gives them: a sentence in capitals with underscores, one
#: in camel case, one in plain words.
LONG_TYPES = (
    "LOVES_HER_BROTHER_BUT_RESENTS_HIS_SUCCESS_AT_SEA",
    "secretlyOwesHimTheDeedToTheLighthouseOnTheReef",
    "swore on the drowned letter to keep him from the caves",
)


def _cut_at_a_word_break(caption: str, full: str) -> bool:
    """`caption` is `full` cut at a word break: a prefix of it, then the ellipsis, and what
    follows the prefix in `full` starts a new word."""
    kept = caption.removesuffix(ELLIPSIS)
    rest = full[len(kept) :]
    return (
        caption.endswith(ELLIPSIS)
        and full.startswith(kept)
        and (rest[:1] in (" ", "_", "-") or (kept[-1:].islower() and rest[:1].isupper()))
    )


def test_a_long_relationship_type_is_cut_at_a_word_break_and_a_short_one_kept() -> None:
    captions = [shorten_label(t) for t in LONG_TYPES]
    assert captions == [
        "LOVES_HER_BROTHER_BUT_RESENTS_HIS\u2026",
        "secretlyOwesHimTheDeedToTheLighthouseOn\u2026",
        "swore on the drowned letter to keep him\u2026",
    ]
    assert all(
        len(c) <= CAPTION_LIMIT and _cut_at_a_word_break(c, t)
        for c, t in zip(captions, LONG_TYPES, strict=True)
    )
    # The look-alikes: a type of exactly the limit, and the short ones, are drawn as they are.
    exact = "KNOWS_THE_KEEPER_OF_THE_LIGHT_ON_THE_REE"
    assert len(exact) == CAPTION_LIMIT and shorten_label(exact) == exact
    assert [relationship_caption(t, None) for t in ("FRIEND_OF", "LOCATED_IN")] == [
        "FRIEND_OF",
        "LOCATED_IN",
    ]
    assert relationship_caption("RELATES_TO", "mentor of") == "RELATES_TO (mentor of)"
    # A long RELATES_TO is drawn with the model's words, not the catch-all type.
    assert relationship_caption("RELATES_TO", LONG_TYPES[2]) == captions[2]
    assert (
        relationship_caption("RELATES_TO", "sworn to guard the heir of Gull Rock")
        == "sworn to guard the heir of Gull Rock"
    )
    # One word past the limit has no break to cut at: it is cut inside, still within the limit.
    assert shorten_label("X" * 60) == "X" * (CAPTION_LIMIT - 1) + ELLIPSIS
    assert shorten_label("line\nbreak  inside") == "line break inside"  # the canvas draws one line


def test_the_graph_draws_a_short_caption_and_keeps_the_full_type_for_the_panel(
    store: GraphStore, tmp_path: Path
) -> None:
    write_story(store)
    store.commit_chapter(
        ChapterDelta(
            chapter=4,
            title="Debts",
            relationships=[
                Relationship(
                    source="Mara Quill",
                    target="Tobias Venn",
                    type=t,
                    scene=1,
                    quote=f"She knew: {t}.",
                )
                for t in LONG_TYPES
            ],
        )
    )
    page = build_novel_codex(store, tmp_path)
    edges = {e.events[0].quote: e for e in page.graph.edges}
    for long_type in LONG_TYPES:
        edge = edges[f"She knew: {long_type}."]
        assert edge.label == f"RELATES_TO ({long_type})"  # the full type, for hover and click
        assert len(edge.caption) <= CAPTION_LIMIT and _cut_at_a_word_break(edge.caption, long_type)
    assert _edge(page, "FRIEND_OF", "Mara Quill").caption == "FRIEND_OF"
    data = json.loads(
        re.search(
            r'id="codex-data">(.*?)</script>',
            render_codex(page),  # type: ignore[union-attr]
            re.DOTALL,
        ).group(1)
    )
    shown = {e["label"]: e["caption"] for e in data["graph"]["edges"]}
    assert {f"RELATES_TO ({t})" for t in LONG_TYPES} <= set(shown)
    assert max(len(c) for c in shown.values()) <= CAPTION_LIMIT


def test_a_chapter_title_the_model_numbered_is_shown_once_numbered(
    store: GraphStore, tmp_path: Path
) -> None:
    write_story(store)
    store.commit_chapter(ChapterDelta(chapter=4, title="Chapter 1 (The Debt)"))
    store.commit_chapter(ChapterDelta(chapter=5, title="Chapter 5"))
    page = build_novel_codex(store, tmp_path)
    timeline = {e.heading: e.title for e in page.timeline}
    # As the chapter files head them: "Chapter 4: The Debt", "Chapter 5".
    assert (timeline["Chapter 4"], timeline["Chapter 5"]) == ("The Debt", "")
    assert timeline["Chapter 1"] == "The Letter"  # a title of its own, as it was
    html = render_codex(page)
    assert "<h3>Chapter 4: The Debt</h3>" in html and "<h3>Chapter 5</h3>" in html


def test_the_html_is_self_contained_deterministic_and_escapes_the_story(
    store: GraphStore, tmp_path: Path
) -> None:
    write_story(store)
    hostile = "</script><script>alert('x')</script> & <b>bold</b>"
    store.commit_chapter(
        ChapterDelta(
            chapter=4,
            title="<i>Tags</i>",
            entities=[Entity(label="Character", name="Mara Quill", sources=[_src(4, 1, hostile)])],
            relationships=[
                Relationship(source="Mara Quill", target="Tobias Venn", type="KNOWS", quote=hostile)
            ],
        )
    )
    page = build_novel_codex(store, tmp_path)
    html = render_codex(page)
    assert html == render_codex(
        build_novel_codex(store, tmp_path)
    )  # the same graph, the same bytes
    assert (
        html.count("<script") == 3
        and "alert('x')</script>" not in html
        and "<b>bold</b>" not in html
    )
    assert "&lt;/script&gt;&lt;script&gt;alert(" in html and "&lt;i&gt;Tags&lt;/i&gt;" in html
    data = json.loads(re.search(r'id="codex-data">(.*?)</script>', html, re.DOTALL).group(1))  # type: ignore[union-attr]
    assert hostile in json.dumps(data, ensure_ascii=False)  # the data keeps the text exactly
    # Nothing is fetched: no src or href leaves the file, and the page's policy forbids it.
    markup = re.sub(r"<script.*?</script>", "", html, flags=re.DOTALL)
    assert len(re.findall(r"\b(?:src|href)=", markup)) == len(re.findall(r'\bhref="#', markup)) > 0
    assert "default-src 'none'" in html
    assert LIBRARY.read_text(encoding="utf-8") in html and LIBRARY_NAME in html
    out = tmp_path / "exports" / "codex.html"
    assert (
        write_codex(page, out) is True and write_codex(page, out) is False
    )  # unchanged: not rewritten


def test_the_vendored_graph_library_is_the_locked_release() -> None:
    lock = json.loads((ASSETS / "package-lock.json").read_text(encoding="utf-8"))
    version = lock["packages"]["node_modules/cytoscape"]["version"]
    assert json.loads((ASSETS / "package.json").read_text())["dependencies"]["cytoscape"] == version
    assert f"Cytoscape.js {version}" in LIBRARY_NAME and f'"{version}"' in LIBRARY.read_text(
        encoding="utf-8"
    )
    installed = ASSETS / "node_modules" / "cytoscape" / "dist" / "cytoscape.min.js"
    if not installed.exists():
        pytest.skip(
            "tools/codex-assets is not installed (npm ci --prefix tools/codex-assets; .ci/run does it)"
        )
    assert installed.read_bytes() == LIBRARY.read_bytes(), (
        "kg/codex/assets differs from the locked release: run make vendor-codex"
    )


@pytest.mark.usefixtures("prefect_api")
def test_qa_marks_its_findings_in_the_codex_and_the_run_links_to_it(
    store: GraphStore, graph_settings: Settings
) -> None:
    from flows.maintenance import qa_flow

    seed_story(store)
    plant_qa_problems(store)
    rt = set_runtime(Runtime(graph_settings))
    try:
        report = qa_flow(str(graph_settings.project_dir))
    finally:
        rt.close()
    codex = graph_settings.project_dir / "exports" / "codex.html"
    html = codex.read_text(encoding="utf-8")
    assert f"{len(report.findings)} findings</a>, marked below" in html
    findings = re.search(r'<section id="findings">(.*?)</section>', html, re.DOTALL).group(1)  # type: ignore[union-attr]
    assert findings.count('<li class="sev-') == len(report.findings) == 8
    assert "dead_character_acting" in findings and "Old Captain is dead from chapter 3" in findings
    mary = re.search(
        r'<article class="card kind-character flagged" id="([^"]+)" data-entity-id="'
        + re.escape(MARY)
        + '">(.*?)</article>',
        html,
        re.DOTALL,
    )
    assert mary and "is both &#39;brave&#39; and &#39;cowardly&#39;" in mary.group(2)
    chapter5 = re.search(
        r'<li class="chapter flagged" id="ch-5".*?(?=<li class="chapter|</ol>\n</section>)',
        html,
        re.DOTALL,
    )
    assert chapter5 and "Old Captain is dead" in chapter5.group(0)
    data = json.loads(re.search(r'id="codex-data">(.*?)</script>', html, re.DOTALL).group(1))  # type: ignore[union-attr]
    assert next(n for n in data["graph"]["nodes"] if n["id"] == MARY)["flagged"] is True
    assert artifact_keys("codex") == {"codex"}


# --- The command --------------------------------------------------------------------------------


def test_kg_codex_writes_the_file_and_refuses_bad_requests_in_one_line(
    store: GraphStore, graph_settings: Settings, tmp_path: Path
) -> None:
    env = graph_env(graph_settings)
    shown = run_module("kg", "codex", "--help", env=env)
    assert (
        shown.returncode == 0
        and "--as-of-chapter" in shown.stdout
        and "--conversation-id" in shown.stdout
    )
    assert "codex" in run_module("kg", "--help", env=env).stdout
    project = tmp_path / "book"
    project.mkdir()
    empty = run_module("kg", "codex", "--project-dir", str(project), env=env)
    assert empty.returncode == 2 and empty.stderr.strip().splitlines()[-1].startswith(
        f"kg: error: the graph of {project} holds no story yet"
    )
    assert not (project / "exports").exists()
    write_story(store)
    made = run_module("kg", "codex", "--project-dir", str(project), env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.startswith(
        "codex of 'The Drowned Letter' as of chapter 3 (6 entities, 5 relationships) "
        f"written to {project / 'exports' / 'codex.html'}"
    )
    latest = (project / "exports" / "codex.html").read_bytes()
    past = run_module("kg", "codex", "--project-dir", str(project), "--as-of-chapter", "1", env=env)
    assert past.returncode == 0, past.stderr[-2000:]
    assert past.stdout.startswith("codex of 'The Drowned Letter' as of chapter 1 (") and (
        f"written to {project / 'exports' / 'codex-chapter-001.html'}" in past.stdout
    )
    # The project's own codex, kept at the latest chapter by every run, is left as it was.
    assert (project / "exports" / "codex.html").read_bytes() == latest
    for args, message in (
        (("--as-of-chapter", "-1"), "kg: error: --as-of-chapter must be 0 or more (got -1)"),
        (
            ("--as-of-chapter", "7"),
            "kg: error: --as-of-chapter 7 is past the book: the graph holds chapters 1-3",
        ),
        (
            ("--conversation-id", "c1", "--as-of-chapter", "1"),
            "kg: error: --as-of-chapter is for a book",
        ),
        (
            ("--conversation-id", "nobody-here"),
            "kg: error: conversation 'nobody-here' has no memory in this graph",
        ),
        (("--out", str(tmp_path)), f"kg: error: --out {tmp_path} is a directory"),
    ):
        refused = run_module("kg", "codex", "--project-dir", str(project), *args, env=env)
        assert refused.returncode == 2, (args, refused.stderr[-1000:])
        assert refused.stderr.strip().splitlines()[-1].startswith(message), refused.stderr[-1000:]
    missing = run_module("kg", "codex", "--project-dir", str(tmp_path / "nope"), env=env)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


# --- The sidecar ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locomo_26(
    graph_settings: Settings, prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, dict]]:
    """locomo-26 ingested with --extract (every turn through the sidecar's pipeline and the
    commit gate) against the scripted server, through the real CLI."""
    conversation = f"locomo-26-{uuid.uuid4().hex[:6]}"
    project = tmp_path_factory.mktemp("sidecar")
    with ScriptedLLM() as llm:
        DialogueScript(participants("locomo-26")).install(llm)
        env = graph_env(
            graph_settings,
            OPENAI_BASE_URL=llm.base_url,
            OPENAI_API_KEY="test-key",
            SKALD_EMBEDDING_BASE_URL=llm.base_url,
            **prefect_api_env(),
        )
        done = run_module(
            "flows.dialogue",
            "ingest",
            "--project-dir",
            str(project),
            "--dialogue",
            str(DIALOGUES_DIR / "locomo-26.turns.jsonl"),
            "--conversation-id",
            conversation,
            "--extract",
            env=env,
            timeout=1800,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        yield conversation, project, {**env, "report": done.stdout}


def test_the_sidecar_codex_shows_a_conversations_entities_relations_and_milestones(
    locomo_26: tuple[str, Path, dict], graph_settings: Settings, tmp_path: Path
) -> None:
    conversation, project, env = locomo_26
    report = json.loads(env.pop("report"))[0]
    assert report["turns"] == 419 and report["extract_outcomes"].get("COMMITTED", 0) > 300
    out = tmp_path / "conversation.html"
    made = run_module(
        "kg",
        "codex",
        "--project-dir",
        str(project),
        "--conversation-id",
        conversation,
        "--out",
        str(out),
        env=env,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.startswith(f"codex of Conversation {conversation}: ")
    store = GraphStore.open(graph_settings)
    try:
        page = build_dialogue_codex(store, conversation)
    finally:
        store.close()
    assert {n.name for n in page.graph.nodes} == {"Caroline", "Melanie"}
    assert {s.title for s in page.sections} == {"Characters"}
    # One drawn line per (who, type, whom), each way; a relation ended and begun again keeps
    # its spells on that line.
    assert sorted(e.label for e in page.graph.edges) == [
        "FRIEND_OF",
        "FRIEND_OF",
        "TRUSTS",
        "TRUSTS",
    ]
    for friends in (e for e in page.graph.edges if e.label == "FRIEND_OF"):
        assert (
            friends.spans[-1][1] is None and friends.ended_by is None
        )  # EVOLVE keeps it, turn after turn
        assert len(friends.events) > 50 and all(ev.quote for ev in friends.events)
        assert friends.events[0].what.startswith("EVOLVE FRIEND_OF") and friends.weight is not None
    trust = [e for e in page.graph.edges if e.label == "TRUSTS"]
    assert all(
        len(e.spans) > 1 for e in trust
    )  # trust given (REPLACE), doubted (DELETE), given again
    ended = [item for e in page.timeline for item in e.ended_relationships]
    assert (
        ended
        and all(
            i.text.endswith("TRUSTS Melanie ended") or i.text.endswith("TRUSTS Caroline ended")
            for i in ended
        )
        and all(i.quote for i in ended)
    )
    assert any(ev.what.startswith("DELETE TRUSTS") for e in trust for ev in e.events)
    milestones = [m for e in page.timeline for m in e.milestones]
    assert len(milestones) >= 10 and all(m.quote for m in milestones)
    html = out.read_text(encoding="utf-8")
    assert (
        "Caroline" in html
        and "Melanie" in html
        and html.count('<li class="turn') == len(page.timeline)
    )
    if chromium_path() is None:
        return  # the browser part runs where Chromium is (tests/kg/test_codex_browser.py says so when it skips)
    with open_page(out, ready="document.documentElement.dataset.codexReady === 'true'") as (
        browser,
        seen,
    ):
        names = browser.evaluate("window.codex.cy.nodes().map(n => n.data('name')).sort()")
        shown = browser.evaluate("window.codex.cy.edges().filter(e => !e.hasClass('off')).length")
    assert names == ["Caroline", "Melanie"] and shown == len(page.graph.edges)
    assert seen.page_errors == [] and seen.console_errors == [] and seen.network == []


def test_codex_rewrites_are_spaced_so_a_long_book_pays_a_flat_cost() -> None:
    # A short book: after every chapter.
    assert all(codex_due(n, 100) for n in range(1, 21))
    # Past 20 chapters: every ceil(n/20) chapters, so about 20 rewrites of the whole-book page
    # per 20 chapters written whatever the book's length (the page grows with n; 1/k shrinks).
    assert [n for n in range(21, 41) if codex_due(n, 100)] == list(range(22, 41, 2))
    assert [n for n in range(81, 101) if codex_due(n, 100)] == [85, 90, 95, 100]
    cost = sum(n for n in range(81, 101) if codex_due(n, 100)) / 20  # page size written per chapter
    early = sum(n for n in range(1, 21) if codex_due(n, 100)) / 20
    assert cost <= 2 * early
    # The look-alike: the last chapter of a run is always written, due or not.
    assert not codex_due(83, 100) and codex_due(83, 83)
