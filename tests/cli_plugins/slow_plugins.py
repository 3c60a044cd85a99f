"""Test-only components for subprocess tests of ``compass launch``.

Loaded through a config's ``plugins:`` list. Fake state is per process, so
these components tell the test what they are doing by writing one line per
event to a FIFO the test created and holds open for reading (path in the
``fifo`` config key): ``running <task id>`` when a task's agent starts (its
Environment session is open and journalled by then) and ``closing <n>``
when a session's close starts. The test blocks on those lines instead of
sleeping or polling.

- ``signal-test-env``: sessions whose ``exec`` / ``read_file`` /
  ``write_file`` do nothing; config ``close``: ``"ok"`` (default) or
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
from agentcompass.runtime._components import BaseEnvironment, BaseHarness, EnvironmentSession
from agentcompass.runtime._results import ExecResult, RunBudget, RunResult
from agentcompass.runtime._values import NetworkPolicy, PreparedTask

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


@attrs.define(eq=False)
class SignalSession(EnvironmentSession):
    number: int
    options: SignalEnvConfig
    files: dict[str, bytes] = attrs.Factory(dict)

    @property
    def handle(self) -> dict[str, Any]:
        return {"number": self.number}

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        await trio.lowlevel.checkpoint()
        return ExecResult(0, stdout="")

    async def read_file(self, path: str) -> bytes:
        await trio.lowlevel.checkpoint()
        try:
            return self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    async def write_file(self, path: str, data: bytes | str) -> None:
        await trio.lowlevel.checkpoint()
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if self.options.close == "hang":
            notify(self.options.fifo, f"closing {self.number}")
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()


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
