"""One attempt: its plan, its tries and runtime retries (SPEC sections 5, 6).

The plan is made once per attempt and reused by every retry. Retries share
one budget of ``max_retries`` extra tries across every stage of the
attempt. What a retry repeats depends on where the retried failure
happened and on the evaluation mode:

* setup, run or collect (any mode), or evaluation in ``reuse`` mode: the
  whole attempt, in a new task Environment (scope ``attempt``);
* evaluation in ``none`` mode: ``evaluate`` only, with the saved prepared
  task and run result (scope ``evaluation``);
* evaluation in ``fresh`` mode: only the evaluation Environment is reopened
  (scope ``evaluation_environment``).

Backoff before the n-th retry: ``base = min(max_delay, min_delay * 2**(n-1))``,
the delay uniform in ``[base/2, base]``. It starts after the try's cleanup,
holds no capacity permit, and is an ordinary cancellable ``trio.sleep``.

A try lost with the executor's worker (SPEC 11) is a FATAL ``worker_lost``
retry of the whole attempt from the same budget: :func:`retry_after_loss`
is the executor's half of that rule, the ``resume`` path of
:func:`run_attempt` the worker's.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import trio

from .._redact import redact
from ..runtime._convert import unstructure
from ..runtime._executor import TaskReporter
from ..runtime._results import AttemptRecord, Issue, Phase, RunResult, derive_status
from ..runtime._values import ExecutionPlan, ExecutionSpec, TaskSpec
from ._context import RequestContext
from ._issues import classify
from ._try import TryOutcome, retryable_issues, run_evaluation_try, run_full_try

__all__ = ["WORKER_LOST", "backoff_delay", "lost_try", "retry_after_loss", "retry_scope", "run_attempt"]

#: The issue code of a try lost with the worker that ran it.
WORKER_LOST = "worker_lost"

_rng = random.Random()


def backoff_delay(n: int, min_delay: float, max_delay: float, rng: random.Random = _rng) -> float:
    """The delay before the ``n``-th retry (1-based) of an attempt."""
    base = min(max_delay, min_delay * 2 ** (n - 1))
    return rng.uniform(0.5 * base, base)


def _honour_retry_after(delay: float, retried: list[tuple[Issue, str | None]], max_delay: float) -> float:
    """A service's ``Retry-After`` raises the delay, never past ``max_delay``."""
    asked = [i.retry_after_seconds for i, _ in retried if i.retry_after_seconds is not None]
    return max(delay, min(max(asked), max_delay)) if asked else delay


def retry_scope(retried: list[Issue], mode: str) -> str:
    """What a retry of these issues repeats (see the module docstring)."""
    if mode == "reuse" or any(issue.phase != "evaluate" for issue in retried):
        return "attempt"
    return "evaluation" if mode == "none" else "evaluation_environment"


def _outcome_from_record(record: AttemptRecord) -> TryOutcome:
    """The outcome of a saved attempt, for an evaluation-only resume."""
    outcome = TryOutcome(prepared=record.prepared, run_result=record.run_result, timings=dict(record.timings))
    for issue in record.issues:
        (outcome.eval_issues if issue.phase == "evaluate" else outcome.task_issues).append(issue)
    return outcome


async def run_attempt(
    ctx: RequestContext, task: TaskSpec, index: int, *, resume: AttemptRecord | None = None
) -> AttemptRecord:
    """Run attempt ``index`` of ``task`` to an evaluated :class:`AttemptRecord`
    (the task scope checkpoints it).

    ``resume`` is a failed attempt from a reused run: it continues with one
    retry of the current budget, evaluation-only when only its evaluation
    failed in ``none`` or ``fresh`` mode (the agent does not run again).
    """
    request = ctx.request
    execution = request.execution
    reporter = ctx.reporter
    try:
        plan = ctx.planner.plan(task, request, index)
    except Exception as exc:
        # A plan that cannot be made is a setup failure of this attempt
        # (deterministic, so not retried), never a crash of the run.
        outcome = TryOutcome()
        outcome.task_issues.append(classify(exc, "prepare_task", "setup", outcome.diagnostics))
        return _record(index, outcome, None, 0)
    # SPEC 5 step 1 (the plan durable in the attempt's directory before its
    # environment opens) is the try's, once it holds its permit: written here,
    # the wait for the disk would reorder the tasks queued for capacity.
    mode = plan.evaluation_environment_mode
    retries = 0
    scope = "attempt"
    previous: TryOutcome | None = None
    try_number = 0
    if resume is not None:
        retries = 1
        if any(issue.code == WORKER_LOST for issue in resume.issues):
            # A try lost with its worker (SPEC 11) continues the attempt's own
            # budget: ``resume.retries`` were used before it, it was one more.
            retries = resume.retries + 1
            try_number = resume.retries + 1
        previous = _outcome_from_record(resume)
        scope = retry_scope([i for i, _ in retryable_issues(resume.issues, ctx.patterns)], mode)
        if scope != "attempt" and (previous.prepared is None or previous.run_result is None):
            scope = "attempt"
    while True:
        try_number += 1
        reporter.event("attempt_started", task=task.task_id, attempt=index, attempt_try=try_number, scope=scope)
        retries_left = retries < execution.max_retries
        if scope == "attempt" or previous is None:
            outcome = await run_full_try(ctx, task, plan, retries_left=retries_left)
        else:
            outcome = await run_evaluation_try(ctx, task, plan, previous, retries_left=retries_left)
        retried = retryable_issues(outcome.issues, ctx.patterns)
        if not retried or not retries_left:
            break
        # No retry once cancelled (the try may have ended in a shielded
        # cleanup, with no checkpoint since): the attempt stays unfinished.
        await trio.lowlevel.checkpoint_if_cancelled()
        retries += 1
        scope = retry_scope([issue for issue, _ in retried], mode)
        delay = backoff_delay(retries, execution.retry_min_delay_seconds, execution.retry_max_delay_seconds)
        delay = _honour_retry_after(delay, retried, execution.retry_max_delay_seconds)
        discarded = _discarded(outcome, plan, retries, scope, retried, delay)
        await _wait_to_retry(reporter, task.task_id, index, try_number, discarded)
        previous = outcome

    record = _record(index, outcome, plan, retries)
    record = await _analyze(ctx, task, record)
    return record


