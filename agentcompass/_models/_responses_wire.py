"""The OpenAI Responses API's replies: a ``response`` object, or its stream.

A reply's ``output`` is a list of items: ``message`` items (role
``assistant``, ``content`` parts of type ``output_text`` or ``refusal``),
``function_call`` items (``call_id``, ``name``, ``arguments`` as JSON text),
and others (``reasoning``, built-in tool calls) that carry neither text nor a
function call. ``usage`` has ``input_tokens`` and ``output_tokens``.

A stream is ``response.created``, then per output item
``response.output_item.added``, its deltas (``response.output_text.delta``,
``response.function_call_arguments.delta``) and ``response.output_item.done``
(the item whole), then ``response.completed`` (or ``response.incomplete``)
with the whole response and its usage. ``error`` and ``response.failed``
events are the server's failure: ``model_server_error``.
"""

from __future__ import annotations

from typing import Any

from ._client import ToolCall
from ._wire import Parsed, ReplyError, arguments_text, call_entry, error_detail, parsed, text_of

__all__ = ["ResponsesStream", "conversation", "parse_response"]


def parse_response(body: Any) -> Parsed:
    """The reply a ``response`` object holds; raises :class:`ReplyError`."""
    if not isinstance(body, dict):
        raise ReplyError("no_valid_output", "the reply is not a response object")
    if body.get("status") == "failed" or body.get("error"):
        raise ReplyError("model_server_error", f"the response failed: {error_detail(body.get('error'))}")
    output = body.get("output")
    if not isinstance(output, list):
        raise ReplyError("no_valid_output", "the reply has no output")
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in output:
        if not isinstance(item, dict):
            raise ReplyError("no_valid_output", "the reply has a malformed output item")
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") in ("output_text", "refusal"):
                    piece = part.get("text" if part["type"] == "output_text" else "refusal")
                    if isinstance(piece, str):
                        text.append(piece)
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise ReplyError("no_valid_output", "the reply has a malformed tool call")
            call_id = item.get("call_id") or item.get("id") or f"call_{len(calls)}"
            calls.append(ToolCall(str(call_id), item["name"], arguments_text(item.get("arguments")) or "{}"))
    return parsed(text, calls, body.get("usage"), body.get("status"), output)


class ResponsesStream:
    """A streamed reply, assembled event by event (:meth:`feed`, then
    :meth:`result`). The closing response's ``output`` is used when it has
    one; otherwise the items are rebuilt from their ``done`` events and
    deltas, so a stream cut before its end still yields what it carried."""

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._done: set[int] = set()
        self._text: dict[int, list[str]] = {}
        self._arguments: dict[int, list[str]] = {}
        self._final: dict[str, Any] | None = None

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "error":
            raise ReplyError("model_server_error", f"the stream ended in an error: {error_detail(event)}")
        if kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            raise ReplyError("model_server_error", f"the response failed: {error_detail(error or event)}")
        index = event.get("output_index")
        if kind in ("response.completed", "response.incomplete"):
            if isinstance(event.get("response"), dict):
                self._final = event["response"]
        elif not isinstance(index, int):
            return
        elif kind in ("response.output_item.added", "response.output_item.done"):
            if isinstance(event.get("item"), dict) and index not in self._done:
                self._items[index] = event["item"]
                if kind == "response.output_item.done":
                    self._done.add(index)
        elif kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
            self._text.setdefault(index, []).append(event["delta"])
        elif kind == "response.function_call_arguments.delta" and isinstance(event.get("delta"), str):
            self._arguments.setdefault(index, []).append(event["delta"])

    def result(self) -> Parsed:
        final = self._final or {}
        output = final.get("output")
        if not (isinstance(output, list) and output):
            output = [self._item(index) for index in sorted(self._items)]
        if not output:
            raise ReplyError("no_valid_output", "the streamed reply has no output")
        return parse_response({"output": output, "usage": final.get("usage"), "status": final.get("status")})

    def _item(self, index: int) -> dict[str, Any]:
        item = dict(self._items[index])
        if index in self._done:
            return item
        if item.get("type") == "message" and index in self._text:
            item["content"] = [{"type": "output_text", "text": "".join(self._text[index]), "annotations": []}]
        elif item.get("type") == "function_call" and index in self._arguments:
            item["arguments"] = "".join(self._arguments[index])
        return item


def conversation(body: Any) -> list[dict[str, Any]]:
    """The conversation a request body holds (see ``_wire``): ``instructions``
    as a ``system`` entry, then ``input`` (a string: one user entry; a list
    of items). ``message`` items of role user, system or developer are
    entries of that role; assistant ``message`` items, ``reasoning`` and
    every ``*_call`` item in a row are one assistant entry (its tool calls
    from ``function_call``, ``custom_tool_call`` and ``local_shell_call``
    items, by ``call_id``); each ``*_call_output`` item is a ``tool`` entry."""
    if not isinstance(body, dict):
        return []
    entries: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        entries.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*entries, {"role": "user", "content": items}]
    turn: dict[str, Any] | None = None
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind == "message" and role != "assistant":
            turn = None
            entries.append({"role": str(role), "content": text_of(item.get("content"))})
        elif isinstance(kind, str) and kind.endswith("_output"):
            turn = None
            output = item.get("output")
            text = text_of(output) if not isinstance(output, dict) else text_of(output.get("content"))
            entries.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text})
        elif kind == "message" or kind == "reasoning" or (isinstance(kind, str) and kind.endswith("_call")):
            if turn is None:
                turn = {"role": "assistant", "content": None}
                entries.append(turn)
            if kind == "message":
                text = text_of(item.get("content"), "text", "refusal")
                if text:
                    turn["content"] = (turn["content"] or "") + text
            elif kind in _CALLS:
                name = item.get("name") or kind.removesuffix("_call")
                call = call_entry(item.get("call_id") or item.get("id"), name, item.get(_CALLS[kind]))
                turn.setdefault("tool_calls", []).append(call)
    return entries


#: The item types that are calls of the agent's own tools, and where their arguments are.
_CALLS = {"function_call": "arguments", "custom_tool_call": "input", "local_shell_call": "action"}
