"""The ``oracle`` harness: runs the task's reference solution instead of an agent.

It runs ``bash "${SOLUTION_DIR:-/solution}/solve.sh"`` in the task
Environment (from the session's working directory), bounded by the run
budget, with the variables the prepared task's ``metadata["solution_env"]``
names (``terminal``: ``task.toml``'s ``[solution.env]``). It checks a
benchmark's verifier and data: under ``oracle`` every correct task should
score full marks. A benchmark puts the solution there (``terminal`` does so
only for this harness). No config keys.

Outcomes: no ``solve.sh`` is ERROR ``harness_no_solution``; running past the
budget is ERROR ``harness_timeout`` (the process group is killed). A non-zero
exit status is a WARNING ``solution_failed`` (the verifier still decides the
score, but a reference solution that fails is worth a look). The result's
``output`` is the tail of stdout, and ``artifacts["harness_command"]`` holds
``{"exit_code", "stdout", "stderr"}`` (each stream's last 16 KiB; the exit
code is None after a timeout).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from agentcompass import (
    BaseHarness,
    EnvironmentSession,
    ExecutionPlan,
    Issue,
    ModelSpec,
    PreparedTask,
    RunBudget,
    RunResult,
    register,
)
from agentcompass.runtime import command_output

__all__ = ["OracleHarness"]

_SOLVE = 'bash "${SOLUTION_DIR:-/solution}/solve.sh"'
_HAS_SOLVE = 'test -f "${SOLUTION_DIR:-/solution}/solve.sh"'
#: How much of stdout / stderr the result keeps (characters, from the end).
TAIL_CHARS = 4000


@attrs.define(eq=False)
class OracleSession:
    """What ``start_session`` returns: the task Environment to run in."""

    env: EnvironmentSession


@register
class OracleHarness(BaseHarness):
    """Runs the task's reference solution (solution/solve.sh) instead of an agent.

    See the module docstring for its outcomes.
    """

    id: ClassVar[str] = "oracle"
    uses_model: ClassVar[bool] = False

    @attrs.frozen
    class Config:
        """No keys: any config key is an error."""

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> Any:
        return OracleSession(env)

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        env = session.env
        if (await env.exec(_HAS_SOLVE)).exit_code != 0:
            message = f"task {prepared.task.task_id!r} has no solution/solve.sh"
            return RunResult(issues=[Issue("error", "run", "harness_no_solution", message)])
        solution_env = prepared.metadata.get("solution_env") or None
        result = await env.exec(_SOLVE, timeout=budget.timeout_seconds, env=solution_env)
        issues = []
        if result.timed_out:
            issues.append(
                Issue("error", "run", "harness_timeout", f"solve.sh did not finish within {budget.timeout_seconds:g}s")
            )
        elif result.exit_code != 0:
            last = (result.stderr.strip().splitlines() or [""])[-1][:200]
            message = f"solution/solve.sh exited with {result.exit_code}" + (f": {last}" if last else "")
            issues.append(Issue("warning", "run", "solution_failed", message))
        return RunResult(
            output=result.stdout[-TAIL_CHARS:],
            artifacts={"harness_command": command_output(result)},
            issues=issues,
        )
