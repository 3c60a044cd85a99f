"""A try phase's deadline: a Trio cancel scope, or none at all when the phase
has no timeout (the common case, kept off the per-attempt path)."""

from __future__ import annotations

import math

import trio

__all__ = ["deadline_scope"]


class _NoDeadline:
    """Stands in for a cancel scope when a phase has no timeout, which is
    most phases of most attempts: with a ``trio.CancelScope`` in every phase
    the row it holds, bench ``overhead`` "x Inspect AI samples/s", falls to
    its target or below (figures in docs/performance.md)."""

    cancelled_caught = False

    def __enter__(self) -> _NoDeadline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_DEADLINE = _NoDeadline()


def deadline_scope(deadline: float) -> trio.CancelScope | _NoDeadline:
    """A cancel scope with ``deadline``, or none at all for no deadline."""
    return _NO_DEADLINE if deadline == math.inf else trio.CancelScope(deadline=deadline)
