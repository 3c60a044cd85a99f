"""Exceptions of the runtime.

Tree::

    CompassError(Exception)
    ├── ConfigError(CompassError, ValueError)      invalid config or usage: exit 2, nothing runs
    │   └── ComponentError(ConfigError)            unknown id, bad component config, contract violation
    ├── IssueError(CompassError)                   a component's classified failure -> an Issue
    │   └── ModelError(IssueError)                 a model call's classified failure (``chat_client``)
    ├── FileRefusedError(CompassError, OSError)    a session file the runtime will not read or write
    └── RunFailedError(CompassError, RuntimeError) ``run_evaluation`` of a request that did not succeed

``Cancelled``, ``KeyboardInterrupt`` and ``SystemExit`` are never wrapped.
"""

from __future__ import annotations

from ._results import Issue, Phase, Severity

__all__ = ["CompassError", "ComponentError", "ConfigError", "FileRefusedError", "IssueError", "RunFailedError"]


class CompassError(Exception):
    """Base of every exception this package raises on purpose."""


class ConfigError(CompassError, ValueError):
    """Invalid configuration or usage; the message is one line naming the key or value."""


class ComponentError(ConfigError):
    """A component could not be resolved or built, or broke its contract."""


class IssueError(CompassError):
    """Raised by a component to report a classified failure.

    ``phase`` defaults to the phase the runtime was in when it caught the error.
    ``logs`` (relative path -> bytes) are kept with the attempt in its
    ``logs/`` directory when the error is raised while its Environment
    opens (a provider's ``build.log``).
    """

    def __init__(self, severity: Severity, code: str, message: str = "", phase: Phase | None = None):
        super().__init__(message or code)
        self.severity = severity
        self.code = code
        self.message = message or code
        self.phase = phase
        self.logs: dict[str, bytes] = {}

    def to_issue(self, phase: Phase) -> Issue:
        return Issue(self.severity, self.phase or phase, self.code, self.message)


class FileRefusedError(CompassError, OSError):
    """A session file operation refused what the session made: a symbolic
    link on the way, a file that is not regular (a FIFO, a device, a socket),
    or more bytes than the caller allows. What a session contains is the
    agent's doing, so this is not an infrastructure failure: the runtime
    passes it to the component unchanged, which decides what it means
    (``terminal`` scores an unreadable reward 0 with a WARNING)."""


class RunFailedError(CompassError, RuntimeError):
    """``run_evaluation`` finished without success; the message names the result paths."""
