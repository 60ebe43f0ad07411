"""Actor slot: generate the reply (config.actor.mode = "generate"), or take the recorded turn.

In "recorded" mode the turn's messages are final (a front end committing after its own model
answered, or a regression replay) and no model is called. In "generate" mode the actor writes
the next message as `config.actor.speaker`, with the injection packet as its memory; the
reply joins the turn's messages, so it is extracted and stored like any other message.
"""

from __future__ import annotations

from pydantic import BaseModel

from core.llm import LLMGateway
from prompts import render_messages
from tasks.dialogue.models import MAX_MESSAGE_CHARS, ChatMessage, TurnCommitRequest
from tasks.dialogue.parts import InjectionPacket
from tasks.dialogue.routing import Route

WINDOW_LINES = 20


class ActorOutput(BaseModel):
    reply: str | None = None
    messages: list[ChatMessage]


def act(
    gateway: LLMGateway,
    route: Route,
    request: TurnCommitRequest,
    packet: InjectionPacket,
    *,
    purpose: str = "",
) -> ActorOutput:
    config = request.config.actor
    if config.mode == "recorded":
        return ActorOutput(messages=list(request.messages))
    speaker = config.speaker or "assistant"
    lines = [m.line() for m in (*request.window, *request.messages)][-WINDOW_LINES:]
    prompt = render_messages(
        "dialogue/actor",
        speaker=speaker,
        max_words=config.max_words,
        memory=packet.text,
        window_lines=lines,
    )
    reply = gateway.text(
        route.tier,
        prompt,
        purpose=purpose,
        model=route.model,
        max_tokens=max(32, config.max_words * 2),
    ).strip()
    # Models often echo the speaker tag they were shown; the stored message must not.
    prefix = f"{speaker}:"
    if reply.startswith(prefix):
        reply = reply[len(prefix) :].strip()
    reply = reply[:MAX_MESSAGE_CHARS] or "..."
    message = ChatMessage(role="assistant", name=speaker, content=reply)
    return ActorOutput(reply=reply, messages=[*request.messages, message])
