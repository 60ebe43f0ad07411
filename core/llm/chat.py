"""One candidate's chat request as its attempts reshape it (`ChatRequest`), and what a reply
gave (`read_reply`): the parts of `LLMGateway`'s chat engine that decide what is asked and
whether the answer is one.

- `ChatRequest.first(...)`: the first request to a candidate: the caller's or the tier's token
  budget and the output model's strict response format; for the embedded tiny model a shorter
  cap and a grammar bounded to it.
- `kwargs(...)`: the `chat.completions.create` arguments of the next attempt, with the seed
  derived from them (core.llm.sampling.request_seed) unless the settings send none.
- `answer(reply, output_model)`: Ok(the text, never blank, or the validated output model,
  near-JSON repaired and the tiny model's cut strings ended cleanly), or Err(why not,
  `bad_output`).
- `after_bad_answer(reply, problem, output_model)`: the next attempt after a bad answer: a
  cut-off answer of the tiny model gets a tighter grammar, another one more room within the
  context window; otherwise the same question with the bad answer and what was wrong with
  it (that feedback replaces earlier feedback, so the prompt stays bounded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from core.errors import Err, Ok, Result
from core.llm.records import CallStats
from core.llm.repair import parse_answer
from core.llm.sampling import anti_repetition_kwargs, request_seed
from core.llm.schemas import bounded_response_format_for, mend_cut_strings, response_format_for
from core.settings import TierSettings

Message = dict[str, Any]

FEEDBACK = "Your previous answer was invalid: {error}. Reply with only JSON matching the schema."
# Below this token budget a tighter grammar no longer helps: the answer is asked again as is.
_MIN_SIZE_BUDGET = 64


class Reply(NamedTuple):
    """What a chat completion said: its text ("" when none) and why it stopped."""

    content: str
    finish: str | None


def read_reply(result: Any, stats: CallStats) -> Reply:
    """The reply of a chat completion, its token usage added to `stats`."""
    usage = result.usage
    if usage is not None:
        stats.prompt_tokens += usage.prompt_tokens or 0
        stats.completion_tokens += usage.completion_tokens or 0
    choice = result.choices[0] if result.choices else None
    content = (choice.message.content if choice is not None else None) or ""
    return Reply(content, choice.finish_reason if choice is not None else None)


@dataclass(slots=True)
class ChatRequest:
    """What the next attempt to one candidate sends."""

    tier: TierSettings
    base: list[Message]
    convo: list[Message]
    tokens: int
    token_cap: int
    size_budget: int
    response_format: dict[str, Any] | None
    tiny: bool
    feedback_echo_chars: int
    #: The settings' base seed (`llm_seed`; None: no seed is sent) and which answer of several to
    #: the same request the caller asks for; with the bad answers so far they make the seed.
    seed: int | None = None
    sample: int = 0
    bad_answers: int = 0

    @classmethod
    def first(
        cls,
        tier: TierSettings,
        base: list[Message],
        output_model: type[BaseModel] | None,
        max_tokens: int | None,
        *,
        tiny: bool,
        tiny_max_tokens: int,
        feedback_echo_chars: int,
        seed: int | None = None,
        sample: int = 0,
    ) -> ChatRequest:
        """The first request to a candidate (`tiny`: the embedded model; `seed`, `sample`: see
        core.llm.sampling.request_seed)."""
        tokens = max_tokens or tier.max_tokens
        token_cap = tier.context_window
        response_format = response_format_for(output_model) if output_model is not None else None
        if tiny:
            # The embedded 135M model can loop until any cap: keep its answers short and
            # bound them in the grammar rather than giving it more room.
            token_cap = tiny_max_tokens
            tokens = min(tokens, token_cap)
            if output_model is not None:
                response_format = bounded_response_format_for(output_model, tokens)
        return cls(
            tier,
            base,
            base,
            tokens,
            token_cap,
            tokens,
            response_format,
            tiny,
            feedback_echo_chars,
            seed,
            sample,
        )

    def kwargs(self, model: str, temperature: float, anti_repetition: bool) -> dict[str, Any]:
        """The arguments of the next attempt's `chat.completions.create`."""
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": self.convo,
            "max_tokens": self.tokens,
            "temperature": temperature,
        }
        if self.response_format is not None:
            kwargs["response_format"] = self.response_format
        if anti_repetition:
            kwargs.update(anti_repetition_kwargs(self.tier.anti_repetition, embedded=self.tiny))
        if self.seed is not None:
            if self.tiny:
                # llama.cpp reuses the KV cache of a previous prompt's common prefix, and logits
                # computed so differ in the last bits from the same prompt processed whole: the
                # same seeded request would answer differently after another request, or in a
                # resumed run's new server. What it costs: on `make run` the cache had saved 14%
                # of the prompt tokens (2,741 of 19,405), ~10 s of 3 minutes.
                kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "cache_prompt": False}
            kwargs["seed"] = request_seed(
                self.seed, kwargs, sample=self.sample, bad_answers=self.bad_answers
            )
        return kwargs

    def answer(
        self, reply: Reply, output_model: type[BaseModel] | None
    ) -> Result[Any, Literal["bad_output"]]:
        """Ok(the answer), or Err(why the reply is none, bad_output)."""
        if output_model is None:
            if reply.content.strip():
                return Ok(reply.content)
            return Err("the reply was empty", "bad_output")
        mend = None
        if self.tiny and self.response_format is not None:
            bounded = self.response_format["json_schema"]["schema"]
            mend = lambda data, schema=bounded: mend_cut_strings(data, schema)  # noqa: E731
        return parse_answer(reply.content, output_model, mend=mend)

    def after_bad_answer(
        self, reply: Reply, problem: str, output_model: type[BaseModel] | None
    ) -> None:
        """Reshape this request for the attempt after a bad answer (`problem`: why bad)."""
        self.bad_answers += 1
        if (
            reply.finish == "length"
            and self.tiny
            and output_model is not None
            and self.size_budget > _MIN_SIZE_BUDGET
        ):
            # Cut off anyway: the tiny model ignores "shorter", so tighten the grammar.
            self.size_budget //= 2
            self.response_format = bounded_response_format_for(output_model, self.size_budget)
            return
        if reply.finish == "length":
            # Cut off: the same question with more room, within the context window.
            room = max(
                min(self.token_cap, self.tier.context_window - _estimate_tokens(self.convo)),
                self.tokens,
            )
            grown = min(room, int(self.tokens * 1.5))
            if grown > self.tokens:
                self.tokens = grown
                return
            problem += "; the answer was cut off, so keep it shorter"
        self.convo = [
            *self.base,
            {"role": "assistant", "content": reply.content[: self.feedback_echo_chars]},
            {"role": "user", "content": FEEDBACK.format(error=problem)},
        ]


def _estimate_tokens(messages: Sequence[Message]) -> int:
    chars = 0
    for message in messages:
        content = message.get("content")
        chars += len(content) if isinstance(content, str) else 0
    return chars // 4 + 4 * len(messages)
