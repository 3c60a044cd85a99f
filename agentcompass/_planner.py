"""The Planner: one deterministic ExecutionPlan per attempt.

Precedence, lowest first: runtime defaults, the benchmark's ``plan``, each
recipe in order, then explicit user values from the request's
``ExecutionSpec``. Because user values are applied last, a recipe can fill
any setting but never override one the user wrote down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .runtime._components import BaseBenchmark, BaseRecipe
from .runtime._errors import ComponentError
from .runtime._values import ExecutionPlan, NetworkPolicy, RunRequest, TaskSpec

__all__ = ["Planner"]

_POLICY_KEYS = ("baseline_network_policy", "run_network_policy", "evaluation_network_policy")
_MODES = ("reuse", "none", "fresh")


def _as_policy(value: Any, where: str) -> NetworkPolicy:
    try:
        return NetworkPolicy.parse(value, where)
    except ValueError as exc:
        raise ComponentError(str(exc)) from None


class Planner:
    """Builds the :class:`ExecutionPlan` of each attempt of one request (sync)."""

    def __init__(self, benchmark: BaseBenchmark, recipes: Sequence[BaseRecipe] = ()):
        self.benchmark = benchmark
        self.recipes = list(recipes)

    def plan(self, task: TaskSpec, request: RunRequest, attempt: int) -> ExecutionPlan:
        plan = ExecutionPlan(
            task_id=task.task_id,
            attempt=attempt,
            environment=request.environment,
            harness=request.harness,
        )
        benchmark_plan = dict(self.benchmark.plan(task, request) or {})
        where = f"benchmark {self.benchmark.id!r} plan"
        changes: dict[str, Any] = {"benchmark_plan": benchmark_plan}
        for key in _POLICY_KEYS:
            if key in benchmark_plan:
                changes[key] = _as_policy(benchmark_plan[key], where)
        mode = benchmark_plan.get("evaluation_environment_mode")
        if mode is not None:
            if mode not in _MODES:
                raise ComponentError(f"{where}: evaluation_environment_mode must be one of {_MODES}, got {mode!r}")
            changes["evaluation_environment_mode"] = mode
        for key in ("run_timeout_seconds", "evaluation_timeout_seconds"):
            if benchmark_plan.get(key) is not None:
                changes[key] = float(benchmark_plan[key])
        plan = attrs.evolve(plan, **changes)

        for recipe in self.recipes:
            plan = recipe.apply(plan, task, request)
            if not isinstance(plan, ExecutionPlan):
                raise ComponentError(f"recipe {recipe.id!r}: apply() must return an ExecutionPlan, got {type(plan).__name__}")

        explicit: dict[str, Any] = {}
        execution = request.execution
        if execution.run_timeout_seconds is not None:
            explicit["run_timeout_seconds"] = execution.run_timeout_seconds
        if execution.evaluation_timeout_seconds is not None:
            explicit["evaluation_timeout_seconds"] = execution.evaluation_timeout_seconds
        # The identity of the attempt is never the recipes' to change.
        explicit.update(task_id=task.task_id, attempt=attempt, environment=request.environment, harness=request.harness)
        return attrs.evolve(plan, **explicit)
