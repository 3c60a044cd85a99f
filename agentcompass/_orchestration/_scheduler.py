"""The orchestration's concurrency limit and ordered dispatch (SPEC section 7).

* Requests are prepared in declaration order, pipelined: request i+1 starts
  preparing once 0..i are prepared and their pending tasks number fewer
  than ``task_concurrency``.
* At most ``task_concurrency`` tasks run at once. Whenever a slot is free
  (a task's attempts are done, a request was prepared, a record landed),
  the dispatcher starts the next task of the earliest request that still
  has pending tasks, in that request's nursery. That is a priority, not a
  barrier: active tasks of an earlier request overlap a later one's.
* A request finalizes once its own tasks are done and every earlier request
  handed out its tasks (see ``_request.request_scope``).

Pending tasks are plain values in per-request deques: no coroutine or
component exists for a task until the dispatcher starts it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..runtime._executor import Executor, Grants
from ._request import RequestRun, request_scope

__all__ = ["Dispatcher"]

#: The tasks of one request started and not yet durable before no more of
#: its tasks start: ``max(MIN_IN_FLIGHT, IN_FLIGHT_PER_SLOT * task_concurrency)``.
#: Under load a record spends several task lengths between queued and
#: durable, so a few per slot keep the slots busy (bench ``overhead``); a
#: record is a few KB.
MIN_IN_FLIGHT = 256
IN_FLIGHT_PER_SLOT = 4


class Dispatcher:
    """Prepares the requests in order and starts their tasks, earliest request
    first. It is what the tasks hold as their :class:`Slots`: a task giving
    its slot back, or its record landing, starts the next task at once (not
    a scheduler batch later, in a dispatcher task of its own)."""

    def __init__(
        self,
        runs: list[RequestRun],
        concurrency: int,
        executor: Executor,
        grants: Grants,
        terminal_status: Callable[[], str],
        scope: trio.CancelScope,
    ):
        self.runs = runs
        self.concurrency = concurrency
        self.executor = executor
        self.grants = grants
        self.terminal_status = terminal_status
        #: The work's scope: once it is cancelled no task starts.
        self.scope = scope
        self.max_in_flight = max(MIN_IN_FLIGHT, IN_FLIGHT_PER_SLOT * concurrency)
        self._free = concurrency
        #: Woken when a task was taken (preparation waits for room).
        self._taken = trio.lowlevel.ParkingLot()

    async def run(self) -> None:
        """The orchestration's work: every request scope and every task,
        in ``scope``."""
        with self.scope:
            async with trio.open_nursery() as nursery:
                for i, run in enumerate(self.runs):
                    while sum(len(r.tasks.pending) for r in self.runs[:i]) >= self.concurrency:
                        await self._taken.park()
                    await nursery.start(self._request, run, self.runs[:i])
                    self._fill()

    async def _request(
        self, run: RequestRun, earlier: list[RequestRun], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await request_scope(run, earlier, self.terminal_status, task_status=task_status)
        finally:
            self.executor.forget(run.request)
            self._fill()  # its pending tasks are gone: the next request may prepare

    def release(self) -> None:
        """A task's attempts are done: its slot is free."""
        self._free += 1
        self._fill()

    def landed(self) -> None:
        """A task's record is durable (or given up): room in its request's backlog."""
        self._fill()

    def _fill(self) -> None:
        """Start every task that can start: while a slot is free, the next
        task of the earliest request with pending tasks, unless that request
        has ``max_in_flight`` records on their way (a slow disk makes the
        run wait, not memory grow)."""
        if self.scope.cancel_called:
            return
        while self._free:
            run = self._earliest()
            if run is None or run.tasks.unsettled >= self.max_in_flight:
                break
            self._free -= 1
            run.start_next(self, self.executor, self.grants)
        if self._taken:
            self._taken.unpark_all()

    def _earliest(self) -> RequestRun | None:
        for run in self.runs:
            if run.tasks.pending:
                return run
            if not run.life.ready:
                return None
        return None
