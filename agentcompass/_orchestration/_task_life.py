"""One task's life in its request, from its start to its counted record: the
executor runs its attempts, each evaluated attempt is checkpointed, the
record is made durable, then counted (the :class:`Reporter` is the
in-process end of the task -> driver channel).

The request's state is seen through :class:`RequestSide`, the part of
``_request.RequestRun`` a task touches, so this module sits below the request scope.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from .._atif._attempt import atif_of
from .._logging import get_logger
from .._redact import redact
from .._store._logs import take_logs, take_task_logs
from ..runtime._executor import Executor, Grants, TaskJob
from ..runtime._results import AttemptRecord, TaskRecord
from ..runtime._values import ExecutionPlan, RunRequest
from ._context import GraceClock, Slots
from ._request_state import Landing, Life, Tally, Tasks
from ._reuse import PendingTask

__all__ = ["Reporter", "RequestSide", "failure_line", "run_task", "save_checkpoint"]

log = get_logger("agentcompass.request")


def failure_line(exc: BaseException) -> str:
    """One redacted line for an error: the first leaf of a group, its type and message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class RequestSide(Protocol):
    """What a task of a request reads and changes of it (``_request.RequestRun``)."""

    request: RunRequest
    grace: GraceClock
    store: Any
    tag: str
    life: Life
    tasks: Tasks
    tally: Tally

    def fail(self, exc: BaseException, where: str) -> None: ...

    def fail_with(self, line: str, *, note: bool = True) -> None: ...

    def publish_progress(self, *, terminal: bool = False) -> None: ...


