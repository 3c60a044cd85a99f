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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ._errors import ComponentError
from ._results import Evaluation, ExecResult, RunBudget, RunResult, TaskRecord
from ._values import (
    ExecutionPlan,
    ModelSpec,
    NetworkPolicy,
    PreparedTask,
    RunRequest,
    TaskSpec,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._output import OutputCallback

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


class Component:
    """Common base: ``id``, ``kind`` and config checking."""

    id: ClassVar[str]
    kind: ClassVar[str] = "component"
    #: Optional attrs class describing the accepted config keys and defaults.
    Config: ClassVar[type | None] = None

    def __init__(self, config: dict[str, Any] | None = None):
        self.config: dict[str, Any] = dict(config or {})
        self.options: Any = self.config
        if self.Config is not None:
            from .._convert import structure_config

            self.options = structure_config(
                self.config, self.Config, where=f"{self.kind} {getattr(self, 'id', type(self).__name__)!r}"
            )


class BaseBenchmark(Component):
    """A set of tasks, how to prepare them and how to score an attempt.

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
        """Put what the task needs into the open task Environment and return the
        agent's input. Unclassified exceptions are FATAL ``setup_failed``."""
        return PreparedTask(task=task, input=dict(task.data))

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        """Gather deliverables while the task Environment is still open.
        Unclassified exceptions are FATAL ``collect_failed``."""
        return run_result

    async def evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        """Score the attempt. ``env`` is the task Environment (mode ``reuse``), a
        fresh one (``fresh``) or ``None`` (``none``). Unclassified exceptions are
        ERROR ``scoring_failed``."""
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
        """Run the task. Unclassified exceptions are ERROR ``benchmark_run_failed``."""
        raise NotImplementedError


class BaseHarness(Component):
    """An agent that works on a prepared task inside an Environment session.

    It enforces ``budget.timeout_seconds`` itself and reports ERROR
    ``harness_timeout``, and its step limit as ERROR ``harness_max_iterations``.
    """

    kind: ClassVar[str] = "harness"
    #: Whether the harness calls the request's model. When False (``oracle``),
    #: a ``${VAR}`` model API key need not be set: nothing will send it.
    uses_model: ClassVar[bool] = True

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> Any:
        """Set the agent up; the returned object is passed back to ``run_task``
        and ``close_session``. Unclassified exceptions are FATAL ``setup_failed``."""
        return None

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        """Run the agent. Unclassified exceptions are FATAL ``harness_crashed``."""
        raise NotImplementedError

    async def close_session(self, session: Any) -> None:
        """Release what ``start_session`` acquired; always called, shielded."""


class EnvironmentSession:
    """One open sandbox. Paths are relative to the sandbox unless the provider
    documents otherwise. ``close`` must be idempotent and safe after a partial
    open, a failure or a cancellation."""

    @property
    def handle(self) -> dict[str, Any]:
        """A small JSON dict identifying the sandbox for ``reap``."""
        raise NotImplementedError

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a string for ``bash -c`` or an argv list)."""
        raise NotImplementedError

    async def exec_stream(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        on_output: OutputCallback,
    ) -> ExecResult:
        """Run ``cmd`` as :meth:`exec` does, handing its output to ``on_output``
        as it arrives instead of keeping it.

        ``await on_output(stream, chunk)`` is called with ``stream``
        ``"stdout"`` or ``"stderr"`` and the next bytes of that stream, in
        order, none dropped: the caller decides what to keep
        (:class:`OutputTail` keeps what ``exec`` would). While a call is
        awaited, the provider reads no more of that stream, so a slow
        consumer slows the command down (its pipe fills) instead of making
        output pile up in memory. The result has ``exit_code`` and
        ``timed_out`` as ``exec`` would; its ``stdout`` and ``stderr`` are
        empty. Timeout and cancellation work as in ``exec`` (the timeout
        still fires while ``on_output`` blocks); an exception raised by
        ``on_output`` kills the command's tree and propagates (in an
        exception group where the provider runs tasks: catch it with
        ``except*``).

        Optional: this default runs :meth:`exec` and then hands over its
        result's text (already cut to the provider's limit, UTF-8 encoded),
        so every provider has it. A provider that reads output in chunks
        should override it and build ``exec`` on it.
        """
        result = await self.exec(cmd, timeout, cwd, env)
        if result.stdout:
            await on_output("stdout", result.stdout.encode("utf-8", errors="surrogateescape"))
        if result.stderr:
            await on_output("stderr", result.stderr.encode("utf-8", errors="surrogateescape"))
        return attrs.evolve(result, stdout="", stderr="")

    async def read_file(self, path: str) -> bytes:
        raise NotImplementedError

    async def write_file(self, path: str, data: bytes | str) -> None:
        raise NotImplementedError

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Switch the live policy; raise if it cannot be enforced."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class BaseEnvironment(Component):
    """A sandbox provider. ``id`` is what capacity and open-rate limits key on."""

    kind: ClassVar[str] = "environment"

    def build_config(self, plan: ExecutionPlan) -> Any:
        """Turn a plan into an ``open`` config (sync). Reject (raise
        :class:`ComponentError`) a plan whose phase policies this provider
        cannot enforce or switch: never run a phase with broader access."""
        return None

    async def open(self, config: Any, policy: NetworkPolicy) -> EnvironmentSession:
        """Open a session under ``policy``. Clean up anything half-made before raising."""
        raise NotImplementedError

    async def reap(self, handle: dict[str, Any]) -> None:
        """Destroy a sandbox left behind by a killed process (idempotent)."""


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
