"""One settings model for the whole project.

Sources, highest priority first: explicit overrides (CLI flags) > environment > `.env`
(project dir, then the current dir) > TOML file (`--config`, `SKALD_CONFIG`, or
`<project-dir>/skald.toml`) > defaults.

Conventional variables are honoured as their own tools do: `OPENAI_BASE_URL`,
`OPENAI_API_KEY` (openai client), `NEO4J_URI`, `NEO4J_USERNAME`, `NEO4J_PASSWORD`,
`NEO4J_DATABASE` (Neo4j tools). Everything else is `SKALD_<FIELD>`, nested with `__`
(e.g. `SKALD_LIMITS__MAX_ITERATIONS=2`, `SKALD_TIERS__LARGE__MODELS='["gpt-4o","gpt-4o-mini"]'`).
"""

from __future__ import annotations

import io
import os
import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from core.content import USER_TEXT_ENCODING
from core.errors import ConfigError, InvalidInputError, first_problem

TierName = Literal["large", "medium", "small", "narrative", "enrichment"]
TIER_NAMES: tuple[TierName, ...] = ("large", "medium", "small", "narrative", "enrichment")
SLOT_NAMES: tuple[str, ...] = ("retriever", "injector", "actor", "extractor", "judge", "historian")

# Set by load_settings() so the TOML source knows which file to read.
_toml_path: ContextVar[Path | None] = ContextVar("skald_toml_path", default=None)


class Candidate(BaseModel):
    """One model a tier may use. `base_url`/`api_key` default to the global endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key: SecretStr | None = None


# llama.cpp's own anti-repetition fields, sent on the embedded llama-server when a tier's
# `anti_repetition.server_fields` is unset. Measured with SmolLM2-135M on a 700-word scene
# prompt (INFRA.md): plain sampling loops (distinct word-trigram ratio 0.23-0.27, one sentence
# 12-19 times); repeat_penalty 1.15 over the last 256 tokens gives 0.99-1.00.
LLAMA_CPP_ANTI_REPETITION: dict[str, float | int] = {"repeat_penalty": 1.15, "repeat_last_n": 256}

# Revisions of the embedded SmolLM2-135M's chapters that passed the checks that had flagged
# them, measured on `make run` (issue #31; README "The embedded defaults"): none did. So a
# chapter written on the embedded model gets one draft unless `limits.max_iterations` is set;
# a configured endpoint keeps the full revision loop.
EMBEDDED_REVISIONS_PASSED = 0
EMBEDDED_REVISIONS_MEASURED = 4
EMBEDDED_MAX_ITERATIONS = 1
# The tiers whose answers the revision checks judge: the scene plan (large) and the prose (narrative).
REVISED_TIERS: tuple[TierName, ...] = ("large", "narrative")


class AntiRepetition(BaseModel):
    """Sampling that discourages loops, for prose calls of one tier (drafts and redrafts).

    `frequency_penalty`/`presence_penalty` are OpenAI-standard and go to any endpoint.
    `server_fields` are extra JSON fields for servers that have more (llama.cpp:
    `repeat_penalty`, `repeat_last_n`, `dry_multiplier`, ...); unset means llama.cpp's
    defaults above on the embedded llama-server and nothing elsewhere (OpenAI rejects
    unknown fields). `first_draft`: send all this on the first draft too, not only on a
    redraft after the degeneration guard failed it; unset means yes on the embedded model
    (it loops without) and no elsewhere.
    """

    model_config = ConfigDict(extra="forbid")

    first_draft: bool | None = None
    frequency_penalty: float | None = Field(0.3, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(0.3, ge=-2.0, le=2.0)
    server_fields: dict[str, float | int | bool | str] | None = None


class TierSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Candidate chain, tried in health-weighted order; a bare string means Candidate(model=...).
    models: list[Candidate] = Field(default_factory=list)
    context_window: int = Field(4096, ge=512)
    max_tokens: int = Field(1024, ge=16)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    anti_repetition: AntiRepetition = Field(default_factory=AntiRepetition)

    @field_validator("models", mode="before")
    @classmethod
    def _strings_are_models(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            return [{"model": v} if isinstance(v, str) else v for v in value]
        return value


BOLT_SCHEMES = ("bolt://", "bolt+s://", "bolt+ssc://", "neo4j://", "neo4j+s://", "neo4j+ssc://")


def bolt_uri(value: str | None) -> str | None:
    """`value` unchanged when it is a Bolt URI (or None); a field validator's ValueError if not."""
    if value is not None and not value.startswith(BOLT_SCHEMES):
        raise ValueError("must be a bolt:// or neo4j:// URI")
    return value


