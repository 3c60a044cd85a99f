"""What the wire modules share: the parsed reply, its failure, and the
server-sent-events reader every API streams in.

A wire module (``_chat_wire``, ``_responses_wire``, ``_messages_wire``,
``_gemini_wire``) knows one API's
request and reply formats and nothing of HTTP: the clients classify what it
raises, the gateway records what it returns, and the scripted model server
reads the conversations it finds, from the same code. A conversation is a
list of chat-like entries: ``{"role", "content"}`` (text or None), with
``tool_calls`` (``[{id, name, arguments}]``) on an assistant entry and
``tool_call_id`` on a ``tool`` entry (a tool's result); an assistant turn
is one entry however many items or blocks the API spreads it over.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from ._client import ToolCall
from ._cost import call_usage

__all__ = [
    "Parsed", "ReplyError", "SSEReader", "arguments_text", "call_entry", "count", "events_of", "parsed", "text_of",
]  # fmt: skip


class ReplyError(Exception):
    """A reply that cannot be used: ``code`` is ``no_valid_output`` (the
    reply is malformed or empty) or ``model_server_error`` (the server said,
    inside a 200 reply, that it failed); ``detail`` is one line."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


@attrs.frozen
class Parsed:
    """One reply as every API has it: its text (None when it has none), its
    tool calls, ``usage`` as ``prompt_tokens``/``completion_tokens``, why it
    stopped, and ``raw``: the API's own reply object (a Responses ``output``
    list, a Messages assistant message) to continue the conversation with."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: dict[str, int]
    finish_reason: str | None
    raw: Any


def parsed(text: list[str], calls: list[ToolCall], usage: Any, finish: Any, raw: Any) -> Parsed:
    """The :class:`Parsed` reply of a Responses or Messages body's pieces
    (both count ``input_tokens`` and ``output_tokens``); a reply with neither
    text nor tool calls is ``no_valid_output``."""
    content = "".join(text) if text else None
    if content is None and not calls:
        raise ReplyError("no_valid_output", "the reply has neither text nor tool calls")
    return Parsed(
        content=content,
        tool_calls=tuple(calls),
        usage=call_usage(usage),
        finish_reason=finish if isinstance(finish, str) else None,
        raw=raw,
    )


def count(value: Any) -> int:
    """A token count as sent, 0 for anything that is not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def arguments_text(value: Any) -> str:
    """Tool-call arguments as JSON text (Messages sends an object)."""
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


class SSEReader:
    """Server-sent events, a line at a time: :meth:`line` returns the JSON
    object an event's ``data`` carries once its blank line arrives (both
    APIs name the event's type inside it, so ``event:`` lines add nothing).
    ``data: [DONE]`` and events with no data are skipped."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def line(self, line: str) -> dict[str, Any] | None:
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
            return None
        if line.strip():
            return None  # event:, id:, retry:, a comment
        return self.flush()

    def flush(self) -> dict[str, Any] | None:
        """The event whose blank line never came (a stream cut after its data)."""
        data, self._data = "\n".join(self._data), []
        if not data.strip() or data.strip() == "[DONE]":
            return None
        try:
            event = json.loads(data)
        except ValueError:
            raise ReplyError("no_valid_output", "a streamed event is not JSON") from None
        if not isinstance(event, dict):
            raise ReplyError("no_valid_output", "a streamed event is not an object")
        return event


def events_of(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of a whole stream's lines (the gateway's kept copy)."""
    reader = SSEReader()
    for line in lines:
        event = reader.line(line)
        if event is not None:
            yield event
    event = reader.flush()
    if event is not None:
        yield event


def error_detail(value: Any, limit: int = 500) -> str:
    """An error object as one line of at most ``limit`` characters."""
    return " ".join(json.dumps(value).split())[:limit]


def text_of(content: Any, *keys: str) -> str | None:
    """Content as text: a string, or the text parts of a list joined (a part's
    text under the first of ``keys`` it has, ``text`` by default)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    pieces = []
    for part in content:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, dict):
            for key in keys or ("text",):
                if isinstance(part.get(key), str):
                    pieces.append(part[key])
                    break
    return "".join(pieces)


def call_entry(call_id: Any, name: Any, arguments: Any) -> dict[str, str]:
    """A tool call as a trajectory has it."""
    return {"id": str(call_id or ""), "name": str(name or ""), "arguments": arguments_text(arguments)}
