"""The scripted model server's scripts: the APIs it speaks, the conversation
each request holds, and the scripts that answer by it (:func:`episode`,
:func:`by_instruction`, a script file's :func:`load_script`). See
``model_server`` for the whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs

from .._models import _chat_wire, _gemini_wire, _messages_wire, _responses_wire
from . import _gemini_render, _messages_render, _responses_render
from ._chat_stream import sse_events
from ._replies import (
    CHUNK_CHARS,
    RecordedRequest,
    Reply,
    Script,
    echo_headers,
    empty_choices,
    error,
    malformed,
    stream_error,
    text,
    tool_call,
    tool_calls,
)

__all__ = ["APIS", "Api", "api_of", "by_instruction", "episode", "load_script", "message_text"]


def message_text(message: Any) -> str:
    """A message's content as text: a string, or the ``text`` of a list of parts."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


@attrs.frozen
class Api:
    """One API the server speaks: its route, where a request keeps its
    conversation (as chat-like messages, see ``_models._wire``), and how a
    scripted chat completion, its stream and an error body are rendered."""

    route: str | tuple[str, ...]
    conversation: Callable[[Any], list[Any]]
    body: Callable[[Any], Any]
    events: Callable[[Any, int, bool, str | None], list[bytes]]
    error: Callable[[int, str], Any]
    #: Whether a request (its path, its JSON body) asks for a stream.
    streams: Callable[[str, Any], bool] = lambda _path, body: isinstance(body, dict) and body.get("stream") is True


def _openai_error(status: int, message: str) -> Any:
    return {"error": {"message": message, "type": "scripted", "code": status}}


APIS = (
    Api("/chat/completions", _chat_wire.conversation, lambda body: body, sse_events, _openai_error),
    Api(
        "/responses",
        _responses_wire.conversation,
        _responses_render.response_body,
        lambda body, size, _usage, failure: _responses_render.response_events(body, size, failure),
        _openai_error,
    ),
    Api(
        "/messages",
        _messages_wire.conversation,
        _messages_render.message_body,
        lambda body, size, _usage, failure: _messages_render.message_events(body, size, failure),
        _messages_render.error_body,
    ),
    Api(
        (":generateContent", ":streamGenerateContent"),
        _gemini_wire.conversation,
        _gemini_render.generate_body,
        lambda body, size, _usage, failure: _gemini_render.generate_events(body, size, failure),
        _gemini_render.error_body,
        _gemini_render.streams,
    ),
)


def api_of(path: str) -> Api | None:
    route = path.split("?")[0].rstrip("/")
    return next((api for api in APIS if route.endswith(api.route)), None)


def _messages(request: RecordedRequest) -> list[Any]:
    return (api_of(request.path) or APIS[0]).conversation(request.json)


def _turn(messages: list[Any], start: int) -> int:
    return sum(1 for m in messages[start:] if isinstance(m, dict) and m.get("role") == "assistant")


def episode(steps: Sequence[Reply], *, delay: float = 0.0, start: Callable[[list[Any]], int] | None = None) -> Script:
    """Reply ``steps[n]`` to a request whose conversation has ``n`` assistant
    messages (the last step repeats), each after ``delay`` unless it has its own.
    ``start(messages)``, when given, is the index of the message the episode
    counts from (assistant messages before it, such as an agent's example
    exchanges, are not turns)."""
    replies = [s if s.delay or not delay else s.after(delay) for s in steps]

    def reply(request: RecordedRequest) -> Reply:
        messages = _messages(request)
        turn = _turn(messages, start(messages) if start is not None else 0)
        return replies[min(turn, len(replies) - 1)]

    return reply


def _anchor(messages: list[Any], needle: str) -> int | None:
    """The index of the first user or tool message containing ``needle``."""
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in ("user", "tool") and needle in message_text(message):
            return index
    return None


def by_instruction(episodes: Sequence[tuple[str, Script]], default: Script | None = None) -> Script:
    """The script of the first ``(substring, script)`` whose substring is in a
    user or tool message of the conversation (text or a list of text parts),
    searched from its last such message back; else ``default`` (else HTTP
    400). An :func:`episode` built by :func:`load_script` counts its turns
    from the first message that holds the substring, so example exchanges an
    agent sends before the task do not shift the script."""

    def reply(request: RecordedRequest) -> Reply:
        messages = _messages(request)
        for message in reversed(messages):
            if not (isinstance(message, dict) and message.get("role") in ("user", "tool")):
                continue
            text = message_text(message)
            for needle, script in episodes:
                if needle in text:
                    return script(request)
        if default is not None:
            return default(request)
        return error(400, body={"error": {"message": "no scripted episode matches this conversation"}})

    return reply


def _step(raw: dict[str, Any], delay: float) -> Reply:
    if not isinstance(raw, dict):
        raise ValueError(f"a script step must be an object, got {raw!r}")
    raw = dict(raw)
    step_delay = float(raw.pop("delay", delay))
    headers = {str(k): str(v) for k, v in (raw.pop("headers", None) or {}).items()}
    chunk_chars = int(raw.pop("chunk_chars", CHUNK_CHARS))
    chunk_delay = float(raw.pop("chunk_delay", 0.0))
    if "text" in raw:
        reply = text(str(raw["text"]))
    elif "tool_call" in raw:
        call = raw["tool_call"]
        reply = tool_call(call["name"], call.get("arguments", {}))
    elif "tool_calls" in raw:
        reply = tool_calls([(call["name"], call.get("arguments", {})) for call in raw["tool_calls"]])
    elif "status" in raw:
        reply = error(int(raw["status"]), body=raw.get("body"))
    elif "malformed" in raw:
        reply = malformed(str(raw["malformed"]))
    elif "empty_choices" in raw:
        reply = empty_choices()
    elif "echo_headers" in raw:
        reply = echo_headers(int(raw["echo_headers"]))
    elif "stream_error" in raw:
        reply = stream_error(str(raw["stream_error"]))
    else:
        raise ValueError(f"unknown script step {sorted(raw)}")
    reply = attrs.evolve(reply, headers={**reply.headers, **headers}, chunk_chars=chunk_chars, chunk_delay=chunk_delay)
    return reply.after(step_delay) if step_delay else reply


def load_script(data: dict[str, Any]) -> Script:
    """The script a JSON script file describes (see the module docstring)."""
    delay = float(data.get("delay", 0))
    episodes = [
        (e["match"], episode([_step(s, delay) for s in e["steps"]], start=partial(_start, e["match"])))
        for e in data.get("episodes", [])
    ]
    default = episode([_step(s, delay) for s in data["default"]]) if data.get("default") else None
    return by_instruction(episodes, default)


def _start(needle: str, messages: list[Any]) -> int:
    anchor = _anchor(messages, needle)
    return 0 if anchor is None else anchor
