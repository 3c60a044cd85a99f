"""Reuse of an earlier run of the same request (SPEC section 8, ``--reuse``).

For each selected task, the earlier run's countable record or attempt
checkpoints decide what runs again:

* a record with no FATAL and no ERROR matching the current retry patterns
  is copied unchanged;
* with ``max_retries: 0``, failed records are copied unchanged too;
* with ``max_retries > 0``, each retryable attempt runs again as one retry
  of the current budget (evaluation-only in ``none`` / ``fresh`` mode when
  only its evaluation failed); its other attempts are kept;
* checkpoints of an interrupted task keep their attempts; only the missing
  attempts run;
* attempts missing from a record (``k`` grew, or a FATAL stopped the task
  early) run.

Before anything runs, every Environment session the earlier run opened and
never closed is reaped. A source run of another benchmark is not reused
(everything runs, and ``run_info.json`` says why); tasks of the source that
are no longer selected are ignored and counted in a note.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import _registry
from .._store import latest_run, load_run
from ..runtime._results import AttemptRecord, TaskRecord
from ..runtime._values import TaskSpec

if TYPE_CHECKING:
    from ._request import RequestRun

__all__ = ["PendingTask", "ReusePlan", "plan_reuse", "reap_sessions"]


@attrs.frozen
class PendingTask:
    """A task waiting for a worker. Kept small: no coroutine, no component."""

    task: TaskSpec
    attempts: tuple[int, ...] | None = None  # None: all k attempts
    done: dict[int, AttemptRecord] | None = None
    resume: dict[int, AttemptRecord] | None = None


@attrs.define
class ReusePlan:
    pending: list[PendingTask]
    reused: list[TaskRecord] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)
    source: Path | None = None


def _retryable(record: AttemptRecord, patterns: list[re.Pattern[str]]) -> bool:
    for issue in record.issues:
        if issue.severity == "fatal":
            return True
        if issue.severity == "error" and any(p.search(issue.message) or p.search(issue.code) for p in patterns):
            return True
    return False


async def reap_sessions(open_sessions: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Reap sessions left open by a killed run; returns notes on failures."""
    notes = []
    for session_id, provider, handle in open_sessions:
        try:
            env = _registry.build("environment", provider, {})
            await env.reap(handle)
        except Exception as exc:  # noqa: BLE001 - one failed reap must not stop the others
            notes.append(f"reap of session {session_id} ({provider}) failed: {type(exc).__name__}: {exc}")
    return notes


async def plan_reuse(run: RequestRun, tasks: list[TaskSpec]) -> ReusePlan:
    request = run.request
    if request.reuse is False:
        return ReusePlan([PendingTask(task) for task in tasks])
    if isinstance(request.reuse, Path):
        source: Path | None = request.reuse
    else:
        source = await trio.to_thread.run_sync(latest_run, request.output_root, request.name, run.store.run_dir)
    if source is None or not await trio.Path(source).is_dir():
        note = f"reuse: no earlier run of {request.name!r} found; running everything"
        return ReusePlan([PendingTask(task) for task in tasks], notes=[note])
    loaded = await trio.to_thread.run_sync(load_run, source)
    plan = ReusePlan([], source=source, notes=[f"reuse: from {source}"] + list(loaded.notes))
    plan.notes.extend(await reap_sessions(loaded.open_sessions))
    if loaded.open_sessions:
        plan.notes.append(f"reuse: reaped {len(loaded.open_sessions)} session(s) left open by the earlier run")

    old_request = loaded.run_info.get("request", {}) if isinstance(loaded.run_info, dict) else {}
    old_benchmark = (old_request.get("benchmark") or {}).get("id")
    if old_benchmark is not None and old_benchmark != request.benchmark.id:
        plan.notes.append(
            f"reuse: {source} ran benchmark {old_benchmark!r}, not {request.benchmark.id!r}; nothing reused"
        )
        plan.pending = [PendingTask(task) for task in tasks]
        return plan

    execution = request.execution
    k = execution.attempts.k
    primary = run.benchmark.metrics[0] if run.benchmark is not None else ""
    patterns = [re.compile(p) for p in (execution.retry_pattern_list or [])]
    selected = {task.task_id for task in tasks}
    ignored = sum(1 for task_id in loaded.details if task_id not in selected)
    if ignored:
        plan.notes.append(f"reuse: {ignored} task(s) of {source} are not selected now and were ignored")
    for task in tasks:
        record = loaded.details.get(task.task_id)
        previous = {r.attempt: r for r in record.attempts} if record is not None else {}
        previous.update(loaded.checkpoints.get(task.task_id, {}))
        previous = {i: r for i, r in previous.items() if i < k}
        if not previous:
            plan.pending.append(PendingTask(task))
            continue
        done: dict[int, AttemptRecord] = {}
        resume: dict[int, AttemptRecord] = {}
        for index, attempt in previous.items():
            if execution.max_retries > 0 and _retryable(attempt, patterns):
                resume[index] = attempt
            else:
                done[index] = attempt
        missing = [i for i in range(k) if i not in previous]
        if record is not None and not resume and (not missing or _finished(record, execution.attempts.strategy, primary)):
            kept = [done[i] for i in sorted(done)]
            plan.reused.append(attrs.evolve(record, attempts=kept))
            continue
        plan.pending.append(PendingTask(task, tuple(sorted(missing + list(resume))), done, resume))
    # Reused records are copied into the new run before anything runs; they
    # are queued together so that they share commit rounds.
    await run.store.save_tasks(plan.reused)
    return plan


def _finished(record: TaskRecord, strategy: str, primary: str) -> bool:
    """True when the earlier record already settled the task (a FATAL stop,
    or a ``pass`` success), so its missing attempts need not run."""
    from ._task import is_success

    if record.severity == "fatal":
        return True
    return strategy == "pass" and any(is_success(a.values.get(primary)) for a in record.attempts)