def _default_tiers() -> dict[str, TierSettings]:
    return {
        "large": TierSettings(temperature=0.7, max_tokens=1536),
        "medium": TierSettings(temperature=0.4, max_tokens=1024),
        "small": TierSettings(temperature=0.2, max_tokens=1024),
        "narrative": TierSettings(temperature=0.8, max_tokens=1536),
        # The optional narrative enrichment pass (limits.enrich_narrative).
        "enrichment": TierSettings(temperature=0.6, max_tokens=1536),
    }


class ContextBudget(BaseModel):
    """Shares of a tier's context window per prompt section (spec 004)."""

    model_config = ConfigDict(extra="forbid")

    history: float = Field(0.30, ge=0, le=1)
    summaries: float = Field(0.10, ge=0, le=1)
    lore: float = Field(0.15, ge=0, le=1)
    characters: float = Field(0.20, ge=0, le=1)
    relationships: float = Field(0.10, ge=0, le=1)
    guidance: float = Field(0.15, ge=0, le=1)

    @model_validator(mode="after")
    def _shares_sum_to_at_most_one(self) -> ContextBudget:
        total = sum(self.model_dump().values())
        if total > 1.0 + 1e-9:
            raise ValueError(f"section shares sum to {total:.2f}; they must sum to at most 1.0")
        return self


class RunLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_iterations: int = Field(
        3,
        ge=1,
        le=20,
        description="revision loops per chapter (the embedded model: 1 unless "
        "set, see Settings.revision_budget)",
    )
    qa_every: int = Field(5, ge=1, description="run QA/healing every N chapters")
    scene_token_target: int = Field(600, ge=50, le=8000)
    scenes_per_chapter: int = Field(3, ge=1, le=20)
    revision_threshold: float = Field(0.5, ge=0, le=1, description="min mean quality score")
    extraction_concurrency: int = Field(4, ge=1, le=64)
    enrich_narrative: bool = Field(
        False,
        description="rewrite each drafted scene with sensory detail and emotional "
        "depth (tier `enrichment`) before it is extracted, validated and committed",
    )
    llm_max_attempts: int = Field(4, ge=1, le=20)
    llm_timeout_s: float = Field(
        120.0,
        gt=0,
        description="seconds a chat request may hear nothing from the model (before its first "
        "token, between two); with llm_stream off, seconds it may take to answer whole",
    )
    llm_stream: bool = Field(
        True,
        description="ask for chat answers streamed, so llm_timeout_s bounds the model's "
        "silences and not the whole answer (off: for a proxy that cannot stream)",
    )
    llm_slots: int | None = Field(
        None,
        ge=1,
        description="chat requests one endpoint is sent at once, for a server that answers "
        "few at a time (llama-server's -np, OLLAMA_NUM_PARALLEL): the others wait in Skald, "
        "where the wait does not count toward llm_timeout_s; unset: no limit (the embedded "
        "server: 1, its own)",
    )
    context_budget: ContextBudget = Field(default_factory=ContextBudget)


class ProseThresholds(BaseModel):
    """The degeneration guard: deterministic limits a drafted scene must meet.

    Human prose has a distinct word-trigram ratio above 0.9 and a zlib compression ratio
    (compressed / raw bytes) of about 0.35-0.45; looping model output scores 0.1-0.3 on both.
    """

    model_config = ConfigDict(extra="forbid")

    min_distinct_trigrams: float = Field(
        0.80, ge=0, le=1, description="distinct / total word trigrams"
    )
    min_distinct_bigrams: float = Field(
        0.60, ge=0, le=1, description="distinct / total word bigrams"
    )
    max_sentence_repeats: int = Field(3, ge=1, description="most times one sentence may occur")
    min_compression_ratio: float = Field(0.25, ge=0, le=1, description="zlib bytes / raw bytes")
    min_length_ratio: float = Field(
        0.15, ge=0, le=10, description="words / target words, lower bound"
    )
    max_length_ratio: float = Field(
        3.0, ge=0.1, le=100, description="words / target words, upper bound"
    )
    max_draft_attempts: int = Field(
        3, ge=1, le=10, description="drafts per scene before it is flagged"
    )
    # Run-on sentences (see tasks/validation.py for the sources): published fiction averages
    # 12-20 words a sentence; Flesch's "very difficult" band (scientific prose) starts at 29.
    max_mean_sentence_words: float = Field(
        30.0, ge=5, description="mean words per sentence, upper bound"
    )
    max_sentence_words: int = Field(
        100, ge=10, description="words in the longest sentence, upper bound"
    )
    # A scene written as an outline ("1. The story begins with ...") rather than as prose.
    max_list_share: float = Field(
        0.3,
        ge=0,
        le=1,
        description="share of a scene's words in list lines (two or more), upper bound",
    )

    @model_validator(mode="after")
    def _length_bounds_ordered(self) -> ProseThresholds:
        if self.min_length_ratio >= self.max_length_ratio:
            raise ValueError("min_length_ratio must be below max_length_ratio")
        return self


