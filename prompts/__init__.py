"""Prompt templates (Jinja2), one folder per agent, each paired with its output model.

A template defines two blocks, `system` and `user`; `render_messages` turns them into
chat messages. Prompt text lives only here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, Template


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=PackageLoader("prompts", ""),
        undefined=StrictUndefined,  # a missing variable is a bug, not an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )


@lru_cache(maxsize=64)
def template(name: str) -> Template:
    return _environment().get_template(name if name.endswith(".j2") else f"{name}.j2")


def render_messages(name: str, /, **context: Any) -> list[dict[str, str]]:
    """Render `<agent>/<template>` into [system, user] chat messages."""
    tmpl = template(name)
    ctx = tmpl.new_context(context)
    messages: list[dict[str, str]] = []
    for role in ("system", "user"):
        block = tmpl.blocks.get(role)
        if block is None:
            continue
        text = "".join(block(ctx)).strip()
        if text:
            messages.append({"role": role, "content": text})
    if not messages:
        raise ValueError(f"prompt template {name!r} has no system/user blocks")
    return messages


def render_text(name: str, /, **context: Any) -> str:
    """Render a template's `user` block as plain text (a piece of a larger prompt)."""
    return render_messages(name, **context)[-1]["content"]


def template_names() -> list[str]:
    return sorted(n for n in _environment().list_templates() if n.endswith(".j2"))
