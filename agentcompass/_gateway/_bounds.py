"""The gateway's bounds (SPEC 12 "Gateway bounds"): what an agent may send, what is kept of it.

The attempt's settings reach :func:`~agentcompass.gateway.open_gateway`
through :func:`attempt_gateway`, which the try scope enters around the
harness's run (the run's tag names the gateway's directory, so that
``reap`` and ``sweep`` find it; the request's ``execution.gateway`` bounds
it). Outside an orchestration the defaults hold and the directory has no tag.

:func:`parse_body` parses a request body (read by ``_asgi.read_body``)
once (for the record) and tells a body nested past the depth limit, with no
``RecursionError`` escaping.
:class:`RecordBudget` decides what of a call the trajectory keeps.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from typing import Any

import attrs

from ..runtime._values import GatewaySpec

__all__ = ["RecordBudget", "attempt_gateway", "current_gateway", "parse_body"]

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


def parse_body(body: bytes | bytearray, limit: int) -> tuple[Any, bool]:
    """``body`` parsed (None when it is not JSON), and whether it nests arrays
    and objects deeper than ``limit``. The parse is the one the record needs
    anyway; a body nested past the interpreter's recursion limit stops the
    parser with ``RecursionError`` (no crash, no traceback: it is too deep)."""
    try:
        parsed = json.loads(body)
    except RecursionError:
        return None, True
    except ValueError:
        return None, False
    return parsed, _deeper_than(parsed, limit)


def _deeper_than(value: Any, limit: int) -> bool:
    # Iterative: a walk over the containers only, never a Python frame per level.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


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
