"""Assembly stage: scene drafts joined into the chapter text."""

from __future__ import annotations

from core.content import ContentRef
from tasks.policy import plain_task
from tasks.services import Services

SCENE_BREAK = "\n\n* * *\n\n"


@plain_task("assemble_chapter")
def assemble_chapter(
    services: Services, number: int, iteration: int, scenes: tuple[ContentRef, ...]
) -> ContentRef:
    text = SCENE_BREAK.join(services.content.get_text(ref).strip() for ref in scenes)
    return services.content.put_text("drafts", f"chapter_{number:03d}/iter_{iteration}", text)
