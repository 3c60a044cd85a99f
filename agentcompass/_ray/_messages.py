"""What the ``ray`` executor's driver and workers send each other (see ``_driver``).

One frozen class per message; each side dispatches on the class (a table
of handlers, one per class it receives). The task reporter's calls cross
as the seam's own messages (:class:`~agentcompass._seam.Report`),
wrapped in :class:`Reported` with the request they belong to.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._seam import Report, TaskJob
from ..runtime._results import TaskRecord

__all__ = [
    "Abandon",
    "Acked",
    "AcquireCapacity",
    "CancelTask",
    "Forget",
    "Granted",
    "OpenToken",
    "Release",
    "Reported",
    "Shutdown",
    "Stages",
    "StartTask",
    "Sweep",
    "Swept",
    "TaskCancelled",
    "TaskDone",
    "TaskFailed",
]

# -- driver to worker --------------------------------------------------------------------


@attrs.frozen
class StartTask:
    """Run ``job`` as task ``key`` of request ``request_id`` (whose run is tagged ``tag``)."""

    key: int
    request_id: int
    tag: str
    job: TaskJob


@attrs.frozen
class Granted:
    """The permit or token asked for as ``grant`` is the worker's."""

    grant: int


@attrs.frozen
class Acked:
    """The driver applied the answered report ``number``; ``error``: the line of
    the ``OSError`` that applying it raised (a plan the driver could not write)."""

    number: int
    error: str | None = None


@attrs.frozen
class CancelTask:
    """Cancel task ``key``: shutdown began, ``remaining`` seconds of grace are left."""

    key: int
    remaining: float


@attrs.frozen
class Shutdown:
    """Shutdown began: every cleanup ends within ``remaining`` seconds."""

    remaining: float


@attrs.frozen
class Forget:
    """Request ``request_id`` is done: drop its components."""

    request_id: int


@attrs.frozen
class Sweep:
    """Sweep each ``(provider, config, tag)`` on the worker's node, answer :class:`Swept`."""

    number: int
    targets: list[tuple[str, dict[str, Any], str]]


# -- worker to driver --------------------------------------------------------------------


@attrs.frozen
class Reported:
    """A task reporter call of request ``request_id``; ``ack``: the number
    the driver acknowledges once applied (an answered report)."""

    request_id: int
    report: Report
    ack: int | None = None


@attrs.frozen
class Stages:
    """The latest stage of each ``(request id, task, attempt)`` that moved since the last poll."""

    stages: dict[tuple[int, str, int], str]


@attrs.frozen
class AcquireCapacity:
    """Grant a capacity permit of ``provider`` as ``grant``."""

    grant: int
    provider: str


@attrs.frozen
class OpenToken:
    """Grant an open-rate token of ``provider`` as ``grant``."""

    grant: int
    provider: str


@attrs.frozen
class Abandon:
    """The waiter for ``grant`` left: stop waiting for it, or give back what was granted."""

    grant: int


@attrs.frozen
class Release:
    """Give back the permit granted as ``grant``."""

    grant: int


@attrs.frozen
class TaskDone:
    """Task ``key`` ended with ``record``."""

    key: int
    record: TaskRecord


@attrs.frozen
class TaskFailed:
    """Task ``key`` raised; ``error`` is the exception pickled (see ``portable_error``)."""

    key: int
    error: bytes


@attrs.frozen
class TaskCancelled:
    """Task ``key`` was cancelled (by a :class:`CancelTask`) before it had a record."""

    key: int


@attrs.frozen
class Swept:
    """The :class:`Sweep` ``number`` is done; ``notes`` name the sweeps that failed."""

    number: int
    notes: list[str]
