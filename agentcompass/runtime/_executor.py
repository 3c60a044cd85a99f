"""Where a task runs (SPEC section 11).

The scheduler hands each task to an :class:`Executor` as a :class:`TaskJob`.
Running one task depends only on that serializable value (the
``RunRequest``, the ``TaskSpec``, the attempt indices still missing, earlier
attempt records to resume from) plus two narrow channels back to the driver:

* :class:`Grants` -- capacity permits and open-rate tokens. Only the driver
  grants them, so limits hold across every worker.
* :class:`TaskReporter` -- progress events, session journal lines,
  checkpoints and discarded tries. Only the driver writes the run directory.

The in-process Trio executor calls the task code directly and
short-circuits both channels; the ``ray`` executor ships the job to a
worker process running its own ``trio.run`` and carries the channels' calls
back and forth as messages.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from ._results import AttemptRecord, TaskRecord
from ._values import ExecutionPlan, RunRequest, TaskSpec

__all__ = ["Executor", "Grants", "TaskJob", "TaskReporter"]


@attrs.frozen
class TaskJob:
    """One task handed to an executor: everything running it depends on.

    ``attempts`` are the attempt indices still to run; ``done`` are attempt
    records already final (resumed from checkpoints); ``resume`` are failed
    attempts a reuse run continues with one retry of the current budget (or
    attempts whose try was lost with a worker, continuing their own budget).
    All of it pickles: a remote executor ships the job to the worker that
    runs it. The channels back to the driver (:class:`Grants`,
    :class:`TaskReporter`) are not part of it: they are arguments of
    :meth:`Executor.run_task`, which a remote executor stands in for on the
    worker.
    """

    request: RunRequest
    task: TaskSpec
    attempts: list[int]
    done: dict[int, AttemptRecord] = attrs.Factory(dict)
    resume: dict[int, AttemptRecord] = attrs.Factory(dict)


class Grants(Protocol):
    """Driver-owned limits, asked for by the task code."""

    async def acquire_capacity(self, provider: str, holder: object) -> None:
        """Wait for a capacity permit of ``provider`` held by ``holder``."""

    def release_capacity(self, provider: str, holder: object) -> None:
        """Give back ``holder``'s permit."""

    async def open_token(self, provider: str) -> None:
        """Wait for an open-rate token of ``provider`` (a cancelled waiter takes none)."""


class TaskReporter(Protocol):
    """What a running task tells the driver. ``discarded_try`` returns once
    the driver made it durable. ``checkpoint`` and the session journal lines
    are queued and made durable by the driver's next commits: waiting for a
    journal line would not shorten the time a just-opened sandbox is
    unjournalled, and waiting for a checkpoint would only hold the next
    attempt still. The driver reports an attempt finished once its
    checkpoint is durable, and writes the task's record only after the
    task's checkpoints landed."""

    #: The run's tag (``[a-z0-9-]``): every Environment session name starts with it.
    tag: str

    def event(self, kind: str, **fields: Any) -> None:
        """A ``progress.jsonl`` event (fire and forget)."""

    async def session_opened(self, session_id: str, provider: str, handle: dict[str, Any], name: str) -> None: ...

    async def session_closed(self, session_id: str, provider: str, handle: dict[str, Any]) -> None: ...

    async def checkpoint(self, task_id: str, record: AttemptRecord) -> None: ...

    async def discarded_try(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None: ...

    async def attempt_plan(self, task_id: str, attempt: int, plan: ExecutionPlan) -> None:
        """Record the attempt's plan (redacted as in records); returns once
        the driver made it durable, before the attempt opens its environment."""


class Executor:
    """Runs one task (its attempts, tries, retries and cleanup) to a ``TaskRecord``.

    ``run_task`` runs ``job`` with the driver's ``grants`` and reports
    through ``reporter``; it returns the task's record, raises what the task
    code raised, and propagates cancellation once the task's sessions are
    closed (within the cleanup grace). Executors are chosen by
    ``orchestration.executor``'s id (SPEC section 11).
    """

    async def run_task(self, job: TaskJob, grants: Grants, reporter: TaskReporter) -> TaskRecord:
        raise NotImplementedError

    def forget(self, request: RunRequest) -> None:
        """The request is done: drop whatever was kept for its tasks."""
