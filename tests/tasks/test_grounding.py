"""Grounding: names that are names, quotes that are in the text, facts the text supports.

Every rule has its true case and the look-alike that must pass (core/grounding.py,
tasks/grounding.py), and the text-cutting helpers never leave half a word or sentence
(core/sentences.py).
"""

from __future__ import annotations

import pytest

from core.grounding import (
    KnownNames,
    SourceText,
    distinct_texts,
    name_problem,
    normalise,
    title_problem,
    usable_title,
)
from core.llm.schemas import bounded_response_format_for, mend_cut_strings
from core.sentences import (
    as_sentence,
    clip_to_sentence,
    ends_sentence,
    finish_cut_text,
    tail_from_sentence,
)
from prompts.initialization.models import ChapterOutline, CharacterSheets
from prompts.knowledge.models import SceneExtraction
from prompts.narrative.models import SceneDetail
from tasks.grounding import ground_extraction
from tasks.planning import tidy_outline, tidy_plan

TITLES = (
    "The Great Sinking: Lighthouse Keeper's Tale",
    "Chapter 1: Aria's Journey Begins",
    "The Drowned Letter",
)


# --- names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Loca-Lina-Lina-Lina-Lina-Lina-Lina-Ll-", "cut short"),
        ("Loca-Lina-Lina-Lina", "repeated fragment"),
        ("LIGHTNIGHBELLE_LIGHTNIGHBELLE_LIGHTNIGH", "repeated fragment"),
        ("The Great Sinking Lighthouse Keeper's Ta", "words"),
        ("Aria's journey begins", "sentence"),
        ("Mara finds the letter", "sentence"),
        ("Aria, the keeper", "punctuation"),
        ("She ran. He hid", "punctuation"),
        ("Chapter 3", "heading"),
        ("## Harbor", "heading"),
        ("The Drowned Letter", "title"),
        ("Aria's Journey Begins", "title"),
        ("The Great Sinking Lighthouse", "title"),
        ("Luna_Luna12", "identifier"),
        ("Luna12", "identifier"),
    ],
)
def test_degenerate_names_are_refused(name: str, why: str) -> None:
    problem = name_problem(name, TITLES)
    assert problem is not None and why in problem, (name, problem)


@pytest.mark.parametrize(
    "name",
    [
        "Mary-Jane",
        "Jean-Luc Picard",
        "The Hollow Library",
        "Ilse's father",
        "Zoë Brontë",
        "Baden-Baden",
        "Dr. Venn",
        "J. R. Hale",
        "Church of Saint Mary of the Angels",
        "the old mill",
        "Gull Rock lighthouse",
        "Aria",  # a character named in the title of chapter 1 is still a character
        "R2-D2",
        "HAL 9000",
        "Louis XIV",
        "C-3PO",
    ],
)
def test_look_alike_names_pass(name: str) -> None:
    assert name_problem(name, TITLES) is None


def test_names_match_whole_words_case_and_accents_aside() -> None:
    source = SourceText("Zoë’s lamp flickered in the location. Captain Tobias Venn waited.")
    assert source.names("Zoe") and source.names("ZOË")
    assert not source.names("Locatio")  # a name cut short is no word of the text
    assert source.names("Tobias Venn") and source.names("Captain Tobias Venn")
    assert not source.names("Tobias Venner")


def test_known_names_are_referred_to_by_a_distinctive_word_or_alias() -> None:
    known = KnownNames([["Mara Quill", "the keeper"], ["Tobias Venn"]])
    source = SourceText("Quill slammed the door, and the keeper swore.")
    assert known.referred("Mara Quill", source) and known.referred("the keeper", source)
    assert not known.referred("Tobias Venn", source)
    assert not known.is_known("Mara")  # a part of a name is not the name


# --- quotes ------------------------------------------------------------------------------


TEXT = (
    "Mara Quill climbed the stairs of Gull Rock lighthouse. “It’s late,” Tobias said, and he "
    "handed her the letter. The lamp room smelled of paraffin."
)


