"""``fake-harness``: a scriptable agent that answers at once."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from agentcompass import register
from agentcompass.runtime import (
    BaseHarness,
    EnvironmentSession,
    ExecutionPlan,
    ModelSpec,
    PreparedTask,
    RunBudget,
    RunResult,
)

from ._benchmark import fake_run_result
from ._environment import session_id
from ._script import script_validator, step

__all__ = ["FakeHarness", "FakeHarnessSession"]

HARNESS_PHASES = ("start_session", "run", "close_session")


@attrs.frozen
class FakeHarnessConfig:
    """Config keys of ``fake-harness``; see :class:`FakeHarness`."""

    log: str = "default"
    script: dict[str, dict[str, list[str]]] = attrs.field(
        factory=dict, validator=script_validator(HARNESS_PHASES)
    )


@attrs.frozen
class FakeHarnessSession:
    """What ``FakeHarness.start_session`` returns: the task and the fake
    Environment session it runs in (``None`` for another provider's)."""

    task_id: str
    env_session: int | None


@register
class FakeHarness(BaseHarness):
    """``fake-harness``: logs its calls and returns a canned answer.

    Config keys:

    - ``log`` (``"default"``): the :func:`call_log` name its calls go to.
    - ``script`` (``{}``): ``{task_id or "*": {phase: [action, ...]}}`` with
      phases ``start_session``, ``run``, ``close_session``; ``run`` also
      accepts ``harness_timeout``.

    ``run_task`` logs ``timeout_seconds`` (the budget it got) and returns
    ``RunResult(output="answer", usage={"input_tokens": 10, "output_tokens": 5})``.
    Its calls carry the Environment session they ran in.
    """

    id: ClassVar[str] = "fake-harness"
    Config: ClassVar[type | None] = FakeHarnessConfig
    options: FakeHarnessConfig

    async def _step(self, phase: str, task_id: str, session: int | None, **detail: Any) -> str:
        outcome, _ = await step(
            self.options.log, self.options.script, "harness", phase, task_id, session, detail
        )
        return outcome

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> FakeHarnessSession:
        task_id = prepared.task.task_id
        await self._step(
            "start_session",
            task_id,
            session_id(env),
            model=model.name if model is not None else None,
            attempt=plan.attempt,
        )
        return FakeHarnessSession(task_id, session_id(env))

    async def run_task(
        self, session: FakeHarnessSession, prepared: PreparedTask, budget: RunBudget
    ) -> RunResult:
        outcome = await self._step(
            "run", prepared.task.task_id, session.env_session, timeout_seconds=budget.timeout_seconds
        )
        return fake_run_result(outcome)

    async def close_session(self, session: FakeHarnessSession) -> None:
        await self._step("close_session", session.task_id, session.env_session)
