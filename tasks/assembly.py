"""Assembly stage: scene drafts joined into the chapter text."""

from __future__ import annotations

from core.content import ContentRef
from tasks.policy import plain_task
from tasks.runtime import runtime

SCENE_BREAK = "\n\n* * *\n\n"


@plain_task("assemble_chapter")
def assemble_chapter(number: int, iteration: int, scenes: tuple[ContentRef, ...]) -> ContentRef:
    rt = runtime()
    text = SCENE_BREAK.join(rt.content.get_text(ref).strip() for ref in scenes)
    return rt.content.put_text("drafts", f"chapter_{number:03d}/iter_{iteration}", text)
