"""The gateway's bounds (SPEC 12 "Gateway bounds"): what an agent may send, what is kept of it.

The attempt's settings reach :func:`~agentcompass.gateway.open_gateway`
through :func:`attempt_gateway`, which the try scope enters around the
harness's run (the run's tag names the gateway's directory, so that
``reap`` and ``sweep`` find it; the request's ``execution.gateway`` bounds
it). Outside an orchestration the defaults hold and the directory has no tag.

:func:`read_body` takes a request body into one buffer, refusing it past
the limit; :func:`too_deep` tells a body nested past the depth limit without
parsing it (so no ``RecursionError``): strings are skipped, brackets counted.
:class:`RecordBudget` decides what of a call the trajectory keeps.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import re
from array import array
from collections.abc import Iterator
from typing import Any

import attrs

from ..runtime._values import GatewaySpec

__all__ = ["RecordBudget", "attempt_gateway", "current_gateway", "read_body", "too_deep"]

_current: contextvars.ContextVar[tuple[str, GatewaySpec] | None] = contextvars.ContextVar(
    "agentcompass_gateway", default=None
)


@contextlib.contextmanager
def attempt_gateway(tag: str, spec: GatewaySpec) -> Iterator[None]:
    """Gateways opened in this block belong to the run ``tag`` and keep to ``spec``."""
    token = _current.set((tag, spec))
    try:
        yield
    finally:
        _current.reset(token)


def current_gateway() -> tuple[str | None, GatewaySpec]:
    """The run's tag (None outside a run) and the bounds for a gateway opened now."""
    value = _current.get()
    return (None, GatewaySpec()) if value is None else value


class BodyRefused(Exception):
    """The request's body is over the limit (``left``: the client left while sending it)."""

    def __init__(self, message: str, *, left: bool = False):
        super().__init__(message)
        self.left = left


async def read_body(receive: Any, limit: int) -> bytearray:
    """The request's body in one buffer (the only copy held); raises
    :class:`BodyRefused` as soon as it passes ``limit`` bytes (a declared
    ``Content-Length`` is not trusted: the bytes are counted)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyRefused("the client left", left=True)
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limit:
            raise BodyRefused(f"request body over {limit} bytes")
        body += chunk
        if not message.get("more_body"):
            return body


# A JSON string (escapes included), or a run of anything but brackets and quotes.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_OTHERS = bytes(b for b in range(256) if b not in b"[{]}")


def too_deep(body: bytes | bytearray, limit: int) -> bool:
    """Whether ``body`` nests arrays and objects deeper than ``limit``.

    Strings are dropped (a bracket in a string does not nest), the brackets
    left are mapped to +1 / -1 and their running sum's maximum is the depth.
    Linear and flat in Python frames, whatever the body: a body that is not
    JSON gets an answer too, and its upstream decides about it.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    steps = array("b", _STRING.sub(b"", body).translate(_BRACKETS, _OTHERS))
    return max(itertools.accumulate(steps), default=0) > limit


@attrs.define(eq=False)
class RecordBudget:
    """What one attempt's record may still keep (see :class:`GatewaySpec`).

    ``recorded`` counts the bytes kept, ``cut`` the bytes of requests and
    replies not kept (cut from a call, or dropped once the attempt's budget
    is spent).
    """

    spec: GatewaySpec
    recorded: int = 0
    cut: int = 0

    @property
    def full(self) -> bool:
        """The attempt's budget is spent: calls are kept as counts and sizes only."""
        return self.recorded >= self.spec.record_attempt_bytes

    def allow(self, size: int, per_call: int) -> int:
        """How many of ``size`` bytes a call may keep (``per_call`` its own bound); counts the rest as cut."""
        room = 0 if self.full else min(per_call, self.spec.record_attempt_bytes - self.recorded)
        kept = min(size, room)
        self.recorded += kept
        self.cut += size - kept
        return kept