async def _wait_to_retry(
    reporter: TaskReporter, task_id: str, index: int, try_number: int, discarded: dict[str, Any]
) -> None:
    """Save the failed try as discarded (durable before the retry), say so, wait the backoff."""
    retry, scope, delay = discarded["retry_number"], discarded["scope"], discarded["retry_delay_seconds"]
    waited = round(delay, 3)
    await reporter.discarded_try(task_id, index, try_number, discarded)
    reporter.event("attempt_retry", task=task_id, attempt=index, retry=retry, scope=scope, retry_delay_seconds=waited)
    reporter.event("retry_wait", task=task_id, attempt=index, retry=retry, retry_delay_seconds=waited)
    await trio.sleep(delay)


def lost_try(
    task_id: str, index: int, try_number: int, stage: Phase, worker: str, resumed: AttemptRecord | None
) -> AttemptRecord:
    """The FATAL ``worker_lost`` record of attempt ``index`` of ``task_id``,
    whose try ``try_number`` was lost in ``stage`` with ``worker`` (a name).
    Its ``retries`` are those the attempt had used before the lost try
    (``resumed``: the record the try resumed from, a reuse run's failed
    attempt starting with one retry used)."""
    retries = try_number - 1
    if resumed is not None and not any(issue.code == WORKER_LOST for issue in resumed.issues):
        retries += 1
    issue = Issue("fatal", stage, WORKER_LOST, f"{worker} was lost while it ran attempt {index} of task {task_id!r}")
    return AttemptRecord(
        attempt=index, status=derive_status([issue]), values={}, issues=[issue], plan=None, retries=retries
    )


async def retry_after_loss(
    execution: ExecutionSpec, reporter: TaskReporter, task_id: str, try_number: int, lost: AttemptRecord
) -> bool:
    """Whether the attempt of lost try ``try_number`` (its record: :func:`lost_try`) runs again.
    False: its retry budget is spent and ``lost`` is its record. True: the
    lost try was saved as discarded and the backoff waited, as for any
    retry of the whole attempt; the executor then runs the attempt again
    with ``lost`` as its ``resume`` record (see :func:`run_attempt`)."""
    if lost.retries >= execution.max_retries:
        return False
    retry = lost.retries + 1
    delay = backoff_delay(retry, execution.retry_min_delay_seconds, execution.retry_max_delay_seconds)
    discarded = {
        "retry_number": retry,
        "stage": lost.issues[0].phase,
        "scope": "attempt",
        "matched_pattern": None,
        "retry_delay_seconds": delay,
        "issues": unstructure(lost.issues),
        "diagnostics": [],
        "plan": None,
        "timings": {},
    }
    await _wait_to_retry(reporter, task_id, lost.attempt, try_number, discarded)
    return True


def _run_result_with_diagnostics(outcome: TryOutcome) -> RunResult | None:
    result = outcome.run_result
    if not outcome.diagnostics and not outcome.logs:
        return result
    result = result or RunResult()
    artifacts = dict(result.artifacts)
    if outcome.diagnostics:
        artifacts["execution_diagnostics"] = list(artifacts.get("execution_diagnostics", [])) + outcome.diagnostics
    if outcome.logs:  # the Environment's own (build.log), beside what the benchmark kept
        artifacts["logs"] = {**outcome.logs, **(artifacts.get("logs") or {})}
    return RunResult(result.output, result.trajectory, result.usage, artifacts, result.issues, result.timings)


def _record(index: int, outcome: TryOutcome, plan: ExecutionPlan | None, retries: int) -> AttemptRecord:
    issues = outcome.issues
    return AttemptRecord(
        attempt=index,
        status=derive_status(issues),
        values=outcome.values,
        issues=issues,
        run_result=_run_result_with_diagnostics(outcome),
        plan=plan,
        retries=retries,
        timings=outcome.rounded_timings(),
        prepared=outcome.prepared,
    )


def _discarded(
    outcome: TryOutcome,
    plan: ExecutionPlan,
    retry_number: int,
    scope: str,
    retried: list[tuple[Issue, str | None]],
    delay: float,
) -> dict[str, Any]:
    """The saved form of a discarded try (kept outside the countable results)."""
    first, pattern = retried[0]
    return {
        "retry_number": retry_number,
        "stage": first.phase,
        "scope": scope,
        "matched_pattern": pattern,
        "retry_delay_seconds": delay,
        "issues": unstructure(outcome.issues),
        "diagnostics": outcome.diagnostics,
        "plan": unstructure(plan),
        "timings": outcome.rounded_timings(),
    }


async def _analyze(ctx: RequestContext, task: TaskSpec, record: AttemptRecord) -> AttemptRecord:
    """Run enabled analyzers; a failure is recorded in ``analysis`` only."""
    if not ctx.analyzers:
        return record
    analysis: dict[str, Any] = {}
    for analyzer in ctx.analyzers:
        try:
            if not analyzer.applies_to(ctx.request, task):
                continue
            analysis[analyzer.id] = await analyzer.analyze(task, record)
        except Exception as exc:
            analysis[analyzer.id] = {"analyzer_failed": redact(f"{type(exc).__name__}: {exc}".splitlines()[0])}
    return attrs.evolve(record, analysis=analysis)
