"""The benchmarks as published: LoCoMo's `locomo10.json` layout and LongMemEval's JSON, read by
`flows.regression` directly (tasks/dialogue/benchmarks.py).

The files in tests/data/ were written for these tests in each layout (the dialogue text is
ours, not the benchmarks'): `locomo-mini.json` holds one LoCoMo sample, and
`locomo-901.turns.jsonl` + `.qa.jsonl` hold the same dialogue in the converted JSONL layout of
../shared/data/dialogues. `longmemeval-mini.json` holds three LongMemEval instances, one of
them an abstention question.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from core.cli import run_main
from core.errors import InvalidInputError
from core.settings import Settings
from core.timex import parse_when
from flows.regression import main as regression_main
from tasks.dialogue.benchmarks import detect_layout, load_dialogues
from tasks.dialogue.ingest import memory_rows
from tasks.dialogue.models import ChatMessage
from tasks.dialogue.replay import distinct_sessions, load_dialogue, session_recall
from tasks.dialogue.report import recall_headline
from tasks.dialogue.retriever import memory_row
from tests.conftest import REPO_ROOT, child_pythonpath
from tests.support.cli import graph_vars
from tests.support.scripted_llm import ScriptedLLM

DATA = REPO_ROOT / "tests" / "data"
LOCOMO_JSON = DATA / "locomo-mini.json"
LOCOMO_JSONL = DATA / "locomo-901.turns.jsonl"
LONGMEMEVAL_JSON = DATA / "longmemeval-mini.json"


def test_a_locomo_sample_reads_as_the_converted_jsonl_dialogue() -> None:
    [spec] = load_dialogues(LOCOMO_JSON)
    converted = load_dialogue(LOCOMO_JSONL)
    assert spec.dialogue_id == converted.dialogue_id == "locomo-901"
    assert [t.model_dump() for t in spec.turns] == [t.model_dump() for t in converted.turns]
    assert [q.model_dump() for q in spec.qa] == [q.model_dump() for q in converted.qa]
    captioned = [t for t in spec.turns if t.image_caption]
    assert [t.dia_id for t in captioned] == [
        "D1:3",
        "D3:3",
    ]  # blip_caption kept, img_url and query not
    adversarial = next(q for q in spec.qa if q.category == 5)
    assert adversarial.answer == "film music"  # LoCoMo calls it adversarial_answer
    assert load_dialogues(LOCOMO_JSON, max_turns=7)[0].turns[-1].dia_id == "D2:1"


def test_a_longmemeval_instance_is_one_session_scored_dialogue() -> None:
    specs = load_dialogues(LONGMEMEVAL_JSON)
    assert [s.dialogue_id for s in specs] == [
        "longmemeval-q-cello",
        "longmemeval-q-trips",
        "longmemeval-q-dentist_abs",
    ]
    trips = specs[1]
    assert trips.scoring == "session" and len(trips.turns) == 16
    assert {t.speaker for t in trips.turns} == {"user", "assistant"}
    assert (
        trips.turns[4].dia_id == "answer_trip_1_1" and trips.turns[4].session_id == "answer_trip_1"
    )
    assert trips.turns[4].session_time == "2023/05/11 (Wed) 09:11"
    [question] = trips.qa
    assert question.evidence_sessions == ["answer_trip_1", "answer_trip_2"]
    assert question.evidence == ["answer_trip_1_1", "answer_trip_2_1"]  # the has_answer turns
    assert question.question_type == "multi-session" and not question.abstention
    assert question.asked_on == "2023/06/01 (Thu) 10:00"  # its relative dates count from it
    assert specs[2].qa[0].abstention and specs[2].qa[0].evidence_sessions == []


def test_session_recall_counts_distinct_sessions_as_longmemeval_does() -> None:
    session_of = {"a_1": "a", "a_2": "a", "b_1": "b", "c_1": "c", "d_1": "d"}
    # Three turns of one session take one of the k places, not three.
    ranked = distinct_sessions(["a_1", "a_2", "a_1", "b_1", "c_1", "d_1"], session_of)
    assert ranked == ["a", "b", "c", "d"]
    assert session_recall(ranked, ["c"], 3) == (1.0, 1.0)
    assert session_recall(ranked, ["c", "d"], 3) == (1.0, 0.0)  # any, not all
    assert session_recall(ranked, ["d"], 3) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"turns": []}]', "in no layout Skald reads"),
        ('{"conversation": {}, "qa": [{"question": "q"}]}', "record 0: sample_id: Field required"),
        (
            '[{"sample_id": "conv-1", "conversation": {"session_1": [{"speaker": "A", "dia_id": "D1:1"}]}, "qa": []}]',
            "sample conv-1, session_1.0: text: Field required",
        ),
        (
            '[{"question_id": "x", "question": "q", "haystack_sessions": [[{"role": "user"}]], '
            '"haystack_session_ids": ["s"], "haystack_dates": ["d"]}]',
            "haystack_sessions.0.0.content: Field required",
        ),
        ("[1, 2", "is not valid JSON"),
    ],
)
def test_a_file_in_no_layout_stops_with_one_line_naming_it(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bench.json"
    path.write_text(content)
    with pytest.raises(InvalidInputError) as raised:
        load_dialogues(path)
    assert (
        message in str(raised.value)
        and str(path) in str(raised.value)
        and "\n" not in str(raised.value)
    )


def test_a_file_saved_with_a_byte_order_mark_reads_as_without_one(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    for source in (LOCOMO_JSONL, LOCOMO_JSON):
        marked = tmp_path / source.name
        marked.write_bytes(bom + source.read_bytes())
        if source == LOCOMO_JSONL:
            qa = source.with_name(source.name.replace(".turns.", ".qa."))
            marked.with_name(qa.name).write_bytes(bom + qa.read_bytes())
        (plain,), (read,) = load_dialogues(source), load_dialogues(marked)
        assert read.turns == plain.turns and read.qa == plain.qa and read.turns


def test_a_malformed_turn_line_names_its_line_and_where_the_format_is_told(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.turns.jsonl"
    path.write_text(
        '{"conversation_id": "c", "turn_id": 1, "speaker": "Ilse", "text": "Hi"}\n'
        '{"conversation_id": "c", "turn_id": 2, "text": "Hello"}\n'
    )
    with pytest.raises(InvalidInputError) as raised:
        load_dialogues(path)
    line = str(raised.value)
    assert f"{path}:2: speaker: Field required" in line and "\n" not in line, line
    assert "'Transcripts as JSONL turns' in Skald's README.md" in line, line


def test_a_transcript_with_a_turn_id_twice_or_a_second_conversation_is_refused_by_its_line(
    tmp_path: Path,
) -> None:
    def line(conversation: str, turn: int, text: str) -> str:
        return json.dumps(
            {"conversation_id": conversation, "turn_id": turn, "speaker": "Ilse", "text": text}
        )

    path = tmp_path / "chat.turns.jsonl"
    for lines, said in (
        (
            [line("c", 1, "Hi"), line("c", 2, "I moved to Porto."), "", line("c", 2, "Lisbon.")],
            f"{path}:4: turn_id 2 again (first on line 2)",
        ),
        (
            [line("c", 1, "Hi"), line("d", 2, "Hello")],
            f"{path}:2: conversation_id 'd' is not the file's 'c' (line 1)",
        ),
    ):
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(InvalidInputError) as raised:
            load_dialogues(path)
        assert str(raised.value).startswith(said + " ("), str(raised.value)
    # The look-alike: turn ids in any order, each once, one conversation.
    path.write_text("\n".join([line("c", 3, "Hi"), line("c", 1, "Hello"), line("c", 2, "Bye")]))
    assert [t.turn_id for t in load_dialogues(path)[0].turns] == [3, 1, 2]


def test_a_turn_without_a_time_is_dated_by_its_session_and_never_by_the_import(
    tmp_path: Path,
) -> None:
    rows = [
        {"session": 1, "session_time": "1:56 pm on 8 May, 2023"},
        {"session": 1},
        {"session": 2},  # its session is dated by a later turn
        {"session": 2, "session_time": "9:00 am on 20 May, 2023"},
        {"session": 1, "session_time": "2:30 pm on 8 May, 2023"},
        {"session": 1},  # the latest time its session gave before it
        {},  # no session: the turn before it
        {"session": 3},  # a session no turn dates: undated still
    ]
    path = tmp_path / "chat.turns.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"conversation_id": "c", "turn_id": i, "speaker": "Ilse", "text": "Hi", **row}
            )
            + "\n"
            for i, row in enumerate(rows, start=1)
        )
    )
    (spec,) = load_dialogues(path)
    assert [t.session_time for t in spec.turns] == [
        "1:56 pm on 8 May, 2023",
        "1:56 pm on 8 May, 2023",
        "9:00 am on 20 May, 2023",
        "9:00 am on 20 May, 2023",
        "2:30 pm on 8 May, 2023",
        "2:30 pm on 8 May, 2023",
        "2:30 pm on 8 May, 2023",
        None,
    ]
    # Remembered so (`flows.dialogue ingest`), the turn no time reaches stays undated: dated
    # when stored, an old chat log's "yesterday" became the day before its import.
    rows = memory_rows(spec, "c")
    assert [r.when for r in rows] == [t.session_time or "" for t in spec.turns]
    assert rows[-1].group == "session 3"
    # The look-alike: a turn being said now, without a time from its front end, is dated now.
    before = datetime.now(UTC).date()
    live = memory_row("c", "c:9", "9", [ChatMessage(role="user", name="Ilse", content="Hi")])
    assert parse_when(live.when) in {before, datetime.now(UTC).date()}  # a midnight between


def test_the_layout_is_read_from_the_file_not_its_name() -> None:
    assert detect_layout(LOCOMO_JSON, json.loads(LOCOMO_JSON.read_text())) == "locomo"
    assert (
        detect_layout(LONGMEMEVAL_JSON, json.loads(LONGMEMEVAL_JSON.read_text())) == "longmemeval"
    )


@pytest.fixture()
def regression_env(graph_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The session's graph, and embeddings from the scripted server (these tests compare
    layouts, not the sentence model)."""
    with ScriptedLLM() as scripted:
        for name, value in {
            **graph_vars(graph_settings),
            "PYTHONPATH": child_pythonpath(),
            "SKALD_EMBEDDING_BASE_URL": scripted.base_url,
        }.items():
            monkeypatch.setenv(name, value)
        yield


