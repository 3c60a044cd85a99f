"""Turning exceptions into Issues (SPEC section 6, classification table).

The try code is the supervisor: every ``Exception`` a component raises
becomes an :class:`Issue` here. ``IssueError`` keeps its own severity and
code; anything else is classified by where it happened. The one-line
message is redacted; the redacted traceback goes to the diagnostics list
that ends up in ``artifacts.execution_diagnostics``.
"""

from __future__ import annotations

import traceback
from typing import Any

import attrs

from .._redact import redact
from ..runtime._errors import IssueError
from ..runtime._results import Issue, Phase

__all__ = ["WHERE", "classify", "diagnostic"]

#: where -> (severity, code) for unclassified exceptions.
WHERE: dict[str, tuple[str, str]] = {
    "environment": ("fatal", "environment_failed"),
    "prepare_task": ("fatal", "setup_failed"),
    "start_session": ("fatal", "setup_failed"),
    "harness_run": ("fatal", "harness_crashed"),
    "benchmark_run": ("error", "benchmark_run_failed"),
    "collect_artifacts": ("fatal", "collect_failed"),
    "evaluate": ("error", "scoring_failed"),
    "cleanup": ("warning", "cleanup_failed"),
}


class EnvironmentFailure(Exception):
    """An unclassified exception raised by an Environment session, tagged so
    it keeps its classification when it surfaces through a benchmark or
    harness call (``prepare_task`` running ``env.exec``, say)."""

    def __init__(self, operation: str, cause: BaseException):
        super().__init__(f"environment {operation} failed: {_one_line(cause)}")
        self.cause = cause


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


def diagnostic(where: str, exc: BaseException) -> dict[str, Any]:
    """The redacted traceback of ``exc`` as a JSON-ready dict."""
    return {
        "where": where,
        "error": redact(_one_line(exc)),
        "traceback": redact("".join(traceback.format_exception(exc))),
    }


def classify(exc: BaseException, where: str, phase: Phase, diagnostics: list[dict[str, Any]]) -> Issue:
    """The Issue for ``exc`` raised at ``where`` during ``phase``."""
    diagnostics.append(diagnostic(where, exc))
    if isinstance(exc, IssueError):
        issue = exc.to_issue(phase)
        return attrs.evolve(issue, message=redact(_first_line(issue.message)))
    if isinstance(exc, EnvironmentFailure):
        severity, code = WHERE["environment"]
        return Issue(severity, phase, code, redact(str(exc)))  # type: ignore[arg-type]
    severity, code = WHERE[where]
    return Issue(severity, phase, code, redact(f"{where} raised {_one_line(exc)}"))  # type: ignore[arg-type]


def _first_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


def redact_issue(issue: Issue) -> Issue:
    """A component-returned issue with its message made one redacted line."""
    message = redact(_first_line(issue.message))
    return issue if message == issue.message else attrs.evolve(issue, message=message)
