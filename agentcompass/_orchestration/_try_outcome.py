"""What one try produced, and which of its issues a runtime retry may fix
(SPEC 5): the attempt scope reads both, the try only fills the first."""

from __future__ import annotations

from typing import Any

import attrs

from ..runtime._results import Issue, RunResult
from ..runtime._values import PreparedTask

__all__ = ["TryOutcome", "retryable_issues"]


@attrs.define(eq=False)
class TryOutcome:
    """What one try produced. ``task_issues`` belong to the task Environment
    stage (setup, run, collect and its cleanup); ``eval_issues`` to the
    evaluation stage, which an evaluation-only retry replaces."""

    task_issues: list[Issue] = attrs.Factory(list)
    eval_issues: list[Issue] = attrs.Factory(list)
    diagnostics: list[dict[str, Any]] = attrs.Factory(list)
    prepared: PreparedTask | None = None
    run_result: RunResult | None = None
    values: dict[str, Any] = attrs.Factory(dict)
    evaluated: bool = False
    timings: dict[str, float] = attrs.Factory(dict)
    #: Log files opening an Environment produced (``build.log``), kept in the attempt's ``logs/``.
    logs: dict[str, bytes] = attrs.Factory(dict)

    @property
    def issues(self) -> list[Issue]:
        return self.task_issues + self.eval_issues

    def rounded_timings(self) -> dict[str, float]:
        return {name: round(seconds, 6) for name, seconds in self.timings.items()}


def retryable_issues(issues: list[Issue], patterns: list[Any]) -> list[tuple[Issue, str | None]]:
    """FATAL always; ERROR when a pattern matches its message or code; never a
    WARNING. Returns each retryable issue with the pattern that matched."""
    found: list[tuple[Issue, str | None]] = []
    for issue in issues:
        if issue.severity == "fatal":
            found.append((issue, None))
        elif issue.severity == "error":
            for pattern in patterns:
                if pattern.search(issue.message) or pattern.search(issue.code):
                    found.append((issue, pattern.pattern))
                    break
    return found
