"""Small pytest-trio helpers: a hang guard and builders for fake requests and plans."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import attrs
import trio

from agentcompass.runtime import NO_HARNESS, ComponentRef, ExecutionPlan, RunRequest

from ._policies import with_policies

__all__ = ["HangGuard", "fake_plan", "fake_request", "hang_guard"]


@attrs.define(eq=False)
class HangGuard:
    """See :func:`hang_guard`."""

    seconds: float
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)

    def __enter__(self) -> trio.CancelScope:
        self._scope = trio.move_on_after(self.seconds)
        return self._scope.__enter__()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        assert self._scope is not None
        handled = self._scope.__exit__(exc_type, exc, tb)
        if self._scope.cancelled_caught:
            raise AssertionError(
                f"hang guard: the body did not finish within {self.seconds}s of Trio time"
            ) from None
        return handled

    async def __aenter__(self) -> trio.CancelScope:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)


def hang_guard(seconds: float) -> HangGuard:
    """Fail the test with ``AssertionError`` if the body runs longer than
    ``seconds`` of Trio time, instead of letting a hang stall the suite.

    Usable as ``async with hang_guard(5):`` or ``with hang_guard(5):``. It is
    ``trio.fail_after`` with a test-friendly error; under ``autojump_clock``
    the seconds are virtual, so a generous bound costs nothing. The body's
    own ``TooSlowError`` is not confused with the guard's expiry.
    """
    return HangGuard(seconds)


def fake_request(
    name: str = "fake",
    *,
    log: str = "default",
    benchmark: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
    harness: dict[str, Any] | None = None,
    harness_free: bool = False,
    **fields: Any,
) -> RunRequest:
    """A RunRequest wired to the fakes, all logging to ``log``.

    ``benchmark``, ``environment`` and ``harness`` are extra config for
    ``fake-bench``, ``fake-env`` and ``fake-harness``; ``harness_free`` uses
    ``fake-free-bench`` and harness ``none``. Other keyword arguments are
    RunRequest fields (``execution``, ``output_root``, ``analyzers``, ...).
    """
    return RunRequest(
        name=name,
        benchmark=ComponentRef(
            "fake-free-bench" if harness_free else "fake-bench", {"log": log, **(benchmark or {})}
        ),
        environment=ComponentRef("fake-env", {"log": log, **(environment or {})}),
        harness=NO_HARNESS if harness_free else ComponentRef("fake-harness", {"log": log, **(harness or {})}),
        **fields,
    )


def fake_plan(
    task_id: str = "t000", attempt: int = 0, *, log: str = "default", **fields: Any
) -> ExecutionPlan:
    """An ExecutionPlan for ``fake-env``; policies may be given as mode strings
    or ``{"mode": ..., "allow": [...]}`` mappings."""
    return ExecutionPlan(
        task_id, attempt, ComponentRef("fake-env", {"log": log}), **with_policies(fields, "fake_plan")
    )
