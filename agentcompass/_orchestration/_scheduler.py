"""The orchestration's worker pool and ordered dispatch (SPEC section 7).

* Requests are prepared in declaration order, pipelined: request i+1 starts
  preparing once 0..i are prepared and their pending tasks number fewer
  than the workers.
* ``task_concurrency`` workers pull from one global pool, always from the
  earliest request that still has pending tasks. That is a priority, not a
  barrier: active tasks of an earlier request overlap a later one's.
* A request finalizes once its own pending and active work drained and every
  earlier request's pending queue is empty; finalize overlaps other work.

Pending tasks are plain values in per-request deques: no coroutine or
component exists for a task until a worker takes it.
"""

from __future__ import annotations

import functools
from typing import Any

import trio

from .._logging import get_logger
from .._store import open_run_store
from ..runtime._executor import Executor, Grants
from ..runtime._results import AttemptRecord
from ._context import GraceClock
from ._request import RequestRun, failure_line

__all__ = ["Scheduler"]

log = get_logger("agentcompass.scheduler")

#: The records of one request that may be on their way to disk before its
#: workers wait: ``max(MIN_SAVING, SAVING_PER_WORKER * task_concurrency)``.
#: Under load a record takes 150-350 ms from queued to durable (the commit
#: round, then the Trio thread getting to its answer); at 2,000 records/s
#: that is up to 700 records, which one record per worker did not cover
#: (workers spent a fifth of a 10,000-task no-op run waiting). A record in
#: memory is a few KB, so 2,000 of them (500 workers) are a few MB.
MIN_SAVING = 256
SAVING_PER_WORKER = 4
#: A worker makes a schedule point of its own once every this many tasks.
YIELD_EVERY = 16


