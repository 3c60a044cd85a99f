"""Test-only components for the ``ray`` executor tests, loaded by file path.

Fake state is per process and tasks run in Ray workers, so everything the
tests learn is written to one log file (``log`` config key), one line per
event, appended with a single write: ``open <t> <pid> <name>``,
``close <t> <pid> <name>``, ``run <task> <attempt> <pid> <t>`` (``t``:
``time.time()``).

- ``ray-log-local``: the built-in ``local`` Environment (a sandbox
  directory per session under ``root``, reaped and swept for real) that
  logs its opens and closes.
- ``ray-log-harness``: logs each run, writes to its sandbox, works
  ``seconds`` of real time.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench
from agentcompass import register
from agentcompass.environments.local import LocalEnvironment
from agentcompass.runtime import (
    BaseHarness,
    EnvironmentSession,
    ExecutionPlan,
    ModelSpec,
    NetworkPolicy,
    PreparedTask,
    RunBudget,
    RunResult,
)
from agentcompass.testing import append_line


@attrs.frozen
class LogLocalConfig(LocalEnvironment.Config):  # type: ignore[misc,name-defined]
    log: str = ""


@register
class LoggingLocalEnvironment(LocalEnvironment):
    id: ClassVar[str] = "ray-log-local"
    Config: ClassVar[type | None] = LogLocalConfig
    options: LogLocalConfig  # type: ignore[assignment]

    def __init__(self, config: Any = None):
        super().__init__(config)
        self._log = self.options.log

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> EnvironmentSession:
        session = await super().open(config, policy, name)
        append_line(self._log, f"open {time.time()} {os.getpid()} {name}")
        close = session.close

        async def logged_close() -> None:
            append_line(self._log, f"close {time.time()} {os.getpid()} {name}")
            await close()

        session.close = logged_close  # type: ignore[method-assign]
        return session


@attrs.frozen
class LogHarnessConfig:
    log: str
    seconds: float = 0.2


@register
class LoggingHarness(BaseHarness):
    id: ClassVar[str] = "ray-log-harness"
    Config: ClassVar[type | None] = LogHarnessConfig
    options: LogHarnessConfig

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> tuple[str, int, EnvironmentSession]:
        await trio.lowlevel.checkpoint()
        return (prepared.task.task_id, plan.attempt, env)

    async def run_task(
        self, session: tuple[str, int, EnvironmentSession], prepared: PreparedTask, budget: RunBudget
    ) -> RunResult:
        task_id, attempt, env = session
        append_line(self.options.log, f"run {task_id} {attempt} {os.getpid()} {time.time()}")
        await env.write_file("/app/answer.txt", f"{task_id} {attempt}\n")
        await trio.sleep(self.options.seconds)
        return RunResult(output="done")

    async def close_session(self, session: Any) -> None:
        await trio.lowlevel.checkpoint()
