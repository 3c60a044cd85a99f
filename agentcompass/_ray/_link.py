"""What the driver follows of each worker (its link) and of each task running on one."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import trio

from ..runtime._executor import TaskReporter
from ..runtime._results import AttemptRecord, Phase
from ..runtime._values import RunRequest

__all__ = ["LOST", "DriverRequest", "Link", "Remote"]


@attrs.define(eq=False)
class Link:
    """The driver's side of one worker."""

    index: int
    actor: Any
    pid: int
    alive: bool = True
    tasks: set[int] = attrs.Factory(set)
    outgoing: list[Any] = attrs.Factory(list)
    wake: trio.Event = attrs.Factory(trio.Event)
    batches: Any = attrs.Factory(itertools.count)
    known: set[int] = attrs.Factory(set)
    #: grant id -> (provider, holder) of a capacity permit held for the worker
    held: dict[int, tuple[str, tuple[int, int]]] = attrs.Factory(dict)
    #: grant id -> the scope of the driver task waiting for it
    granting: dict[int, trio.CancelScope] = attrs.Factory(dict)
    #: driver session id -> (request id, provider, handle) journalled open
    sessions: dict[str, tuple[int, str, dict[str, Any]]] = attrs.Factory(dict)

    def send(self, message: Any) -> None:
        """Queue ``message`` for the worker; the link's sender ships it."""
        self.outgoing.append(message)
        self.wake.set()


@attrs.define(eq=False)
class Remote:
    """One task running on a worker, as the driver follows it."""

    key: int
    request_id: int
    task_id: str
    link: Link
    finished: trio.Event = attrs.Factory(trio.Event)
    #: How it ended: TaskDone, TaskFailed or TaskCancelled, or LOST with its worker.
    outcome: Any = None
    checkpoints: dict[int, AttemptRecord] = attrs.Factory(dict)
    #: attempt -> the try number of its latest ``attempt_started``
    tries: dict[int, int] = attrs.Factory(dict)
    #: attempt -> the stage its latest try is in (setup, run, collect, evaluate)
    stages: dict[int, Phase] = attrs.Factory(dict)
    current: int | None = None

    def end(self, outcome: Any) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.finished.set()


#: The outcome of a task whose worker was lost.
LOST = "lost"


@attrs.define(eq=False)
class DriverRequest:
    """One request whose tasks run on workers: its reporter and its tasks running now."""

    request: RunRequest
    reporter: TaskReporter
    tasks: dict[str, Remote] = attrs.Factory(dict)
