"""One Environment session's whole life: permit, open, journal, close.

:class:`TrackedSession` is the only way the try code opens a sandbox. The
try holds the provider's capacity permit and an open-rate token (both
granted by the driver); the session opens under the baseline policy,
journals its handle, and on the way out (success, failure or cancellation)
closes in a shielded scope bounded by the grace deadline and journals the
close. Each cleanup is installed before the next checkpoint after its
resource is acquired.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import trio

from ..runtime._components import EnvironmentSession
from ..runtime._errors import FileRefusedError, IssueError
from ..runtime._results import ExecResult, Issue, Phase
from ..runtime._values import NetworkPolicy
from ._context import GraceClock, RequestContext
from ._issues import EnvironmentFailure, classify

__all__ = ["GuardedSession", "TrackedSession", "run_cleanup"]

_session_ids = itertools.count(1)


class GuardedSession(EnvironmentSession):
    """What components see: the provider's session, with unclassified
    failures tagged as Environment failures and ``close`` owned by the runtime."""

    def __init__(self, inner: EnvironmentSession, policy: NetworkPolicy):
        self._inner = inner
        self.policy = policy

    @property
    def handle(self) -> dict[str, Any]:
        return self._inner.handle

    @property
    def inner(self) -> EnvironmentSession:
        """The provider's own session object (for providers' and tests' eyes)."""
        return self._inner

    async def _call(self, operation: str, fn: Any, *args: Any) -> Any:
        try:
            return await fn(*args)
        except (IssueError, EnvironmentFailure, FileRefusedError):
            raise  # FileRefusedError is what the session made: the component decides
        except Exception as exc:
            raise EnvironmentFailure(operation, exc) from exc

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        return await self._call("exec", self._inner.exec, cmd, timeout, cwd, env)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:  # providers written before max_bytes keep working
            return await self._call("read_file", self._inner.read_file, path)
        return await self._call("read_file", self._inner.read_file, path, max_bytes)

    async def exec_private(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        directory: str,
        max_bytes: int,
        inputs: Mapping[str, bytes] | None = None,
    ) -> tuple[ExecResult, dict[str, bytes]]:
        options: dict[str, Any] = {"directory": directory, "max_bytes": max_bytes}
        if inputs:  # providers written before inputs keep working without them
            options["inputs"] = inputs
        try:
            return await self._inner.exec_private(cmd, timeout, cwd, env, **options)
        except NotImplementedError:
            raise  # the caller falls back to exec and read_file
        except (IssueError, EnvironmentFailure):
            raise
        except Exception as exc:
            raise EnvironmentFailure("exec_private", exc) from exc

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._call("write_file", self._inner.write_file, path, data)

    async def expose_directory(self, host_path: str) -> str:
        return await self._optional("expose_directory", self._inner.expose_directory, host_path)

    async def expose_socket(self, host_path: str) -> str:
        return await self._optional("expose_socket", self._inner.expose_socket, host_path)

    async def _optional(self, operation: str, fn: Any, *args: Any) -> Any:
        """An optional operation: NotImplementedError reaches the caller, which reports it."""
        try:
            return await fn(*args)
        except NotImplementedError:
            raise
        except (IssueError, EnvironmentFailure):
            raise
        except Exception as exc:
            raise EnvironmentFailure(operation, exc) from exc

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._call("set_network_policy", self._inner.set_network_policy, policy)
        self.policy = policy

    async def close(self) -> None:
        # Components never close the runtime's sessions; the runtime does.
        return None


async def run_cleanup(
    grace: GraceClock, issues: list[Issue], diagnostics: list[dict[str, Any]], what: str, fn: Any, *args: Any
) -> bool:
    """Run one cleanup step shielded until the grace deadline. A failure or
    an overrun becomes a WARNING ``cleanup_failed``; it never raises.
    Returns whether the step finished."""
    with trio.CancelScope(deadline=grace.deadline(), shield=True) as scope:
        try:
            await fn(*args)
        except Exception as exc:
            issues.append(classify(exc, "cleanup", "cleanup", diagnostics))
            return False
    if scope.cancelled_caught:
        issues.append(Issue("warning", "cleanup", "cleanup_failed", f"{what} did not finish within the cleanup grace"))
        return False
    return True


