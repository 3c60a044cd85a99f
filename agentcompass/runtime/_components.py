"""Base classes of the plugin contracts (SPEC section 4).

Every component class has a ``id`` class variable and is built as
``cls(config)`` from its ``ComponentRef.config``; one instance serves one
request. A component that declares a ``Config`` attrs class gets its config
checked and structured into ``self.options`` when it is built: an unknown
key or a bad value is a :class:`ComponentError` naming the component, raised
before any task runs.

The runtime calls the async methods from inside the scope that owns the
resource involved (SPEC section 2) and turns any ``Exception`` they raise
into an :class:`Issue` (SPEC section 6). To report a classified failure,
raise :class:`IssueError` or return issues in the result. Never swallow
``trio.Cancelled``.

The Environment contract (:class:`BaseEnvironment`, :class:`EnvironmentSession`)
is its own module, ``_environment``; its names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ._component_base import Component
from ._environment import BaseEnvironment, EnvironmentSession
from ._errors import ComponentError
from ._results import Evaluation, RunBudget, RunResult, TaskRecord
from ._values import (
    ExecutionPlan,
    ModelSpec,
    PreparedTask,
    RunRequest,
    TaskSpec,
)

__all__ = [
    "BaseAnalyzer",
    "BaseBenchmark",
    "BaseEnvironment",
    "BaseHarness",
    "BaseRecipe",
    "Component",
    "EnvironmentSession",
    "HarnessFreeBenchmark",
]


class BaseBenchmark(Component):
    """A set of tasks, how to prepare them and how to score an attempt.

    Subclass it, set ``id``, implement :meth:`load_tasks` and
    :meth:`evaluate`, and override the other hooks where the defaults do not
    fit. One instance serves one request; per-task state belongs in the
    returned values (``PreparedTask``, ``RunResult``), not on ``self``, since
    many tasks run at once.

    For every attempt the runtime calls, in order: :meth:`plan` (sync),
    :meth:`prepare_task` in the open task Environment, the harness (or
    ``run_task`` of a :class:`HarnessFreeBenchmark`), :meth:`collect_artifacts`
    while that Environment is still open, then :meth:`evaluate`. Each async
    hook runs inside a cancel scope with the phase's deadline (SPEC 5): when
    it expires or the run is cancelled, the hook receives ``trio.Cancelled``
    at its next checkpoint and must let it propagate (clean up in
    ``finally``). An ``Exception`` a hook raises becomes an :class:`Issue`
    with the severity and code each hook names; raise :class:`IssueError`
    to choose them yourself.

    ``metrics`` names the metric series ``evaluate`` fills; the first is the
    primary metric (the one ``pass`` looks at). ``evaluation_timeout_values``
    are recorded when evaluation times out (empty: leave the values missing).
    """

    kind: ClassVar[str] = "benchmark"
    metrics: ClassVar[tuple[str, ...]] = ("score",)
    evaluation_timeout_values: ClassVar[dict[str, Any]] = {}

    def preflight(self, request: RunRequest) -> None:
        """Check the benchmark's data before anything runs (sync; may block).

        Called by ``compass validate`` and at the start of ``launch`` (in a
        worker thread), after the config was structured and before any run
        directory is written or any sandbox opened. Check what ``load_tasks``
        and ``select_tasks`` would trip over, so that a config that validates
        does not fail at startup: the data exists and loads, every task has
        what it needs, every id in ``request.task_ids`` exists. Raise
        :class:`ComponentError` with one line that starts with the config
        key at fault (``path: task directory '/data/x' does not exist``,
        ``task_ids: no task 'nope'``); the runtime prefixes the request and
        the benchmark. Anything else raised is reported the same way, as a
        config error. The default checks nothing.
        """

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        """Return every task of the benchmark. Called once per request, before
        any task runs. An exception here fails the request, not a task."""
        raise NotImplementedError

    def task_source(self) -> dict[str, Any] | None:
        """Where the tasks :meth:`load_tasks` returned came from, for the
        record (sync): ``run_info.json`` keeps it under ``task_source``
        (the ``terminal`` benchmark: the registry, ``name@version`` and each
        task's resolved commit). Called after ``load_tasks``; JSON data; the
        default is None (nothing recorded)."""
        return None

    def select_tasks(self, tasks: list[TaskSpec], request: RunRequest) -> list[TaskSpec]:
        """Pick the tasks to run (sync). Default: ``request.task_ids`` (in the
        order given; unknown ids are a :class:`ComponentError`), then ``request.limit``."""
        if request.task_ids is not None:
            by_id = {t.task_id: t for t in tasks}
            missing = [t for t in request.task_ids if t not in by_id]
            if missing:
                raise ComponentError(f"benchmark {self.id!r} has no task {missing[0]!r}")
            tasks = [by_id[t] for t in request.task_ids]
        if request.limit is not None:
            tasks = tasks[: request.limit]
        return tasks

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        """Return the benchmark's part of the plan (sync, deterministic).

        Keys the runtime reads: ``evaluation_environment_mode``,
        ``baseline_network_policy``, ``run_network_policy``,
        ``evaluation_network_policy`` (``NetworkPolicy`` values),
        ``run_timeout_seconds``, ``evaluation_timeout_seconds``. Anything else
        is kept for the benchmark and comes back as ``benchmark_plan``.
        """
        return {}

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        """Put what the task needs into the open task Environment and return the agent's input.

        ``env`` is already open under the baseline network policy;
        ``benchmark_plan`` is what :meth:`plan` returned beyond the keys the
        runtime reads. Return a :class:`PreparedTask` (the default passes
        ``task.data`` as the input). Unclassified exceptions are FATAL
        ``setup_failed``: the attempt is not run.
        """
        return PreparedTask(task=task, input=dict(task.data))

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        """Gather deliverables while the task Environment is still open.

        Return ``run_result``, usually with files read from ``env`` added to
        its ``artifacts`` (``attrs.evolve``); it is what :meth:`evaluate` and
        the saved record see. Called after the run ended, also when it failed
        or timed out. Unclassified exceptions are FATAL ``collect_failed``.
        """
        return run_result

    async def evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        """Score the attempt and return an :class:`Evaluation`.

        ``env`` follows the plan's ``evaluation_environment_mode``: the task
        Environment (``reuse``), a fresh one opened under the evaluation
        network policy (``fresh``) or ``None`` (``none``). Fill every series of
        ``metrics`` you can. The plan's ``evaluation_timeout_seconds`` bounds
        the call: when it expires, the values of ``evaluation_timeout_values``
        are recorded instead. Unclassified exceptions are ERROR
        ``scoring_failed``.
        """
        raise NotImplementedError

    def aggregate_metrics(self, records: Sequence[TaskRecord]) -> dict[str, Any] | None:
        """Override to replace the standard metrics (sync). ``None`` keeps them."""
        return None


class HarnessFreeBenchmark(BaseBenchmark):
    """A benchmark that runs its own inference loop; its request uses harness ``none``."""

    #: Whether ``run_task`` calls the request's model. When False, a
    #: ``${VAR}`` model API key need not be set (nothing will send it).
    uses_model: ClassVar[bool] = True

    async def run_task(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, budget: RunBudget
    ) -> RunResult:
        """Run the task in ``env`` with ``model`` (``None`` if the request has none).

        Enforce ``budget.timeout_seconds`` yourself and return a
        :class:`RunResult` whose issues say what went wrong; the runtime only
        cancels a run that overruns the budget by its compensation margin.
        Unclassified exceptions are ERROR ``benchmark_run_failed``.
        """
        raise NotImplementedError


class BaseHarness(Component):
    """An agent that works on a prepared task inside an Environment session.

    Subclass it, set ``id``, implement :meth:`run_task` and, if the agent
    needs setting up, :meth:`start_session` / :meth:`close_session`. For
    each attempt the runtime calls ``start_session``, then ``run_task``,
    then always ``close_session`` (shielded, bounded by the cleanup grace),
    all with the task Environment open under the run network policy.

    Timeouts: the harness enforces ``budget.timeout_seconds`` itself (stop
    the agent, return what it has) and reports ERROR ``harness_timeout``,
    and its step limit as ERROR ``harness_max_iterations``. The runtime
    cancels ``run_task`` only when it overruns the budget by the
    compensation margin, or when the run is cancelled; ``trio.Cancelled``
    must then propagate, with cleanup in ``finally``.
    """

    kind: ClassVar[str] = "harness"
    #: Whether the harness calls the request's model. When False (``oracle``),
    #: a ``${VAR}`` model API key need not be set: nothing will send it.
    uses_model: ClassVar[bool] = True

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> Any:
        """Set the agent up for one attempt; return any object (passed back to
        ``run_task`` and ``close_session``). ``model`` is ``None`` when the
        request has none. Unclassified exceptions are FATAL ``setup_failed``."""
        return None

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        """Run the agent on ``prepared.input`` and return its :class:`RunResult`.

        Put the conversation in ``trajectory`` and token counts in ``usage``;
        report a classified failure as an issue in the result (or raise
        :class:`IssueError`). Unclassified exceptions are FATAL ``harness_crashed``.
        """
        raise NotImplementedError

    async def close_session(self, session: Any) -> None:
        """Release what ``start_session`` acquired.

        Always called once ``start_session`` returned, even after a failure or
        a cancellation, inside a shielded scope bounded by the cleanup grace:
        it must not wait for anything unbounded. Exceptions are recorded as
        WARNING ``cleanup_failed``.
        """


class BaseRecipe(Component):
    """Fills missing plan settings; never overrides explicit user values."""

    kind: ClassVar[str] = "recipe"

    def apply(self, plan: ExecutionPlan, task: TaskSpec, request: RunRequest) -> ExecutionPlan:
        """Return the plan with this recipe's settings filled in (sync, pure)."""
        return plan


class BaseAnalyzer(Component):
    """Looks at evaluated attempts; its result goes in the attempt's ``analysis``.
    Its failure is recorded there and changes nothing else."""

    kind: ClassVar[str] = "analyzer"

    def applies_to(self, request: RunRequest, task: TaskSpec) -> bool:
        return True

    async def analyze(self, task: TaskSpec, attempt_record: Any) -> dict[str, Any]:
        raise NotImplementedError
