"""One task: its ``k`` attempts and the attempt strategy (SPEC section 6).

``avg`` runs every attempt; ``pass`` stops after the first valid success of
the primary metric (``True``, or a number >= 1). A FATAL left after
retries invalidates the whole task, so the remaining attempts are not run:
they could not change the outcome and would only spend sandboxes (a reuse
run with retry budget picks the task up again).
"""

from __future__ import annotations

import trio

from .._observations import is_success
from ..runtime._results import AttemptRecord, TaskRecord, worst_severity
from ..runtime._values import TaskSpec
from ._attempt import run_attempt
from ._context import RequestContext

__all__ = ["run_task", "task_record"]


def _settled(records: dict[int, AttemptRecord], strategy: str, primary: str) -> bool:
    for record in records.values():
        if record.severity == "fatal":
            return True
        if strategy == "pass" and is_success(record.values.get(primary)):
            return True
    return False


async def run_task(
    ctx: RequestContext,
    task: TaskSpec,
    attempts: list[int],
    done: dict[int, AttemptRecord] | None = None,
    resume: dict[int, AttemptRecord] | None = None,
) -> TaskRecord:
    """Run the missing ``attempts`` of ``task``; ``done`` are final already."""
    records = dict(done or {})
    resume = resume or {}
    strategy = ctx.request.execution.attempts.strategy
    primary = ctx.benchmark.metrics[0]
    todo = sorted(attempts)
    for position, index in enumerate(todo):
        if _settled(records, strategy, primary):
            break
        if position:
            # An attempt can end without a checkpoint after its last
            # shielded cleanup (a sandbox close the deadline passed during):
            # its result is kept, but no new attempt starts once cancelled.
            await trio.lowlevel.checkpoint_if_cancelled()
        records[index] = await run_attempt(ctx, task, index, resume=resume.get(index))
        # Checkpoint every evaluated attempt the task record does not make
        # durable right away: the last one to run goes straight into the
        # record. The driver reports an attempt finished once its checkpoint
        # or the record holding it is durable ("finished" events always
        # follow durability); the next attempt need not wait for the disk.
        if position < len(todo) - 1 and not _settled(records, strategy, primary):
            await ctx.reporter.checkpoint(task.task_id, records[index])
    return task_record(task, records)


def task_record(task: TaskSpec, records: dict[int, AttemptRecord]) -> TaskRecord:
    """The record of ``task`` with these attempts, its severity the worst of their issues."""
    ordered = [records[i] for i in sorted(records)]
    issues = [issue for record in ordered for issue in record.issues]
    return TaskRecord(task.task_id, task.category, ordered, worst_severity(issues))