def _ingest(
    project: Path, dialogues: Path, run_id: str, *extra: str
) -> tuple[int, dict, pl.DataFrame]:  # type: ignore[type-arg]
    with pytest.raises(SystemExit) as exited:
        run_main(
            regression_main,
            "regression",
            [
                "--project-dir",
                str(project),
                "--dialogues",
                str(dialogues),
                "--mode",
                "ingest",
                "--run-id",
                run_id,
                *extra,
            ],
        )
    out = project / ".saga" / "regression" / run_id
    return (
        int(exited.value.code or 0),
        json.loads((out / "summary.json").read_text()),
        pl.read_parquet(out / "recall.parquet"),
    )


def test_the_batch_gives_the_same_recall_on_locomo_json_as_on_its_jsonl(
    regression_env: None,
    prefect_api: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code_json, published, probe_json = _ingest(
        tmp_path / "a", LOCOMO_JSON, "published", "--no-recall-gate"
    )
    code_jsonl, converted, probe_jsonl = _ingest(
        tmp_path / "b", LOCOMO_JSONL, "converted", "--no-recall-gate"
    )
    assert code_json == code_jsonl == 0
    assert published["recall_at_k"] == converted["recall_at_k"]
    assert published["recall_at_k"]["10"]["all"] is not None
    assert published["questions"] == converted["questions"]
    assert published["questions"]["probed"] == 6  # 7 items, one without evidence
    assert published["questions"]["skipped"] == {"locomo-901": {"no evidence listed": 1}}
    columns = [
        "dialogue_id",
        "category",
        "question",
        "evidence",
        "retrieved",
        "recall_at_5",
        "recall_at_10",
    ]
    assert probe_json.select(columns).equals(probe_jsonl.select(columns))
    assert published["session_recall_at_k"] is None
    assert "recall@10 categories 1-4:" in capsys.readouterr().out
    # The run's one-line headline (its log and its Prefect artifact) names LoCoMo's figures only.
    headline = recall_headline(probe_json)
    assert headline.startswith("recall@10 (categories 1-4) ") and "session" not in headline
    report = (tmp_path / "a" / ".saga" / "regression" / "published" / "report.md").read_text()
    assert "- recall@10 over categories 1-4: " in report and "## Recall per category" in report
    assert "Session recall" not in report


def test_a_longmemeval_file_is_scored_as_session_recall_and_gated_on_it(
    regression_env: None,
    prefect_api: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, summary, probe = _ingest(tmp_path, LONGMEMEVAL_JSON, "lme", "--min-recall", "0.5")
    out = capsys.readouterr().out
    sessions = summary["session_recall_at_k"]
    assert sessions["questions"] == 2 and probe.height == 2
    assert summary["questions"]["skipped"]["longmemeval-q-dentist_abs"] == {
        "abstention question (no evidence by design; LongMemEval skips it too)": 1
    }
    # Haystacks of four sessions: every session is among the first 5 distinct ones.
    assert sessions["5"] == {
        "any": 1.0,
        "all": 1.0,
        "by_type": {"multi-session": 1.0, "single-session-user": 1.0},
    }
    trips = probe.filter(pl.col("dialogue_id") == "longmemeval-q-trips").row(0, named=True)
    assert sorted(trips["retrieved_sessions"]) == [
        "answer_trip_1",
        "answer_trip_2",
        "s_garden",
        "s_tax",
    ]
    assert summary["recall_at_k"]["10"]["all"] is None  # no LoCoMo categories in this run
    # ... so its headline is LongMemEval's session recall, not LoCoMo's figures as "None".
    assert recall_headline(probe) == "session recall@10 (LongMemEval) 1.0, recall@5 1.0"
    gates = pl.read_parquet(tmp_path / ".saga" / "regression" / "lme" / "gates.parquet")
    assert "session recall_any@10 (LongMemEval)" in gates["gate"].to_list()
    assert code == 0 and "session recall@10 (LongMemEval, 2 questions): any 1.0, all 1.0" in out
    report = (tmp_path / ".saga" / "regression" / "lme" / "report.md").read_text()
    assert "## Session recall per question type" in report and "| multi-session | 1 |" in report
    assert "categories 1-4" not in report and "None" not in report


def _audit_folder(folder: Path) -> Path:
    """An evidence audit of locomo-901 in the layout of dial481/locomo-audit's audit/ folder."""
    qa = [json.loads(line) for line in LOCOMO_JSONL.with_name("locomo-901.qa.jsonl").open()]
    every_turn = [json.loads(line)["dia_id"] for line in LOCOMO_JSONL.open()]

    def entry(number: int, question: str, correct: list[str]) -> dict[str, object]:
        return {
            "question_id": f"locomo_0_qa{number}",
            "question": question,
            "golden_answer": "-",
            "category": qa[number]["category"],
            "error_type": "WRONG_CITATION",
            "cited_evidence": qa[number]["evidence"],
            "correct_evidence": correct,
            "reasoning": "-",
        }

    folder.mkdir()
    entries = [
        # Re-cited: every turn of the dialogue, so recall@10 is 10/16 whatever the ranking.
        entry(0, qa[0]["question"].upper(), every_turn),
        # Disputed, not re-cited: the same turns; a turn the dialogue does not have.
        entry(1, qa[1]["question"], list(reversed(qa[1]["evidence"]))),
        entry(4, qa[4]["question"], ["D9:1"]),
        # Neither: another question's words under this number.
        entry(2, qa[3]["question"], every_turn),
    ]
    (folder / "errors_conv_0.json").write_text(json.dumps(entries), encoding="utf-8")
    return folder


def test_the_batch_scores_recall_against_an_evidence_audit_beside_the_published_evidence(
    regression_env: None,
    prefect_api: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    audit = str(_audit_folder(tmp_path / "audit"))
    runs = {
        layout: _ingest(tmp_path / layout, path, layout, "--evidence-audit", audit)
        for layout, path in (("jsonl", LOCOMO_JSONL), ("json", LOCOMO_JSON))
    }
    code, summary, probe = runs["jsonl"]
    assert code == 0
    rows = {row["question"]: row for row in probe.iter_rows(named=True)}
    qa = [json.loads(line) for line in LOCOMO_JSONL.with_name("locomo-901.qa.jsonl").open()]
    first = rows[qa[0]["question"]]
    assert len(first["audited_evidence"]) == 16 and first["audit_error"] == "WRONG_CITATION"
    assert (first["audited_recall_at_5"], first["audited_recall_at_10"]) == (5 / 16, 10 / 16)
    # The look-alikes keep the published evidence and its recall.
    for number in (1, 2, 3, 4):
        row = rows[qa[number]["question"]]
        assert row["audited_evidence"] is None
        assert row["audited_recall_at_10"] == row["recall_at_10"]
        assert (row["audit_error"] is not None) == (number in (1, 4))
    audited = summary["evidence_audit"]
    assert (audited["folder"], audited["disputed"], audited["recited"]) == (audit, 3, 1)
    main = probe.filter(pl.col("category") <= 4)
    assert audited["recall_at_k"]["10"]["all"] == round(main["audited_recall_at_10"].mean(), 4)
    assert audited["recall_at_k"]["10"]["all"] != summary["recall_at_k"]["10"]["all"]
    # The gate stays on the published evidence.
    gates = pl.read_parquet(tmp_path / "jsonl" / ".saga" / "regression" / "jsonl" / "gates.parquet")
    recall_gate = gates.filter(pl.col("gate").str.starts_with("recall@10")).row(0, named=True)
    assert recall_gate["value"] == summary["recall_at_k"]["10"]["all"]
    out = capsys.readouterr().out
    assert (
        f"against the evidence audit (3 questions disputed, 1 re-cited): recall@10 "
        f"{audited['recall_at_k']['10']['all']}"
    ) in out
    report = (tmp_path / "jsonl" / ".saga" / "regression" / "jsonl" / "report.md").read_text()
    at_10 = audited["recall_at_k"]["10"]
    assert (
        f"- against the evidence audit in `{audit}` (3 questions of categories 1-4 disputed, 1 "
        f"re-cited): recall@10 {at_10['all']} (multi-hop {at_10['1']}, temporal {at_10['2']}, "
        f"open-domain {at_10['3']}, single-hop {at_10['4']}); recall@5: "
    ) in report
    assert recall_headline(probe) == (
        f"recall@10 (categories 1-4) {summary['recall_at_k']['10']['all']}, recall@5 "
        f"{summary['recall_at_k']['5']['all']}; against the evidence audit recall@10 "
        f"{at_10['all']}"
    )
    # LoCoMo's JSON finds the same questions by their place in the sample's qa list.
    _, published, probe_json = runs["json"]
    assert published["evidence_audit"]["recall_at_k"] == audited["recall_at_k"]
    columns = ["question", "audit_error", "audited_evidence", "audited_recall_at_10"]
    assert probe_json.select(columns).equals(probe.select(columns))


def test_an_evidence_audit_outside_ingest_mode_or_not_an_audit_is_refused_in_one_line(
    regression_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = _audit_folder(tmp_path / "audit")
    for mode, folder, says in (
        ("replay", audit, "evidence_audit scores the ingest mode's probe"),
        ("ingest", tmp_path, "no errors_conv_*.json files"),
    ):
        with pytest.raises(SystemExit) as exited:
            run_main(
                regression_main,
                "regression",
                [
                    "--project-dir",
                    str(tmp_path / "p"),
                    "--dialogues",
                    str(LOCOMO_JSONL),
                    "--mode",
                    mode,
                    "--evidence-audit",
                    str(folder),
                ],
            )
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "p" / ".saga").exists()  # refused before anything was written
