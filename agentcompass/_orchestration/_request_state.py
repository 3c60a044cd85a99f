"""The request scope's state (SPEC 2, request row), in four pieces with one job each.

The scope itself, which drives these, is ``_request``.

:class:`Life` is where the request is: a :class:`Stage`, every step checked.
:class:`Prepared` is what preparation decided, fixed once made.
:class:`Tasks` follows its tasks from queued to settled.
:class:`Tally` holds its results so far and how it went.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from ..runtime._executor import TaskReporter
from ..runtime._results import TaskRecord
from ..runtime._values import TaskSpec
from ._reuse import PendingTask

__all__ = ["MAX_FAILURE_NOTES", "Landing", "Life", "Stage", "Prepared", "Tally", "Tasks"]

#: Failures of one request noted in its ``run_info.json`` (the rest are counted).
MAX_FAILURE_NOTES = 5


class Stage(enum.IntEnum):
    """Where a request is in its life. Stages only move forward, in this order::

        WAITING -> PREPARING -> RUNNING -> DISPATCHED -> TALLIED -> FINALIZED

    A request may skip ahead to DISPATCHED from WAITING or PREPARING (it has
    no run directory, or was stopped before its tasks were queued); no other
    step is allowed (:meth:`Life.advance` raises on one)."""

    #: Not started yet (its store may be open already).
    WAITING = 0
    #: Loading and selecting its tasks, planning reuse.
    PREPARING = 1
    #: Its tasks are queued: the dispatcher hands them out.
    RUNNING = 2
    #: No task left to hand out: all were started, or dropped (a stop, a failure).
    DISPATCHED = 3
    #: Finalize took the count: a record that lands now is late (:attr:`Tally.late`).
    TALLIED = 4
    #: The terminal status is on disk.
    FINALIZED = 5


_NEXT: dict[Stage, frozenset[Stage]] = {
    Stage.WAITING: frozenset({Stage.PREPARING, Stage.DISPATCHED}),
    Stage.PREPARING: frozenset({Stage.RUNNING, Stage.DISPATCHED}),
    Stage.RUNNING: frozenset({Stage.DISPATCHED}),
    Stage.DISPATCHED: frozenset({Stage.TALLIED}),
    Stage.TALLIED: frozenset({Stage.FINALIZED}),
    Stage.FINALIZED: frozenset(),
}


@attrs.define(eq=False)
class Life:
    """A request's :class:`Stage`, and the tasks waiting for it to reach one
    (the request's own scope, later requests' finalize)."""

    stage: Stage = Stage.WAITING
    _moved: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)

    def advance(self, to: Stage) -> None:
        """Move on to ``to``. A step :class:`Stage` does not allow is a bug: raised here, where it happens."""
        if to not in _NEXT[self.stage]:
            raise RuntimeError(f"a request cannot go from {self.stage.name} to {to.name}")
        self.stage = to
        self._moved.unpark_all()

    async def reached(self, stage: Stage) -> None:
        """Until the request is at ``stage`` or past it (a checkpoint either way, as ``Event.wait``)."""
        if self.stage >= stage:
            await trio.lowlevel.checkpoint()
        while self.stage < stage:
            await self._moved.park()

    @property
    def ready(self) -> bool:
        """Preparation is over (its tasks were queued, or it has none): the dispatcher may look past it."""
        return self.stage >= Stage.RUNNING

    @property
    def tallied(self) -> bool:
        """Finalize took the count: a record landing now is late, a task error no longer fails the request."""
        return self.stage >= Stage.TALLIED


@attrs.frozen
class Prepared:
    """What preparation decided, fixed from then on: the selected tasks in
    order, each one's position (results read in task order), and the records
    reuse took from an earlier run (counted, never run here)."""

    tasks: tuple[TaskSpec, ...]
    order: Mapping[str, int]
    reused: tuple[TaskRecord, ...]

    @classmethod
    def of(cls, tasks: Sequence[TaskSpec], reused: Sequence[TaskRecord]) -> Prepared:
        return cls(tuple(tasks), {task.task_id: i for i, task in enumerate(tasks)}, tuple(reused))


@attrs.define(eq=False)
class Landing:
    """One task's checkpoints on their way to disk; its record waits for them
    (commit rounds may finish out of order, and the record's round removes them)."""

    #: Checkpoints sent and not landed yet.
    count: int = 0
    #: Attempts whose checkpoint is durable (reported finished already).
    durable: set[int] = attrs.Factory(set)
    #: Where the record waits, made only when it has to (most tasks never do).
    _lot: trio.lowlevel.ParkingLot | None = None

    def send(self) -> None:
        """A checkpoint is on its way; :meth:`landed` once its write returned."""
        self.count += 1

    def landed(self, attempt: int, *, durable: bool) -> None:
        """The checkpoint of ``attempt`` was written (``durable``) or given up."""
        if durable:
            self.durable.add(attempt)
        self.count -= 1
        if not self.count and self._lot is not None:
            self._lot.unpark_all()

    async def wait(self) -> None:
        """Until every checkpoint sent has landed."""
        while self.count:
            if self._lot is None:
                self._lot = trio.lowlevel.ParkingLot()
            await self._lot.park()


@attrs.define(eq=False)
class Tasks:
    """A request's tasks from queued to settled. ``pending`` wait for a slot;
    a started task is ``active`` while it holds one, and unsettled until its
    record is durable or given up; ``saving`` are finished records on their
    way to disk (finalize counts those that never land). ``nursery`` and
    ``reporter`` are set while the request scope's nursery is open."""

    pending: collections.deque[PendingTask] = attrs.Factory(collections.deque)
    nursery: trio.Nursery | None = None
    reporter: TaskReporter | None = None
    active: int = 0
    unsettled: int = 0
    #: task id -> its checkpoints on their way.
    landing: dict[str, Landing] = attrs.Factory(dict)
    saving: dict[str, TaskRecord] = attrs.Factory(dict)
    #: task id -> (Trio time it started, its time budget or None), while it runs: the ETA's inputs.
    running: dict[str, tuple[float, float | None]] = attrs.Factory(dict)
    #: Seconds each task run in this process took, start to settled (the ETA's other input).
    durations: list[float] = attrs.Factory(list)
    #: Woken when ``unsettled`` or ``saving`` drops to none.
    _quiet: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)

    def start(self, task_id: str, budget: float | None = None) -> Landing:
        """A task starts, holding a slot; undone by :meth:`attempts_done` and :meth:`settle`."""
        self.active += 1
        self.unsettled += 1
        self.running[task_id] = (trio.current_time(), budget)
        landing = self.landing[task_id] = Landing()
        return landing

    def attempts_done(self) -> None:
        self.active -= 1

    def settle(self, task_id: str) -> None:
        """The task's record is durable or given up: it no longer holds back its request."""
        del self.landing[task_id]
        self.unsettled -= 1
        started = self.running.pop(task_id, None)
        if started is not None:
            self.durations.append(trio.current_time() - started[0])
        if not self.unsettled:
            self._quiet.unpark_all()

    def save(self, record: TaskRecord) -> None:
        """``record`` is on its way to disk; :meth:`saved` once the write returned."""
        self.saving[record.task_id] = record

    def saved(self, task_id: str) -> None:
        del self.saving[task_id]
        if not self.saving:
            self._quiet.unpark_all()

    async def until_settled(self) -> None:
        while self.unsettled:
            await self._quiet.park()

    async def until_saved(self) -> None:
        while self.saving:
            await self._quiet.park()


