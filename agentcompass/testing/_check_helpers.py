"""What every conformance check stands on: a session closed exactly once, and failures that name the provider and the check."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import attrs
import trio

from agentcompass.runtime import BaseEnvironment, ComponentError, EnvironmentSession, ExecutionPlan

__all__ = ["CheckHelpers"]


@attrs.define(eq=False)
class _Opened:
    session: EnvironmentSession
    closed: bool = False


class CheckHelpers:
    """The helpers of :class:`~agentcompass.testing.EnvironmentConformance` and its check mixins."""

    env: BaseEnvironment
    plan: ExecutionPlan | None
    count_sandboxes: Callable[[], int | Awaitable[int]] | None
    grace_seconds: float
    _check: str

    @property
    def _plan(self) -> ExecutionPlan:
        assert self.plan is not None
        return self.plan

    def _fail(self, message: str, cause: BaseException | None = None) -> NoReturn:
        raise AssertionError(
            f"environment {self.env.id!r} fails conformance check {self._check!r}: {message}"
        ) from cause

    async def _count(self) -> int | None:
        if self.count_sandboxes is None:
            return None
        count = self.count_sandboxes()
        return await count if inspect.isawaitable(count) else count

    @staticmethod
    async def _raises(call: Callable[[], Awaitable[Any]], results: list[Any] | None = None) -> bool:
        """Whether ``call()`` raised an Exception (what it returned goes to ``results``)."""
        try:
            result = await call()
        except Exception:  # noqa: BLE001 - any failure is the expected outcome
            return True
        if results is not None:
            results.append(result)
        return False

    async def _ok(self, what: str, call: Awaitable[Any], hint: str = "") -> Any:
        try:
            return await call
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"{what} raised {exc!r}" + (f"; {hint}" if hint else ""), exc)

    def _build(self, plan: ExecutionPlan | None) -> Any:
        try:
            return self.env.build_config(plan or self._plan)
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"build_config rejected the base plan ({exc!r}); pass a plan the provider accepts", exc)

    def _accepts(self, plan: ExecutionPlan, what: str) -> bool:
        try:
            self.env.build_config(plan)
        except ComponentError:
            return False
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"build_config for {what} raised {exc!r}; reject a plan with ComponentError", exc)
        return True

    @asynccontextmanager
    async def _opened(self, plan: ExecutionPlan | None = None) -> AsyncIterator[_Opened]:
        """A session under the plan's baseline policy, closed on the way out
        unless the check closed it (``box.closed``)."""
        plan = plan or self._plan
        config = self._build(plan)
        policy = plan.baseline_network_policy
        session = await self._ok(f"open(config, {policy})", self.env.open(config, policy))
        box = _Opened(session)
        try:
            yield box
        except BaseException:
            if not box.closed:
                # The check's own failure is the one to report, not this close's.
                with trio.move_on_after(self.grace_seconds, shield=True):
                    await self._raises(session.close)
            raise
        if not box.closed:
            await self._close_checked(session)

    async def _close_checked(self, session: EnvironmentSession, what: str = "close()") -> None:
        with trio.move_on_after(self.grace_seconds, shield=True) as grace:
            await self._ok(what, session.close())
        if grace.cancelled_caught:
            self._fail(f"{what} did not finish within the {self.grace_seconds}s grace")

    async def _still_works(self, when: str) -> None:
        async with self._opened() as box:
            result = await self._ok(f"exec('echo hi') {when}", box.session.exec("echo hi"))
            if getattr(result, "exit_code", None) != 0:
                self._fail(f"exec('echo hi') {when} returned {result!r}")
