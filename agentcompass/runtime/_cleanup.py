"""The one deadline every cleanup of a run ends by (SPEC 7).

``launch`` makes its grace clock current for everything it runs; a provider,
harness or benchmark bounds its own shielded cleanup (killing a process tree,
closing a connection) with :func:`cleanup_deadline` instead of a fixed number
of seconds of its own, so ``cleanup_grace_seconds`` stays the one bound of
every way out.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["DEFAULT_CLEANUP_GRACE_SECONDS", "cleanup_deadline"]

#: The grace a cleanup gets outside ``launch`` (the same as
#: ``Orchestration.cleanup_grace_seconds``' default).
DEFAULT_CLEANUP_GRACE_SECONDS = 30.0


class _Clock(Protocol):
    def deadline(self) -> float: ...


_current: contextvars.ContextVar[_Clock | None] = contextvars.ContextVar("agentcompass_cleanup_clock", default=None)


def cleanup_deadline() -> float:
    """The ``trio.current_time()`` by which a cleanup starting now must end.

    Under ``launch``: once the run's shutdown started (its deadline, a stop
    signal, the caller's cancellation) the one deadline fixed then, the
    shutdown's start plus ``cleanup_grace_seconds``, shared by every nested
    cleanup; before that (closing a finished task's sandbox) now plus the
    grace, and never past the run's deadline plus the grace. Elsewhere (a
    test, a notebook) now plus :data:`DEFAULT_CLEANUP_GRACE_SECONDS`.

    Use it as ``with trio.move_on_at(cleanup_deadline(), shield=True):`` in
    a ``finally``; past it give up and leave what is left to ``reap``.
    """
    clock = _current.get()
    if clock is None:
        import trio  # here: importing the contracts loads no engine

        return trio.current_time() + DEFAULT_CLEANUP_GRACE_SECONDS
    return clock.deadline()


@contextmanager
def using_cleanup_clock(clock: _Clock) -> Iterator[None]:
    """Make ``clock`` the one :func:`cleanup_deadline` answers from, for this
    task and every task it starts."""
    token = _current.set(clock)
    try:
        yield
    finally:
        _current.reset(token)
