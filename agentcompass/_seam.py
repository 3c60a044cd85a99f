"""The executor seam: what crosses between the orchestration and an executor (SPEC section 11).

The request scope hands each task to an :class:`~agentcompass.runtime.Executor`
as one :class:`~agentcompass.runtime.TaskJob` value (the request, the task,
the attempts still missing, the records to resume from) with two channels
back to the driver: :class:`~agentcompass.runtime.Grants` (capacity permits
and open-rate tokens) and :class:`~agentcompass.runtime.TaskReporter`
(progress, session journal lines, checkpoints, discarded tries, plans). This module
is everything an executor takes from the orchestration; an executor package
(``agentcompass._ray``) imports this and no other module of it.

* Running a job where it lands: :func:`run_job` on a
  :class:`RequestContext` (the request's components, built once per request
  where its tasks run) under a :class:`GraceClock`. :class:`InProcessExecutor`
  is exactly that, in the driver's own Trio run.
* Carrying the reporter across a process boundary: one frozen message class
  per ``TaskReporter`` method (:class:`ProgressEvent`, :class:`SessionOpened`,
  :class:`SessionClosed`, :class:`Checkpoint`, :class:`DiscardedTry`,
  :class:`AttemptPlan`), all
  pickling. Where the task runs, :class:`ForwardingReporter` turns each call
  into its message; on the driver, ``await message.apply(reporter)`` makes
  the same call on the request's reporter. :attr:`Report.answered` says
  whether the caller waits for the driver's answer, :attr:`Report.durable`
  whether that answer waits for the disk.
* A try lost with its worker: :func:`after_loss` applies the attempt
  scope's rule (:func:`~._attempt.retry_after_loss`) and says what runs
  next: the job again (the lost attempt resumed from the same retry budget,
  the checkpointed attempts kept) or the task's final record.

Which executor runs an orchestration is chosen by id
(:mod:`agentcompass._executors`); an executor's module registers itself there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import attrs
import trio

from ._orchestration._attempt import WORKER_LOST, lost_try, retry_after_loss
from ._orchestration._context import GraceClock, RequestContext
from ._orchestration._task import run_task, task_record
from .runtime._executor import Executor, Grants, TaskJob, TaskReporter
from .runtime._results import AttemptRecord, Phase, TaskRecord
from .runtime._values import ExecutionPlan, RunRequest

__all__ = [
    "WORKER_LOST",
    "AttemptPlan",
    "Checkpoint",
    "DiscardedTry",
    "ForwardingReporter",
    "GraceClock",
    "InProcessExecutor",
    "LostTry",
    "ProgressEvent",
    "Report",
    "RequestContext",
    "SessionClosed",
    "SessionOpened",
    "TaskJob",
    "after_loss",
    "run_job",
]


async def run_job(ctx: RequestContext, job: TaskJob) -> TaskRecord:
    """Run ``job`` (a task of ``ctx``'s request) to its record: the task scope."""
    return await run_task(ctx, job.task, job.attempts, job.done, job.resume)


class InProcessExecutor(Executor):
    """Runs tasks in the driver's own Trio run (``orchestration.executor: inprocess``).

    Components are built once per request, from the request's refs, the
    first time one of its tasks runs here."""

    def __init__(self, grace: GraceClock):
        self.grace = grace
        self._contexts: dict[int, RequestContext] = {}

    async def run_task(self, job: TaskJob, grants: Grants, reporter: TaskReporter) -> TaskRecord:
        ctx = self._contexts.get(id(job.request))
        if ctx is None:
            ctx = RequestContext.build(job.request, grants, reporter, self.grace)
            self._contexts[id(job.request)] = ctx
        return await run_job(ctx, job)

    def forget(self, request: RunRequest) -> None:
        """Drop a finished request's components."""
        self._contexts.pop(id(request), None)


# -- the reporter, as messages ----------------------------------------------------------


@attrs.frozen
class Report:
    """One :class:`TaskReporter` call, as a value that crosses a process boundary."""

    #: The caller waits until the driver has applied it (``session_opened``,
    #: ``discarded_try``); the others are fire and forget.
    answered: ClassVar[bool] = False
    #: Applying it waits for the disk: the driver applies it in a task of
    #: its own, so that the messages behind it do not wait.
    durable: ClassVar[bool] = False

    async def apply(self, reporter: TaskReporter) -> None:
        """Make the call on ``reporter`` (the driver's, for the request)."""
        raise NotImplementedError


@attrs.frozen
class ProgressEvent(Report):
    """``reporter.event(kind, **fields)``."""

    kind: str
    fields: dict[str, Any]

    async def apply(self, reporter: TaskReporter) -> None:
        reporter.event(self.kind, **self.fields)


@attrs.frozen
class SessionOpened(Report):
    """``reporter.session_opened(...)``: answered once the driver queued the journal line."""

    answered: ClassVar[bool] = True

    session_id: str
    provider: str
    handle: dict[str, Any]
    name: str

    async def apply(self, reporter: TaskReporter) -> None:
        await reporter.session_opened(self.session_id, self.provider, self.handle, self.name)


@attrs.frozen
class SessionClosed(Report):
    """``reporter.session_closed(...)``."""

    session_id: str
    provider: str
    handle: dict[str, Any]

    async def apply(self, reporter: TaskReporter) -> None:
        await reporter.session_closed(self.session_id, self.provider, self.handle)


@attrs.frozen
class Checkpoint(Report):
    """``reporter.checkpoint(task_id, record)``."""

    task_id: str
    record: AttemptRecord

    async def apply(self, reporter: TaskReporter) -> None:
        await reporter.checkpoint(self.task_id, self.record)


@attrs.frozen
class DiscardedTry(Report):
    """``reporter.discarded_try(...)``: answered once the driver made it durable."""

    answered: ClassVar[bool] = True
    durable: ClassVar[bool] = True

    task_id: str
    attempt: int
    try_number: int
    data: dict[str, Any]

    async def apply(self, reporter: TaskReporter) -> None:
        await reporter.discarded_try(self.task_id, self.attempt, self.try_number, self.data)


class ForwardingReporter:
    """A :class:`TaskReporter` where the task runs, away from the driver:
    each call becomes its :class:`Report`, handed to ``send`` (fire and
    forget) or, when :attr:`~Report.answered`, to ``ask``, which returns once
    the driver has applied it, as the in-process call returns."""

    def __init__(self, tag: str, send: Callable[[Report], None], ask: Callable[[Report], Awaitable[None]]):
        #: The run's tag (see ``TaskReporter.tag``).
        self.tag = tag
        self._send = send
        self._ask = ask

    async def _report(self, message: Report) -> None:
        if message.answered:
            await self._ask(message)
        else:
            self._send(message)
            await trio.lowlevel.checkpoint()

    def event(self, kind: str, **fields: Any) -> None:
        self._send(ProgressEvent(kind, fields))

    async def session_opened(self, session_id: str, provider: str, handle: dict[str, Any], name: str) -> None:
        await self._report(SessionOpened(session_id, provider, handle, name))

    async def session_closed(self, session_id: str, provider: str, handle: dict[str, Any]) -> None:
        await self._report(SessionClosed(session_id, provider, handle))

    async def checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        await self._report(Checkpoint(task_id, record))

    async def discarded_try(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        await self._report(DiscardedTry(task_id, attempt, try_number, data))

    async def attempt_plan(self, task_id: str, attempt: int, plan: ExecutionPlan) -> None:
        await self._report(AttemptPlan(task_id, attempt, plan))


@attrs.frozen
class AttemptPlan(Report):
    """``reporter.attempt_plan(...)``: answered once the driver made it durable
    (an ``OSError`` writing it is raised where the attempt runs)."""

    answered: ClassVar[bool] = True
    durable: ClassVar[bool] = True

    task_id: str
    attempt: int
    plan: ExecutionPlan

    async def apply(self, reporter: TaskReporter) -> None:
        await reporter.attempt_plan(self.task_id, self.attempt, self.plan)


# -- a try lost with its worker ----------------------------------------------------------


@attrs.frozen
class LostTry:
    """What the executor knows of the try its worker was running when lost."""

    #: The attempt it belonged to (None: the worker had started none of the job's).
    attempt: int | None
    try_number: int
    #: The stage the worker last reported for it.
    stage: Phase
    #: The worker, as the issue names it (``Ray worker 1 (pid 4242)``).
    worker: str


async def after_loss(
    job: TaskJob, reporter: TaskReporter, checkpoints: dict[int, AttemptRecord], lost: LostTry
) -> TaskJob | TaskRecord:
    """What runs after ``job``'s worker was lost: the job again, less the
    attempts it ``checkpoints``-ed and with the lost attempt resumed (its
    try saved as a discarded FATAL ``worker_lost`` one, the backoff
    waited), or, once that attempt's retry budget is spent, the task's
    record with it FATAL ``worker_lost``."""
    done = {**job.done, **checkpoints}
    todo = [i for i in job.attempts if i not in done]
    index = lost.attempt
    if index is None or index in done:
        return attrs.evolve(job, attempts=todo, done=done)
    record = lost_try(job.task.task_id, index, lost.try_number, lost.stage, lost.worker, job.resume.get(index))
    if not await retry_after_loss(job.request.execution, reporter, job.task.task_id, lost.try_number, record):
        return task_record(job.task, {**done, index: record})
    return attrs.evolve(job, attempts=todo, done=done, resume={**job.resume, index: record})
