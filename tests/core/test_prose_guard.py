"""The degeneration guard's metrics, anti-repetition sampling through the gateway, and the
scene prompt's budget."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.errors import ConfigError
from core.llm import LLMGateway, anti_repetition_kwargs
from core.prose import compression_ratio, distinct_n, measure, most_repeated_sentence, words_of
from core.settings import (
    LLAMA_CPP_ANTI_REPETITION,
    AntiRepetition,
    ContextBudget,
    ProseThresholds,
    load_settings,
)
from kg.models import Entity, EntityProfile
from prompts.narrative.models import SceneDetail
from tasks.context import build_envelope, estimate_tokens
from tasks.drafting import (
    SceneBrief,
    clean_prose,
    fixed_prompt_tokens,
    prompt_tokens,
    scene_messages,
)
from tasks.retrieval import _profile_line
from tests.support.prose_samples import CLEAN_PROSE, LOOP
from tests.support.scripted_llm import ScriptedLLM, scripted_prose

# --- metrics -------------------------------------------------------------------------------


def test_looping_text_fails_every_repetition_metric() -> None:
    metrics = measure(LOOP, 150, ProseThresholds())
    assert metrics.distinct_trigrams < 0.1 and metrics.max_sentence_repeats == 20
    assert metrics.compression_ratio < 0.1
    assert (
        not metrics.clean and len(metrics.failures) == 4
    )  # trigrams, bigrams, repeats, compression


def test_varied_prose_with_a_refrain_passes() -> None:
    # A look-alike: a short line said three times (a refrain, a knock) is not a loop.
    text = f'{CLEAN_PROSE} "Who\'s there?" she called. Nothing. "Who\'s there?" Only the wind. "Who\'s there?"'
    metrics = measure(text, 150, ProseThresholds())
    assert metrics.max_sentence_repeats == 3 and metrics.clean, metrics.failures
    assert 0.35 < metrics.compression_ratio < 0.75


def test_length_against_the_target() -> None:
    thresholds = ProseThresholds(min_length_ratio=0.5, max_length_ratio=2.0)
    assert measure(CLEAN_PROSE, 150, thresholds).clean
    short = measure(CLEAN_PROSE, 1000, thresholds)
    assert [f for f in short.failures if "target" in f] and short.distinct_trigrams > 0.9
    assert any("over" in f for f in measure(CLEAN_PROSE, 40, thresholds).failures)


def test_metric_building_blocks() -> None:
    assert words_of("Don't stop, Mara!") == ["don't", "stop", "mara"]
    assert distinct_n(["a", "b", "a", "b"], 2) == pytest.approx(2 / 3)
    assert distinct_n(["a"], 3) == 1.0
    assert most_repeated_sentence("It rained. it rained!  It RAINED?\nThen sun.") == (
        "it rained",
        3,
    )
    assert compression_ratio("") == 1.0 and compression_ratio("ab" * 500) < 0.05
    assert measure(scripted_prose(3), 100, ProseThresholds()).clean


# --- anti-repetition sampling through the gateway --------------------------------------------


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


def test_gateway_sends_the_tiers_penalties_only_when_asked(llm: ScriptedLLM, tmp_path) -> None:
    settings = load_settings(
        tmp_path,
        openai_base_url=llm.base_url,
        tiers={"narrative": {"anti_repetition": {"server_fields": {"repeat_penalty": 1.2}}}},
    )
    with LLMGateway(settings) as gateway:
        gateway.text("narrative", [{"role": "user", "content": "plain"}])
        gateway.text("narrative", [{"role": "user", "content": "penalized"}], anti_repetition=True)
        gateway.text("large", [{"role": "user", "content": "other tier"}], anti_repetition=True)
    plain, penalized, other = (r.body for r in llm.requests)
    assert not {"frequency_penalty", "presence_penalty", "repeat_penalty"} & plain.keys()
    assert (
        penalized["frequency_penalty"],
        penalized["presence_penalty"],
        penalized["repeat_penalty"],
    ) == (0.3, 0.3, 1.2)
    # The large tier has no server fields configured and is not the embedded server: OpenAI fields only.
    assert other["frequency_penalty"] == 0.3 and "repeat_penalty" not in other


def test_llama_cpp_fields_go_to_the_embedded_server_only_by_default() -> None:
    assert (
        anti_repetition_kwargs(AntiRepetition(), embedded=True)["extra_body"]
        == LLAMA_CPP_ANTI_REPETITION
    )
    assert "extra_body" not in anti_repetition_kwargs(AntiRepetition(), embedded=False)
    none = AntiRepetition(frequency_penalty=None, presence_penalty=None, server_fields={})
    assert anti_repetition_kwargs(none, embedded=True) == {}


def test_first_draft_penalties_default_to_the_embedded_model(tmp_path) -> None:
    assert LLMGateway(load_settings(tmp_path)).sends_anti_repetition_first("narrative")
    remote = load_settings(tmp_path, openai_base_url="http://127.0.0.1:9/v1")
    assert not LLMGateway(remote).sends_anti_repetition_first("narrative")
    forced = load_settings(
        tmp_path,
        openai_base_url="http://127.0.0.1:9/v1",
        tiers={"narrative": {"anti_repetition": {"first_draft": True}}},
    )
    assert LLMGateway(forced).sends_anti_repetition_first("narrative")


# --- the scene prompt within its budget ---------------------------------------------------------


def brief(**changes: object) -> SceneBrief:
    plan = tuple(
        SceneDetail(
            title=f"Scene {i}",
            pov="Mara",
            setting=f"Place {i}",
            characters=["Mara", "Tobias"],
            beats=[f"beat {i}a", f"beat {i}b"],
        )
        for i in range(1, 4)
    )
    values = dict(
        title="The Drowned Letter",
        genre="gothic",
        logline="A keeper chases a ghost's letter.",
        themes=("grief", "the sea"),
        chapter_number=2,
        chapter_title="Salt",
        chapter_summary="Mara reads.",
        plan=plan,
        scene_number=2,
        previous_text="the lamp went out.",
        target_words=450,
    )
    return SceneBrief.model_validate(values | changes)


def character(name: str) -> EntityProfile:
    entity = Entity(
        label="Character",
        name=name,
        description=f"{name} keeps the light. " * 3,
        traits=["brave"],
        attributes={
            "motivation": f"{name} wants the truth",
            "voice": f"{name} speaks in short bursts",
            "backstory": f"{name} lost a sister to the sea. " * 20,
        },
    )
    return EntityProfile(entity=entity, as_of_chapter=1, status="alive")


def test_profile_line_has_motivation_backstory_essentials_and_voice() -> None:
    line = _profile_line(character("Mara"))
    assert (
        "motivation: Mara wants the truth" in line and "voice: Mara speaks in short bursts" in line
    )
    assert "backstory: Mara lost a sister to the sea." in line and len(line) < 600


@pytest.mark.parametrize("window", [1400, 2048, 4096])
def test_scene_prompt_with_guidance_stays_within_budget(window: int) -> None:
    scene = brief()
    max_tokens = 900
    guidance = "Cut the repetition; give Tobias a reason to stay. " * 80
    sections = {
        "guidance": [guidance],
        "characters": [_profile_line(character(n)) for n in ("Mara", "Tobias", "Elsa")],
        "summaries": ["Chapter 1: Mara found the letter. " * 30],
        "history": ["Chapter 1 scene 1: x " * 200],
    }
    envelope = build_envelope(
        sections, ContextBudget(), window, reserved_tokens=fixed_prompt_tokens(scene) + max_tokens
    )
    messages = scene_messages(scene, envelope.text)
    assert prompt_tokens(messages) + max_tokens <= window
    text = "\n".join(m["content"] for m in messages)
    assert "## Guidance" in text  # revision guidance is inside the budget
    report = next(s for s in envelope.sections if s.name == "guidance")
    assert report.used_tokens <= report.budget_tokens
    # Cut to what the window leaves it; at 4096 the other sections give back what they do not need.
    assert bool(report.cut) == (window < 4096)
    assert (estimate_tokens(guidance) > report.used_tokens) == (window < 4096)
    assert "2. Scene 2 (Place 2): beat 2a; beat 2b  <- THIS SCENE" in text and "3. Scene 3" in text
    assert "scene 3 (Scene 3) can follow" in text
    assert "The previous scene ended:" in text and "third person, past tense" in text


def test_first_scene_shows_the_previous_chapters_ending() -> None:
    text = "\n".join(
        m["content"]
        for m in scene_messages(
            brief(scene_number=1, previous_text="She closed the door.", previous_is_chapter=True),
            "",
        )
    )
    assert (
        "The previous chapter ended:\nShe closed the door." in text
        and "The previous scene" not in text
    )
    last = "\n".join(m["content"] for m in scene_messages(brief(scene_number=3), ""))
    assert "This scene ends the chapter." in last


def test_guard_style_and_sampling_settings_from_toml_and_bad_values(tmp_path) -> None:
    (tmp_path / "skald.toml").write_text(
        "[tiers.narrative.anti_repetition]\nserver_fields = { dry_multiplier = 0.8 }\nfirst_draft = true\n"
        '[prose]\nmax_draft_attempts = 2\n[style]\nperson = "first"\nregister = "terse"\n'
    )
    settings = load_settings(tmp_path)
    narrative = settings.tier("narrative").anti_repetition
    assert narrative.server_fields == {"dry_multiplier": 0.8} and narrative.first_draft is True
    assert (
        settings.tier("large").anti_repetition.server_fields is None
    )  # other tiers keep their defaults
    assert settings.prose.max_draft_attempts == 2
    assert (settings.style.person, settings.style.tone_register) == ("first", "terse")
    for bad, setting in (
        ('[style]\nperson = "fourth"\n', "style.person"),
        ("[prose]\nmin_length_ratio = 2.0\nmax_length_ratio = 1.5\n", "prose"),
    ):
        (tmp_path / "skald.toml").write_text(bad)
        with pytest.raises(ConfigError, match=setting):
            load_settings(tmp_path)


def test_a_drafts_headings_fences_and_preamble_go_and_its_prose_stays() -> None:
    draft = (
        "Here is the scene:\n```\n### CHAPTER ONE\n # THE LAST DAY\n## Scene 2: The Storm\n"
        "Mara lit the lamp.\n#1 on her list was the letter, #hashtag-free.\n"
        "    # an indented code line is not a heading\nShe read it twice.\n```"
    )
    assert clean_prose(draft) == (
        "Mara lit the lamp.\n#1 on her list was the letter, #hashtag-free.\n"
        "    # an indented code line is not a heading\nShe read it twice."
    )


def test_a_drafts_html_tags_go_and_angle_brackets_in_prose_stay() -> None:
    # As the embedded 135M model wrote them into a chapter of a fresh `make run`.
    draft = (
        "So many went to sail<br><br>He decided not to leave.</p >\n"
        '<p class="scene">Mara lit the <i>brass</i> lamp.<br/>\n<br />\nShe read it twice.'
    )
    assert clean_prose(draft) == (
        "So many went to sail He decided not to leave.\nMara lit the brass lamp.\n\n"
        "She read it twice."
    )
    # The look-alikes: angle brackets that are prose, and tag-shaped words that are no markup.
    prose = (
        "Five < seven > three, she counted.\nThe sign said <CLOSED>.\nI <3 you, he wrote.\n"
        "<- back, the arrow said; <b and c> were the marks on the chart."
    )
    assert clean_prose(prose) == prose


def test_a_title_marked_with_doubled_angle_brackets_goes_and_prose_after_it_stays() -> None:
    draft = (
        "<<Remnants from Beyond Your Dreams>>  \n\nOn a quiet evening, I sat.\n"
        "<<the lost night>>   This story begins here."
    )
    assert clean_prose(draft) == "On a quiet evening, I sat.\nThis story begins here."
    # Look-alikes: doubled brackets inside a sentence, a guillemet's quoted speech, arithmetic.
    prose = "She said <<no>> twice.\n\u00abBonjour\u00bb, dit-il.\n\u00abNon\u00bb\n5 << 7 >> 3"
    assert clean_prose(prose) == prose


def test_a_line_that_only_echoes_a_title_goes_and_a_sentence_naming_it_stays() -> None:
    titles = ("A Littlestone's Journey: The Unshakened Hero", "Liza's journey")
    draft = (
        "Agnes watched the harbor.\nThe Littlestone's Journey: The Unshakened Hero\n"
        "**Liza's Journey**\n\u201cLiza's Journey\u201d\n[Liza's Journey]\n"
        "She had read A Littlestone's Journey: The Unshakened Hero twice.\n"
        "Liza's journey began at dawn."
    )
    assert clean_prose(draft, titles=titles) == (
        "Agnes watched the harbor.\n"
        "She had read A Littlestone's Journey: The Unshakened Hero twice.\n"
        "Liza's journey began at dawn."
    )
    # Without titles (and with an empty chapter title) nothing of the kind is dropped.
    assert clean_prose(draft) == draft
    assert clean_prose("Dawn.\n\nDusk.", titles=("", "The")) == "Dawn.\n\nDusk."