class TrackedSession:
    """One Environment session of a try: :meth:`open` it under a policy,
    then :meth:`close` it on every way out (the caller's ``finally``).
    Failures to open raise :class:`IssueError` FATAL ``environment_failed``
    in ``phase``.

    Plain methods, not a context manager: a session is opened once or twice
    per attempt and the context-manager machinery was a measurable share of
    the per-attempt overhead. The caller holds the capacity permit.
    """

    __slots__ = ("ctx", "diagnostics", "grace", "handle", "issues", "logs", "phase", "raw", "session_id", "timings")

    def __init__(
        self,
        ctx: RequestContext,
        *,
        phase: Phase,
        grace: GraceClock,
        issues: list[Issue],
        diagnostics: list[dict[str, Any]],
    ):
        self.ctx = ctx
        self.phase = phase
        self.grace = grace
        self.issues = issues
        self.diagnostics = diagnostics
        self.raw: EnvironmentSession | None = None
        self.session_id = ""
        self.handle: dict[str, Any] = {}
        #: What opening produced for the attempt's record besides the session (SPEC 12 "Image source").
        self.logs: dict[str, bytes] = {}
        self.timings: dict[str, float] = {}

    async def open(self, config: Any, policy: NetworkPolicy) -> GuardedSession:
        ctx, phase = self.ctx, self.phase
        # Named before ``open`` and without a write: the provider labels the
        # sandbox with it, so ``sweep(tag)`` finds it even if the process is
        # killed before the journal line below is on disk.
        name = ctx.session_name()
        try:
            raw = await ctx.environment.open(config, policy, name)
        except IssueError as exc:
            exc.phase = exc.phase or phase
            self.logs.update(exc.logs)
            raise
        except Exception as exc:
            issue = classify(exc, "environment", phase, self.diagnostics)
            raise IssueError(issue.severity, issue.code, issue.message, phase=phase) from exc
        # Installed before the next checkpoint: from here on the caller's
        # ``finally`` closes it.
        self.raw = raw
        self.issues.extend(raw.open_issues)
        self.logs.update(raw.open_logs)
        self.timings.update(raw.open_timings)
        self.session_id = f"s{next(_session_ids)}"
        self.handle = raw.handle
        await ctx.reporter.session_opened(self.session_id, ctx.provider, self.handle, name)
        return GuardedSession(raw, policy)

    async def close(self) -> None:
        """Close the session if it was opened, shielded until the grace
        deadline, and journal the close. Never raises (a failure is a
        WARNING ``cleanup_failed``).

        ``keep_environment`` only skips the close; the journal still records
        that the runtime is done with the session, so reap leaves it alone.
        A close that failed or overran stays "opened" in the journal: the
        sandbox may be left behind, and the next reuse or ``compass reap``
        destroys it.
        """
        raw = self.raw
        if raw is None:
            return
        self.raw = None
        ctx = self.ctx
        keep = ctx.request.execution.keep_environment
        # One shielded scope for the close and its journal line.
        with trio.CancelScope(deadline=self.grace.deadline(), shield=True) as scope:
            try:
                if not keep:
                    await raw.close()
            except Exception as exc:
                self.issues.append(classify(exc, "cleanup", "cleanup", self.diagnostics))
                return
            await ctx.reporter.session_closed(self.session_id, ctx.provider, self.handle)
        if scope.cancelled_caught:
            what = "journalling" if keep else "closing"
            self.issues.append(
                Issue(
                    "warning",
                    "cleanup",
                    "cleanup_failed",
                    f"{what} session {self.session_id} did not finish within the cleanup grace",
                )
            )
