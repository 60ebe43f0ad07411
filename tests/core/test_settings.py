"""Settings: sources and their precedence, conventional variables, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("SKALD_", "NEO4J_", "OPENAI_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_defaults_mean_embedded_services(tmp_path: Path) -> None:
    settings = load_settings(tmp_path)
    assert settings.openai_base_url is None and settings.neo4j_uri is None
    assert settings.limits.max_iterations == 3 and settings.limits.qa_every == 5
    assert set(settings.tiers) == {"large", "medium", "small", "narrative", "enrichment"}


def test_precedence_flags_over_env_over_dotenv_over_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "skald.toml").write_text(
        'default_model = "from-toml"\nembedding_model = "emb-toml"\n[limits]\nqa_every = 7\nmax_iterations = 9\n'
        '[tiers.large]\nmodels = ["big-a", "big-b"]\n'
    )
    (tmp_path / ".env").write_text("SKALD_DEFAULT_MODEL=from-dotenv\nSKALD_LIMITS__QA_EVERY=6\n")
    monkeypatch.setenv("SKALD_DEFAULT_MODEL", "from-env")
    settings = load_settings(tmp_path, max_iterations=None)
    assert settings.default_model == "from-env"  # env beats .env and TOML
    assert settings.limits.qa_every == 6  # .env beats TOML
    assert settings.embedding_model == "emb-toml"  # TOML beats defaults
    assert [c.model for c in settings.tiers["large"].models] == ["big-a", "big-b"]
    assert settings.tiers["small"].temperature == 0.2  # untouched tiers keep their defaults
    assert load_settings(tmp_path, default_model="from-flag").default_model == "from-flag"


def test_conventional_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://llm.local:8000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("NEO4J_URI", "neo4j://db.local:7687")
    monkeypatch.setenv("NEO4J_USERNAME", "writer")
    monkeypatch.setenv("NEO4J_PASSWORD", "pw")
    settings = load_settings(tmp_path)
    assert settings.openai_base_url == "http://llm.local:8000/v1"
    assert (
        settings.openai_api_key is not None
        and settings.openai_api_key.get_secret_value() == "sk-test"
    )
    assert (settings.neo4j_uri, settings.neo4j_username) == ("neo4j://db.local:7687", "writer")


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("SKALD_LIMITS__MAX_ITERATIONS", "0", "limits.max_iterations"),
        ("SKALD_LIMITS__QA_EVERY", "often", "limits.qa_every"),
        ("NEO4J_URI", "http://nope", "NEO4J_URI"),
        ("OPENAI_BASE_URL", "localhost:8000", "OPENAI_BASE_URL"),
        ("SKALD_LIMITS__CONTEXT_BUDGET__HISTORY", "0.9", "limits.context_budget"),
    ],
)
def test_invalid_value_is_one_line_naming_the_setting(
    var: str, value: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    message = str(info.value)
    assert "\n" not in message and expected in message


def test_broken_toml_and_missing_config_file(tmp_path: Path) -> None:
    (tmp_path / "skald.toml").write_text("[limits\nqa_every = 3\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path, config_file=tmp_path / "missing.toml")


def test_a_toml_file_saved_with_a_byte_order_mark_reads_as_without_one(tmp_path: Path) -> None:
    (tmp_path / "skald.toml").write_bytes(b"\xef\xbb\xbf[limits]\nqa_every = 3\n")
    assert load_settings(tmp_path).limits.qa_every == 3
    # The look-alike: a byte-order mark inside the file is still an error.
    (tmp_path / "skald.toml").write_bytes(b"[limits]\n\xef\xbb\xbfqa_every = 3\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path)


def test_embedded_default_keeps_the_first_draft(tmp_path: Path) -> None:
    budget = load_settings(tmp_path).revision_budget()
    assert budget.iterations == 1
    assert "embedded 135M model's revisions have not passed these checks" in budget.why
    assert "set limits.max_iterations" in budget.why


@pytest.mark.parametrize(
    ("where", "line"),
    [("env", "SKALD_LIMITS__MAX_ITERATIONS=3"), ("toml", "[limits]\nmax_iterations = 3\n")],
)
def test_a_set_max_iterations_revises_on_the_embedded_model(
    where: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The look-alike: the same value as the default, but the writer asked for it.
    if where == "env":
        name, value = line.split("=")
        monkeypatch.setenv(name, value)
    else:
        (tmp_path / "skald.toml").write_text(line)
    budget = load_settings(tmp_path).revision_budget()
    assert (budget.iterations, budget.why) == (3, "")


def test_a_configured_endpoint_keeps_the_revision_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://llm.local:8000/v1")
    assert load_settings(tmp_path).revision_budget().model_dump() == {"iterations": 3, "why": ""}
    monkeypatch.delenv("OPENAI_BASE_URL")
    # Prose from a model of its own endpoint (the plan still on the embedded one): revised too.
    monkeypatch.setenv(
        "SKALD_TIERS__NARRATIVE__MODELS", '[{"model": "m", "base_url": "http://llm.local/v1"}]'
    )
    settings = load_settings(tmp_path)
    assert settings.embedded_tier("large") and not settings.embedded_tier("narrative")
    assert settings.revision_budget().iterations == 3


def test_a_dotenv_line_that_is_no_setting_stops_in_one_line_without_its_value(
    tmp_path: Path,
) -> None:
    project = tmp_path / "book"
    project.mkdir()
    # The look-alikes python-dotenv reads: comments, blank lines, `export`, spaces around `=`,
    # a quoted value holding '#', a name alone.
    (project / ".env").write_text(
        "# my endpoint\n\nexport OPENAI_BASE_URL=http://127.0.0.1:9/v1\n"
        'SKALD_DEFAULT_MODEL = "model # one"\nSKALD_UNUSED\n'
    )
    settings = load_settings(project)
    assert settings.openai_base_url == "http://127.0.0.1:9/v1"
    assert settings.default_model == "model # one"
    for text, said in (
        ('# keys\n\nOPENAI_API_KEY="sk-secret-123\n', "line 3 (OPENAI_API_KEY)"),
        (
            "OPENAI_BASE_URL=http://127.0.0.1:9/v1\nOPENAI_BASE_URL http://x/v1\n",
            "line 2 (OPENAI_BASE_URL)",
        ),
        ("= sk-secret-123\n", "line 1"),
    ):
        (project / ".env").write_text(text)
        with pytest.raises(ConfigError) as refused:
            load_settings(project)
        message = str(refused.value)
        assert message.startswith(f"{project / '.env'} {said} is not NAME=value (")
        assert "sk-secret" not in message and "http://x" not in message
    (project / ".env").unlink()
    (tmp_path / ".env").write_text("OPENAI_BASE_URL 'http://x/v1'\n")  # the current directory's
    with pytest.raises(ConfigError, match=r"^\.env line 1 \(OPENAI_BASE_URL\) is not NAME=value"):
        load_settings(project)