def test_quotes_match_normalised_and_forgive_small_copy_errors() -> None:
    source = SourceText(TEXT)
    assert source.quote_problem("Mara Quill climbed the stairs of Gull Rock lighthouse") is None
    assert source.quote_problem('"It\'s late," Tobias said') is None  # straight for curly quotes
    assert (
        source.quote_problem("mara quill climbed the stair of gull rock lighthouse") is None
    )  # a slip
    assert (
        source.quote_problem("Mara Quill's lamp room smelled of paraffin") is not None
    )  # not what it says


def test_invented_or_empty_quotes_are_refused() -> None:
    source = SourceText(TEXT)
    assert "not in the text" in (
        source.quote_problem("Mara ran to the harbour with Tobias at dawn") or ""
    )
    assert source.quote_problem("") == "no quote"
    assert "shorter" in (source.quote_problem("Tobias said") or "")


# --- a scene's extraction ----------------------------------------------------------------


def _extraction(**parts: object) -> SceneExtraction:
    return SceneExtraction.model_validate(
        {"entities": [], "relationships": [], "status_changes": [], **parts}
    )


def test_grounding_drops_invented_names_made_up_quotes_and_titles() -> None:
    extraction = _extraction(
        entities=[
            {
                "name": "Mara Quill",
                "kind": "Character",
                "quote": "Mara Quill climbed the stairs",
                "traits": [
                    {"trait": "tired", "quote": "It's late, Tobias said"},
                    {"trait": "brave", "quote": "Mara faced the storm without fear"},
                ],
            },
            {"name": "Elise Marrow", "kind": "Character", "quote": "Elise Marrow waited below"},
            {
                "name": "The Drowned Letter",
                "kind": "Character",
                "quote": "he handed her the letter",
            },
            {"name": "Tobias", "kind": "Character", "quote": "Mara Quill climbed the stairs"},
        ],
        relationships=[
            {
                "source": "Tobias",
                "target": "Mara Quill",
                "type": "FRIEND_OF",
                "quote": "Tobias said, and he handed her the letter",
            },
            {
                "source": "Mara Quill",
                "target": "The Drowned Letter",
                "type": "FAMILY_OF",
                "quote": "he handed her the letter",
            },
            {
                "source": "Mara Quill",
                "target": "Gull Rock lighthouse",
                "type": "LOCATED_IN",
                "quote": "Mara Quill rested at Gull Rock lighthouse all night",
            },
        ],
        status_changes=[{"name": "Tobias", "status": "dead", "quote": "Tobias drowned in the bay"}],
    )
    grounded, report = ground_extraction(extraction, TEXT, 1, KnownNames([["Mara Quill"]]), TITLES)
    assert [e.name for e in grounded.entities] == ["Mara Quill"]
    assert [t.trait for t in grounded.entities[0].traits] == ["tired"]
    # Tobias's own quote does not name him, yet the relationship's quote does: its end is grounded.
    assert [(r.source, r.target) for r in grounded.relationships] == [("Tobias", "Mara Quill")]
    assert grounded.status_changes == []
    reasons = {d.fact: d.reason for d in report.dropped}
    assert reasons["Character 'Elise Marrow'"] == "name not in the scene"
    assert "title" in reasons["Character 'The Drowned Letter'"]
    assert reasons["Character 'Tobias'"] == "the quote does not name it"
    assert "title" in reasons["Mara Quill -FAMILY_OF-> The Drowned Letter"]
    assert "not in the text" in reasons["Mara Quill -LOCATED_IN-> Gull Rock lighthouse"]
    assert "not in the text" in reasons["Tobias: dead"]
    assert "not in the text" in reasons["Mara Quill: brave"]
    assert report.kept == 3 and len(report.dropped) == 7


