"""What one attempt's gateway saw: its calls, their usage, their classified failures."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from .._models import ModelUsage
from .._models._wire import Parsed
from ..runtime._results import Issue
from ..runtime._values import GatewaySpec
from ._bounds import RecordBudget

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

    What is kept is bounded by the attempt's :class:`GatewaySpec`: of a call
    at most ``record_request_bytes`` of its new messages (later ones dropped,
    the last kept one shortened) and ``record_reply_bytes`` of its reply;
    once the attempt kept ``record_attempt_bytes``, a call is its reply entry
    with ``status``, sizes and timing only. Each reply entry carries
    ``request_bytes`` and ``reply_bytes`` (the sizes on the wire) and, when
    something of the call was not kept, ``cut_bytes``; ``recorded_bytes``
    and ``cut_bytes`` sum them over the attempt.
    """

    spec: GatewaySpec = attrs.field(default=GatewaySpec(), kw_only=True)
    trajectory: list[dict[str, Any]] = attrs.Factory(list)
    usage: ModelUsage = attrs.Factory(ModelUsage)
    issues: list[Issue] = attrs.Factory(list)
    calls: int = 0
    refused: int = 0
    #: Per conversation (its key): how many of its messages are recorded.
    _seen: dict[str, int] = attrs.Factory(dict)
    _current: str = ""
    _budget: RecordBudget = attrs.field(
        init=False, default=attrs.Factory(lambda self: RecordBudget(self.spec), takes_self=True)
    )
    #: The call in flight: its request's size and what of it was cut.
    _request_bytes: int = 0
    _call_cut: int = 0

    @property
    def recorded_bytes(self) -> int:
        """The bytes of text the trajectory kept of this attempt's calls."""
        return self._budget.recorded

    @property
    def cut_bytes(self) -> int:
        """The bytes of requests and replies not kept."""
        return self._budget.cut

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

    def add_request(self, messages: list[dict[str, Any]], size: int = 0) -> None:
        """Record the messages of a request's conversation that are new since
        its last call (``size``: the request body's bytes), within the bounds."""
        key = _key(messages)
        seen = self._seen.get(key, 0)
        start = seen if len(messages) >= seen else 0
        self._seen[key] = len(messages)
        self._current = key
        self._request_bytes = size
        before = self._budget.cut
        new = [_cut(m) for m in messages[start:]]
        size_new = sum(_size(m) for m in new)
        self._budget.cut += max(0, sum(_size(m) for m in messages[start:]) - size_new)  # what _cut shortened
        room = self._budget.allow(size_new, self.spec.record_request_bytes)
        for message in new:
            length = _size(message)
            if length > room:
                if room > 0 and isinstance(message.get("content"), str):
                    self.trajectory.append(_shortened(message, room))
                break
            self.trajectory.append(message)
            room -= length
        self._call_cut = self._budget.cut - before

    def add_reply(self, reply: Parsed | None, status: int, seconds: float, size: int = 0) -> None:
        """Record the reply (None: none usable) of the call in flight (``size``: its bytes)."""
        entry: dict[str, Any] = {"role": "assistant", "call": self.calls, "status": status}
        cut = self._call_cut
        if reply is not None:
            self.usage.add(reply.usage)
            if self._current in self._seen:
                self._seen[self._current] += 1  # the assistant message the agent will send back
            content = _text(reply.content)
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
            length = (len(content) if isinstance(content, str) else 0) + sum(len(c["arguments"]) for c in calls)
            before = self._budget.cut
            room = self._budget.allow(length, self.spec.record_reply_bytes)
            cut += self._budget.cut - before
            if room >= length:
                entry["content"] = content
                entry["tool_calls"] = calls
            elif room > 0 and isinstance(content, str):
                entry["content"] = content[:room]
                entry["tool_calls"] = []
            entry["usage"] = dict(reply.usage)
        elif size:
            cut += size  # a reply not parsed is not kept
            self._budget.cut += size
        entry["request_bytes"] = self._request_bytes
        entry["reply_bytes"] = size
        if cut:
            entry["cut_bytes"] = cut
        entry["duration_seconds"] = round(seconds, 6)
        self.trajectory.append(entry)
        self._request_bytes = self._call_cut = 0


def _size(message: dict[str, Any]) -> int:
    """What a trajectory entry holds in text (its content and tool arguments), in characters."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else 0
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            size += len(str(call.get("arguments", "")))
    return size


def _shortened(message: dict[str, Any], room: int) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": message["content"][:room]}


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
