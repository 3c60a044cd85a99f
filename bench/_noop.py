"""Minimal no-op components for the overhead benchmarks (importing this module registers them).

Unlike the ``fake-*`` components these log nothing and script nothing: each
call does the least a component may do, so what a benchmark measures is the
runtime's own cost. That least is nothing at all, not even a schedule point,
unless a ``sleep`` is configured (then a ``trio.sleep``) or ``checkpoint`` is
set (then one ``trio.lowlevel.checkpoint()`` per call that would otherwise not
yield). A schedule point is a cost of its own under load: it puts the call
behind every runnable task, so attempts that all yield right after waking
advance in lockstep (see :mod:`bench`). The runtime itself yields at least
once every few tasks, so components that never yield starve nothing.

- ``noop-bench`` (Benchmark): ``tasks`` (3) tasks ``t0000000``, ``t0000001``, ...
- ``noop-free-bench`` (HarnessFreeBenchmark): the same; ``run_task`` sleeps ``sleep`` (0) seconds;
  ``checkpoint`` (false).
- ``noop-env`` (Environment): ``open`` sleeps ``sleep`` (0) seconds; ``record_opens`` (false),
  ``checkpoint`` (false).
- ``noop-harness`` (Harness): ``run_task`` sleeps ``sleep`` (0) seconds; ``checkpoint`` (false).

Every task scores ``{"score": 1.0}``. Sessions count themselves in
:data:`NOOP_SESSIONS` (``opened``, ``closed``), per process, so a benchmark
can check that every session it opened was closed; with ``record_opens``
the Trio time of every open is appended to :data:`NOOP_OPEN_TIMES`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import trio

from agentcompass import register
from agentcompass.runtime import (
    BaseBenchmark,
    BaseEnvironment,
    BaseHarness,
    EnvironmentSession,
    Evaluation,
    ExecResult,
    ExecutionPlan,
    HarnessFreeBenchmark,
    ModelSpec,
    NetworkPolicy,
    PreparedTask,
    RunBudget,
    RunRequest,
    RunResult,
    TaskSpec,
)

__all__ = [
    "NOOP_OPEN_TIMES",
    "NOOP_SESSIONS",
    "NoopBenchmark",
    "NoopEnvironment",
    "NoopHarness",
    "NoopHarnessFreeBenchmark",
    "NoopSession",
]

#: Sessions opened and closed by ``noop-env`` in this process.
NOOP_SESSIONS: dict[str, int] = {"opened": 0, "closed": 0}
#: ``trio.current_time()`` of each ``noop-env`` open, when ``record_opens`` is set.
NOOP_OPEN_TIMES: list[float] = []


def _non_negative(_instance: Any, attribute: Any, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{attribute.name}: expected a number >= 0, got {value!r}")


@attrs.frozen
class NoopBenchmarkConfig:
    tasks: int = attrs.field(default=3, validator=_non_negative)
    sleep: float = attrs.field(default=0.0, validator=_non_negative)
    checkpoint: bool = False


@attrs.frozen
class NoopSleepConfig:
    sleep: float = attrs.field(default=0.0, validator=_non_negative)
    checkpoint: bool = False


@attrs.frozen
class NoopEnvironmentConfig:
    sleep: float = attrs.field(default=0.0, validator=_non_negative)
    record_opens: bool = False
    checkpoint: bool = False


async def _pause(seconds: float, checkpoint: bool) -> None:
    if seconds:
        await trio.sleep(seconds)
    elif checkpoint:
        await trio.lowlevel.checkpoint()


_RESULT = RunResult(output="answer")
_VALUES = {"score": 1.0}


@register
class NoopBenchmark(BaseBenchmark):
    """``noop-bench``: ``tasks`` tasks ``t0000000`` ...; every attempt scores 1."""

    id: ClassVar[str] = "noop-bench"
    Config: ClassVar[type | None] = NoopBenchmarkConfig
    options: NoopBenchmarkConfig

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        await trio.lowlevel.checkpoint()
        return [TaskSpec(f"t{i:07d}", data={}) for i in range(int(self.options.tasks))]

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        return PreparedTask(task=task, input={})

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        return run_result

    async def evaluate(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession | None, request: RunRequest
    ) -> Evaluation:
        return Evaluation(dict(_VALUES))


@register
class NoopHarnessFreeBenchmark(NoopBenchmark, HarnessFreeBenchmark):
    """``noop-free-bench``: :class:`NoopBenchmark` whose ``run_task`` sleeps ``sleep`` seconds."""

    id: ClassVar[str] = "noop-free-bench"

    async def run_task(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, budget: RunBudget
    ) -> RunResult:
        await _pause(self.options.sleep, self.options.checkpoint)
        return _RESULT


class NoopSession(EnvironmentSession):
    """A session of ``noop-env``: nothing behind it; ``close`` is idempotent."""

    __slots__ = ("_closed", "_id")
    _next = 0

    def __init__(self) -> None:
        NoopSession._next += 1
        self._id = NoopSession._next
        self._closed = False
        NOOP_SESSIONS["opened"] += 1

    @property
    def handle(self) -> dict[str, Any]:
        return {"noop": self._id}

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        await trio.lowlevel.checkpoint()
        return ExecResult(0)

    async def read_file(self, path: str) -> bytes:
        await trio.lowlevel.checkpoint()
        raise FileNotFoundError(path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await trio.lowlevel.checkpoint()

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            NOOP_SESSIONS["closed"] += 1


@register
class NoopEnvironment(BaseEnvironment):
    """``noop-env``: sessions with nothing behind them; ``open`` sleeps ``sleep`` seconds."""

    id: ClassVar[str] = "noop-env"
    Config: ClassVar[type | None] = NoopEnvironmentConfig
    options: NoopEnvironmentConfig

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> NoopSession:
        if self.options.record_opens:
            NOOP_OPEN_TIMES.append(trio.current_time())
        await _pause(self.options.sleep, self.options.checkpoint)
        return NoopSession()


@register
class NoopHarness(BaseHarness):
    """``noop-harness``: ``run_task`` sleeps ``sleep`` seconds and returns a fixed answer."""

    id: ClassVar[str] = "noop-harness"
    Config: ClassVar[type | None] = NoopSleepConfig
    options: NoopSleepConfig

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> None:
        return None

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        await _pause(self.options.sleep, self.options.checkpoint)
        return _RESULT

    async def close_session(self, session: Any) -> None:
        return None
