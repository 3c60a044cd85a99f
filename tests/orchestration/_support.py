"""Helpers for engine tests: in-memory driver channels and request builders."""

from __future__ import annotations

import math
from typing import Any

import attrs
import trio

import agentcompass.testing  # noqa: F401  (registers the fakes)
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, RunRequest
from agentcompass._orchestration._context import GraceClock, RequestContext
from agentcompass._orchestration._task import run_task
from agentcompass.runtime import AttemptRecord, TaskRecord


@attrs.define
class MemoryReporter:
    events: list[tuple[str, dict[str, Any]]] = attrs.Factory(list)
    opened: list[str] = attrs.Factory(list)
    closed: list[str] = attrs.Factory(list)
    checkpoints: list[tuple[str, AttemptRecord]] = attrs.Factory(list)
    discarded: list[dict[str, Any]] = attrs.Factory(list)
    plans: list[tuple[str, int, Any]] = attrs.Factory(list)
    on_event: Any = None  # optional hook called with (kind, fields) before recording

    def event(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, fields)
        self.events.append((kind, fields))

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [f for k, f in self.events if k == kind]

    async def session_opened(self, session_id: str, provider: str, handle: dict[str, Any], name: str = "") -> None:
        await trio.lowlevel.checkpoint()
        self.opened.append(session_id)

    async def session_closed(self, session_id: str, provider: str, handle: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        self.closed.append(session_id)

    async def checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        await trio.lowlevel.checkpoint()
        self.checkpoints.append((task_id, record))

    async def attempt_plan(self, task_id: str, attempt: int, plan: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.plans.append((task_id, attempt, plan))

    async def discarded_try(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        self.discarded.append({"task_id": task_id, "attempt": attempt, "try": try_number, **data})


class MemoryGrants:
    """Capacity and open tokens granted in memory; tracks what is held."""

    def __init__(self, capacity: float = math.inf):
        self.limiter = trio.CapacityLimiter(capacity)
        self.held: set[object] = set()
        self.max_held = 0
        self.tokens = 0

    async def acquire_capacity(self, provider: str, holder: object) -> None:
        await self.limiter.acquire_on_behalf_of(holder)
        self.held.add(holder)
        self.max_held = max(self.max_held, len(self.held))

    def release_capacity(self, provider: str, holder: object) -> None:
        self.held.discard(holder)
        self.limiter.release_on_behalf_of(holder)

    async def open_token(self, provider: str) -> None:
        await trio.lowlevel.checkpoint()
        self.tokens += 1


def make_request(
    *,
    log: str = "t",
    tasks: Any = 1,
    bench: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    harness: dict[str, Any] | None = None,
    free: bool = False,
    harness_id: str = "fake-harness",
    k: int = 1,
    strategy: str = "avg",
    analyzers: list[ComponentRef] | None = None,
    recipes: list[ComponentRef] | None = None,
    output_root: Any = "runs",
    **execution: Any,
) -> RunRequest:
    bench_config = {"log": log, "tasks": tasks, **(bench or {})}
    return RunRequest(
        name="r",
        benchmark=ComponentRef("fake-free-bench" if free else "fake-bench", bench_config),
        environment=ComponentRef("fake-env", {"log": log, **(env or {})}),
        harness=ComponentRef("none") if free else ComponentRef(harness_id, {"log": log, **(harness or {})}),
        analyzers=analyzers or [],
        recipes=recipes or [],
        execution=ExecutionSpec(attempts=AttemptsSpec(k, strategy), **execution),  # type: ignore[arg-type]
        output_root=output_root,
    )


def make_context(request: RunRequest, *, grace: float = 10.0, capacity: float = math.inf):
    reporter = MemoryReporter()
    grants = MemoryGrants(capacity)
    ctx = RequestContext.build(request, grants, reporter, GraceClock(grace))
    return ctx, reporter, grants


async def run_one(request: RunRequest, task_index: int = 0, **kwargs: Any) -> tuple[TaskRecord, Any, Any, Any]:
    ctx, reporter, grants = make_context(request, **kwargs)
    tasks = await ctx.benchmark.load_tasks(request)
    record = await run_task(ctx, tasks[task_index], list(range(request.execution.attempts.k)))
    return record, reporter, grants, ctx
