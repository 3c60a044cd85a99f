"""The Anthropic Messages API's replies: a ``message`` object, or its stream.

A reply is ``{"type": "message", "role": "assistant", "content": [block,
...], "stop_reason", "usage"}``; blocks are ``text`` (``text``),
``tool_use`` (``id``, ``name``, ``input``: an object) and others
(``thinking``, server tools) that carry neither text nor a tool call.
``usage`` has ``input_tokens`` and ``output_tokens``.

A stream is ``message_start`` (the message with no content and the input
tokens), per block ``content_block_start``, ``content_block_delta``
(``text_delta``; ``input_json_delta`` pieces of a ``tool_use``'s input as
JSON text) and ``content_block_stop``, then ``message_delta`` (the
``stop_reason`` and the output tokens so far) and ``message_stop``;
``ping`` events may come at any point. An ``error`` event is the server's
failure (an overloaded server mid-stream): ``model_server_error``.
"""

from __future__ import annotations

import json
from typing import Any

from ._client import ToolCall
from ._wire import Parsed, ReplyError, call_entry, error_detail, parsed, text_of

__all__ = ["MessagesStream", "conversation", "parse_message"]


def parse_message(body: Any) -> Parsed:
    """The reply a ``message`` object holds; raises :class:`ReplyError`."""
    if not isinstance(body, dict):
        raise ReplyError("no_valid_output", "the reply is not a message object")
    if body.get("type") == "error":
        raise ReplyError("model_server_error", f"the reply is an error: {error_detail(body.get('error'))}")
    blocks = body.get("content")
    if not isinstance(blocks, list):
        raise ReplyError("no_valid_output", "the reply has no content")
    text: list[str] = []
    calls: list[ToolCall] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise ReplyError("no_valid_output", "the reply has a malformed content block")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            if not isinstance(block.get("name"), str):
                raise ReplyError("no_valid_output", "the reply has a malformed tool call")
            arguments = json.dumps(block.get("input") if block.get("input") is not None else {})
            calls.append(ToolCall(str(block.get("id") or f"toolu_{len(calls)}"), block["name"], arguments))
    return parsed(text, calls, body.get("usage"), body.get("stop_reason"), {"role": "assistant", "content": blocks})


class MessagesStream:
    """A streamed reply, assembled event by event (:meth:`feed`, then
    :meth:`result`): blocks by ``index``, a ``tool_use``'s input from its
    JSON pieces, the input tokens of ``message_start`` and the output tokens
    of the last ``message_delta``."""

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._stop: Any = None

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "error":
            raise ReplyError("model_server_error", f"the stream ended in an error: {error_detail(event.get('error'))}")
        index = event.get("index")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self._message = event["message"]
            if isinstance(self._message.get("usage"), dict):
                self._usage.update(self._message["usage"])
        elif kind == "message_delta":
            delta: dict[str, Any] = event["delta"] if isinstance(event.get("delta"), dict) else {}
            self._stop = delta.get("stop_reason") or self._stop
            if isinstance(event.get("usage"), dict):
                # Counts here are cumulative: each replaces the one before.
                self._usage.update({k: v for k, v in event["usage"].items() if v is not None})
        elif not isinstance(index, int):
            return
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and index in self._blocks and isinstance(event.get("delta"), dict):
            delta, block = event["delta"], self._blocks[index]
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = str(block.get("text") or "") + delta["text"]
            elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self._json.setdefault(index, []).append(delta["partial_json"])

    def result(self) -> Parsed:
        if self._message is None and not self._blocks:
            raise ReplyError("no_valid_output", "the streamed reply has no message")
        blocks = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use" and index in self._json:
                text = "".join(self._json[index])
                try:
                    block = {**block, "input": json.loads(text) if text.strip() else {}}
                except ValueError:
                    raise ReplyError("no_valid_output", "a streamed tool call's input is not JSON") from None
            blocks.append(block)
        return parse_message({"content": blocks, "usage": self._usage, "stop_reason": self._stop})


def conversation(body: Any) -> list[dict[str, Any]]:
    """The conversation a request body holds (see ``_wire``): ``system`` as a
    ``system`` entry, then per message: an assistant message is one entry
    (its ``text`` blocks, its ``tool_use`` blocks as tool calls); a user
    message is a ``tool`` entry per ``tool_result`` block, then one ``user``
    entry with its text blocks (if it has any)."""
    if not isinstance(body, dict):
        return []
    entries: list[dict[str, Any]] = []
    system = text_of(body.get("system"))
    if system is not None:
        entries.append({"role": "system", "content": system})
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        blocks = [b for b in blocks if isinstance(b, dict)]
        text = text_of([b for b in blocks if b.get("type") == "text"]) or None
        if role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": text}
            calls = [
                call_entry(b.get("id"), b.get("name"), b.get("input")) for b in blocks if b.get("type") == "tool_use"
            ]
            if calls:
                entry["tool_calls"] = calls
            entries.append(entry)
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                result = {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id") or ""),
                    "content": text_of(block.get("content")),
                }
                entries.append(result)
        if text is not None or not any(b.get("type") == "tool_result" for b in blocks):
            entries.append({"role": str(role), "content": text})
    return entries
