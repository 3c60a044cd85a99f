"""The orchestration's concurrency limit and ordered dispatch (SPEC section 7).

* Requests are prepared in declaration order, pipelined: request i+1 starts
  preparing once 0..i are prepared and their pending tasks number fewer
  than ``task_concurrency``.
* At most ``task_concurrency`` tasks run at once. The dispatcher takes a
  free slot, then the next task of the earliest request that still has
  pending tasks, and starts it in that request's nursery; the task gives the
  slot back when its attempts are done. That is a priority, not a barrier:
  active tasks of an earlier request overlap a later one's.
* A request finalizes once its own tasks are done and every earlier request
  handed out its tasks (see ``_request.request_scope``).

Pending tasks are plain values in per-request deques: no coroutine or
component exists for a task until the dispatcher starts it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..runtime._executor import Executor, Grants
from ._context import Slots
from ._request import RequestRun, request_scope

__all__ = ["Dispatcher"]

#: The tasks of one request started and not yet durable before the
#: dispatcher waits: ``max(MIN_IN_FLIGHT, IN_FLIGHT_PER_SLOT * task_concurrency)``.
#: Under load a record takes 150-350 ms from queued to durable, so a few per
#: slot keep the slots busy (bench ``overhead``); a record is a few KB.
MIN_IN_FLIGHT = 256
IN_FLIGHT_PER_SLOT = 4


class Dispatcher:
    """Prepares the requests in order and starts their tasks, earliest request first."""

    def __init__(
        self,
        runs: list[RequestRun],
        concurrency: int,
        executor: Executor,
        grants: Grants,
        terminal_status: Callable[[], str],
    ):
        self.runs = runs
        self.concurrency = concurrency
        self.executor = executor
        self.grants = grants
        self.terminal_status = terminal_status
        self.max_in_flight = max(MIN_IN_FLIGHT, IN_FLIGHT_PER_SLOT * concurrency)
        self.slots = Slots(concurrency)
        self._all_prepared = False
        #: Woken when a task was taken (preparation waits for room).
        self._taken = trio.lowlevel.ParkingLot()

    async def run(self) -> None:
        """The orchestration's work: every request scope and every task."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._dispatch)
            await self._prepare_all(nursery)

    async def _prepare_all(self, nursery: trio.Nursery) -> None:
        try:
            for run in self.runs:
                while sum(len(r.pending) for r in self.runs[: run.index]) >= self.concurrency:
                    await self._taken.park()
                await nursery.start(self._request, run)
                self.slots.changed.unpark_all()
        finally:
            self._all_prepared = True
            self.slots.changed.unpark_all()

    async def _request(self, run: RequestRun, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await request_scope(run, self.runs[: run.index], self.terminal_status, task_status=task_status)
        finally:
            self.executor.forget(run.request)

    def _earliest(self) -> RequestRun | None:
        for run in self.runs:
            if run.pending:
                return run
            if not run.prepared:
                return None
        return None

    async def _dispatch(self) -> None:
        """Start every task that can start, then wait until another can: a
        slot is free, the earliest request with pending tasks has fewer than
        ``max_in_flight`` records on their way (a slow disk makes the
        dispatcher wait, not memory grow)."""
        slots = self.slots
        while True:
            run = self._earliest()
            if run is None:
                if self._all_prepared:
                    return
            elif slots.free and run.in_flight < self.max_in_flight:
                slots.free -= 1
                run.start_task(run.pending.popleft(), slots, self.executor, self.grants)
                self._taken.unpark_all()
                continue
            await slots.changed.park()
