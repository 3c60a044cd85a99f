"""A try's state and how it takes one step: a component call whose
exception becomes an Issue (and stops the stage), its timing and its trace.
The stages themselves are ``_try``'s."""

from __future__ import annotations

import math
from typing import Any

from .._logging import debug_enabled, get_logger
from ..runtime._errors import ComponentError
from ..runtime._results import Issue, Phase
from ..runtime._values import ExecutionPlan, TaskSpec
from ._context import RequestContext
from ._issues import classify, redact_issue
from ._try_outcome import TryOutcome, retryable_issues

__all__ = ["Stop", "TrySteps"]

log = get_logger("agentcompass.attempt")


class Stop(Exception):
    """The try cannot usefully continue (the issue is recorded)."""


class TrySteps:
    """One try's state (its outcome so far, its deadlines) and its steps."""

    def __init__(self, ctx: RequestContext, task: TaskSpec, plan: ExecutionPlan, retries_left: bool):
        self.ctx = ctx
        self.task = task
        self.plan = plan
        self.retries_left = retries_left
        self.out = TryOutcome()
        self.grace = ctx.grace
        # The run's clock, read directly: several readings per attempt.
        self.now = ctx.now
        self.setup_deadline = math.inf
        self.harness_session: Any = None
        self.collected = False

    # -- helpers -----------------------------------------------------------

    def _enter(self, stage: Phase) -> None:
        on_stage = self.ctx.on_stage
        if on_stage is not None:
            on_stage(self.task.task_id, self.plan.attempt, stage)

    def _add(self, issues: list[Issue], new: list[Issue]) -> None:
        if new:
            issues.extend(redact_issue(i) for i in new)

    def _should_stop(self, issues: list[Issue]) -> bool:
        if not issues:
            return False
        if any(i.severity == "fatal" for i in issues):
            return True
        return self.retries_left and bool(retryable_issues(issues, self.ctx.patterns))

    async def _step(self, issues: list[Issue], where: str, phase: Phase, fn: Any, *args: Any) -> Any:
        """Await one component call; an exception becomes an Issue and stops the stage."""
        try:
            return await fn(*args)
        except Exception as exc:
            issues.append(classify(exc, where, phase, self.out.diagnostics))
            raise Stop from None

    def _check(self, value: Any, kind: type, what: str, issues: list[Issue], where: str, phase: Phase) -> Any:
        if not isinstance(value, kind):
            exc = ComponentError(f"{what} returned {type(value).__name__}, expected {kind.__name__}")
            issues.append(classify(exc, where, phase, self.out.diagnostics))
            raise Stop
        return value

    def _mark(self, name: str, start: float) -> None:
        # Rounded once, when the record is made (TryOutcome.rounded_timings).
        timings = self.out.timings
        timings[name] = timings.get(name, 0.0) + self.now() - start
        if name != "setup" and debug_enabled():
            self._trace(name, start)

    def _trace(self, step: str, start: float, **extra: Any) -> None:
        """The attempt lifecycle at debug level (``--log-level debug``; ``log.jsonl`` too)."""
        log.debug(
            f"attempt_{step}",
            request=self.ctx.request.name,
            task_id=self.task.task_id,
            attempt=self.plan.attempt,
            seconds=round(self.now() - start, 6),
            **extra,
        )

    def _after(self, timeout: float | None) -> float:
        return math.inf if timeout is None else self.now() + timeout
