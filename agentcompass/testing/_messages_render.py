"""A scripted reply in the Anthropic Messages API's wire format.

The script's replies are chat completions (``model_server.text`` and the
rest build them); :func:`message_body` turns one into a ``message`` object
(``id``, ``type``, ``role``, ``model``, ``content`` blocks: ``text`` and
``tool_use`` with its ``input`` object, ``stop_reason`` ``end_turn`` or
``tool_use``, ``stop_sequence``, ``usage``) and :func:`message_events` into
the server-sent events the Messages API streams: ``message_start`` (the
message with no content and its input tokens), ``ping``, per block
``content_block_start``, ``content_block_delta`` pieces (``text_delta``, or
``input_json_delta`` with the input's JSON text) and ``content_block_stop``,
then ``message_delta`` (``stop_reason``, output tokens) and
``message_stop``. Every event is ``event: TYPE`` + ``data: {...}``.
:func:`error_body` is the API's error object for an HTTP status (529:
``overloaded_error``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

__all__ = ["error_body", "message_body", "message_events"]

_ids = itertools.count(1)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """The Messages API's error body for ``status``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _blocks(completion: Any) -> list[dict[str, Any]]:
    choices = completion.get("choices") if isinstance(completion, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    message = message if isinstance(message, dict) else {}
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                       "input": arguments if isinstance(arguments, dict) else {}})  # fmt: skip
    return blocks


def _usage(completion: Any, output: int | None = None) -> dict[str, int]:
    usage = completion.get("usage") if isinstance(completion, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": int(usage.get("completion_tokens") or 0) if output is None else output,
    }


def _message(completion: Any, blocks: list[dict[str, Any]], stop: str | None, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": f"msg_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def message_body(completion: Any) -> dict[str, Any]:
    """The ``message`` object of a scripted chat completion."""
    blocks = _blocks(completion)
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return _message(completion, blocks, stop, _usage(completion))


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def message_events(completion: Any, chunk_chars: int, failure: str | None = None) -> list[bytes]:
    """The events of a streamed message (see the module docstring); with
    ``failure``, the blocks are streamed and an ``error`` event
    (``overloaded_error``, that message) takes the place of the closing ones."""
    blocks = _blocks(completion)
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": _message(completion, [], None, _usage(completion, output=1))},
        {"type": "ping"},
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            )
            events += [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
                       for piece in _pieces(block["text"], chunk_chars)]  # fmt: skip
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
            events += [{"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}
                       for piece in _pieces(json.dumps(block["input"]), chunk_chars)]  # fmt: skip
        events.append({"type": "content_block_stop", "index": index})
    if failure is None:
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        usage = {"output_tokens": _usage(completion)["output_tokens"]}
        events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage})
        events.append({"type": "message_stop"})
    else:
        events.append({"type": "error", "error": {"type": "overloaded_error", "message": failure}})
    return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events]
