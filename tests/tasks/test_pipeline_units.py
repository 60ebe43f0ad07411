"""Pure pipeline logic: extraction merge/normalization, consistency checks, act ranges, and the
character sheets' re-ask (against the scripted HTTP LLM).

The consistency checks' true cases and look-alikes live in tests/tasks/test_validation_checks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import LLMBadOutputError
from core.settings import load_settings
from kg.models import ChapterDelta, Entity, SceneDelta
from prompts.initialization.models import CharacterSheets
from prompts.knowledge.models import SceneExtraction
from tasks.consolidation import merge_extractions
from tasks.initialization import act_ranges
from tasks.validation import contradictory_traits, duplicate_scenes
from tests.support.scripted_llm import ScriptedLLM


def _extraction(
    entities: list[dict],
    relationships: list[dict] | None = None,
    statuses: list[dict] | None = None,
) -> SceneExtraction:
    return SceneExtraction.model_validate(
        {
            "entities": entities,
            "relationships": relationships or [],
            "status_changes": statuses or [],
        }
    )


def test_merge_keeps_one_entity_per_name_with_every_scene_as_source() -> None:
    scene1 = _extraction(
        [{"name": "Mara Quill", "kind": "Character", "description": "keeper", "traits": ["brave"]}],
        [
            {"source": "Mara Quill", "target": "Tobias", "type": "is friends with"},
            {"source": "Mara Quill", "target": "Mara Quill", "type": "LOVES"},
        ],
    )
    scene2 = _extraction(
        [
            {
                "name": "mara quill",
                "kind": "Character",
                "description": "the lighthouse keeper",
                "traits": ["Brave", "stubborn"],
            },
            {"name": "The Guild", "kind": "Organization"},
        ],
        [
            {"source": "Mara Quill", "target": "Tobias", "type": "FRIEND_OF"},
            {"source": "Mara Quill", "target": "Tobias", "type": "owes money to"},
        ],
    )
    entities, rels, _ = merge_extractions(3, [scene1, scene2])
    mara = next(e for e in entities if e.name == "Mara Quill")
    assert [s.scene for s in mara.sources] == [1, 2]
    assert mara.traits == ["brave", "stubborn"]
    assert mara.description == "the lighthouse keeper."  # a finished sentence
    assert next(e for e in entities if e.name == "The Guild").label == "Faction"
    # "is friends with" and FRIEND_OF are one relationship; the self-loop is dropped;
    # an unknown type is kept as RELATES_TO with its raw text.
    assert sorted((r.type, r.raw_type) for r in rels) == [
        ("FRIEND_OF", "is friends with"),
        ("RELATES_TO", "owes money to"),
    ]


def test_contradictory_traits_and_clean_case() -> None:
    delta = ChapterDelta(
        chapter=2,
        entities=[
            Entity(label="Character", name="Tobias", traits=["Brave", "cowardly"]),
            Entity(label="Character", name="Mara", traits=["brave"]),
        ],
    )
    found = contradictory_traits(delta, [("brave", "cowardly")])
    assert [p.entities for p in found] == [["Tobias"]]


def test_duplicate_scenes_within_and_across_chapters() -> None:
    delta = ChapterDelta(
        chapter=4,
        scenes=[
            SceneDelta(index=1, embedding=[1.0, 0.0, 0.0]),
            SceneDelta(index=2, embedding=[0.999, 0.01, 0.0]),
            SceneDelta(index=3, embedding=[0.0, 0.0, 1.0]),
        ],
    )
    problems = duplicate_scenes(delta, earlier=[(2, 1, [0.0, 0.0, 1.0]), (2, 2, [0.0, 1.0, 0.0])])
    messages = sorted(p.message for p in problems)
    assert len(problems) == 2
    assert "scene 3 repeats chapter 2 scene 1" in messages[0] and "scenes 1 and 2" in messages[1]


def test_act_ranges_cover_every_chapter_once() -> None:
    assert act_ranges(7, 3) == [(1, 1, 3), (2, 4, 5), (3, 6, 7)]
    assert act_ranges(2, 3) == [(1, 1, 1), (2, 2, 2)]


def test_chapter_heading_numbers_a_title_once() -> None:
    from core.grounding import chapter_heading

    assert (
        chapter_heading(1, "Chapter 1: Chapter 1: The Rising Tide") == "Chapter 1: The Rising Tide"
    )
    assert chapter_heading(3, "chapter III - The Ford") == "Chapter 3: The Ford"
    assert chapter_heading(2, "The Chapter 7 Problem") == "Chapter 2: The Chapter 7 Problem"
    assert chapter_heading(4, "Chapter 4") == "Chapter 4"
    assert chapter_heading(5, "Chapterhouse") == "Chapter 5: Chapterhouse"
    # A slug the tiny model gave as a title (make run's outline/chapters.yaml: "chapter-1").
    assert chapter_heading(1, "chapter-1") == "Chapter 1"
    assert chapter_heading(2, "Chapter_2: The Ford") == "Chapter 2: The Ford"
    assert chapter_heading(3, "Chapter3 - Tide") == "Chapter 3: Tide"
    assert chapter_heading(6, "Chapter Ivy") == "Chapter 6: Chapter Ivy"  # a word, not a numeral
    assert chapter_heading(7, "Chaptercivic") == "Chapter 7: Chaptercivic"
    # A title the model put in brackets after another chapter's number.
    assert (
        chapter_heading(2, "Chapter 1 (Lysander's life and home)")
        == "Chapter 2: Lysander's life and home"
    )
    # Brackets that are part of the title stay.
    assert chapter_heading(6, "(Un)forgiven") == "Chapter 6: (Un)forgiven"
    assert chapter_heading(7, "The Ford (Part Two)") == "Chapter 7: The Ford (Part Two)"
    assert chapter_heading(8, "(One) and (Two)") == "Chapter 8: (One) and (Two)"


# --- Character sheets: a first answer with no usable name is asked again, saying why ---------------

GOOD_SHEET = {
    "name": "Amara Vell",
    "role": "protagonist",
    "description": "The keeper.",
    "traits": ["stubborn"],
    "motivation": "",
    "backstory": "",
    "voice": "",
}
IDENTIFIER_SHEET = {**GOOD_SHEET, "name": "Lighthouse_Lady_Amara"}


def _sheets(llm: ScriptedLLM, tmp_path: Path) -> CharacterSheets:
    from prefect.logging import disable_run_logger

    from core.content import ContentStore
    from tasks.initialization import generate_character_sheets
    from tasks.runtime import Runtime
    from tasks.services import Services

    rt = Runtime(load_settings(tmp_path, openai_base_url=llm.base_url))
    services = Services(
        settings=rt.settings, llm=rt, content=rt.content
    )  # no graph: the stage reads none
    with disable_run_logger():  # the task's body, without a Prefect run around it
        ref = generate_character_sheets.fn(services, "A keeper finds a letter.", "mystery", 2)
    return ContentStore(rt.settings.saga_dir / "content").get_model(ref, CharacterSheets)


def _sheet_requests(llm: ScriptedLLM) -> list[str]:
    return [r.last_user for r in llm.requests if r.schema_name == "CharacterSheets"]


def test_character_sheets_with_no_usable_name_are_asked_for_again_naming_what_was_refused(
    tmp_path: Path,
) -> None:
    with ScriptedLLM() as llm:
        llm.on(schema="CharacterSheets", respond={"characters": [GOOD_SHEET]})
        llm.on(schema="CharacterSheets", respond={"characters": [IDENTIFIER_SHEET]}, times=1)
        sheets = _sheets(llm, tmp_path)
        asked = _sheet_requests(llm)
    assert [c.name for c in sheets.characters] == ["Amara Vell"]
    assert len(asked) == 2
    assert "could not be used" not in asked[0]
    assert '"Lighthouse_Lady_Amara": an identifier' in asked[1]


def test_usable_character_sheets_are_asked_for_once(tmp_path: Path) -> None:
    with ScriptedLLM() as llm:
        llm.on(schema="CharacterSheets", respond={"characters": [IDENTIFIER_SHEET, GOOD_SHEET]})
        sheets = _sheets(llm, tmp_path)
        asked = _sheet_requests(llm)
    assert [c.name for c in sheets.characters] == ["Amara Vell"]
    assert len(asked) == 1


def test_character_sheets_never_usable_fail_in_one_line_after_three_answers(tmp_path: Path) -> None:
    with ScriptedLLM() as llm:
        llm.on(schema="CharacterSheets", respond={"characters": [IDENTIFIER_SHEET]})
        with pytest.raises(
            LLMBadOutputError,
            match="wrote 3 character sheets in 3 answers and none has a usable name",
        ):
            _sheets(llm, tmp_path)
        assert len(_sheet_requests(llm)) == 3


LOOPING_SHEET = {
    # Seen in a make run's characters/lysander.yaml (the embedded 135M model).
    **GOOD_SHEET,
    "name": "Lysander",
    "role": "Lysander",
    "traits": ["loyal, protective, and protective of the town."] * 3 + ["", "Lysander"],
}


def test_a_sheet_keeps_each_trait_once_and_no_role_that_is_its_name(tmp_path: Path) -> None:
    look_alike = {**GOOD_SHEET, "role": "Amara's rival", "traits": ["stubborn", "stubbornly kind"]}
    with ScriptedLLM() as llm:
        llm.on(schema="CharacterSheets", respond={"characters": [LOOPING_SHEET, look_alike]})
        sheets = _sheets(llm, tmp_path)
    looping, kept = sheets.characters
    assert (looping.role, looping.traits) == (
        "",
        ["loyal, protective, and protective of the town."],
    )
    # The look-alike: a role that holds another name and traits that share a word stay as written.
    assert (kept.role, kept.traits) == ("Amara's rival", ["stubborn", "stubbornly kind"])


def _outline_stage_services(llm: ScriptedLLM, tmp_path: Path):  # noqa: ANN202
    from tasks.runtime import Runtime
    from tasks.services import Services

    rt = Runtime(load_settings(tmp_path, openai_base_url=llm.base_url))
    return Services(settings=rt.settings, llm=rt, content=rt.content)


def test_the_outline_keeps_no_theme_that_is_its_title_and_no_act_event_twice(
    tmp_path: Path,
) -> None:
    from prefect.logging import disable_run_logger

    from prompts.initialization.models import ActOutline, GlobalOutline
    from tasks.initialization import generate_act_outline, generate_global_outline

    written = {
        "title": "Sailor's Last Refuge",
        "logline": "A keeper finds a letter.",
        "setting": "A rocky cove.",
        "themes": ["Sailor's Last Refuge", "grief", "Grief.", "the sea's memory"],
        "acts": [{"number": 1, "summary": "The letter."}],
    }
    events = [
        "1. 1: Sailing to Lysander",
        "The storm breaks.",
        "- the storm breaks",
        "Act 1: Sailor's Last Refuge",
        "3 ships sink",
    ]
    with ScriptedLLM() as llm:
        llm.on(schema="GlobalOutline", respond=written)
        llm.on(schema="ActOutline", respond={"summary": "The letter.", "key_events": events})
        services = _outline_stage_services(llm, tmp_path)
        sheets = services.content.put_json(
            "character_sheets", "characters", CharacterSheets(characters=[GOOD_SHEET])
        )
        with disable_run_logger():
            outline_ref = generate_global_outline.fn(services, "A letter.", "mystery", 2, 1, sheets)
            act_ref = generate_act_outline.fn(services, outline_ref, 1, 1, 2)
    outline = services.content.get_model(outline_ref, GlobalOutline)
    act = services.content.get_model(act_ref, ActOutline)
    assert outline.themes == ["grief", "the sea's memory"]
    # A number that is part of the event ("3 ships sink") stays; the list's own numbering and
    # the book's title as an event go.
    assert act.key_events == ["Sailing to Lysander", "The storm breaks.", "3 ships sink"]
    # The writer's global_outline.md lists the themes kept, and no empty "Themes:" line.
    from tasks.persist import InitArtifacts, global_outline_markdown

    def markdown(outline_ref: object) -> str:
        artifacts = InitArtifacts(
            characters=sheets,
            global_outline=outline_ref,
            act_outlines=(act_ref,),
            chapter_outlines=(),
            relationships=sheets,
        )
        return global_outline_markdown(services, artifacts)

    assert "**Themes:** grief, the sea's memory\n" in markdown(outline_ref)
    themeless = services.content.put_json(
        "global_outline", "themeless", outline.model_copy(update={"themes": []})
    )
    assert "Themes" not in markdown(themeless) and "- 3 ships sink" in markdown(themeless)


def test_the_outlines_world_refuses_what_is_no_name_and_says_each_refusal_once() -> None:
    from prompts.initialization.models import OutlineRelationships
    from tasks.initialization import world_with_names

    # Seen in a make run: one sentence-like place and relationship, written over and over.
    sentence = "Lysander the lost sailor"
    written = OutlineRelationships.model_validate(
        {
            "locations": [{"name": sentence}, {"name": sentence}, {"name": "Gull Rock"}],
            "relationships": [
                {"source": "Lysander", "target": sentence, "type": "LOVES"},
                {"source": "Lysander", "target": sentence, "type": "LOVES"},
                {"source": "Lysander", "target": "Gull Rock", "type": "LIVES_AT"},
            ],
        }
    )
    world, refusals = world_with_names(written, ("Lysander",), ("The Lost Night",))
    assert [p.name for p in world.locations] == ["Gull Rock"]
    assert [(r.source, r.target) for r in world.relationships] == [("Lysander", "Gull Rock")]
    assert len(refusals) == 2
    assert refusals[0].startswith("place 'Lysander the lost sailor' refused")
    assert refusals[1].startswith("relationship 'Lysander' -LOVES-> 'Lysander the lost sailor'")


# --- Scene plans: a plan short of scenes is completed by a re-ask that names what is planned ------


def _scene(title: str) -> dict:
    return {
        "title": title,
        "pov": "Amara Vell",
        "setting": "The lighthouse",
        "characters": ["Amara Vell"],
        "beats": ["She climbs the stairs."],
    }


def test_a_short_scene_plan_is_completed_by_a_re_ask_naming_the_planned_scenes(
    tmp_path: Path,
) -> None:
    from prefect.logging import disable_run_logger

    from core.content import ContentStore
    from prompts.initialization.models import ChapterOutline
    from prompts.narrative.models import ScenePlan
    from tasks.planning import PlanRequest, plan_scenes
    from tasks.runtime import Runtime
    from tasks.services import Services

    outline = ChapterOutline(number=1, title="The Letter", summary="Amara finds the letter.")
    with ScriptedLLM() as llm:
        llm.on(
            schema="ScenePlan", respond={"scenes": [_scene("The Stairs"), _scene("The Lamp Room")]}
        )
        llm.on(schema="ScenePlan", respond={"scenes": [_scene("The Harbor")]}, times=1)
        rt = Runtime(load_settings(tmp_path, openai_base_url=llm.base_url))
        services = Services(settings=rt.settings, llm=rt, content=rt.content)
        with disable_run_logger():
            request = PlanRequest(
                title="The Salt Road",
                genre="mystery",
                chapter=outline,
                scene_count=3,
                character_names=("Amara Vell",),
                iteration=1,
            )
            ref = plan_scenes.fn(services, request)
        asked = [r.last_user for r in llm.requests if r.schema_name == "ScenePlan"]
    plan = ContentStore(rt.settings.saga_dir / "content").get_model(ref, ScenePlan)
    assert [s.title for s in plan.scenes] == ["The Harbor", "The Stairs", "The Lamp Room"]
    assert len(asked) == 2
    assert "already planned" not in asked[0] and "Plan exactly 3 scenes" in asked[0]
    assert "Scenes already planned: The Harbor. Plan the next 2." in asked[1]
    assert "was rejected" not in asked[1]  # a re-ask for missing scenes is not a revision
