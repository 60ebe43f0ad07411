"""Strict JSON schemas for structured output, and tighter ones for the embedded tiny model.

`response_format_for(model)`: the `json_schema` response format OpenAI's strict mode wants
(closed objects, every property required, no `$ref` with siblings), built once per class.
`bounded_response_format_for(model, max_tokens)`: the same, bounded so that llama-server's
grammar-constrained sampling keeps a 135M model's answer short enough to finish.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache, lru_cache
from typing import Any

from pydantic import BaseModel

from core.sentences import finish_cut_text, whole_words

# Grammar bounds for the embedded 135M model: llama-server compiles maxLength / maxItems into
# its sampling grammar, so a string that would loop is closed instead of running into the
# token cap (which leaves invalid JSON); string caps shrink so the whole answer fits.
LOCAL_MAX_STRING_CHARS = 160
LOCAL_MIN_STRING_CHARS = 24
LOCAL_MAX_ITEMS = 3
# Characters per SmolLM2 token assumed when sizing string caps to the token cap: English runs
# ~4, the model's repetitive junk less.
LOCAL_CHARS_PER_TOKEN = 3
# What the grammar lets the model spend around one field or item: quotes, colon, comma and
# a newline with indentation.
_JSON_SEPARATOR_CHARS = 12
# Printable ASCII but the quote and backslash: one token at most per character.
_ASCII_TEXT = r"[\x20\x21\x23-\x5b\x5d-\x7e]"
# llama-server's grammar bounds integers but not floats (a tiny model then answers -3 for a
# 0-1 score); a bounded float becomes an enum of this many evenly spaced values instead.
LOCAL_NUMBER_STEPS = 20


@cache
def response_format_for(model: type[BaseModel]) -> dict[str, Any]:
    """The strict json_schema response_format for `model`, built once per class."""
    schema = model.model_json_schema()
    _make_strict(schema, schema)
    name = re.sub(r"[^A-Za-z0-9_-]", "_", model.__name__)[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@lru_cache(maxsize=256)
def bounded_response_format_for(model: type[BaseModel], max_tokens: int) -> dict[str, Any]:
    """response_format_for(model) bounded for small local models whose grammar-constrained
    sampling enforces the bounds: every array gets at most LOCAL_MAX_ITEMS items (fewer when
    the token budget is small); every free
    string is printable ASCII (an escape or an emoji costs several tokens per character) with
    a length cap sized so that the longest answer the schema allows fits in `max_tokens`
    (between LOCAL_MIN_STRING_CHARS and LOCAL_MAX_STRING_CHARS); every float with a minimum
    and maximum becomes an enum of steps. Tighter bounds of the model are kept, and a bound
    never goes below a field's own minimum."""
    strict = response_format_for(model)["json_schema"]
    schema = copy.deepcopy(strict["schema"])
    for items in range(LOCAL_MAX_ITEMS, 0, -1):
        # Fewer items before strings shorter than LOCAL_MIN_STRING_CHARS: three garbled names
        # are worth less than one whole one.
        strings, fixed = _longest_answer(schema, schema, 0, items)
        room = max_tokens * LOCAL_CHARS_PER_TOKEN - fixed
        cap = int(room / strings) if strings else LOCAL_MAX_STRING_CHARS
        if cap >= LOCAL_MIN_STRING_CHARS:
            break
    _bound(schema, min(LOCAL_MAX_STRING_CHARS, max(LOCAL_MIN_STRING_CHARS, cap)), items)
    return {"type": "json_schema", "json_schema": {**strict, "schema": schema}}


def mend_cut_strings(data: Any, schema: dict[str, Any]) -> Any:
    """`data` (a parsed answer to the bounded `schema`) with every free string that reached
    its grammar cap ended where a sentence or clause ends, never mid-word or mid-sentence.

    A cut string with no sentence or clause end to fall back to is emptied when its field
    may be empty, else (a required name, say) kept to its last whole word: name checks
    downstream decide whether a short name is a name (core.grounding)."""
    return _mend(data, schema, schema, 0)


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return target if isinstance(target, dict) else {}
    return node


def _mend(data: Any, node: Any, root: dict[str, Any], depth: int) -> Any:
    if not isinstance(node, dict) or depth > 32:
        return data
    node = _resolve(node, root)
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            for branch in node[key]:
                data = _mend(data, branch, root, depth + 1)
            return data
    if isinstance(data, dict) and isinstance(node.get("properties"), dict):
        return {k: _mend(v, node["properties"].get(k), root, depth + 1) for k, v in data.items()}
    if isinstance(data, list) and isinstance(node.get("items"), dict):
        return [_mend(v, node["items"], root, depth + 1) for v in data]
    cap = node.get("maxLength")
    if (
        isinstance(data, str)
        and _free_string_or_bounded(node)
        and isinstance(cap, int)
        and len(data) >= cap
    ):
        mended = finish_cut_text(data)
        if len(mended) < node.get("minLength", 0) or not mended:
            mended = whole_words(data) if node.get("minLength", 0) else ""
        return mended if len(mended) >= node.get("minLength", 0) else data
    return data


