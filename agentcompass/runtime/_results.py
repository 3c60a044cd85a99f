"""Outcome-side values: what components return and what the runtime records."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ._values import ExecutionPlan, Limits, PreparedTask

__all__ = [
    "AttemptRecord",
    "Evaluation",
    "ExecResult",
    "Issue",
    "OrchestrationResult",
    "RequestResult",
    "RunBudget",
    "RunResult",
    "TaskRecord",
]

Severity = Literal["fatal", "error", "warning"]
Phase = Literal["setup", "run", "collect", "evaluate", "cleanup"]
AttemptStatus = Literal["completed", "run_error", "eval_error", "run_error_or_eval_error"]
TaskSeverity = Literal["fatal", "error", "normal"]

SEVERITY_RANK = {"warning": 0, "error": 1, "fatal": 2}


@attrs.frozen
class Issue:
    """One classified problem. ``message`` is a single redacted line; the
    traceback, if any, lives in the attempt's ``artifacts.execution_diagnostics``.

    ``retry_after_seconds`` is a delay the failing service asked for (a
    model's ``Retry-After``): a retry of this issue waits at least that long,
    within ``retry_max_delay_seconds``. It is left out of JSON when ``None``.
    """

    severity: Severity
    phase: Phase
    code: str
    message: str = ""
    retry_after_seconds: float | None = None

    @property
    def is_failure(self) -> bool:
        """FATAL and ERROR are failures; a WARNING is diagnostic only."""
        return self.severity != "warning"


@attrs.frozen
class ExecResult:
    """What one ``EnvironmentSession.exec`` returned."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


@attrs.frozen
class RunBudget:
    """The agent's budget for ``run_task``; ``None`` means unbounded.

    ``timeout_seconds``: a harness enforces it itself and reports ERROR
    ``harness_timeout``; the runtime only stops a run that overruns it by the
    compensation margin. ``deadline``: the same end as Unix seconds (wall
    clock), which every program the harness runs for the agent gets as
    ``AGENTCOMPASS_DEADLINE`` (:meth:`environment`). ``limits``: the
    attempt's budgets (``ExecutionSpec.limits``); the runtime's model client
    and the model gateway enforce them, and a harness passes them on to an
    agent that has a switch of its own for one (turns, cost).
    """

    timeout_seconds: float | None = None
    limits: Limits = Limits()
    deadline: float | None = None

    def environment(self) -> dict[str, str]:
        """``{"AGENTCOMPASS_DEADLINE": "<Unix seconds>"}``, or ``{}`` with no deadline."""
        return {} if self.deadline is None else {"AGENTCOMPASS_DEADLINE": f"{self.deadline:.0f}"}


@attrs.frozen
class RunResult:
    """What a run (harness or harness-free benchmark) produced."""

    output: Any = None
    trajectory: list[Any] = attrs.Factory(list)
    usage: dict[str, Any] = attrs.Factory(dict)
    artifacts: dict[str, Any] = attrs.Factory(dict)
    issues: list[Issue] = attrs.Factory(list)
    timings: dict[str, float] = attrs.Factory(dict)


@attrs.frozen
class Evaluation:
    """What ``Benchmark.evaluate`` returns: one value per metric series."""

    values: dict[str, float | bool | None] = attrs.Factory(dict)
    issues: list[Issue] = attrs.Factory(list)


@attrs.frozen
class AttemptRecord:
    """One evaluated attempt. ``status`` is derived from ``issues`` (SPEC 6).

    ``prepared`` keeps the prepared task so that an attempt whose evaluation
    failed in ``none`` or ``fresh`` mode can be evaluated again on reuse
    without running the agent again.
    """

    attempt: int
    status: AttemptStatus
    values: dict[str, float | bool | None] = attrs.Factory(dict)
    issues: list[Issue] = attrs.Factory(list)
    run_result: RunResult | None = None
    plan: ExecutionPlan | None = None
    analysis: dict[str, Any] = attrs.Factory(dict)
    retries: int = 0
    timings: dict[str, float] = attrs.Factory(dict)
    prepared: PreparedTask | None = None

    @property
    def severity(self) -> TaskSeverity:
        return worst_severity(self.issues)


@attrs.frozen
class TaskRecord:
    """The countable result of one task: all its attempts and the worst severity."""

    task_id: str
    category: str | None
    attempts: list[AttemptRecord]
    severity: TaskSeverity


@attrs.frozen
class RequestResult:
    """How one request ended and where its files are."""

    name: str
    run_dir: str
    status: Literal["succeeded", "failed", "timed_out", "cancelled"]
    metrics: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen
class OrchestrationResult:
    """How one ``launch`` ended; ``exit_code`` is what ``compass launch`` exits with."""

    status: Literal["succeeded", "partial_failure", "failed", "timed_out", "cancelled"]
    requests: list[RequestResult]
    exit_code: int


def worst_severity(issues: list[Issue]) -> TaskSeverity:
    """``fatal`` if any FATAL, else ``error`` if any ERROR, else ``normal``."""
    worst = "normal"
    for issue in issues:
        if issue.severity == "fatal":
            return "fatal"
        if issue.severity == "error":
            worst = "error"
    return worst  # type: ignore[return-value]


def derive_status(issues: list[Issue]) -> AttemptStatus:
    """SPEC 6: failures in setup/run/collect give ``run_error``, in evaluate
    ``eval_error``, in both ``run_error_or_eval_error``; warnings only ``completed``."""
    run = evaluate = False
    for issue in issues:
        if not issue.is_failure:
            continue
        if issue.phase == "evaluate":
            evaluate = True
        elif issue.phase != "cleanup":
            run = True
    if run and evaluate:
        return "run_error_or_eval_error"
    if run:
        return "run_error"
    if evaluate:
        return "eval_error"
    return "completed"
