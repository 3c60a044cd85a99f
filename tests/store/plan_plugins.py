"""Test-only harness for ``test_store_plan.py``: ``plan-hold-harness`` says
on a FIFO (config ``fifo``) which attempt started its agent, as one line
``<task id> <attempt>``, then holds the run until the process is killed."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench and fake-env
from agentcompass import register
from agentcompass.runtime import BaseHarness, EnvironmentSession, ExecutionPlan, ModelSpec, PreparedTask, RunBudget


@attrs.frozen
class _Config:
    fifo: str


@register
class PlanHoldHarness(BaseHarness):
    id: ClassVar[str] = "plan-hold-harness"
    Config: ClassVar[type | None] = _Config
    options: _Config

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> Any:
        line = f"{plan.task_id} {plan.attempt}\n".encode()
        fd = await trio.to_thread.run_sync(os.open, self.options.fifo, os.O_WRONLY)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return plan

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> Any:
        await trio.sleep_forever()