def test_grounding_keeps_look_alikes_and_known_aliases() -> None:
    text = (
        "Mary-Jane and Jean-Luc Picard met Ilse's father at The Hollow Library. Zoë Brontë followed. "
        "The ferryman rowed them home, and Quill watched from the tower."
    )
    names = [
        "Mary-Jane",
        "Jean-Luc Picard",
        "Ilse's father",
        "The Hollow Library",
        "Zoë Brontë",
        "the ferryman",
    ]
    extraction = _extraction(
        entities=[
            {
                "name": n,
                "kind": "Location" if "Library" in n else "Character",
                "quote": "Mary-Jane and Jean-Luc Picard met Ilse's father at The Hollow Library"
                if n not in ("Zoë Brontë", "the ferryman")
                else (
                    "Zoe Bronte followed" if n == "Zoë Brontë" else "The ferryman rowed them home"
                ),
            }
            for n in names
        ]
        + [{"name": "Mara Quill", "kind": "Character", "quote": "Quill watched from the tower"}],
        relationships=[
            {
                "source": "the ferryman",
                "target": "Zoë Brontë",
                "type": "KNOWS",
                "quote": "The ferryman rowed them home",
            }
        ],
    )
    known = KnownNames([["Tobias Venn", "the ferryman"], ["Mara Quill"]])
    grounded, report = ground_extraction(extraction, text, 2, known, TITLES)
    assert [e.name for e in grounded.entities] == [*names, "Mara Quill"], report.dropped
    assert len(grounded.relationships) == 1 and not report.dropped


# --- cutting text ------------------------------------------------------------------------


def test_cut_text_ends_at_a_sentence_or_clause() -> None:
    cut = (
        "Aria is a compassionate soul. She has dedicated her life to the light, and she never lets "
    )
    assert (
        finish_cut_text(cut)
        == "Aria is a compassionate soul. She has dedicated her life to the light."
    )
    assert (
        finish_cut_text(
            "A keeper, the last one to remember, and the one most often referred to in a 1"
        )
        == "A keeper, the last one to remember."
    )
    assert finish_cut_text("no punctuation here so nothing is left") == ""
    assert finish_cut_text("Complete already.") == "Complete already."
    assert clip_to_sentence("Dr. Venn came. He stayed long.", 20) == "Dr. Venn came."
    assert (
        tail_from_sentence("Alpha beta gamma. Delta epsilon zeta. Eta theta.", 30)
        == "Delta epsilon zeta. Eta theta."
    )


def test_grammar_cut_strings_of_a_bounded_answer_are_mended() -> None:
    schema = bounded_response_format_for(CharacterSheets, 256)["json_schema"]["schema"]
    sheet_schema = schema["$defs"]["CharacterSheet"]
    cap = sheet_schema["properties"]["description"]["maxLength"]
    cut = ("Aria keeps the light. She has dedicated a lifetime to the lamp and the storm " * 4)[
        :cap
    ]
    answer = {
        "characters": [
            {
                "name": "Aria",
                "role": "keeper",
                "description": cut,
                "traits": [],
                "motivation": "x" * cap,
                "backstory": "Short.",
                "voice": "Plain, low",
            }
        ]
    }
    mended = mend_cut_strings(answer, schema)["characters"][0]
    assert mended["description"] == "Aria keeps the light." and ends_sentence(mended["description"])
    assert mended["motivation"] == ""  # nothing to cut at: dropped, not left mid-word
    assert (
        mended["backstory"] == "Short." and mended["voice"] == "Plain, low"
    )  # not cut: left alone
    assert normalise(mended["name"]) == "aria"


@pytest.mark.parametrize(
    ("title", "why"),
    [
        ("2016: 2016: 2016: 2016", "no words"),
        ("Chapter 2: 2017-01-21. 2020-01-32.", "no words"),
        ("]/*/ 2016: 2016", "no words"),
        ("Chapter 2: Lynx: 2016: 2016", "repeated fragment"),
        ("The Storm The Storm The Storm", "repeated fragment"),
        ("", "blank"),
        ("Title 1", "placeholder"),
        ("Chapter 2: Title 2", "placeholder"),
        ("Chapter Title", "placeholder"),
        ("[Title]", "placeholder"),
        ("Untitled", "placeholder"),
        ("TBD", "placeholder"),
        ("Title goes here", "placeholder"),
        (
            "Lynx walked to the lighthouse and then she looked at the sea for a very long time, thinking of home",
            "words",
        ),
    ],
)
def test_loops_and_paragraphs_are_not_titles(title: str, why: str) -> None:
    problem = title_problem(title)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    "title",
    [
        "The Lion, the Witch and the Wardrobe",
        "Bora Bora",
        "Summer of 1984",
        "The Sea, The Sea",
        "Chapter 3: The Letter",
        "Title Fight",
        "The Title",
        "Untitled Love Song",
        "Book of Names",
        "Chapter 3",
    ],
)
def test_look_alike_titles_pass(title: str) -> None:
    assert title_problem(title) is None