@attrs.define(eq=False)
class Tally:
    """A request's results so far, and how it went.

    ``records`` are the counted task records (``counts``: tasks left with a
    FATAL, an ERROR, a WARNING); ``unsaved`` finished but could not be
    written (they count as unavailable). After a deadline or cancellation,
    ``unfinished`` are the tasks that had not finished when finalize took its
    count, and ``late`` those of them that finished since. ``status``,
    ``error``, ``failures`` and ``notes`` say how the request went;
    ``metrics`` are the last ones written."""

    status: str | None = None
    error: str | None = None
    #: Unclassified failures so far (see :meth:`RequestRun.fail`).
    failures: int = 0
    #: It failed on bad input found while preparing (a task ID): the CLI exits 2.
    config_error: bool = False
    notes: list[str] = attrs.Factory(list)
    retries: int = 0
    records: list[TaskRecord] = attrs.Factory(list)
    counts: dict[str, int] = attrs.Factory(lambda: {"fatal": 0, "error": 0, "warning": 0})
    unsaved: list[TaskRecord] = attrs.Factory(list)
    unfinished: dict[str, TaskSpec] = attrs.Factory(dict)
    late: list[TaskRecord] = attrs.Factory(list)
    metrics: dict[str, Any] = attrs.Factory(dict)
    #: (record counts, metrics, notes) of the last aggregate, see ``RequestRun._write_results``.
    aggregated: Any = None

    def count(self, record: TaskRecord) -> None:
        self.records.append(record)
        if record.severity == "fatal":
            self.counts["fatal"] += 1
        elif record.severity == "error":
            self.counts["error"] += 1
        elif any(issue.severity == "warning" for a in record.attempts for issue in a.issues):
            self.counts["warning"] += 1

    def fail(self, line: str, *, note: bool) -> bool:
        """The request failed (``line`` says why); True for its first failure."""
        first = self.error is None
        self.status = "failed"
        self.error = self.error or line
        self.failures += 1
        if note and self.failures <= MAX_FAILURE_NOTES:
            self.notes.append(line)
        elif note and self.failures == MAX_FAILURE_NOTES + 1:
            self.notes.append("more failures followed (see log.jsonl)")
        return first

    def finish(self, status: str, selected: Sequence[TaskSpec]) -> None:
        """Finalize's count: ``status`` is the terminal one. Every selected
        task without a record is unfinished (it counts as unavailable, so a
        partial run never reads like a full score), not only those pending or
        active now: a task cancelled with nothing to clean up may have
        unwound already."""
        self.status = status
        finished = {r.task_id for r in self.records} | {r.task_id for r in self.unsaved}
        self.unfinished = {t.task_id: t for t in selected if t.task_id not in finished}

    def landed_late(self, record: TaskRecord) -> None:
        """``record`` became durable after finalize took its count: :meth:`recount_late` counts it."""
        if record.task_id in self.unfinished:
            self.late.append(record)

    def recount_late(self, *, finalized: bool) -> bool:
        """Count the late records as finished, once the terminal results are
        written (``finalized``; otherwise they are dropped: the finalize still
        to come counts what is durable). True when the results changed."""
        late, self.late = self.late, []
        if not finalized:
            return False
        for record in late:
            self.unfinished.pop(record.task_id, None)
            self.count(record)
        return bool(late)

    def forget_records(self) -> None:
        """Drop the per-task values; ``status`` and ``metrics`` stay."""
        self.records, self.unsaved, self.late, self.unfinished = [], [], [], {}
