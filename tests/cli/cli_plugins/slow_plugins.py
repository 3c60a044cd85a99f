"""Test-only components for subprocess tests of ``compass launch``.

Loaded through a config's ``plugins:`` list. Fake state is per process, so
these components tell the test what they are doing by writing one line per
event to a FIFO the test created and holds open for reading (path in the
``fifo`` config key): ``running <task id>`` when a task's agent starts (its
Environment session is open and journalled by then) and ``closing <n>``
when a session's close starts. The test blocks on those lines instead of
sleeping or polling.

- ``signal-test-env``: in-memory sessions (``agentcompass.testing.MemorySession``); config ``close``: ``"ok"`` (default) or
  ``"hang"`` (``close`` never returns, so cleanup waits for the grace).
- ``signal-test-harness``: ``run_task`` announces itself and hangs.

``import agentcompass.testing`` registers ``fake-bench`` for the configs.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, ClassVar, Literal

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench
from agentcompass import register
from agentcompass.runtime import BaseEnvironment, BaseHarness, NetworkPolicy, PreparedTask, RunBudget, RunResult
from agentcompass.testing import MemorySession

_numbers = itertools.count(1)


def notify(fifo: str, line: str) -> None:
    """Write one line to the test's FIFO (a single write under PIPE_BUF: atomic).

    Non-blocking: the test opened the FIFO before starting this process, so
    the open and a short write never wait.
    """
    if not fifo:
        return
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@attrs.frozen
class SignalEnvConfig:
    fifo: str = ""
    close: Literal["ok", "hang"] = "ok"


class SignalSession(MemorySession):
    def __init__(self, number: int, options: SignalEnvConfig) -> None:
        super().__init__(number)
        self.options = options

    async def close(self) -> None:
        if self.options.close == "hang":
            notify(self.options.fifo, f"closing {self.number}")
            await trio.sleep_forever()
        await super().close()


@register
class SignalTestEnvironment(BaseEnvironment):
    id: ClassVar[str] = "signal-test-env"
    Config: ClassVar[type | None] = SignalEnvConfig
    options: SignalEnvConfig

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> SignalSession:
        await trio.lowlevel.checkpoint()
        return SignalSession(next(_numbers), self.options)

    async def reap(self, handle: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()


@attrs.frozen
class SignalHarnessConfig:
    fifo: str = ""


@register
class SignalTestHarness(BaseHarness):
    id: ClassVar[str] = "signal-test-harness"
    Config: ClassVar[type | None] = SignalHarnessConfig
    options: SignalHarnessConfig

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        notify(self.options.fifo, f"running {prepared.task.task_id}")
        await trio.sleep_forever()
        raise AssertionError("unreachable")
