"""Reading a structured answer: near-JSON repair, validation, one-line reasons for a re-ask.

`repair_json` is hand-written on purpose rather than `json-repair` (PyPI): it fixes only what
models do to otherwise complete JSON (code fences, prose around the value, trailing commas,
smart quotes). json-repair also completes truncated JSON, which would turn an answer cut off
at the token cap into a valid but truncated value, where the gateway instead asks again with
more room (core.llm.gateway).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from core.errors import Err, Ok, Result, error_location, is_invalid_json
from core.llm.failures import clip_line

T = TypeVar("T", bound=BaseModel)


def parse_answer(
    content: str, output_model: type[T], *, mend: Callable[[Any], Any] | None = None
) -> Result[T, Literal["bad_output"]]:
    """Ok(instance) or Err(one-line reason, bad_output). Repairs near-JSON before giving up.

    `mend` rewrites the parsed JSON value before validation (the gateway ends strings that
    the tiny model's grammar cut off at a sentence end, core.llm.schemas.mend_cut_strings)."""
    try:
        return Ok(_validate(content, output_model, mend))
    except ValidationError as exc:
        error = exc
    if is_invalid_json(error):
        repaired = repair_json(content)
        if repaired is not None and repaired != content:
            try:
                return Ok(_validate(repaired, output_model, mend))
            except ValidationError as exc:
                error = exc
    return Err(_summarize_validation(error), "bad_output")


def _validate(content: str, output_model: type[T], mend: Callable[[Any], Any] | None) -> T:
    if mend is None:
        return output_model.model_validate_json(content)
    try:
        data = json.loads(content)
    except ValueError:
        return output_model.model_validate_json(content)  # raises the json_invalid error
    return output_model.model_validate(mend(data))


def _summarize_validation(error: ValidationError) -> str:
    problems = error.errors()
    parts = []
    for problem in problems[:3]:
        loc = error_location(problem, "answer")
        parts.append(f"{loc}: {problem['msg']}")
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return clip_line("; ".join(parts) + more, 400)


_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_OPENERS = {"{": "}", "[": "]"}


def repair_json(text: str) -> str | None:
    """Best-effort fix of near-JSON: code fences, prose around the value, trailing commas,
    smart double quotes. Returns None when there is no JSON value to salvage."""
    candidate = text.strip()
    fenced = _FENCE.search(candidate)
    if fenced:
        candidate = fenced.group(1).strip()
    starts = [i for i in (candidate.find("{"), candidate.find("[")) if i >= 0]
    if not starts:
        return None
    start = min(starts)
    end = candidate.rfind(_OPENERS[candidate[start]])
    if end < start:
        return None
    return _fix_commas_and_quotes(candidate[start : end + 1])


def _fix_commas_and_quotes(text: str) -> str:
    out: list[str] = []
    in_string = False
    closer = '"'
    escaped = False
    length = len(text)
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == closer:
                in_string = False
                ch = '"'
            elif ch == '"':
                ch = '\\"'  # a plain quote inside a smart-quoted string
            out.append(ch)
            continue
        if ch == '"' or ch == "\u201c":
            in_string, closer = True, ('"' if ch == '"' else "\u201d")
            out.append('"')
            continue
        if ch == ",":
            j = i + 1
            while j < length and text[j] in " \t\r\n":
                j += 1
            if j < length and text[j] in "}]":
                continue  # trailing comma
        out.append(ch)
    return "".join(out)