class Reporter:
    """The in-process short-circuit of the task -> driver channel of one request."""

    def __init__(self, run: RequestSide):
        self.run = run
        self.store = run.store
        self.tag = run.tag

    def event(self, kind: str, **fields: Any) -> None:
        self.store.event(kind, **fields)

    async def session_opened(self, session_id: str, provider: str, handle: dict[str, Any], name: str) -> None:
        # Queued, not waited for: the sandbox exists from the moment ``open``
        # returned, so waiting for the line would not shorten the window in
        # which a kill leaks it (``sweep`` by the run's tag covers it).
        await self.store.journal_session("opened", session_id, provider, handle, durable=False, name=name)

    async def session_closed(self, session_id: str, provider: str, handle: dict[str, Any]) -> None:
        # Not waited for: a lost "closed" line only means one harmless extra reap.
        await self.store.journal_session("closed", session_id, provider, handle, durable=False)

    async def checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        # The next attempt does not wait for the disk; the task's record does.
        tasks = self.run.tasks
        landing = tasks.landing[task_id]
        landing.send()
        assert tasks.nursery is not None
        record, logs = take_logs(record)
        tasks.nursery.start_soon(save_checkpoint, self.run, task_id, record, landing, logs)
        await trio.lowlevel.checkpoint()

    async def attempt_plan(self, task_id: str, attempt: int, plan: ExecutionPlan) -> None:
        await self.store.save_plan(task_id, attempt, plan)

    async def discarded_try(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        self.run.tally.retries += 1
        issues = data.get("issues") or [{}]
        log.info(
            "attempt_retry",
            request=self.run.request.name,
            task=task_id,
            attempt=attempt,
            scope=data.get("scope"),
            code=issues[0].get("code"),
            message=issues[0].get("message"),
        )
        await self.store.save_retry(task_id, attempt, try_number, data)


async def run_task(
    run: RequestSide,
    pending: PendingTask,
    attempts: list[int],
    landing: Landing,
    slots: Slots,
    executor: Executor,
    grants: Grants,
) -> None:
    """One task: its attempts (holding its slot), then its counted record."""
    tasks = run.tasks
    task_id = pending.task.task_id
    try:
        try:
            assert tasks.reporter is not None
            job = TaskJob(run.request, pending.task, attempts, pending.done or {}, pending.resume or {})
            record = await executor.run_task(job, grants, tasks.reporter)
        finally:
            tasks.attempts_done()
            slots.release()
        # A finished task's record is its result: it is made durable
        # even when the deadline passed during its last cleanup.
        with run.grace.bounded_shield():
            await landing.wait()
            record, logs = take_task_logs(record)
            for attempt, files in logs.items():
                if attempt not in landing.durable:
                    await save_logs(run, task_id, attempt, files)
            await _save(run, record, pending.done or {}, landing.durable)
            # After the record, never ahead of it in the writer's queue: a second view of it.
            await save_atif(run, task_id, record)
    except Exception as exc:  # noqa: BLE001 - unclassified: fails this request only (SPEC 7)
        if run.life.tallied:
            # The request's terminal state is taken: the task is
            # unfinished, as in a crash.
            log.info("late_task_error", request=run.request.name, error=failure_line(exc))
        else:
            run.fail(exc, f"task {task_id!r}")
    finally:
        tasks.settle(task_id)
        slots.landed()
        if not run.life.tallied:
            run.publish_progress()


async def save_checkpoint(
    run: RequestSide, task_id: str, record: AttemptRecord, landing: Landing, logs: dict[str, bytes] | None = None
) -> None:
    """Make one evaluated attempt of a running task durable (its kept
    ``logs`` first); report it finished once it is. A failure only means
    the task's record holds it."""
    if logs:
        await save_logs(run, task_id, record.attempt, logs)
    durable = False
    try:
        await run.store.save_checkpoint(task_id, record)
        durable = True
    except Exception as exc:  # noqa: BLE001 - the record holds the attempt
        line = f"could not write a checkpoint of task {task_id!r}: {failure_line(exc)}"
        log.info("checkpoint_not_written", request=run.request.name, task=task_id, error=line)
    else:
        if not run.life.tallied:
            run.store.event(
                "attempt_finished", task=task_id, attempt=record.attempt, status=record.status, retries=record.retries
            )
    finally:
        landing.landed(record.attempt, durable=durable)


async def save_atif(run: RequestSide, task_id: str, record: TaskRecord) -> None:
    """Write the attempts' trajectories in ATIF where a harness ran them; a
    second view of the record's, so a failure is a log line."""
    run_id = run.store.run_dir.name
    documents = {a.attempt: atif_of(run.request, task_id, a, run_id) for a in record.attempts}
    found = {n: d for n, d in documents.items() if d is not None}
    if not found:
        return
    try:
        await run.store.save_agent_trajectories(task_id, found)
    except Exception as exc:  # noqa: BLE001 - the record holds the trajectory
        line = f"could not write the ATIF trajectory of task {task_id!r}: {failure_line(exc)}"
        log.info("atif_not_written", request=run.request.name, task=task_id, error=line)


async def save_logs(run: RequestSide, task_id: str, attempt: int, files: dict[str, bytes]) -> None:
    """Write an attempt's kept logs; they are diagnostics, so a failure is a log line, not the request's."""
    try:
        await run.store.save_logs(task_id, attempt, files)
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        line = f"could not keep the logs of task {task_id!r} attempt {attempt}: {failure_line(exc)}"
        log.info("logs_not_written", request=run.request.name, task=task_id, error=line)


async def _save(run: RequestSide, record: TaskRecord, earlier: dict[int, Any], checkpointed: set[int]) -> None:
    """Make ``record`` durable, then count it and report its attempts
    (those not ``checkpointed`` or taken from a reused run) and the task
    finished. A record that cannot be written is not finished: it counts
    as unavailable, a --reuse run runs it again, and the request fails."""
    task_id = record.task_id
    run.tasks.save(record)
    try:
        await run.store.save_task(record)
    except Exception as exc:  # noqa: BLE001 - one record; reported below
        line = f"could not write the record of task {task_id!r}: {failure_line(exc)}"
        log.info("record_not_written", request=run.request.name, task=task_id, error=line)
        if not run.life.tallied:
            run.tally.unsaved.append(record)
            run.fail_with(line)
        return
    finally:
        run.tasks.saved(task_id)
    if run.life.tallied:
        # Finalize counted what was on its way; a task that finished
        # while the request unwound is counted by ``RequestRun.recount_late``.
        run.tally.landed_late(record)
        return
    run.tally.count(record)
    event = run.store.event
    for attempt in record.attempts:
        if attempt.attempt not in checkpointed and attempt.attempt not in earlier:
            event(
                "attempt_finished",
                task=task_id,
                attempt=attempt.attempt,
                status=attempt.status,
                retries=attempt.retries,
            )
    event("task_finished", task=task_id, severity=record.severity)
    if record.severity == "fatal":
        issue = next((i for a in record.attempts for i in a.issues if i.severity == "fatal"), None)
        log.warning(
            "task_invalidated",
            request=run.request.name,
            task=task_id,
            code=issue.code if issue else None,
            message=issue.message if issue else None,
        )
