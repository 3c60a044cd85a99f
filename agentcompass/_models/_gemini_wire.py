"""Google's Gemini API (``generateContent``) replies: a
``GenerateContentResponse``, or its stream.

A reply is ``{"candidates": [{"content": {"role": "model", "parts": [part,
...]}, "finishReason"}], "usageMetadata"}``; parts are ``text`` (a
``thought: true`` part is the model's reasoning, not its answer),
``functionCall`` (``name``, ``args``: an object, optional ``id``) and others
(inline data, code execution) that carry neither text nor a tool call.
``usageMetadata`` has ``promptTokenCount``, ``candidatesTokenCount`` and
``thoughtsTokenCount`` (the output tokens are the last two summed). Only
the first candidate is read. A reply without candidates is
``no_valid_output`` (a blocked prompt's ``promptFeedback`` says why); an
``error`` object inside a 200 reply is ``model_server_error``.

``:streamGenerateContent?alt=sse`` streams the same objects as server-sent
events (``data: {...}`` only), each carrying the next parts: text pieces to
join, function calls whole; ``usageMetadata`` counts are cumulative, so the
last one holds. Without ``alt=sse`` the stream is one JSON array of those
objects, which :func:`parse_reply` reads as a stream.
"""

from __future__ import annotations

import json
from typing import Any

from ._client import ToolCall
from ._wire import Parsed, ReplyError, call_entry, count, error_detail, parsed, text_of

__all__ = ["GeminiStream", "conversation", "parse_reply"]


def parse_reply(body: Any) -> Parsed:
    """The reply one ``GenerateContentResponse`` (or a JSON array of streamed
    ones) holds; raises :class:`ReplyError`."""
    if isinstance(body, list):
        stream = GeminiStream()
        for chunk in body:
            if not isinstance(chunk, dict):
                raise ReplyError("no_valid_output", "a streamed reply's chunk is not an object")
            stream.feed(chunk)
        return stream.result()
    if not isinstance(body, dict):
        raise ReplyError("no_valid_output", "the reply is not a GenerateContentResponse")
    if body.get("error") is not None:
        raise ReplyError("model_server_error", f"the reply is an error: {error_detail(body.get('error'))}")
    candidates = body.get("candidates")
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        feedback = body.get("promptFeedback")
        reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
        detail = f" (blocked: {str(reason)[:100]})" if reason else ""
        raise ReplyError("no_valid_output", f"the reply has no candidates{detail}")
    candidate = candidates[0]
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    text: list[str] = []
    calls: list[ToolCall] = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            raise ReplyError("no_valid_output", "the reply has a malformed part")
        if isinstance(part.get("text"), str) and part.get("thought") is not True:
            text.append(part["text"])
        elif isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            if not isinstance(call.get("name"), str):
                raise ReplyError("no_valid_output", "the reply has a malformed tool call")
            args = call.get("args") if call.get("args") is not None else {}
            calls.append(ToolCall(str(call.get("id") or call["name"]), call["name"], json.dumps(args)))
    return parsed(text, calls, usage(body.get("usageMetadata")), candidate.get("finishReason"), content)


def usage(metadata: Any) -> dict[str, int]:
    """``usageMetadata`` as the ``input_tokens``/``output_tokens`` the other APIs count."""
    metadata = metadata if isinstance(metadata, dict) else {}
    output = count(metadata.get("candidatesTokenCount")) + count(metadata.get("thoughtsTokenCount"))
    return {"input_tokens": count(metadata.get("promptTokenCount")), "output_tokens": output}


class GeminiStream:
    """A streamed reply, assembled chunk by chunk (:meth:`feed`, then
    :meth:`result`): the first candidate's parts in order (adjacent text
    pieces joined), its last ``finishReason``, the last ``usageMetadata``."""

    def __init__(self) -> None:
        self._parts: list[dict[str, Any]] = []
        self._finish: Any = None
        self._usage: Any = None
        self._chunks = 0

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("error") is not None:
            raise ReplyError("model_server_error", f"the stream ended in an error: {error_detail(chunk['error'])}")
        self._chunks += 1
        if isinstance(chunk.get("usageMetadata"), dict):
            self._usage = chunk["usageMetadata"]
        candidates = chunk.get("candidates")
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        if not isinstance(candidate, dict):
            return
        self._finish = candidate.get("finishReason") or self._finish
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                continue
            last = self._parts[-1] if self._parts else None
            if (
                isinstance(part.get("text"), str)
                and last is not None
                and isinstance(last.get("text"), str)
                and last.get("thought") == part.get("thought")
            ):
                last["text"] += part["text"]
            else:
                self._parts.append(dict(part))

    def result(self) -> Parsed:
        if not self._chunks:
            raise ReplyError("no_valid_output", "the streamed reply has no chunks")
        content = {"role": "model", "parts": self._parts}
        candidate = {"content": content, "finishReason": self._finish}
        return parse_reply({"candidates": [candidate], "usageMetadata": self._usage})


def conversation(body: Any) -> list[dict[str, Any]]:
    """The conversation a request body holds (see ``_wire``):
    ``systemInstruction`` as a ``system`` entry, then per ``contents`` entry:
    a ``model`` turn is one assistant entry (its text parts, its
    ``functionCall`` parts as tool calls); a ``user`` turn is a ``tool`` entry
    per ``functionResponse`` part (``tool_call_id`` its ``id``, else its
    ``name``), then one ``user`` entry with its text parts (if it has any)."""
    if not isinstance(body, dict):
        return []
    entries: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if isinstance(system, dict):
        entries.append({"role": "system", "content": text_of(system.get("parts"))})
    elif isinstance(system, str):
        entries.append({"role": "system", "content": system})
    contents = body.get("contents")
    if isinstance(contents, (str, dict)):
        contents = [contents]
    for turn in contents if isinstance(contents, list) else ():
        if isinstance(turn, str):
            entries.append({"role": "user", "content": turn})
            continue
        if not isinstance(turn, dict):
            continue
        parts = (
            [p for p in turn.get("parts") or () if isinstance(p, dict)] if isinstance(turn.get("parts"), list) else []
        )
        text = text_of([p for p in parts if isinstance(p.get("text"), str) and p.get("thought") is not True]) or None
        if turn.get("role") == "model":
            entry: dict[str, Any] = {"role": "assistant", "content": text}
            calls = [
                call_entry(c.get("id") or c.get("name"), c.get("name"), c.get("args"))
                for c in (p.get("functionCall") for p in parts)
                if isinstance(c, dict)
            ]
            if calls:
                entry["tool_calls"] = calls
            entries.append(entry)
            continue
        responses = [r for r in (p.get("functionResponse") for p in parts) if isinstance(r, dict)]
        for response in responses:
            result = response.get("response")
            content = result if isinstance(result, str) else json.dumps(result)
            entries.append({"role": "tool", "tool_call_id": str(response.get("id") or response.get("name") or ""),
                            "content": content})  # fmt: skip
        if text is not None or not responses:
            entries.append({"role": "user", "content": text})
    return entries
