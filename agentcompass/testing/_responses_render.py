"""A scripted reply in the OpenAI Responses API's wire format.

The script's replies are chat completions (``model_server.text`` and the
rest build them); :func:`response_body` turns one into a ``response``
object and :func:`response_events` into the server-sent events the
Responses API streams: ``response.created``, ``response.in_progress``, per
output item ``response.output_item.added``, its content part and
``response.output_text.delta`` pieces (or, for a ``function_call`` item with
its ``call_id``, ``response.function_call_arguments.delta`` pieces), their
``.done`` events and ``response.output_item.done``, then
``response.completed`` with the whole response and its ``usage``. Every
event is ``event: TYPE`` + ``data: {...}`` with ``type`` and
``sequence_number``; item events carry ``output_index`` and ``item_id``,
text events ``content_index``, as OpenAI's SDKs and Codex parse them.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

__all__ = ["response_body", "response_events"]

_ids = itertools.count(1)


def _message(completion: Any) -> dict[str, Any]:
    choices = completion.get("choices") if isinstance(completion, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else {}


def _usage(completion: Any) -> dict[str, Any]:
    usage = completion.get("usage") if isinstance(completion, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    prompt, output = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _items(completion: Any) -> list[dict[str, Any]]:
    message = _message(completion)
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if content:
        text = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        items.append({"id": f"msg_{next(_ids)}", "type": "message", "status": "completed", "role": "assistant",
                      "content": [text]})  # fmt: skip
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append({"id": f"fc_{next(_ids)}", "type": "function_call", "status": "completed",
                      "call_id": call.get("id"), "name": function.get("name"),
                      "arguments": function.get("arguments") or ""})  # fmt: skip
    return items


def _response(status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, rid: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": 0,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "scripted",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def response_body(completion: Any) -> dict[str, Any]:
    """The ``response`` object of a scripted chat completion."""
    return _response("completed", _items(completion), _usage(completion), f"resp_{next(_ids)}")


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def response_events(completion: Any, chunk_chars: int, failure: str | None = None) -> list[bytes]:
    """The events of a streamed response (see the module docstring); with
    ``failure``, the output items are streamed and ``response.failed`` (with
    that message) takes the place of ``response.completed``."""
    rid = f"resp_{next(_ids)}"
    items = _items(completion)
    events: list[dict[str, Any]] = []
    start = _response("in_progress", [], None, rid)
    events += [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    for index, item in enumerate(items):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            events.append({"type": "response.content_part.added", **at, "content_index": 0, "part": part})
            events += [{"type": "response.output_text.delta", **at, "content_index": 0, "delta": piece, "logprobs": []}
                       for piece in _pieces(text, chunk_chars)]  # fmt: skip
            events.append({"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []})
            events.append(
                {"type": "response.content_part.done", **at, "content_index": 0, "part": {**part, "text": text}}
            )
        else:
            arguments = item["arguments"]
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            events += [{"type": "response.function_call_arguments.delta", **at, "delta": piece}
                       for piece in _pieces(arguments, chunk_chars)]  # fmt: skip
            events.append(
                {"type": "response.function_call_arguments.done", **at, "name": item["name"], "arguments": arguments}
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    if failure is None:
        events.append(
            {"type": "response.completed", "response": _response("completed", items, _usage(completion), rid)}
        )
    else:
        failed = {**_response("failed", items, None, rid), "error": {"code": "server_error", "message": failure}}
        events.append({"type": "response.failed", "response": failed})
    return [
        f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': n})}\n\n".encode()
        for n, event in enumerate(events)
    ]
