"""The request scope: run directory, task loading and selection, reuse,
results as tasks finish, and finalize (metrics, summary, terminal status).

The driver side of a request. Its tasks run through an ``Executor``; the
request only sees serializable results come back and owns every write to
its run directory, through its :class:`RunStore`.
"""

from __future__ import annotations

import collections
import math
import platform
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import trio

from .. import _registry
from .._convert import unstructure
from .._logging import add_json_log, get_logger, remove_json_log
from .._redact import redact
from .._store import compute_metrics, render_summary
from .._store._run_store import new_run_tag
from ..runtime._components import BaseBenchmark
from ..runtime._errors import ComponentError
from ..runtime._results import AttemptRecord, RequestResult, TaskRecord
from ..runtime._values import RunRequest, TaskSpec
from ._context import GraceClock
from ._reuse import PendingTask, ReusePlan, plan_reuse

__all__ = ["PendingTask", "RequestRun", "failure_line"]

log = get_logger("agentcompass.request")


#: Failures of one request noted in its ``run_info.json`` (the rest are counted).
MAX_FAILURE_NOTES = 5


def failure_line(exc: BaseException) -> str:
    """One redacted line for an error: the first leaf of a group, its type and message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


@attrs.define(eq=False)
class RequestRun:
    """Driver-side state of one request of an orchestration."""

    index: int
    request: RunRequest
    grace: GraceClock
    store: Any = None
    benchmark: BaseBenchmark | None = None
    pending: collections.deque[PendingTask] = attrs.Factory(collections.deque)
    active: int = 0
    retries: int = 0
    total: int = 0
    prepared: bool = False
    finalized: bool = False
    status: str | None = None
    error: str | None = None
    records: list[TaskRecord] = attrs.Factory(list)
    counts: dict[str, int] = attrs.Factory(lambda: {"fatal": 0, "error": 0, "warning": 0})
    started_at: float = 0.0
    started_clock: float = 0.0
    drained: trio.Event = attrs.Factory(trio.Event)
    metrics: dict[str, Any] = attrs.Factory(dict)
    reuse: ReusePlan | None = None
    notes: list[str] = attrs.Factory(list)
    order: dict[str, int] = attrs.Factory(dict)
    #: The selected tasks, in order.
    tasks: list[TaskSpec] = attrs.Factory(list)
    active_tasks: dict[int, PendingTask] = attrs.Factory(dict)
    #: task id -> attempts checkpointed in this run, until the task completes.
    checkpointed: dict[str, set[int]] = attrs.Factory(dict)
    #: task id -> how many of its checkpoints are on their way to disk.
    landing: dict[str, int] = attrs.Factory(dict)
    #: task id -> queues its finished record, once those checkpoints landed.
    deferred: dict[str, Callable[[], None]] = attrs.Factory(dict)
    #: Woken when ``active`` drops to 0 (the request scope's last wait).
    idle: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)
    #: Tasks were queued (after reuse copied what it takes); ``run_info.json`` "prepared".
    queued: bool = False
    #: task id -> finished record on its way to disk (see ``complete``).
    saving: dict[str, TaskRecord] = attrs.Factory(dict)
    #: Finished records that could not be written (they count as unavailable).
    unsaved: list[TaskRecord] = attrs.Factory(list)
    all_saved: trio.Event = attrs.Factory(trio.Event)
    #: Finalize took its count: records saved from now on are not counted again.
    tallied: bool = False
    #: After a deadline or cancellation: task id -> task that had not
    #: finished when finalize took its count.
    unfinished: dict[str, TaskSpec] = attrs.Factory(dict)
    #: Records of such tasks that finished while the request unwound.
    late: list[TaskRecord] = attrs.Factory(list)
    #: Called after each record is saved (the scheduler's wake-up).
    on_saved: Any = lambda: None
    #: Called after ``fail`` dropped the pending tasks (the scheduler's wake-up).
    on_failed: Any = lambda: None
    #: Unclassified failures so far (see ``fail``).
    failures: int = 0
    #: (record counts, metrics, notes) of the last aggregate, see ``_write_results``.
    _aggregated: Any = None
    #: Prefix of every Environment session name of this run (``run_info.json`` "tag").
    tag: str = attrs.Factory(new_run_tag)

    # -- preparation ---------------------------------------------------------

    async def prepare(self, store: Any) -> None:
        """Create the run, load and select tasks, decide reuse, queue the rest.
        A failure here fails the request (status ``failed``), not the run."""
        request = self.request
        self.store = store
        self.started_at = time.time()
        self.started_clock = trio.current_time()
        add_json_log(store.run_dir / "log.jsonl", request=request.name)
        await store.write_run_info(self.run_info("running"))
        store.event("run_started", request=request.name, run_dir=str(store.run_dir))
        try:
            self.benchmark = _registry.build("benchmark", request.benchmark.id, request.benchmark.config)
            tasks = await self.benchmark.load_tasks(request)
            tasks = self.benchmark.select_tasks(list(tasks), request)
            seen: set[str] = set()
            for task in tasks:
                if not isinstance(task, TaskSpec):
                    raise ComponentError(f"benchmark {request.benchmark.id!r}: load_tasks() must return TaskSpec values")
                if task.task_id in seen:
                    raise ComponentError(f"benchmark {request.benchmark.id!r}: duplicate task id {task.task_id!r}")
                seen.add(task.task_id)
            self.reuse = await plan_reuse(self, tasks)
        except Exception as exc:  # noqa: BLE001 - the request fails, the orchestration goes on
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.status = "failed"
            self.prepared = True
            log.error("request_failed", request=request.name, error=self.error)
            return
        self.order = {task.task_id: i for i, task in enumerate(tasks)}
        self.tasks = tasks
        self.notes.extend(self.reuse.notes)
        # Durable before any task can start: a run whose run_info.json does
        # not say "prepared" ran nothing (and may hold only part of what it
        # copied from a reuse source), so a later reuse skips it (_reuse).
        self.queued = True
        self.total = len(tasks)
        await store.write_run_info(self.run_info("running"))
        for record in self.reuse.reused:
            self._count(record)
        self.pending.extend(self.reuse.pending)
        self.reuse.pending = []
        self.prepared = True
        self.publish_progress()

    def fail(self, exc: BaseException, where: str) -> None:
        """An error no row of SPEC section 6 classifies (a full disk, a
        provider rejecting a resumed attempt's plan) fails this request, and
        only it: status ``failed``, the error in ``run_info.json`` and on the
        console as one line. Its other tasks still run: their results may
        well be sound (a task that cannot be written counts as unavailable)."""
        self.fail_with(f"{where}: {failure_line(exc)}")

    def fail_with(self, line: str) -> None:
        """:meth:`fail` with the error already made one line. Only the first
        failure goes to the console; the others are in the notes."""
        first = self.error is None
        self.status = "failed"
        self.error = self.error or line
        self.failures += 1
        if self.failures <= MAX_FAILURE_NOTES:
            self.notes.append(line)
        elif self.failures == MAX_FAILURE_NOTES + 1:
            self.notes.append("more failures followed (see log.jsonl)")
        if not self.prepared:
            self.prepared = True
        if first:
            log.error("request_failed", request=self.request.name, error=line)
        self.on_failed()

    # -- results -------------------------------------------------------------

    def _count(self, record: TaskRecord) -> None:
        self.records.append(record)
        if record.severity == "fatal":
            self.counts["fatal"] += 1
        elif record.severity == "error":
            self.counts["error"] += 1
        elif any(issue.severity == "warning" for a in record.attempts for issue in a.issues):
            self.counts["warning"] += 1

    def checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        """Queue the checkpoint of an evaluated attempt of a running task;
        the attempt is reported finished once it is durable (see
        :meth:`_checkpoint_saved`)."""
        attempts = self.checkpointed.setdefault(task_id, set())
        attempts.add(record.attempt)
        self.landing[task_id] = self.landing.get(task_id, 0) + 1
        self.store.save_checkpoint_soon(task_id, record, partial(self._checkpoint_saved, task_id, record, attempts))

    def _checkpoint_saved(
        self, task_id: str, record: AttemptRecord, attempts: set[int], error: Exception | None
    ) -> None:
        left = self.landing[task_id] - 1
        if left:
            self.landing[task_id] = left
        else:
            del self.landing[task_id]
        if error is not None:
            # Not durable: the attempt is reported finished with the task's
            # record, which holds it (``attempts`` is what :meth:`complete`
            # is or will be given). Only a kill before the record lands
            # would run it again.
            attempts.discard(record.attempt)
            line = f"could not write a checkpoint of task {task_id!r}: {error}".splitlines()[0]
            # Not a failure by itself (the record holds the attempt); only in the run's log.
            log.info("checkpoint_not_written", request=self.request.name, task=task_id, error=line)
        elif not self.tallied and not self.store.closed:
            self.store.event(
                "attempt_finished", task=task_id, attempt=record.attempt, status=record.status, retries=record.retries
            )
        if not left:
            queue = self.deferred.pop(task_id, None)
            if queue is not None:
                queue()

    def complete(self, record: TaskRecord, pending: PendingTask, checkpointed: set[int]) -> None:
        """A task finished: queue its record. Once the record is durable it is
        counted and the attempts that went straight into it (not
        ``checkpointed``, not taken from a reused run) and the task are
        reported finished (see :meth:`_saved`). The worker does not wait for
        the disk: it takes its next task meanwhile (``saving`` bounds how many
        records may be on their way).

        A record whose task still has checkpoints on their way is queued once
        they landed: commit rounds may finish out of order, and the record's
        round removes the checkpoints it supersedes."""
        self.saving[record.task_id] = record
        queue = partial(self.store.save_task_soon, record, partial(self._saved, record, pending.done or {}, checkpointed))
        if record.task_id in self.landing:
            self.deferred[record.task_id] = queue
        else:
            queue()

    def queue_deferred(self) -> None:
        """Queue every record still waiting for its checkpoints, now: for a
        request scope about to close its store after a deadline or
        cancellation (the close commits what is queued, and a checkpoint
        landing then could no longer queue its record). A checkpoint that
        lands after its record is harmless: readers prefer the record."""
        deferred, self.deferred = self.deferred, {}
        for queue in deferred.values():
            queue()

    def _saved(
        self, record: TaskRecord, earlier: dict[int, Any], checkpointed: set[int], error: Exception | None
    ) -> None:
        del self.saving[record.task_id]
        if not self.saving:
            self.all_saved.set()
        if error is not None:
            line = f"could not write the record of task {record.task_id!r}: {error}".splitlines()[0]
            log.info("record_not_written", request=self.request.name, task=record.task_id, error=line)
        if self.tallied or self.store.closed:
            # After a deadline, finalize counted what was still on its way;
            # a task that finished while the request unwound is counted by
            # recount_late. The store may be closing (the grace ran out
            # before finalize did, and the store's close commits what is
            # queued): nothing more to report.
            if error is None and record.task_id in self.unfinished:
                self.late.append(record)
            return
        if error is not None:
            # Not on disk, so not finished: it counts as unavailable and a
            # --reuse run runs it again. The request cannot succeed.
            self.unsaved.append(record)
            self.fail_with(line)
        else:
            self._count(record)
            event = self.store.event
            for attempt in record.attempts:
                if attempt.attempt not in checkpointed and attempt.attempt not in earlier:
                    event(
                        "attempt_finished",
                        task=record.task_id,
                        attempt=attempt.attempt,
                        status=attempt.status,
                        retries=attempt.retries,
                    )
            event("task_finished", task=record.task_id, severity=record.severity)
            if record.severity == "fatal":
                issue = next((i for a in record.attempts for i in a.issues if i.severity == "fatal"), None)
                log.warning(
                    "task_invalidated",
                    request=self.request.name,
                    task=record.task_id,
                    code=issue.code if issue else None,
                    message=issue.message if issue else None,
                )
        self.publish_progress()
        self.on_saved()

    async def wait_saved(self) -> None:
        """Until every queued record is durable (or failed)."""
        if self.saving:
            self.all_saved = trio.Event()
            await self.all_saved.wait()

    def publish_progress(self, *, terminal: bool = False) -> None:
        """Queue the progress snapshot. After a deadline or cancellation
        (``terminal``) nothing runs any more: every unfinished task counts as
        pending, none as active, whatever is still unwinding."""
        if self.store is None:
            return
        if terminal:
            self.store.set_progress(self.snapshot(terminal=True))
        else:
            # Built when the store writes it (at most every half second).
            self.store.set_progress(self.snapshot)

    def snapshot(self, *, terminal: bool = False) -> dict[str, Any]:
        unfinished = len(self.unfinished) if self.tallied else len(self.pending) + len(self.active_tasks)
        return {
            "total": self.total,
            "pending": unfinished if terminal else len(self.pending),
            "active": 0 if terminal else self.active,
            "completed": len(self.records),
            "failed_tasks": self.counts["fatal"],
            "error_tasks": self.counts["error"],
            "warning_tasks": self.counts["warning"],
            "elapsed": round(trio.current_time() - self.started_clock, 3),
        }

    # -- finalize ------------------------------------------------------------

    def run_info(self, status: str, notes: list[str] | None = None) -> dict[str, Any]:
        from .. import __version__

        notes = self.notes if notes is None else notes

        info: dict[str, Any] = {
            "request": unstructure(self.request),
            "status": status,
            "tag": self.tag,
            "started_at": self.started_at,
            "versions": {"agentcompass": __version__, "python": platform.python_version(), "trio": trio.__version__},
        }
        info["prepared"] = self.queued
        if self.queued:
            info["tasks"] = self.total  # selected: what an interrupted run left unfinished is counted from it
        if status != "running":
            info["ended_at"] = time.time()
        if self.error:
            info["error"] = self.error
        if notes:
            info["notes"] = notes
        return info

    async def finalize(self, status: str | None = None, save_deadline: float | None = None) -> None:
        """Write metrics, summary and the terminal status. ``status`` overrides
        the derived one (``timed_out`` or ``cancelled``).

        ``finalized`` is set only once the terminal status is written, so a
        finalize that a deadline or cancellation cut short is done again by
        the caller's cleanup (with the terminal status): no run stays
        ``running``. The count is taken once (``tallied``)."""
        if self.finalized or self.store is None:
            return
        if not self.tallied:
            # Normally nothing is on its way any more (a request drains only
            # then); after a deadline this waits within the caller's grace. A
            # record still queued is a result all the same: the store's close
            # writes it. ``save_deadline`` (shutdown) keeps part of the grace
            # for the writes below: a record that never lands (a hung disk)
            # must not leave the run ``running``.
            with trio.move_on_at(math.inf if save_deadline is None else save_deadline):
                await self.wait_saved()
            self.tallied = True
            for record in self.saving.values():
                self._count(record)
        failure = self.store.failure
        if failure is not None and self.status != "failed":
            self.status = "failed"
            self.error = self.error or failure
            log.error("request_failed", request=self.request.name, error=failure)
        if status is None:
            status = self.status or ("failed" if self.counts["fatal"] else "succeeded")
        self.status = status
        # Tasks that never finished still count: as unavailable (no valid
        # value), so a partial run never reads like a full score. Every
        # selected task without a record, not only those pending or active
        # now: a task cancelled with nothing to clean up may have unwound
        # already, a failed request drops its pending ones.
        finished = {r.task_id for r in self.records} | {r.task_id for r in self.unsaved}
        self.unfinished = {t.task_id: t for t in self.tasks if t.task_id not in finished}
        await self._write_results()
        self.finalized = True
        self.store.event("run_finished", status=status)
        log.info("request_finished", request=self.request.name, status=status, run_dir=str(self.store.run_dir))
        self.close_log()

    def close_log(self) -> None:
        """Detach the run's JSON log from the process-wide logger (idempotent)."""
        if self.store is not None:
            remove_json_log(self.store.run_dir / "log.jsonl")

    async def recount_late(self) -> None:
        """After a deadline or cancellation, once the request's tasks have
        unwound: count the tasks that finished meanwhile (in a cleanup the
        deadline passed during) and write metrics, summary and run info
        again. The caller bounds this by the grace; until then, the results
        written at the deadline stand."""
        await self.wait_saved()
        late, self.late = self.late, []
        if not late:
            return
        for record in late:
            self.unfinished.pop(record.task_id, None)
            self._count(record)
        await self._write_results()

    async def _write_results(self) -> None:
        status = self.status
        assert status is not None
        # Records arrive in completion order; results read in task order.
        self.records.sort(key=lambda r: self.order.get(r.task_id, len(self.order)))
        records = list(self.records)
        # Finished but not on disk: unavailable, like a task that never ran.
        records += [TaskRecord(r.task_id, r.category, [], "normal") for r in self.unsaved]
        notes = list(self.notes)
        if self.unfinished:
            notes.append(
                f"{len(self.unfinished)} of {self.total} task(s) did not finish before the run was {status}; "
                "they count as unavailable (a --reuse run picks them up)"
            )
            records += [TaskRecord(t.task_id, t.category, [], "normal") for t in self.unfinished.values()]
        benchmark = self.benchmark
        metric_names = benchmark.metrics if benchmark is not None else ()
        strategy = self.request.execution.attempts.strategy
        # A finalize cut short by the deadline is done again in the grace:
        # the benchmark's (maybe slow) aggregate is not run twice on the same records.
        key = (len(records), len(self.unsaved), len(self.unfinished))
        cached = self._aggregated
        if cached is not None and cached[0] == key:
            metrics, aggregate_notes = cached[1], cached[2]
        else:
            metrics, aggregate_notes = None, []
            if benchmark is not None:
                try:
                    metrics = benchmark.aggregate_metrics(records)
                except Exception as exc:  # noqa: BLE001 - keep the standard metrics
                    aggregate_notes.append(f"aggregate_metrics failed: {type(exc).__name__}: {exc}".splitlines()[0])
            if metrics is None:
                metrics = compute_metrics(tuple(metric_names), records, strategy)
            self._aggregated = (key, metrics, aggregate_notes)
        notes += aggregate_notes
        self.metrics = metrics
        self.publish_progress(terminal=status in ("timed_out", "cancelled"))
        summary = render_summary(self.request.name, self.store.run_dir, metrics, records, status)
        if self.error:
            summary += f"\n## Request failed\n\n{self.error}\n"
        if notes:
            summary += "\n## Notes\n\n" + "".join(f"- {note}\n" for note in notes)
        # Metrics and summary share a commit round; the terminal status comes
        # only once both are durable.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.store.write_json, "metrics.json", metrics)
            nursery.start_soon(self.store.write_text, "summary.md", summary)
        await self.store.write_run_info(self.run_info(status, notes))

    def release(self) -> None:
        """Drop the per-task state once :meth:`result` was taken.

        The request's scheduler and reporters refer back to it, so without
        this its records would wait for a cyclic collection, which then
        walks all of them (they are acyclic: reference counting frees them
        here at once)."""
        self.records, self.tasks, self.order = [], [], {}
        self.pending.clear()
        self.saving, self.unsaved, self.late, self.unfinished = {}, [], [], {}
        self.reuse = None

    def result(self) -> RequestResult:
        run_dir = str(self.store.run_dir) if self.store is not None else ""
        return RequestResult(self.request.name, run_dir, self.status or "cancelled", self.metrics)  # type: ignore[arg-type]
