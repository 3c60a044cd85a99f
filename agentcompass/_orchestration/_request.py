"""The request scope: task loading and selection, reuse, a nursery in which
the request's tasks run, their records, and finalize (metrics, summary,
terminal status).

:func:`request_scope` is the scope itself, one task per request. Its run
directory's store is opened by ``launch`` (outside the deadline); the scope
prepares the request, opens the nursery the dispatcher starts its tasks in,
waits until every task it was given has finished, and finalizes. After the
deadline or a cancellation it writes the terminal status at once, while its
tasks unwind, and counts again the tasks that finished in their cleanup.

A request's state (:class:`RequestRun`) is four pieces, each with one job:
:class:`Life` is where it is (a :class:`Stage`, every step checked);
:class:`Prepared` is what preparation decided; :class:`Tasks` follows its
tasks from queued to settled; :class:`Tally` holds its results so far.

One task's life here (``_task_life.run_task``): the dispatcher starts
it holding a concurrency slot; it runs its attempts, gives the slot back,
waits for its checkpoints to land, awaits its record's durability (the
dispatcher starts no task of a request with too many records on their way:
a slow disk makes it wait, not memory grow), and is counted.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import _registry
from .._logging import add_json_log, get_logger, remove_json_log
from .._progress import task_budget
from .._report import render_summary
from .._store import Disk, compute_metrics
from .._store._run_store import new_run_tag
from ..runtime._components import BaseBenchmark
from ..runtime._convert import unstructure
from ..runtime._errors import ComponentError, ConfigError
from ..runtime._executor import Executor, Grants
from ..runtime._results import RequestResult, TaskRecord
from ..runtime._values import RunRequest, TaskSpec
from ._context import GraceClock, Slots
from ._request_state import Life, Prepared, Stage, Tally, Tasks
from ._reuse import PendingTask, plan_reuse
from ._task_ids import check_task_ids
from ._task_life import Reporter, failure_line, run_task

__all__ = ["PendingTask", "Reporter", "RequestRun", "failure_line", "request_scope"]

log = get_logger("agentcompass.request")


@attrs.define(eq=False)
class RequestRun:
    """Driver-side state of one request of an orchestration: what it is
    (``request``, its run directory's ``store``, the ``tag`` its sessions are
    named by) and the four pieces that change while it runs: ``life``,
    ``prepared`` (None until preparation succeeded), ``tasks``, ``tally``."""

    request: RunRequest
    grace: GraceClock
    #: What the run store writes through and reuse reads through (None: the store's default).
    disk: Disk | None = None
    store: Any = None
    #: Prefix of every Environment session name of this run (``run_info.json`` "tag").
    tag: str = attrs.Factory(new_run_tag)
    #: Wall-clock and Trio time it started (``run_info.json``, progress).
    started_at: float = 0.0
    started_clock: float = 0.0
    benchmark: BaseBenchmark | None = None
    life: Life = attrs.Factory(Life)
    prepared: Prepared | None = None
    tasks: Tasks = attrs.Factory(Tasks)
    tally: Tally = attrs.Factory(Tally)

    @property
    def total(self) -> int:
        """The selected tasks (0 until preparation succeeded)."""
        return len(self.prepared.tasks) if self.prepared is not None else 0

    # -- preparation ---------------------------------------------------------

    def begin(self) -> None:
        """The request starts (to prepare, or to be finalized unstarted)."""
        self.started_at = time.time()
        self.started_clock = trio.current_time()

    async def prepare(self) -> list[PendingTask]:
        """Start the run, load and select tasks, decide reuse; returns the
        tasks to run. A benchmark's failure here fails the request (status
        ``failed``), not the run."""
        request, store = self.request, self.store
        self.life.advance(Stage.PREPARING)
        self.begin()
        add_json_log(Path(store.layout.log), request=request.name)
        await store.write_run_info(self.run_info("running"))
        store.event("run_started", request=request.name, run_dir=str(store.run_dir))
        try:
            self.benchmark = _registry.build("benchmark", request.benchmark.id, request.benchmark.config)
            tasks = list(await self.benchmark.load_tasks(request))
            check_task_ids(tasks, f"benchmark {request.benchmark.id!r}")
            tasks = self.benchmark.select_tasks(tasks, request)
            seen: set[str] = set()
            for task in tasks:
                if not isinstance(task, TaskSpec):
                    raise ComponentError(
                        f"benchmark {request.benchmark.id!r}: select_tasks() must return TaskSpec values"
                    )
                if task.task_id in seen:
                    raise ComponentError(
                        f"benchmark {request.benchmark.id!r}: select_tasks() repeated task id {task.task_id!r}"
                    )
                seen.add(task.task_id)
            primary = self.benchmark.metrics[0] if self.benchmark.metrics else ""
            reuse = await plan_reuse(request, primary, store, tasks, self.disk)
        except Exception as exc:  # noqa: BLE001 - the request fails, the orchestration goes on
            self.tally.config_error = isinstance(exc, ConfigError)
            self.fail_with(f"{type(exc).__name__}: {exc}".splitlines()[0], note=False)
            return []
        self.prepared = Prepared.of(tasks, reuse.reused)
        self.tally.notes.extend(reuse.notes)
        # Durable before any task can start: a run whose run_info.json does
        # not say "prepared" ran nothing (and may hold only part of what it
        # copied from a reuse source), so a later reuse skips it (_reuse).
        await store.write_run_info(self.run_info("running"))
        for record in self.prepared.reused:
            self.tally.count(record)
        return reuse.pending

    def queue(self, pending: list[PendingTask]) -> None:
        """Hand ``pending`` to the dispatcher (in the request's nursery)."""
        self.tasks.pending.extend(pending)
        self.life.advance(Stage.RUNNING)
        if not pending:
            self.life.advance(Stage.DISPATCHED)

    def fail(self, exc: BaseException, where: str) -> None:
        """An error no row of SPEC section 6 classifies (a full disk, a
        provider rejecting a resumed attempt's plan) fails this request, and
        only it: status ``failed``, the error in ``run_info.json`` and on the
        console as one line. Its other tasks still run: their results may
        well be sound (a task that cannot be written counts as unavailable)."""
        self.fail_with(f"{where}: {failure_line(exc)}")

    def fail_with(self, line: str, *, note: bool = True) -> None:
        """:meth:`fail` with the error already made one line. Only the first
        failure goes to the console; the others are in the notes."""
        if self.tally.fail(line, note=note):
            log.error("request_failed", request=self.request.name, error=line)

    def drop_pending(self) -> None:
        """No more tasks of this request start (it is finishing or stopped)."""
        self.tasks.pending.clear()
        if self.life.stage < Stage.DISPATCHED:
            self.life.advance(Stage.DISPATCHED)

    # -- tasks -----------------------------------------------------------------

    def start_next(self, slots: Slots, executor: Executor, grants: Grants) -> None:
        """Start the next pending task in this request's nursery, holding one
        of ``slots`` (the dispatcher's call)."""
        tasks = self.tasks
        pending = tasks.pending.popleft()
        if not tasks.pending:
            self.life.advance(Stage.DISPATCHED)
        k = self.request.execution.attempts.k
        attempts = list(range(k)) if pending.attempts is None else list(pending.attempts)
        self.store.event("task_started", task=pending.task.task_id, attempts=attempts)
        assert tasks.nursery is not None
        landing = tasks.start(pending.task.task_id, task_budget(self.request, pending.task))
        tasks.nursery.start_soon(run_task, self, pending, attempts, landing, slots, executor, grants)

    async def until_done(self) -> None:
        """Until every task was handed out, has run and has its record saved."""
        await self.life.reached(Stage.DISPATCHED)
        await self.tasks.until_settled()

    # -- progress ----------------------------------------------------------------

    def publish_progress(self, *, terminal: bool = False) -> None:
        """Queue the progress snapshot. After a deadline or cancellation
        (``terminal``) nothing runs any more: every unfinished task counts as
        pending, none as active, whatever is still unwinding."""
        if self.store is None or self.store.closed:
            return
        if terminal:
            self.store.set_progress(self.snapshot(terminal=True))
        else:
            # Built when the store writes it (at most every half second).
            self.store.set_progress(self.snapshot)

    def snapshot(self, *, terminal: bool = False) -> dict[str, Any]:
        tasks, tally = self.tasks, self.tally
        unfinished = len(tally.unfinished) if self.life.tallied else len(tasks.pending) + tasks.active
        return {
            "total": self.total,
            "pending": unfinished if terminal else len(tasks.pending),
            "active": 0 if terminal else tasks.active,
            "completed": len(tally.records),
            "failed_tasks": tally.counts["fatal"],
            "error_tasks": tally.counts["error"],
            "warning_tasks": tally.counts["warning"],
            "elapsed": round(trio.current_time() - self.started_clock, 3),
        }

    # -- finalize ------------------------------------------------------------

    def run_info(self, status: str, notes: list[str] | None = None) -> dict[str, Any]:
        from .. import __version__

        notes = self.tally.notes if notes is None else notes

        info: dict[str, Any] = {
            "request": unstructure(self.request),
            "status": status,
            "tag": self.tag,
            "started_at": self.started_at,
            "versions": {"agentcompass": __version__, "python": platform.python_version(), "trio": trio.__version__},
        }
        info["prepared"] = self.prepared is not None
        # Datasets (SPEC 12): the registry, name@version and resolved commits the tasks came from.
        source = self.benchmark.task_source() if self.benchmark is not None and self.prepared is not None else None
        if source:
            info["task_source"] = source
        if self.prepared is not None:
            info["tasks"] = self.total  # selected: what an interrupted run left unfinished is counted from it
        if status != "running":
            info["ended_at"] = time.time()
        if self.tally.error:
            info["error"] = self.tally.error
        if notes:
            info["notes"] = notes
        return info

    async def finalize(self, status: str | None = None) -> None:
        """Write metrics, summary and the terminal status. ``status`` overrides
        the derived one (``timed_out`` or ``cancelled``); no task of the
        request starts any more.

        The request is FINALIZED only once the terminal status is written,
        so a finalize that a deadline or cancellation cut short is done again
        by the caller's cleanup (with the terminal status): no run stays
        ``running``. The count is taken once (TALLIED)."""
        if self.life.stage is Stage.FINALIZED or self.store is None:
            return
        tally = self.tally
        self.drop_pending()
        if not self.life.tallied:
            if status is not None:
                # Shutdown: records on their way get half of what is left of
                # the grace; one that never lands (a hung disk) must not leave
                # the run ``running``. It is a result all the same: counted.
                limit = self.grace.deadline()
                now = trio.current_time()
                with trio.move_on_at(now + (limit - now) / 2):
                    await self.tasks.until_saved()
            self.life.advance(Stage.TALLIED)
            for record in self.tasks.saving.values():
                tally.count(record)
        failure = self.store.failure
        if failure is not None and tally.status != "failed":
            self.fail_with(failure, note=False)
        if status is None:
            status = tally.status or ("failed" if tally.counts["fatal"] else "succeeded")
        tally.finish(status, self.prepared.tasks if self.prepared is not None else ())
        await self._write_results()
        self.life.advance(Stage.FINALIZED)
        self.store.event("run_finished", status=status)
        log.info("request_finished", request=self.request.name, status=status, run_dir=str(self.store.run_dir))
        self.close_log()

    def close_log(self) -> None:
        """Detach the run's JSON log from the process-wide logger (idempotent)."""
        if self.store is not None:
            remove_json_log(Path(self.store.layout.log))

    async def recount_late(self) -> None:
        """After a deadline or cancellation, once the request's tasks have
        unwound: count the tasks that finished meanwhile (in a cleanup the
        deadline passed during) and write metrics, summary and run info
        again. The caller bounds this by the grace; until then, the results
        written at the deadline stand."""
        if self.tally.recount_late(finalized=self.life.stage is Stage.FINALIZED):
            await self._write_results()

    async def _write_results(self) -> None:
        tally = self.tally
        status = tally.status
        assert status is not None
        # Records arrive in completion order; results read in task order.
        order = self.prepared.order if self.prepared is not None else {}
        tally.records.sort(key=lambda r: order.get(r.task_id, len(order)))
        records = list(tally.records)
        # Finished but not on disk: unavailable, like a task that never ran.
        records += [TaskRecord(r.task_id, r.category, [], "normal") for r in tally.unsaved]
        notes = list(tally.notes)
        if tally.unfinished:
            notes.append(
                f"{len(tally.unfinished)} of {self.total} task(s) did not finish before the run was {status}; "
                "they count as unavailable (a --reuse run picks them up)"
            )
            records += [TaskRecord(t.task_id, t.category, [], "normal") for t in tally.unfinished.values()]
        benchmark = self.benchmark
        metric_names = benchmark.metrics if benchmark is not None else ()
        strategy = self.request.execution.attempts.strategy
        # A finalize cut short by the deadline is done again in the grace:
        # the benchmark's (maybe slow) aggregate is not run twice on the same records.
        key = (len(records), len(tally.unsaved), len(tally.unfinished))
        cached = tally.aggregated
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
            tally.aggregated = (key, metrics, aggregate_notes)
        notes += aggregate_notes
        tally.metrics = metrics
        self.publish_progress(terminal=status in ("timed_out", "cancelled"))
        summary = render_summary(self.request.name, self.store.run_dir, metrics, records, status)
        if tally.error:
            summary += f"\n## Request failed\n\n{tally.error}\n"
        if notes:
            summary += "\n## Notes\n\n" + "".join(f"- {note}\n" for note in notes)
        # Metrics and summary share a commit round; the terminal status comes
        # only once both are durable.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.store.write_metrics, metrics)
            nursery.start_soon(self.store.write_summary, summary)
        await self.store.write_run_info(self.run_info(status, notes))

    def release(self) -> None:
        """Drop the per-task state once :meth:`result` was taken, so that the
        records are freed by reference counting, not by a cyclic collection
        walking all of them."""
        self.prepared = None
        self.tasks = Tasks()
        self.tally.forget_records()

    def result(self) -> RequestResult:
        run_dir = str(self.store.run_dir) if self.store is not None else ""
        status = self.tally.status or "cancelled"
        return RequestResult(self.request.name, run_dir, status, self.tally.metrics)  # type: ignore[arg-type]


async def request_scope(
    run: RequestRun,
    earlier: list[RequestRun],
    terminal_status: Callable[[], str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The request scope (SPEC 2): prepare, hold the nursery the dispatcher
    starts this request's tasks in until they are done, finalize once every
    ``earlier`` request handed out its tasks. Reports started once its tasks
    are queued. An error no row of SPEC 6 classifies fails this request only;
    after the deadline or a cancellation the terminal state is written at
    once, and again once the tasks unwound if some finished meanwhile."""
    if run.store is None:  # no run directory (``launch`` failed the request)
        run.drop_pending()
        task_status.started()
        return
    try:
        try:
            pending = await run.prepare()
        except Exception as exc:  # noqa: BLE001 - unclassified: fails this request only (SPEC 7)
            run.fail(exc, "request")
            pending = []
        async with trio.open_nursery() as nursery:
            run.tasks.nursery, run.tasks.reporter = nursery, Reporter(run)
            run.queue(pending)
            run.publish_progress()
            task_status.started()
            try:
                await run.until_done()
            except BaseException:
                # Freeze the terminal state now, while the tasks unwind.
                await _stop(run, terminal_status())
                raise
        for other in earlier:
            await other.life.reached(Stage.DISPATCHED)
        await run.finalize()
    except Exception as exc:  # noqa: BLE001 - unclassified: fails this request only (SPEC 7)
        run.fail(exc, "request")
        try:
            await run.finalize("failed")
        except Exception as again:  # noqa: BLE001 - the request has failed already
            # The request_failed line said why; this goes to the run's log only.
            log.info("request_not_finalized", request=run.request.name, error=failure_line(again))
    except BaseException:
        await _stop(run, terminal_status())
        with trio.move_on_at(run.grace.deadline(), shield=True):
            await run.recount_late()
        raise
    finally:
        run.drop_pending()
        run.close_log()


async def _stop(run: RequestRun, status: str) -> None:
    """Write the terminal state after a deadline or cancellation, within the grace."""
    with trio.move_on_at(run.grace.deadline(), shield=True):
        try:
            await run.finalize(status)
        except Exception as exc:  # noqa: BLE001 - the cancellation is what propagates
            run.fail(exc, "finalize")
