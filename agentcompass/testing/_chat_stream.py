"""A chat completion as the server-sent events OpenAI streams it in.

``sse_events(body, chunk_chars, include_usage)`` turns the body of a
non-streamed ``chat.completion`` into ``data: {chunk}`` events of
``chat.completion.chunk`` objects and a closing ``data: [DONE]``: per choice
the role, the content in pieces, each tool call opened with its ``index``,
``id`` and function name and then its arguments in pieces, and a chunk with
the ``finish_reason``; with ``include_usage`` every chunk carries
``"usage": null`` and a last one with no choices carries the usage. Not a
model of any server's chunk boundaries: pieces are ``chunk_chars``
characters, so a client is tested on split content and split JSON arguments.
"""

from __future__ import annotations

import json
from typing import Any

from .._models._chat_wire import chunk

__all__ = ["sse_events"]


def sse_events(body: Any, chunk_chars: int, include_usage: bool, failure: str | None = None) -> list[bytes]:
    """The events for ``body``; a ``bytes`` body (a malformed reply) is one
    event of those bytes, with no ``[DONE]``. With ``failure`` the message's
    deltas are followed by ``data: {"error": {...}}`` (that message) instead
    of the finish chunk, the usage and ``[DONE]``."""
    if isinstance(body, bytes):
        return [b"data: " + body + b"\n\n"]
    chunks = _chunks(body if isinstance(body, dict) else {}, chunk_chars, include_usage and failure is None)
    if failure is not None:
        error = {"error": {"message": failure, "type": "server_error", "code": None}}
        return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks[:-1]] + [
            f"data: {json.dumps(error)}\n\n".encode()
        ]
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _chunks(body: dict[str, Any], size: int, include_usage: bool) -> list[dict[str, Any]]:
    head: dict[str, Any] = {
        "id": body.get("id", "chatcmpl-stream"),
        "object": "chat.completion.chunk",
        "created": body.get("created", 0),
        "model": body.get("model", "scripted"),
    }
    if include_usage:
        head["usage"] = None  # as OpenAI sends it: null on every chunk but the last

    chunks = []
    for choice in body.get("choices") or []:
        index, message = choice.get("index", 0), choice.get("message") or {}
        content, calls = message.get("content"), message.get("tool_calls") or []
        chunks.append(
            chunk(head, index, {"role": message.get("role", "assistant"), "content": "" if content else None})
        )
        chunks += [chunk(head, index, {"content": piece}) for piece in _pieces(content or "", size)]
        for n, call in enumerate(calls):
            function = call.get("function") or {}
            opening = {"index": n, "id": call.get("id"), "type": "function",
                       "function": {"name": function.get("name"), "arguments": ""}}  # fmt: skip
            chunks.append(chunk(head, index, {"tool_calls": [opening]}))
            for piece in _pieces(function.get("arguments") or "", size):
                chunks.append(chunk(head, index, {"tool_calls": [{"index": n, "function": {"arguments": piece}}]}))
        chunks.append(chunk(head, index, {}, choice.get("finish_reason") or "stop"))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": body.get("usage") or {}})
    return chunks
