"""What one attempt's gateway saw: its calls, their usage, their classified failures."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from .._models import ModelUsage
from .._models._wire import Parsed
from ..runtime._results import Issue

__all__ = ["GatewayRecord"]

#: How much of a message's text a trajectory entry keeps.
_TEXT_CHARS = 20000


@attrs.define(eq=False)
class GatewayRecord:
    """The calls through one gateway, in order, whatever the model's API.

    ``trajectory`` holds per call the messages the request added since the
    previous call of the same conversation, then one ``assistant`` entry
    with the reply (``content``, ``tool_calls`` as ``{id, name,
    arguments}``, ``usage``, ``status``, ``duration_seconds``, ``call``: the
    call's number, from 1). A message is ``{"role", "content"}`` (text),
    with ``tool_calls`` on an assistant message and ``tool_call_id`` on a
    ``tool`` one (a tool's result): Responses items and Messages content
    blocks are read into the same shape (an assistant turn is one entry,
    each tool result one ``tool`` entry; ``instructions`` and ``system`` are
    a ``system`` entry). Conversations are told apart by their first
    messages, so a side request (an agent naming its session, say) does not
    replay the main one. ``usage`` sums the calls that got a usable reply.
    ``issues`` are the classified failures (one per code, the first of
    each), which the harness returns with its result.
    """

    trajectory: list[dict[str, Any]] = attrs.Factory(list)
    usage: ModelUsage = attrs.Factory(ModelUsage)
    issues: list[Issue] = attrs.Factory(list)
    calls: int = 0
    refused: int = 0
    #: Per conversation (its key): how many of its messages are recorded.
    _seen: dict[str, int] = attrs.Factory(dict)
    _current: str = ""

    #: Set once a FATAL issue is recorded (a harness may stop its agent then).
    failed: trio.Event = attrs.Factory(trio.Event)

    def add_issue(self, issue: Issue) -> None:
        if all(i.code != issue.code for i in self.issues):
            self.issues.append(issue)
        if issue.severity == "fatal":
            self.failed.set()

    @property
    def fatal(self) -> Issue | None:
        return next((i for i in self.issues if i.severity == "fatal"), None)

    def add_request(self, messages: list[dict[str, Any]]) -> None:
        """Record the messages of a request's conversation that are new since its last call."""
        key = _key(messages)
        seen = self._seen.get(key, 0)
        start = seen if len(messages) >= seen else 0
        self.trajectory.extend(_cut(m) for m in messages[start:])
        self._seen[key] = len(messages)
        self._current = key

    def add_reply(self, reply: Parsed | None, status: int, seconds: float) -> None:
        entry: dict[str, Any] = {"role": "assistant", "call": self.calls, "status": status}
        if reply is not None:
            entry["content"] = _text(reply.content)
            entry["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
            entry["usage"] = dict(reply.usage)
            self.usage.add(reply.usage)
            if self._current in self._seen:
                self._seen[self._current] += 1  # the assistant message the agent will send back
        entry["duration_seconds"] = round(seconds, 6)
        self.trajectory.append(entry)


def _key(messages: list[dict[str, Any]]) -> str:
    """A conversation's identity: its first message that is not a system one."""
    first = next((m for m in messages if m.get("role") not in ("system", "developer")), None)
    if first is None:
        return ""
    return f"{first.get('role')}:{str(first.get('content'))[:4096]}"


def _text(content: Any) -> Any:
    if isinstance(content, str) and len(content) > _TEXT_CHARS:
        return content[:_TEXT_CHARS] + f"\n[{len(content) - _TEXT_CHARS} more characters]"
    return content


def _cut(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "content": _text(message.get("content"))}
