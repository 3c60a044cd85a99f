"""Cyclic garbage collection while runs are in flight.

A run allocates a few hundred short-lived containers per attempt and keeps
every finished task record alive until finalize (metrics need them). With
CPython's default thresholds (700, 10, 10) the young generation fills every
few attempts, and every tenth young collection walks the middle generation,
where all the retained records pass through: measured on 10,000 no-op tasks,
collections took about 20 % of the run's time and found almost nothing to
free (the runtime's data is acyclic; reference counting frees it).

While at least one :func:`agentcompass.launch` runs in the process, the
first threshold is raised to :data:`GEN0_THRESHOLD` (never lowered), which
makes collections of the older generations ten times rarer; collection is
not disabled, so cycles still get collected. The previous thresholds come
back when the last running ``launch`` returns, unless something else
changed them meanwhile (then they are left as that code set them).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["GEN0_THRESHOLD", "relaxed_collection"]

#: The first-generation threshold during a run (CPython's default is 700).
#: Measured on 10,000 no-op tasks with 500 in flight: collections took about
#: 650 ms of the Trio thread at 10,000 and about 190 ms at 100,000 (the
#: young generation holds every in-flight attempt's objects, so each
#: collection walks much the same live set however often it runs). The
#: price is cyclic garbage waiting longer: at most this many young objects,
#: a few MB.
GEN0_THRESHOLD = 100_000

_active = 0
_saved: tuple[int, ...] | None = None
_applied: tuple[int, ...] | None = None


@contextlib.contextmanager
def relaxed_collection() -> Iterator[None]:
    """Raise the young-generation threshold while the block runs (nestable)."""
    global _active, _saved, _applied
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