def _free_string_or_bounded(node: dict[str, Any]) -> bool:
    # Bounded free strings carry the ASCII pattern _bound adds; enums and formats are not text.
    return "string" in _kinds(node) and not any(k in node for k in ("enum", "const", "format"))


def _kinds(node: dict[str, Any]) -> list[Any]:
    kind = node.get("type")
    return kind if isinstance(kind, list) else [kind]


def _free_string(node: dict[str, Any]) -> bool:
    return "string" in _kinds(node) and not any(
        k in node for k in ("enum", "const", "pattern", "format")
    )


def _items_cap(node: dict[str, Any], items: int) -> int:
    cap = max(items, node.get("minItems", 0))
    return int(min(node.get("maxItems", cap), cap))


def _bound(node: Any, string_cap: int, items: int) -> None:
    if isinstance(node, list):
        for item in node:
            _bound(item, string_cap, items)
        return
    if not isinstance(node, dict):
        return
    if _free_string(node):
        low = node.get("minLength", 0)
        cap = max(string_cap, low)
        node["maxLength"] = min(node.get("maxLength", cap), cap)
        node["pattern"] = f"^{_ASCII_TEXT}{{{low},{node['maxLength']}}}$"
    if "array" in _kinds(node):
        node["maxItems"] = _items_cap(node, items)
    low, high = node.get("minimum"), node.get("maximum")
    if (
        _kinds(node) == ["number"]
        and "enum" not in node
        and "const" not in node
        and low is not None
        and high is not None
    ):
        node["enum"] = [
            round(low + (high - low) * i / LOCAL_NUMBER_STEPS, 6)
            for i in range(LOCAL_NUMBER_STEPS + 1)
        ]
    for value in node.values():
        if isinstance(value, dict | list):
            _bound(value, string_cap, items)


def _longest_answer(node: Any, root: dict[str, Any], depth: int, items: int) -> tuple[int, int]:
    """(free strings, other characters) in the longest JSON the schema allows once bounded,
    counting the grammar's optional whitespace; a guess for what cannot be bounded (recursion)."""
    if not isinstance(node, dict) or depth > 12:
        return 0, 8
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _longest_answer(target, root, depth + 1, items)
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key]:
            return max(
                (_longest_answer(b, root, depth + 1, items) for b in node[key]),
                key=lambda t: t[0] * 100 + t[1],
            )
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")])
        return 0, max((len(json.dumps(v)) for v in values), default=4)
    kinds = _kinds(node)
    if "object" in kinds and isinstance(node.get("properties"), dict):
        strings, fixed = 0, 2
        for key, sub in node["properties"].items():
            s, f = _longest_answer(sub, root, depth + 1, items)
            strings, fixed = strings + s, fixed + f + len(json.dumps(key)) + _JSON_SEPARATOR_CHARS
        return strings, fixed
    if "array" in kinds:
        count = _items_cap(node, items)
        s, f = _longest_answer(node.get("items", {}), root, depth + 1, items)
        return count * s, 2 + count * (f + _JSON_SEPARATOR_CHARS)
    if _free_string(node):
        return 1, 2
    if "string" in kinds:
        return 0, 2 + int(node.get("maxLength", 24))
    if kinds == ["number"] and "minimum" in node and "maximum" in node:
        return 0, 8  # becomes an enum of short steps
    return 0, 18


def _make_strict(node: Any, root: dict[str, Any]) -> Any:
    """In place: what OpenAI's strict mode wants (closed objects, every property required,
    no `$ref` with siblings, no null defaults); local servers accept the same schema."""
    if isinstance(node, list):
        return [_make_strict(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    for defs_key in ("$defs", "definitions"):
        if isinstance(node.get(defs_key), dict):
            for sub in node[defs_key].values():
                _make_strict(sub, root)
    if node.get("type") == "object" and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if isinstance(node.get("properties"), dict):
        node["required"] = list(node["properties"])
        for sub in node["properties"].values():
            _make_strict(sub, root)
    if isinstance(node.get("items"), dict):
        _make_strict(node["items"], root)
    for key in ("anyOf", "oneOf", "prefixItems"):
        if isinstance(node.get(key), list):
            _make_strict(node[key], root)
    if isinstance(node.get("allOf"), list):
        if len(node["allOf"]) == 1:
            only = node.pop("allOf")[0]
            node.update(_make_strict(only, root))
        else:
            _make_strict(node["allOf"], root)
    if "default" in node and node["default"] is None:
        del node["default"]
    ref = node.get("$ref")
    if isinstance(ref, str) and len(node) > 1:
        resolved: Any = root
        for part in ref.removeprefix("#/").split("/"):
            resolved = resolved[part]
        node.update({**resolved, **node})
        del node["$ref"]
        _make_strict(node, root)
    return node