def test_a_chapter_title_that_repeats_the_books_or_an_earlier_chapters_is_not_used() -> None:
    taken = ("Sailor's Last Refuge", "The Letter")
    # As SmolLM2 headed both chapters of the `make run` book: the book's title again.
    assert usable_title("Sailor's Last Refuge", "Chapter 2", taken=taken) == (
        "Chapter 2",
        "the book's title or an earlier chapter's",
    )
    # Numbered, cased or punctuated otherwise, it is still the same title.
    assert usable_title("Chapter 2: SAILOR’S LAST REFUGE!", "Chapter 2", taken=taken)[0] == (
        "Chapter 2"
    )
    assert usable_title("The Letter.", "Chapter 3", taken=taken)[0] == "Chapter 3"
    # The look-alikes: a title that shares words with one taken, and any title when none is.
    assert usable_title("Sailor's Last Stand", "Chapter 2", taken=taken) == (
        "Sailor's Last Stand",
        None,
    )
    assert usable_title("The Letter Burns", "Chapter 3", taken=taken)[0] == "The Letter Burns"
    assert usable_title("Sailor's Last Refuge", "Chapter 1") == ("Sailor's Last Refuge", None)


def test_a_plan_keeps_its_names_and_loses_its_loops() -> None:
    scenes = [
        SceneDetail(
            title="2016: 2016: 2016",
            pov="Lynx",
            setting="Lynx: 2016: 2016: 2016",
            characters=[
                "Lynx",
                "2016: 2016: 2016",
                "Loca-Lina-Lina-Lina",
                "Old Tom",
                "fleets",
                "A Tribute to a Heroine",
            ],
            beats=["x"],
        ),
        SceneDetail(
            title="The Lamp Room",
            pov="Lynx Lynx Lynx",
            setting="the lamp room at dusk",
            characters=["Eleanor"],
            beats=["y"],
        ),
    ]
    tidy, dropped = tidy_plan(
        scenes, ("Lynx", "Eleanor"), ("Lysa the Keeper: A Tribute to a Heroine", "The Letter")
    )
    assert [s.title for s in tidy] == ["Scene 1", "The Lamp Room"]
    assert (
        tidy[0].characters == ["Lynx", "Old Tom"]
        and tidy[0].setting == ""
        and tidy[0].pov == "Lynx"
    )
    # The look-alike scene keeps its title, setting and bible name; only its looping point of view goes.
    assert (
        tidy[1].characters == ["Eleanor"]
        and tidy[1].setting == "the lamp room at dusk"
        and tidy[1].pov == ""
    )
    assert len(dropped) == 7 and any("point of view" in d for d in dropped)


def test_a_plan_keeps_no_scene_title_twice_and_no_beat_that_says_nothing() -> None:
    # Seen in a make run's chapter plan (the embedded 135M model).
    written = SceneDetail(
        title="Sailing Saga of Lies",
        pov="Lysander",
        setting="the cove",
        beats=[
            "3.1, 3.2, 3.4, 5.1.",
            " ,",
            "The Lost Night",
            "Lysander rows out.",
            "lysander rows out",
        ],
    )
    titles = ("The Lost Night", "Chapter 1")
    tidy, dropped = tidy_plan([written, written], ("Lysander",), titles)
    assert [s.title for s in tidy] == ["Sailing Saga of Lies", "Scene 2"]
    assert [s.beats for s in tidy] == [["Lysander rows out."], ["Lysander rows out."]]
    assert len(dropped) == 3 and "scene 2 title" in dropped[1]
    # Look-alikes: two scenes with titles that share words, beats that share words, a number
    # inside a beat.
    kept = [
        written.model_copy(update={"title": "The Cove", "beats": ["Lysander rows 3 miles."]}),
        written.model_copy(
            update={"title": "The Cove at Night", "beats": ["Lysander rows 3 miles back."]}
        ),
    ]
    assert tidy_plan(kept, ("Lysander",), titles) == (kept, [])


