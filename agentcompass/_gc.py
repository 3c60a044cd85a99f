"""Cyclic garbage collection while runs are in flight, an opt-in of the process owner.

A run keeps every finished task record alive until finalize, and with
CPython's default thresholds the frequent middle-generation collections walk
them all while finding almost nothing to free (the runtime's data is
acyclic), a large share of the time of the bench scenario ``overhead``.

Importing this module changes nothing. A process that owns its interpreter
(the ``compass`` CLI, the bench) calls :func:`allow` once; from then on,
while at least one :func:`agentcompass.launch` runs, the first threshold is
raised to :data:`GEN0_THRESHOLD` (never lowered; collection is not
disabled). The previous thresholds come back when the last running
``launch`` returns, unless something else changed them meanwhile. An
application that embeds ``launch`` without calling :func:`allow` keeps its
own thresholds.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["GEN0_THRESHOLD", "allow", "relaxed_collection"]

#: The first-generation threshold during a run (CPython's default is 700).
GEN0_THRESHOLD = 100_000

_allowed = False
_active = 0
_saved: tuple[int, ...] | None = None
_applied: tuple[int, ...] | None = None


def allow(enabled: bool = True) -> bool:
    """Let :func:`relaxed_collection` raise the threshold (or stop it); returns the previous setting."""
    global _allowed
    previous, _allowed = _allowed, enabled
    return previous


@contextlib.contextmanager
def relaxed_collection() -> Iterator[None]:
    """Raise the young-generation threshold while the block runs, if :func:`allow` was called (nestable)."""
    global _active, _saved, _applied
    if not _allowed and _active == 0:
        yield
        return
    if _active == 0:
        current = gc.get_threshold()
        _saved = current
        if current[0] and current[0] < GEN0_THRESHOLD:
            gc.set_threshold(GEN0_THRESHOLD, *current[1:])
        _applied = gc.get_threshold()
    _active += 1
    try:
        yield
    finally:
        _active -= 1
        if _active == 0:
            if gc.get_threshold() == _applied and _saved is not None:
                gc.set_threshold(*_saved)
            _saved = _applied = None