class _RequestReporter:
    """The in-process short-circuit of the task -> driver channel."""

    def __init__(self, run: RequestRun):
        self.run = run
        self.tag = run.tag

    def event(self, kind: str, **fields: Any) -> None:
        # Replaced by the store's own method once there is one (see
        # ``_bind``): events are reported several times per attempt.
        self.run.store.event(kind, **fields)

    def _bind(self) -> None:
        if self.run.store is not None:
            self.event = self.run.store.event  # type: ignore[method-assign]

    async def session_opened(self, session_id: str, provider: str, handle: dict[str, Any], name: str) -> None:
        # Queued, not waited for: the sandbox exists from the moment ``open``
        # returned, so waiting for the line would not shorten the window in
        # which a kill leaks it (the next commit round writes and syncs the
        # line, a few milliseconds); it would only hold the attempt still.
        await self.run.store.journal_session("opened", session_id, provider, handle, durable=False, name=name)

    async def session_closed(self, session_id: str, provider: str, handle: dict[str, Any]) -> None:
        # Not waited for: a lost "closed" line only means one harmless extra reap.
        await self.run.store.journal_session("closed", session_id, provider, handle, durable=False)

    async def checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        self.run.checkpoint(task_id, record)

    async def discarded_try(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        self.run.retries += 1
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
        await self.run.store.save_retry(task_id, attempt, try_number, data)


class Scheduler:
    def __init__(
        self,
        runs: list[RequestRun],
        concurrency: int,
        executor: Executor,
        grants: Grants,
        grace: GraceClock,
        terminal_status: Any,
    ):
        self.runs = runs
        self.concurrency = concurrency
        self.executor = executor
        self.grants = grants
        self.grace = grace
        self.terminal_status = terminal_status
        self.all_prepared = False
        self._work = trio.lowlevel.ParkingLot()
        self._progress = trio.lowlevel.ParkingLot()
        self._reporters = {run.index: _RequestReporter(run) for run in runs}
        #: Records on their way to disk, per request, before workers wait.
        self.max_saving = max(MIN_SAVING, SAVING_PER_WORKER * concurrency)
        # Per request: workers waiting for room in that request's backlog.
        self._saved = {run.index: trio.lowlevel.ParkingLot() for run in runs}
        for run in runs:
            run.on_saved = functools.partial(self._on_saved, self._saved[run.index])
            run.on_failed = self._on_failed

    # -- dispatch --------------------------------------------------------------

    def _next(self) -> tuple[RequestRun, Any] | None:
        for run in self.runs:
            if run.pending:
                return run, run.pending.popleft()
            if not run.prepared:
                return None
        return None

    async def worker(self) -> None:
        ran = 0
        while True:
            # No new task once cancelled: the last one may have finished in
            # a shielded cleanup, with no checkpoint since (see _task).
            await trio.lowlevel.checkpoint_if_cancelled()
            ran += 1
            if ran % YIELD_EVERY == 0:
                # The runtime adds no schedule point to an attempt of its
                # own (each one, under load, holds the attempt behind every
                # runnable task; see _LocalGrants.acquire_capacity). With
                # components that never yield either, a worker would run
                # task after task and starve the store's actors and the
                # other workers: it yields once every few tasks instead.
                await trio.lowlevel.cancel_shielded_checkpoint()
            item = self._next()
            if item is None:
                if self.all_prepared:
                    return
                await self._work.park()
                continue
            run, pending = item
            run.active += 1
            run.active_tasks[id(pending)] = pending
            self._progress.unpark_all()
            # Taking a request's last pending task may let a later request
            # that already drained finalize now, not at the next completion.
            self._check_drained()
            try:
                k = run.request.execution.attempts.k
                attempts = list(range(k)) if pending.attempts is None else list(pending.attempts)
                record = await self.executor.run_task(
                    run.request,
                    pending.task,
                    attempts,
                    pending.done or {},
                    pending.resume or {},
                    self.grants,
                    self._reporters[run.index],
                )
            except Exception as exc:  # noqa: BLE001 - unclassified: fails this request only (SPEC 7)
                run.checkpointed.pop(pending.task.task_id, None)
                if run.tallied:
                    # After a deadline or cancellation the request's terminal
                    # state is taken (its store may be closed): the task is
                    # unfinished, as in a crash.
                    log.info("late_task_error", request=run.request.name, error=failure_line(exc))
                else:
                    run.fail(exc, f"task {pending.task.task_id!r}")
            else:
                run.complete(record, pending, run.checkpointed.pop(pending.task.task_id, set()))
            finally:
                run.active -= 1
                del run.active_tasks[id(pending)]
                if not run.active:
                    run.idle.unpark_all()
            self._check_drained()
            # Backpressure: a slow disk makes workers wait, not memory grow.
            while len(run.saving) >= self.max_saving:
                await self._saved[run.index].park()

    def _on_saved(self, lot: trio.lowlevel.ParkingLot) -> None:
        # One record saved makes room for one waiting worker (waking them
        # all would only send the rest back to wait, at a cost per worker).
        lot.unpark()
        self._check_drained()

    def _on_failed(self) -> None:
        # A failed request dropped its pending tasks: the next request may
        # start preparing, and the failed one may have drained.
        self._progress.unpark_all()
        self._work.unpark_all()
        self._check_drained()

    def _check_drained(self) -> None:
        earlier_pending = False
        for run in self.runs:
            if not run.prepared:
                return
            if (
                not run.drained.is_set()
                and not run.pending
                and run.active == 0
                and not run.saving
                and not earlier_pending
            ):
                run.drained.set()
            earlier_pending = earlier_pending or bool(run.pending)

    # -- preparation -----------------------------------------------------------

    async def prepare_all(self, nursery: trio.Nursery) -> None:
        try:
            for run in self.runs:
                while sum(len(r.pending) for r in self.runs[: run.index]) >= self.concurrency:
                    await self._progress.park()
                await nursery.start(self._request_scope, run, nursery)
                self._work.unpark_all()
                self._check_drained()
        finally:
            self.all_prepared = True
            self._work.unpark_all()

    async def _finalize_failed(self, run: RequestRun) -> None:
        """Write what a failed request can (its terminal status first of all)
        once its running tasks drained; a write that fails again is only noted."""
        self._check_drained()
        await run.drained.wait()
        try:
            await run.finalize("failed")
        except Exception as exc:  # noqa: BLE001 - the request has failed already
            # The request_failed line said why; this goes to the run's log only.
            log.info("request_not_finalized", request=run.request.name, error=failure_line(exc))

    async def _hold_store(
        self, run: RequestRun, closed: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the request's run store open, shielded, until ``closed`` is set.

        The store commits every write through actor tasks of its own nursery.
        Opened in the request scope's task, those actors would be cancelled
        with it by the deadline or the caller's cancel scope, and the shielded
        finalize and cleanup journal writes would then wait for them until the
        grace ran out, leaving ``run_info.json`` at ``running``. Held in a task
        of its own under a shield, the store keeps committing while the
        request unwinds; the request scope closes it (``closed``) on every way out.
        """
        request = run.request
        # Held until ``closed``, which the request scope sets on every way
        # out, and never past the grace deadline once shutdown begins.
        with self.grace.bounded_shield():
            async with open_run_store(request.output_root, request.name, close_deadline=self.grace.deadline) as store:
                task_status.started(store)
                await closed.wait()

    async def _request_scope(
        self, run: RequestRun, nursery: trio.Nursery, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The request scope: owns the run directory from creation to finalize."""
        request = run.request
        closed = trio.Event()
        started = False
        try:
            # Shielded: trio reparents a started task only when the caller
            # is not cancelled; a deadline passing during the (short) open
            # would otherwise leave the holder waiting here for ``closed``.
            try:
                with self.grace.bounded_shield():
                    store = await nursery.start(self._hold_store, run, closed)
            except Exception as exc:  # noqa: BLE001 - no run directory: this request fails, no other
                run.fail(exc, "could not create the run directory")
                task_status.started()
                return
            try:
                await run.prepare(store)
                self._reporters[run.index]._bind()
                started = True
                task_status.started()
                await run.drained.wait()
                await run.finalize()
            except Exception as exc:  # noqa: BLE001 - unclassified: fails this request only (SPEC 7)
                run.fail(exc, "request")
                if not started:
                    started = True
                    task_status.started()
                await self._finalize_failed(run)
            except BaseException:
                # Deadline or cancellation: persist the terminal state of what
                # finished, within the grace window, then keep unwinding.
                limit = self.grace.deadline()
                with trio.move_on_at(limit, shield=True):
                    try:
                        now = trio.current_time()
                        await run.finalize(self.terminal_status(), save_deadline=now + (limit - now) / 2)
                    except Exception as exc:  # noqa: BLE001 - the cancellation is what propagates
                        run.fail(exc, "finalize")
                raise
            finally:
                forget = getattr(self.executor, "forget", None)
                if forget is not None:
                    forget(request)
        finally:
            # After a deadline or cancellation, the store stays open until
            # every task of the request has unwound: their sessions' journal
            # lines (a close, or an open that could not be interrupted) and
            # the records of tasks that finished in a cleanup are still
            # written, within the grace (their own cleanups end by then too).
            with trio.move_on_at(self.grace.deadline(), shield=True):
                while run.active:
                    await run.idle.park()
            # The store commits what is queued as it closes; a record still
            # waiting for its checkpoints must be queued by then.
            run.queue_deferred()
            if run.tallied:
                with trio.move_on_at(self.grace.deadline(), shield=True):
                    await run.recount_late()
            run.close_log()
            closed.set()
