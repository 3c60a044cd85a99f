"""What one attempt's gateway saw: its calls, their usage, their classified failures."""

from __future__ import annotations

import json
from typing import Any

import attrs

from .._models import ModelUsage
from ..runtime._results import Issue

__all__ = ["GatewayRecord", "parse_reply", "parse_stream"]

#: How much of a message's text a trajectory entry keeps.
_TEXT_CHARS = 20000


@attrs.define(eq=False)
class GatewayRecord:
    """The calls through one gateway, in order.

    ``trajectory`` holds per call the messages the request added since the
    previous call of the same conversation (``role`` as sent), then one
    ``assistant`` entry with the reply (``content``, ``tool_calls`` as
    ``{id, name, arguments}``, ``usage``, ``status``, ``duration_seconds``,
    ``call``: the call's number, from 1). ``usage`` sums the calls that got a
    usable reply. ``issues`` are the classified failures (one per code, the
    first of each), which the harness returns with its result.
    """

    trajectory: list[dict[str, Any]] = attrs.Factory(list)
    usage: ModelUsage = attrs.Factory(ModelUsage)
    issues: list[Issue] = attrs.Factory(list)
    calls: int = 0
    refused: int = 0
    _seen: int = 0

    def add_issue(self, issue: Issue) -> None:
        if all(i.code != issue.code for i in self.issues):
            self.issues.append(issue)

    @property
    def fatal(self) -> Issue | None:
        return next((i for i in self.issues if i.severity == "fatal"), None)

    def add_request(self, body: Any) -> None:
        """The messages of a request that are new since the last one."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return
        start = self._seen if len(messages) >= self._seen else 0
        for message in messages[start:]:
            if isinstance(message, dict):
                self.trajectory.append(_message(message))
        self._seen = len(messages)

    def add_reply(self, reply: dict[str, Any] | None, status: int, seconds: float) -> None:
        entry: dict[str, Any] = {"role": "assistant", "call": self.calls, "status": status}
        if reply is not None:
            entry.update(reply)
            self.usage.add(reply["usage"])
            self._seen += 1  # the assistant message the agent will send back
        entry["duration_seconds"] = round(seconds, 6)
        self.trajectory.append(entry)


def _text(content: Any) -> Any:
    """A message's content as text (a list of parts joined), cut to size."""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if isinstance(content, str) and len(content) > _TEXT_CHARS:
        return content[:_TEXT_CHARS] + f"\n[{len(content) - _TEXT_CHARS} more characters]"
    return content


def _message(message: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": str(message.get("role")), "content": _text(message.get("content"))}
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
            arguments = function.get("arguments")
            calls.append(
                {
                    "id": str(call.get("id") or ""),
                    "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                }
            )
    return calls


def _usage(raw: Any) -> dict[str, int]:
    raw = raw if isinstance(raw, dict) else {}
    return {key: _count(raw.get(key)) for key in ("prompt_tokens", "completion_tokens")}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_reply(data: bytes) -> dict[str, Any] | None:
    """The assistant entry of a non-streamed chat completion; None when it has no usable message."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    choices = body.get("choices") if isinstance(body, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return None
    content, calls = _text(message.get("content")), _calls(message.get("tool_calls"))
    if content is None and not calls:
        return None
    return {"content": content, "tool_calls": calls, "usage": _usage(body.get("usage"))}


def parse_stream(data: bytes) -> dict[str, Any] | None:
    """The assistant entry of a streamed chat completion (its ``data:`` events); None when unusable."""
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
            return None
        if not isinstance(chunk, dict):
            return None
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
                index = raw.get("index") if isinstance(raw.get("index"), int) else len(calls)
                call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
                call["id"] = str(raw.get("id") or call["id"])
                if isinstance(function.get("name"), str):
                    call["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    call["arguments"] += function["arguments"]
    content = _text("".join(text)) if text else None
    if content is None and not calls:
        return None
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "usage": _usage(usage)}
