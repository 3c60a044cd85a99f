"""``fake-bench`` and ``fake-free-bench``: scriptable benchmarks with made-up tasks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from agentcompass import register
from agentcompass.runtime import (
    BaseBenchmark,
    ComponentError,
    EnvironmentSession,
    Evaluation,
    HarnessFreeBenchmark,
    Issue,
    ModelSpec,
    PreparedTask,
    RunBudget,
    RunRequest,
    RunResult,
    TaskSpec,
)

from ._calls import call_log
from ._environment import session_id
from ._policies import with_policies
from ._script import check_script, script_validator, step

__all__ = ["FakeBenchmark", "FakeHarnessFreeBenchmark", "fake_run_result"]

BENCH_PHASES = ("load_tasks", "prepare", "collect", "evaluate")
FREE_BENCH_PHASES = (*BENCH_PHASES, "run")
EVALUATION_MODES = ("reuse", "none", "fresh")


def fake_run_result(outcome: str, phase: str = "run") -> RunResult:
    """What the fake harness and harness-free benchmark return for a run outcome."""
    issues = []
    if outcome == "warning":
        issues.append(Issue("warning", "run", f"fake_{phase}_warning", f"fake {phase} warning"))
    elif outcome == "harness_timeout":
        issues.append(Issue("error", "run", "harness_timeout", "fake harness ran out of its time budget"))
    return RunResult(output="answer", usage={"input_tokens": 10, "output_tokens": 5}, issues=issues)


def _check_tasks(_instance: Any, _attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        raise TypeError(f"tasks: expected a number of tasks or a list of task ids, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"tasks: must be >= 0, got {value}")
    if isinstance(value, list):
        if not all(isinstance(t, str) and t for t in value):
            raise ValueError("tasks: task ids must be non-empty strings")
        if len(set(value)) != len(value):
            raise ValueError("tasks: task ids must be unique")


def _check_categories(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is None or (isinstance(value, Mapping) and all(isinstance(c, str) for c in value.values())):
        return
    if isinstance(value, str) and value.startswith("mod:"):
        k = value[4:]
        if k.isdigit() and int(k) > 0:
            return
    raise ValueError(f"categories: expected {{task_id: category}} or 'mod:K' with K >= 1, got {value!r}")


def _check_values(_instance: Any, _attribute: Any, value: dict[str, dict[str, Any]]) -> None:
    for key, series in value.items():
        for name, v in series.items():
            for item in v if isinstance(v, list) else [v]:
                if item is not None and not isinstance(item, (bool, int, float)):
                    raise ValueError(
                        f"values[{key!r}][{name!r}]: expected a number, a boolean or null, got {item!r}"
                    )


def _check_plan(_instance: Any, _attribute: Any, value: dict[str, Any]) -> None:
    with_policies(value, "plan")
    mode = value.get("evaluation_environment_mode", "reuse")
    if mode not in EVALUATION_MODES:
        raise ValueError(
            f"plan.evaluation_environment_mode: must be one of {', '.join(EVALUATION_MODES)}, got {mode!r}"
        )


@attrs.frozen
class FakeBenchmarkConfig:
    """Config keys of ``fake-bench`` and ``fake-free-bench``; see :class:`FakeBenchmark`."""

    log: str = "default"
    script: dict[str, dict[str, list[str]]] = attrs.field(
        factory=dict, validator=script_validator(FREE_BENCH_PHASES)
    )
    tasks: Any = attrs.field(default=3, validator=_check_tasks)
    categories: Any = attrs.field(default=None, validator=_check_categories)
    metrics: list[str] = attrs.field(factory=lambda: ["score"])
    values: dict[str, dict[str, Any]] = attrs.field(
        factory=lambda: {"*": {"score": 1.0}}, validator=_check_values
    )
    plan: dict[str, Any] = attrs.field(factory=dict, validator=_check_plan)
    evaluation_timeout_values: dict[str, Any] = attrs.Factory(dict)

    @metrics.validator
    def _check_metrics(self, _attribute: Any, value: list[str]) -> None:
        if not value:
            raise ValueError("metrics: name at least one series (the first is the primary metric)")


@register
class FakeBenchmark(BaseBenchmark):
    """``fake-bench``: made-up tasks, scripted phases and configurable scores.

    Config keys:

    - ``log`` (``"default"``): the :func:`call_log` name its calls go to.
    - ``script`` (``{}``): ``{task_id or "*": {phase: [action, ...]}}`` with
      phases ``load_tasks``, ``prepare``, ``collect``, ``evaluate``.
    - ``tasks`` (``3``): a count N, giving ids ``t000`` .. ``t{N-1}`` (zero-padded
      to at least 3 digits), or a list of task ids.
    - ``categories`` (none): ``{task_id: category}``, or ``"mod:K"`` for category
      ``f"c{i % K}"`` of the i-th task.
    - ``metrics`` (``["score"]``): the series names; the first is primary.
    - ``values`` (``{"*": {"score": 1.0}}``): ``{task_id or "*": {series: value}}``;
      a task's entry overrides ``"*"`` series by series. A list value gives the
      n-th ``evaluate`` call of the task its n-th entry (the last one repeats),
      so attempts and retries can score differently.
    - ``plan`` (``{}``): returned by ``plan()`` for every task; policies may be
      written ``{"mode": "allowlist", "allow": ["pypi.org"]}``, e.g.
      ``{"evaluation_environment_mode": "fresh", "run_network_policy": {"mode": "none"}}``.
    - ``evaluation_timeout_values`` (``{}``): recorded on evaluation timeout.

    ``prepare_task`` logs the ``benchmark_plan`` it got; ``collect_artifacts``
    adds ``artifacts["collected"] = True``; ``evaluate`` logs the session it
    got (``None`` and ``detail["with_env"] = False`` for mode ``none``).
    ``plan`` logs a ``plan`` entry (not scriptable: it is sync).
    """

    id: ClassVar[str] = "fake-bench"
    Config: ClassVar[type | None] = FakeBenchmarkConfig
    PHASES: ClassVar[tuple[str, ...]] = BENCH_PHASES
    options: FakeBenchmarkConfig

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        try:
            # The config class is shared with fake-free-bench, which also scripts "run".
            check_script(self.options.script, self.PHASES)
        except ValueError as exc:
            raise ComponentError(f"benchmark {self.id!r}: {exc}") from None
        # Shadow the ClassVars on the instance: the runtime reads them per request.
        self.metrics = tuple(self.options.metrics)  # type: ignore[misc]
        self.evaluation_timeout_values = dict(self.options.evaluation_timeout_values)  # type: ignore[misc]
        self._plan = with_policies(self.options.plan, "plan")

    @property
    def task_ids(self) -> list[str]:
        tasks = self.options.tasks
        if isinstance(tasks, list):
            return list(tasks)
        width = max(3, len(str(tasks - 1)))
        return [f"t{i:0{width}d}" for i in range(tasks)]

    def _category(self, index: int, task_id: str) -> str | None:
        categories = self.options.categories
        if isinstance(categories, str):
            return f"c{index % int(categories[4:])}"
        if categories is not None:
            return categories.get(task_id)
        return None

    async def _step(
        self, phase: str, task_id: str | None, env: EnvironmentSession | None = None, **detail: Any
    ) -> tuple[str, int]:
        return await step(
            self.options.log, self.options.script, "benchmark", phase, task_id, session_id(env), detail
        )

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        await self._step("load_tasks", None, request=request.name)
        return [
            TaskSpec(
                task_id,
                data={"index": i, "question": f"question {task_id}"},
                category=self._category(i, task_id),
            )
            for i, task_id in enumerate(self.task_ids)
        ]

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        call_log(self.options.log).record("benchmark", "plan", task.task_id)
        return dict(self._plan)

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        await self._step("prepare", task.task_id, env, benchmark_plan=dict(benchmark_plan))
        return PreparedTask(task=task, input=dict(task.data))

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        outcome, _ = await self._step("collect", prepared.task.task_id, env)
        issues = list(run_result.issues)
        if outcome == "warning":
            issues.append(Issue("warning", "collect", "fake_collect_warning", "fake collect warning"))
        return attrs.evolve(run_result, artifacts={**run_result.artifacts, "collected": True}, issues=issues)

    async def evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        task_id = prepared.task.task_id
        outcome, index = await self._step("evaluate", task_id, env, with_env=env is not None)
        issues = []
        if outcome == "warning":
            issues.append(Issue("warning", "evaluate", "fake_evaluate_warning", "fake evaluate warning"))
        return Evaluation(self._values(task_id, index), issues)

    def _values(self, task_id: str, index: int) -> dict[str, float | bool | None]:
        merged = {**self.options.values.get("*", {}), **self.options.values.get(task_id, {})}
        values: dict[str, float | bool | None] = {}
        for series, value in merged.items():
            if isinstance(value, list):
                value = value[min(index, len(value) - 1)] if value else None
            values[series] = value
        return values


@register
class FakeHarnessFreeBenchmark(FakeBenchmark, HarnessFreeBenchmark):
    """``fake-free-bench``: :class:`FakeBenchmark` that runs its own tasks.

    Same config keys; ``script`` also accepts the ``run`` phase (where
    ``harness_timeout`` applies). ``run_task`` logs ``timeout_seconds`` (the
    budget) and ``model`` (its name or ``None``) and returns
    ``RunResult(output="answer", usage={"input_tokens": 10, "output_tokens": 5})``.
    """

    id: ClassVar[str] = "fake-free-bench"
    PHASES: ClassVar[tuple[str, ...]] = FREE_BENCH_PHASES

    async def run_task(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, budget: RunBudget
    ) -> RunResult:
        outcome, _ = await self._step(
            "run",
            prepared.task.task_id,
            env,
            timeout_seconds=budget.timeout_seconds,
            model=model.name if model is not None else None,
        )
        return fake_run_result(outcome)
