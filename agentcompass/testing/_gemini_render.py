"""A scripted reply in Google's Gemini API (``generateContent``) wire format.

The script's replies are chat completions (``model_server.text`` and the
rest build them); :func:`generate_body` turns one into a
``GenerateContentResponse`` (one candidate whose ``content`` is a ``model``
turn with a ``text`` part and a ``functionCall`` part per tool call, its
``args`` an object and its ``id`` the call's; ``finishReason`` ``STOP``;
``usageMetadata``) and :func:`generate_events` into the server-sent events
``:streamGenerateContent?alt=sse`` sends: one ``data: {...}`` chunk per text
piece and one per function call (whole, as Gemini sends them), the last
with the ``finishReason`` and ``usageMetadata``. :func:`error_body` is
Google's error object for an HTTP status; a stream that fails ends in a
chunk holding one.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

__all__ = ["error_body", "generate_body", "generate_events", "streams"]

_ids = itertools.count(1)

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Google's error body for ``status``."""
    name = _STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return {"error": {"code": status, "message": message, "status": name}}


def streams(path: str, body: Any) -> bool:
    """Whether a request asks for a stream: Gemini says so by its route."""
    return path.split("?")[0].rstrip("/").endswith(":streamGenerateContent")


def _parts(completion: Any) -> list[dict[str, Any]]:
    choices = completion.get("choices") if isinstance(completion, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    message = message if isinstance(message, dict) else {}
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        args = arguments if isinstance(arguments, dict) else {}
        parts.append({"functionCall": {"id": call.get("id"), "name": function.get("name"), "args": args}})
    return parts


def _usage(completion: Any) -> dict[str, int]:
    usage = completion.get("usage") if isinstance(completion, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    prompt, output = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"promptTokenCount": prompt, "candidatesTokenCount": output, "totalTokenCount": prompt + output}


def _chunk(
    parts: list[dict[str, Any]], finish: str | None = None, usage: dict[str, int] | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": "scripted", "responseId": f"r{next(_ids)}"}
    if usage is not None:
        chunk["usageMetadata"] = usage
    return chunk


def generate_body(completion: Any) -> dict[str, Any]:
    """The ``GenerateContentResponse`` of a scripted chat completion."""
    return _chunk(_parts(completion), "STOP", _usage(completion))


def generate_events(completion: Any, chunk_chars: int, failure: str | None = None) -> list[bytes]:
    """The events of a streamed reply (see the module docstring); with
    ``failure``, the parts are streamed and a chunk holding Google's
    ``INTERNAL`` error with that message takes the place of the last one."""
    size = max(1, chunk_chars)
    pieces: list[list[dict[str, Any]]] = []
    for part in _parts(completion):
        if "text" in part:
            pieces += [[{"text": part["text"][i : i + size]}] for i in range(0, len(part["text"]), size)]
        else:
            pieces.append([part])
    if failure is None:
        last = pieces.pop() if pieces else [{"text": ""}]
        chunks = [_chunk(p) for p in pieces] + [_chunk(last, "STOP", _usage(completion))]
    else:
        chunks = [_chunk(p) for p in pieces] + [error_body(500, failure)]
    return [f"data: {json.dumps(chunk)}\r\n\r\n".encode() for chunk in chunks]
