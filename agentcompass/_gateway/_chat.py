"""What the gateway reads of chat completions: a request's conversation and
a reply, complete or streamed (its ``data:`` events)."""

from __future__ import annotations

import json
from typing import Any

from .._models._client import ToolCall
from .._models._cost import call_usage
from .._models._wire import Parsed, ReplyError, call_entry, error_detail, text_of

__all__ = ["conversation", "parse_reply", "parse_stream"]


def conversation(body: Any) -> list[dict[str, Any]]:
    """The request's ``messages`` as trajectory entries (``role`` as sent)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    return [_message(m) for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def _message(message: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": str(message.get("role")), "content": text_of(message.get("content"))}
    if message.get("tool_call_id") is not None:
        entry["tool_call_id"] = str(message["tool_call_id"])
    if message.get("tool_calls"):
        entry["tool_calls"] = _calls(message["tool_calls"])
    return entry


def _calls(raw: Any) -> list[dict[str, Any]]:
    calls = []
    for call in raw if isinstance(raw, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append(call_entry(call.get("id"), function.get("name"), function.get("arguments")))
    return calls


def _parsed(content: str | None, calls: list[dict[str, Any]], usage: Any) -> Parsed:
    if content is None and not calls:
        raise ReplyError("no_valid_output", "the reply has neither content nor tool calls")
    return Parsed(content, tuple(ToolCall(**call) for call in calls), call_usage(usage), None, None)


def parse_reply(data: bytes) -> Parsed:
    """A non-streamed chat completion; raises ``ReplyError`` when it has no usable message."""
    try:
        body = json.loads(data)
    except ValueError:
        raise ReplyError("no_valid_output", "the reply is not JSON") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    message = (
        choices[0].get("message") if choices and isinstance(choices, list) and isinstance(choices[0], dict) else None
    )
    if not isinstance(message, dict):
        raise ReplyError("no_valid_output", "the reply has no message")
    return _parsed(text_of(message.get("content")), _calls(message.get("tool_calls")), body.get("usage"))


def parse_stream(data: bytes) -> Parsed:
    """A streamed chat completion (its ``data:`` events); an ``error`` chunk is ``model_server_error``."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: Any = None
    for line in data.decode("utf-8", errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise ReplyError("no_valid_output", "a streamed chunk is not JSON") from None
        if not isinstance(chunk, dict):
            raise ReplyError("no_valid_output", "a streamed chunk is not an object")
        if chunk.get("error") is not None:
            raise ReplyError("model_server_error", f"the stream ended in an error: {error_detail(chunk['error'])}")
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for raw in delta.get("tool_calls") or ():
                if not isinstance(raw, dict):
                    continue
                index: int = raw["index"] if isinstance(raw.get("index"), int) else len(calls)
                call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                function: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else {}
                call["id"] = str(raw.get("id") or call["id"])
                if isinstance(function.get("name"), str):
                    call["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    call["arguments"] += function["arguments"]
    return _parsed("".join(text) if text else None, [calls[i] for i in sorted(calls)], usage)
