"""OpenAI chat completions on the wire: the request, the reply, its stream.

A request is ``{"model", "messages", "tools", ...}`` (:func:`request_body`);
a streamed one also asks ``stream_options.include_usage``, without which a
stream carries no token counts (:func:`with_stream_usage`).

A reply is a ``chat.completion``: ``choices[0].message`` (``role``,
``content`` as text or null, ``tool_calls`` as ``[{id, type: function,
function: {name, arguments}}]``), its ``finish_reason``, and ``usage``
(``prompt_tokens``, ``completion_tokens``). A stream is ``data:`` events of
``chat.completion.chunk`` objects, read with the shared
:class:`~._wire.SSEReader`: per choice a ``delta`` (content pieces; tool
calls by ``index``, the first piece with the ``id`` and the name, then
argument pieces) and a ``finish_reason``, a last chunk with no choices and
the ``usage``, then ``data: [DONE]``. A chunk with an ``error`` is the
server's failure: ``model_server_error``.

The client, the gateway's record and the scripted model server read and
write chat completions only here, so all three hold a reply to one rule:
only the first choice counts; ``content`` is text or null; a tool call is an
object whose ``function`` has a string name (name and argument pieces that
are not text are skipped, as every server's stream is read); ``choices``,
``tool_calls`` and a delta's ``tool_calls`` are lists; a reply has at most
:data:`MAX_TOOL_CALLS` tool calls, a streamed call's ``index`` is below it;
and a reply with neither text nor a tool call is ``no_valid_output``.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from ._client import ToolCall
from ._cost import call_usage
from ._wire import Parsed, ReplyError, call_entry, error_detail, text_of

__all__ = [
    "MAX_TOOL_CALLS", "ChatStream", "chunk", "completion", "conversation", "message_of", "parse_completion",
    "request_body", "with_stream_usage",
]  # fmt: skip

#: The most tool calls one reply may carry (a streamed call's ``index`` is below it).
MAX_TOOL_CALLS = 1024

_ids = itertools.count(1)


def request_body(
    model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, stream: bool
) -> dict[str, Any]:
    """A request's body before the ModelSpec's and the call's ``params``."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def with_stream_usage(parsed: dict[str, Any], body: bytes | bytearray) -> bytes | bytearray:
    """``body`` (whose parse is ``parsed``) asking ``stream_options.include_usage``:
    as it is when it asks already, else re-encoded with it."""
    options = parsed.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    options = dict(options) if isinstance(options, dict) else {}
    return json.dumps({**parsed, "stream_options": {**options, "include_usage": True}}).encode()


def conversation(body: Any) -> list[dict[str, Any]]:
    """The request's ``messages`` as conversation entries (see ``_wire``; ``role`` as sent)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    return [_entry(m) for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def _entry(message: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": str(message.get("role")), "content": text_of(message.get("content"))}
    if message.get("tool_call_id") is not None:
        entry["tool_call_id"] = str(message["tool_call_id"])
    calls = message.get("tool_calls")
    if calls:
        entry["tool_calls"] = [
            call_entry(call.get("id"), call["function"].get("name"), call["function"].get("arguments"))
            for call in (calls if isinstance(calls, list) else ())
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
        ]
    return entry


def completion(message: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """A ``chat.completion`` whose one choice is ``message``."""
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chunk(head: dict[str, Any], index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A ``chat.completion.chunk`` (``head``: its id, object, created, model) with one choice's ``delta``."""
    return {**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def message_of(content: str | None, calls: tuple[ToolCall, ...] | list[ToolCall]) -> dict[str, Any]:
    """The assistant message a reply continues the conversation with."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def _malformed(what: str = "the reply has a malformed tool call") -> ReplyError:
    return ReplyError("no_valid_output", what)


def _parsed(content: str | None, calls: list[ToolCall], usage: Any, finish: Any) -> Parsed:
    if content is None and not calls:
        raise ReplyError("no_valid_output", "the reply has neither content nor tool calls")
    finish = finish if isinstance(finish, str) else None
    return Parsed(content, tuple(calls), call_usage(usage), finish, message_of(content, calls))


def _list(value: Any, what: str) -> list[Any]:
    """``value`` as a list (None: empty); anything else is malformed."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _malformed(f"the reply's {what} are not a list")
    return value


def parse_completion(body: Any) -> Parsed:
    """The reply a ``chat.completion`` holds (``raw``: its assistant message
    as the conversation continues with it); raises :class:`ReplyError`."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ReplyError("no_valid_output", "the reply has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ReplyError("no_valid_output", "the reply's first choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ReplyError("no_valid_output", "the reply's content is not text")
    raws = _list(message.get("tool_calls"), "tool calls")
    if len(raws) > MAX_TOOL_CALLS:
        raise _malformed(f"the reply has more than {MAX_TOOL_CALLS} tool calls")
    calls: list[ToolCall] = []
    for raw in raws:
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _malformed()
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(ToolCall(str(raw.get("id") or f"call_{len(calls)}"), function["name"], arguments))
    return _parsed(content, calls, body.get("usage"), choice.get("finish_reason"))


class ChatStream:
    """A streamed reply, assembled chunk by chunk (:meth:`feed` each event
    the shared reader yields, then :meth:`result`): the first choice's
    content pieces, its tool calls by ``index`` (the id, the name's pieces,
    the arguments' pieces), its last ``finish_reason``, and the last usage."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, tuple[list[Any], list[str], list[str]]] = {}  # index -> ([id], name, arguments)
        self._usage: Any = None
        self._finish: str | None = None
        self._chunks = 0

    def feed(self, event: dict[str, Any]) -> None:
        if event.get("error") is not None:
            raise ReplyError("model_server_error", f"the stream ended in an error: {error_detail(event['error'])}")
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        for choice in _list(event.get("choices"), "streamed choices"):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            self._chunks += 1
            self._finish = choice.get("finish_reason") or self._finish
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta)

    def _delta(self, delta: dict[str, Any]) -> None:
        piece = delta.get("content")
        if piece is not None and not isinstance(piece, str):
            raise ReplyError("no_valid_output", "the reply's content is not text")
        if piece is not None:
            self._text.append(piece)
        for raw in _list(delta.get("tool_calls"), "streamed tool calls"):
            if not isinstance(raw, dict):
                raise _malformed()
            index = raw.get("index", len(self._calls))
            if not isinstance(index, int) or isinstance(index, bool):
                index = len(self._calls)
            if not 0 <= index < MAX_TOOL_CALLS:
                raise _malformed(f"a streamed tool call's index is not below {MAX_TOOL_CALLS}")
            call_id, name, arguments = self._calls.setdefault(index, ([None], [], []))
            function: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else {}
            call_id[0] = raw.get("id") or call_id[0]
            if isinstance(function.get("name"), str):
                name.append(function["name"])
            if isinstance(function.get("arguments"), str):
                arguments.append(function["arguments"])

    def result(self) -> Parsed:
        if not self._chunks:
            raise ReplyError("no_valid_output", "the streamed reply has no choices")
        calls: list[ToolCall] = []
        for _, (call_id, name, arguments) in sorted(self._calls.items()):
            if not name or not "".join(name):
                raise _malformed()
            calls.append(ToolCall(str(call_id[0] or f"call_{len(calls)}"), "".join(name), "".join(arguments) or "{}"))
        content = "".join(self._text) if self._text else None
        if content == "" and calls:
            content = None  # as a complete reply gives a tool-call message
        return _parsed(content, calls, self._usage, self._finish)