def test_a_chapter_outline_keeps_no_sentence_for_its_point_of_view_and_no_beat_twice() -> None:
    # Seen in a make run's outline/chapters.yaml (the embedded 135M model).
    written = ChapterOutline(
        number=2,
        title="Chapter 2",
        summary="Lysander's life and home.",
        pov="This chapter begins with a brief description of the setting and the setting itself.",
        setting=",1:",
        key_beats=[
            "The first act is a stormy scene.",
            "Lysander mends the nets.",
            "the first act is a  stormy scene",
            # The template's fields echoed and a numbering with no words (a later make run).
            "1.2-1.3-1.4",
            "Summary",
            "Title",
        ],
    )
    tidy, dropped = tidy_outline(written, ("Lysander",), ("Sailor's Last Refuge",))
    assert (tidy.pov, tidy.setting) == ("", "")
    assert tidy.key_beats == ["The first act is a stormy scene.", "Lysander mends the nets."]
    assert [d.split(" ")[0] for d in dropped] == ["point", "setting", "4"]
    # Look-alikes: a bible name, a new name, a real place and beats that only share words stay.
    for pov in ("Lysander", "Captain Mara Voss"):
        kept = written.model_copy(
            update={
                "pov": pov,
                "setting": "the harbour at dawn",
                "key_beats": ["Lysander mends the nets.", "Lysander mends the sails."],
            }
        )
        assert tidy_outline(kept, ("Lysander",), ("Sailor's Last Refuge",)) == (kept, [])
    # The book's title is no point of view.
    titled = written.model_copy(update={"pov": "Sailor's Last Refuge"})
    assert tidy_outline(titled, ("Lysander",), ("Sailor's Last Refuge",))[0].pov == ""


def test_a_field_stopped_mid_sentence_loses_that_sentence_and_a_finished_one_gets_its_stop() -> (
    None
):
    # Seen in a make run: the tiny model ended a description on "the", and a full stop made it look done.
    assert (
        as_sentence("Lysa keeps the lighthouse on a storm-bound island. She is the")
        == "Lysa keeps the lighthouse on a storm-bound island."
    )
    assert as_sentence("She realizes the importance of the fact that the") == ""
    assert as_sentence("He loved her and") == ""
    # Look-alikes: sentences that end on a preposition, an auxiliary or a pronoun are finished.
    assert as_sentence("Dr. Venn is the one she works for") == "Dr. Venn is the one she works for."
    assert as_sentence("She knew she could") == "She knew she could."
    assert as_sentence("He loved her,") == "He loved her."
    assert as_sentence("Deliberation") == "Deliberation."


def test_a_models_list_keeps_each_item_once_without_its_own_numbering() -> None:
    written = [
        "1. 1: Sailing to the cove",
        "- 2) The storm",
        "the storm!",
        "  ",
        "(4) Untitled",
        "2.1-2.3-2.4, 3.1",
    ]
    assert distinct_texts(written, unwanted=["Untitled"]) == ["Sailing to the cove", "The storm"]
    # Look-alikes: numbers that belong to the item, and items that share most of their words.
    kept = [
        "3 ships sink",
        "10:30 the ferry leaves",
        "-5 degrees at night",
        "3.5 tons of salt",
        "1984 comes back",
        "Act 2 begins",
        "Chapter 2 ends with a storm",
        "Chapter 3 ends with a storm",
        "Lysander mends the nets.",
        "Lysander mends the sails.",
        "2.1 the boat sinks",
        "Summary of the trial",
    ]
    assert distinct_texts(kept, unwanted=["Summary"]) == kept