class RevisionBudget(BaseModel):
    """How many drafts a chapter may get, and why when it is not `limits.max_iterations`."""

    model_config = ConfigDict(frozen=True)

    iterations: int = Field(ge=1)
    why: str = Field(
        "", description="one line for the log when a flagged chapter is kept for this budget"
    )


class StyleGuide(BaseModel):
    """How the prose is written; every scene prompt carries it."""

    # `register` is the setting's name; the attribute is `tone_register` (BaseModel has a
    # `register` method).
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    person: Literal["first", "second", "third"] = "third"
    tense: Literal["past", "present"] = "past"
    tone_register: str = Field(
        "literary, concrete and sensory; plain modern English", max_length=300, alias="register"
    )
    notes: str = Field(
        "Show through action and dialogue; vary sentence length; never repeat a sentence.",
        max_length=2000,
    )


class HealingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name_similarity: float = Field(0.85, ge=0, le=1)
    embedding_similarity: float = Field(0.85, ge=0, le=1)
    graduation_confidence: float = Field(0.6, ge=0, le=1)
    enrichment_edge_threshold: int = Field(5, ge=1)
    provisional_alert_ratio: float = Field(0.5, ge=0, le=1)
    antonym_pairs: list[tuple[str, str]] = Field(
        default_factory=lambda: [
            ("brave", "cowardly"),
            ("honest", "deceitful"),
            ("kind", "cruel"),
            ("calm", "volatile"),
            ("generous", "greedy"),
            ("loyal", "treacherous"),
        ]
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SKALD_",
        env_nested_delimiter="__",
        extra="ignore",
        populate_by_name=True,
        validate_default=True,
    )

    # --- LLM endpoint: unset means the embedded llama.cpp server with SmolLM2.
    openai_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "OPENAI_BASE_URL", "SKALD_OPENAI_BASE_URL", "openai_base_url"
        ),
    )
    openai_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("OPENAI_API_KEY", "SKALD_OPENAI_API_KEY", "openai_api_key"),
    )
    default_model: str = Field(
        "gpt-4o-mini", min_length=1, description="used by tiers with no models"
    )
    # Completion cap for the embedded SmolLM2 default (a tiny model can loop until any cap).
    local_max_tokens: int = Field(1024, ge=32, le=8192)
    # The base of every chat request's sampling seed (core.llm.sampling): the same settings and
    # prompts give the same answers from a seeded server (the embedded llama-server, vLLM,
    # OpenAI at its best effort), so a book is the same from run to run and a resumed run
    # writes what the uninterrupted one would have. "off" sends no seed.
    llm_seed: int | None = Field(0, ge=0, le=2**31 - 1)
    tiers: dict[TierName, TierSettings] = Field(default_factory=_default_tiers)
    # Dialogue sidecar slot -> model (request `config.models.<slot>` overrides these).
    slot_models: dict[str, str] = Field(default_factory=dict)
    # Dialogue sidecar slot -> seconds it may run before its turn is rolled back (timed_out);
    # the turn deadline applies as well. Slots not named here are bounded by the deadline only.
    slot_timeouts_s: dict[str, float] = Field(default_factory=dict)
    # Dialogue sidecar: remembered turns a process keeps in its in-memory recall indexes, over
    # all conversations (a few KB each); the least recently used conversations' indexes are
    # dropped past it and rebuilt from the graph when next asked for.
    recall_cache_turns: int = Field(100_000, ge=100)

    # --- Embeddings: unset means a local llama-server in --embeddings mode.
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None
    embedding_model: str = "text-embedding-3-small"

    # --- Graph: unset NEO4J_URI means embedded ArcadeDB under <project-dir>/.saga/graph.
    neo4j_uri: str | None = Field(
        None, validation_alias=AliasChoices("NEO4J_URI", "SKALD_NEO4J_URI", "neo4j_uri")
    )
    neo4j_username: str = Field(
        "neo4j",
        validation_alias=AliasChoices(
            "NEO4J_USERNAME", "NEO4J_USER", "SKALD_NEO4J_USERNAME", "neo4j_username"
        ),
    )
    neo4j_password: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("NEO4J_PASSWORD", "SKALD_NEO4J_PASSWORD", "neo4j_password"),
    )
    neo4j_database: str | None = Field(
        None,
        validation_alias=AliasChoices("NEO4J_DATABASE", "SKALD_NEO4J_DATABASE", "neo4j_database"),
    )
    graph_connect_attempts: int = Field(5, ge=1, le=50)

    # --- Where outputs live.
    project_dir: Path = Path(".")

    limits: RunLimits = Field(default_factory=RunLimits)
    prose: ProseThresholds = Field(default_factory=ProseThresholds)
    style: StyleGuide = Field(default_factory=StyleGuide)
    healing: HealingSettings = Field(default_factory=HealingSettings)

    @field_validator("tiers", mode="before")
    @classmethod
    def _merge_tiers_over_defaults(cls, value: Any) -> Any:
        # A partial tiers table (e.g. only `large`) keeps the defaults of the others.
        if isinstance(value, dict):
            merged: dict[str, Any] = {k: v.model_dump() for k, v in _default_tiers().items()}
            for name, tier in value.items():
                base = merged.get(name, {})
                if isinstance(tier, dict):
                    merged[name] = {**base, **tier}
                else:
                    merged[name] = tier
            return merged
        return value

    @field_validator("slot_timeouts_s")
    @classmethod
    def _known_slots_positive(cls, value: dict[str, float]) -> dict[str, float]:
        for slot, seconds in value.items():
            if slot not in (*SLOT_NAMES, "commit"):
                raise ValueError(f"unknown slot {slot!r}; slots: {', '.join(SLOT_NAMES)}, commit")
            if not seconds > 0:
                raise ValueError(f"slot_timeouts_s.{slot} must be > 0 seconds (got {seconds})")
        return value

    @field_validator("openai_base_url", "embedding_base_url", "neo4j_uri", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("llm_seed", mode="before")
    @classmethod
    def _off_sends_no_seed(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("off", "none"):
            return None
        return value

    @field_validator("openai_base_url", "embedding_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("neo4j_uri")
    @classmethod
    def _bolt_url(cls, value: str | None) -> str | None:
        return bolt_uri(value)

    @property
    def saga_dir(self) -> Path:
        return self.project_dir / ".saga"

    def tier(self, name: str) -> TierSettings:
        if name not in self.tiers:
            raise ConfigError(
                f"unknown LLM tier {name!r}", hint=f"use one of {', '.join(TIER_NAMES)}"
            )
        return self.tiers[name]  # type: ignore[index]

    def embedded_tier(self, name: str) -> bool:
        """Whether the tier's calls go to the embedded llama-server: no OPENAI_BASE_URL and no
        candidate of the tier with an endpoint of its own."""
        return self.openai_base_url is None and not any(c.base_url for c in self.tier(name).models)

    def revision_budget(self) -> RevisionBudget:
        """Drafts per chapter: `limits.max_iterations` when it is set or an endpoint is
        configured; on the embedded model by default, EMBEDDED_MAX_ITERATIONS (its revisions
        have not passed the checks that flagged them)."""
        limits = self.limits
        if "max_iterations" in limits.model_fields_set or not all(
            self.embedded_tier(t) for t in REVISED_TIERS
        ):
            return RevisionBudget(iterations=limits.max_iterations)
        return RevisionBudget(
            iterations=EMBEDDED_MAX_ITERATIONS,
            why=f"the embedded 135M model's revisions have not passed these checks ({EMBEDDED_REVISIONS_PASSED} of "
            f"{EMBEDDED_REVISIONS_MEASURED} measured), so it is kept as drafted: set limits.max_iterations "
            "(SKALD_LIMITS__MAX_ITERATIONS) to revise anyway",
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, dotenv_settings, _TomlSource(settings_cls))


class _TomlSource(PydanticBaseSettingsSource):
    """Reads the TOML file chosen by load_settings(); keys mirror the field names."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = _toml_path.get()
        if path is None or not path.exists():
            return {}
        try:
            # A byte-order mark would be tomllib's "invalid statement at line 1, column 1".
            data = tomllib.loads(path.read_text(encoding=USER_TEXT_ENCODING))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                f"cannot read config file {path}: {exc}", hint="fix the TOML syntax"
            ) from exc
        # Accept both a top-level table and a [skald] table.
        return dict(data.get("skald", data))


def _one_line(exc: ValidationError) -> str:
    problem = first_problem(exc, "settings")
    value = problem.detail.get("input")
    shown = "" if isinstance(value, dict) else f" (got {str(value)[:60]!r})"
    return f"invalid setting {problem.place}: {problem.message}{shown}{problem.and_more('')}"


def load_settings(
    project_dir: str | Path | None = None,
    config_file: str | Path | None = None,
    **overrides: Any,
) -> Settings:
    """Build Settings from every source; raise ConfigError with one line on bad values."""
    project = (
        Path(project_dir)
        if project_dir is not None
        else Path(os.environ.get("SKALD_PROJECT_DIR", "."))
    )
    config = config_file or os.environ.get("SKALD_CONFIG")
    toml_path = Path(config) if config else project / "skald.toml"
    if config and not toml_path.exists():
        raise ConfigError(
            f"config file {toml_path} does not exist", hint="check --config / SKALD_CONFIG"
        )
    env_files = [p for p in (Path(".env"), project / ".env") if p.exists()]
    for env_file in env_files:
        check_env_file(env_file)
    token = _toml_path.set(toml_path)
    try:
        settings = Settings(
            _env_file=env_files or None,  # type: ignore[call-arg]
            project_dir=project.resolve(),
            **{k: v for k, v in overrides.items() if v is not None},
        )
    except ValidationError as exc:
        raise ConfigError(_one_line(exc), hint="see README 'Configuration'") from None
    finally:
        _toml_path.reset(token)
    return settings


def check_env_file(path: Path) -> None:
    """Refuse a `.env` file with a line python-dotenv cannot parse (an unclosed quote, a
    missing `=`): it would skip that line with a warning, so the setting on it is ignored and,
    say, a run meant for the endpoint the line names goes to the local model. The parser is
    python-dotenv's own, the one that reads the file for the settings."""
    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding=USER_TEXT_ENCODING)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint=_ENV_FILE_HINT) from None
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            # The line is not echoed: its value may be a key (OPENAI_API_KEY="sk-...).
            found = binding.original.string
            name = _ENV_NAME.match(found)
            named = f" ({name.group(1)})" if name else ""
            # The parser's line is where the blank lines before the statement start.
            line = binding.original.line + found[: len(found) - len(found.lstrip())].count("\n")
            raise ConfigError(
                f"{path} line {line}{named} is not NAME=value",
                hint=_ENV_FILE_HINT,
            )


_ENV_NAME = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)")
_ENV_FILE_HINT = (
    "write NAME=value with any quote closed, or delete the line; README 'Configuration' lists "
    "the settings"
)


def require_project_dir(project_dir: Path) -> None:
    """For a command that reads or changes what a project already holds: a project directory
    that does not exist is a mistyped path, not an empty project. Without this the embedded
    graph would be created there, and the command would answer from it, empty."""
    if not project_dir.is_dir():
        raise InvalidInputError(
            f"--project-dir {project_dir} is not a directory",
            hint="point it at an existing project, one python -m flows.novel or the sidecar wrote",
        )


def require_project(settings: Settings) -> None:
    """The same for a directory that exists but holds no project (no `.saga/`: the wrong folder,
    `--project-dir .` run from elsewhere), when the graph is the embedded one that lives in the
    project: it would be created there, empty, and the command would answer from it. With
    NEO4J_URI the graph is elsewhere and the directory only holds settings. Callers check
    `require_project_dir` first, before the settings are read."""
    if settings.neo4j_uri is None and not settings.saga_dir.is_dir():
        raise InvalidInputError(
            f"--project-dir {settings.project_dir} holds no Skald project (no .saga/ folder)",
            hint="point it at a project python -m flows.novel or the sidecar wrote, or set "
            "NEO4J_URI for a graph served elsewhere",
        )
