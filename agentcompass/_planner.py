"""The Planner: one deterministic ExecutionPlan per attempt.

Precedence, lowest first: runtime defaults, the benchmark's ``plan``, each
recipe in order, then explicit user values from the request's
``ExecutionSpec`` (timeouts, ``evaluation_environment_mode``, the
per-phase ``network`` policies and the ``sandbox`` fields set). A
benchmark gives its part of the :class:`SandboxSpec` as the plan's
``sandbox`` key (a ``SandboxSpec`` or a mapping of its fields). Because user values are applied last, a recipe can fill
any setting but never override one the user wrote down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .runtime._components import BaseBenchmark, BaseRecipe
from .runtime._convert import structure_config
from .runtime._errors import ComponentError
from .runtime._values import ExecutionPlan, NetworkPolicy, RunRequest, SandboxSpec, TaskSpec

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
        benchmark_plan = dict(self.benchmark.plan(task, request) or {})
        where = f"benchmark {self.benchmark.id!r} plan"
        settings: dict[str, Any] = {"benchmark_plan": benchmark_plan}
        for key in _POLICY_KEYS:
            if key in benchmark_plan:
                settings[key] = _as_policy(benchmark_plan[key], where)
        mode = benchmark_plan.get("evaluation_environment_mode")
        if mode is not None:
            if mode not in _MODES:
                raise ComponentError(f"{where}: evaluation_environment_mode must be one of {_MODES}, got {mode!r}")
            settings["evaluation_environment_mode"] = mode
        for key in ("run_timeout_seconds", "evaluation_timeout_seconds"):
            if benchmark_plan.get(key) is not None:
                settings[key] = float(benchmark_plan[key])
        sandbox = benchmark_plan.get("sandbox")
        if sandbox is not None:
            settings["sandbox"] = (
                sandbox if isinstance(sandbox, SandboxSpec) else structure_config(sandbox, SandboxSpec, where=where)
            )
        # Defaults, then the benchmark's part, in one construction.
        plan = ExecutionPlan(
            task_id=task.task_id,
            attempt=attempt,
            environment=request.environment,
            harness=request.harness,
            **settings,
        )

        for recipe in self.recipes:
            plan = recipe.apply(plan, task, request)
            if not isinstance(plan, ExecutionPlan):
                raise ComponentError(f"recipe {recipe.id!r}: apply() must return an ExecutionPlan, got {type(plan).__name__}")

        execution = request.execution
        # Explicit user values win; the identity of the attempt is never the
        # recipes' to change. Evolved only when something differs.
        explicit: dict[str, Any] = {}
        if execution.run_timeout_seconds is not None and plan.run_timeout_seconds != execution.run_timeout_seconds:
            explicit["run_timeout_seconds"] = execution.run_timeout_seconds
        if (
            execution.evaluation_timeout_seconds is not None
            and plan.evaluation_timeout_seconds != execution.evaluation_timeout_seconds
        ):
            explicit["evaluation_timeout_seconds"] = execution.evaluation_timeout_seconds
        mode = execution.evaluation_environment_mode
        if mode is not None and plan.evaluation_environment_mode != mode:
            explicit["evaluation_environment_mode"] = mode
        for phase in ("baseline", "run", "evaluation"):
            policy = getattr(execution.network, phase)
            if policy is not None and getattr(plan, f"{phase}_network_policy") != policy:
                explicit[f"{phase}_network_policy"] = policy
        sandbox = plan.sandbox.overridden_by(execution.sandbox)
        if sandbox != plan.sandbox:
            explicit["sandbox"] = sandbox
        for key, value in (
            ("task_id", task.task_id),
            ("attempt", attempt),
            ("environment", request.environment),
            ("harness", request.harness),
        ):
            if getattr(plan, key) is not value:
                explicit[key] = value
        return attrs.evolve(plan, **explicit) if explicit else plan
