"""The runtime's own schedule points on the per-attempt path.

Taking a capacity permit and an open-rate token are Trio checkpoints, free
or not, as trio's own acquisitions are; a cancelled caller takes nothing,
and components that never yield still cannot starve the run: a task starts
as a task of its own and awaits its record's write.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from _orch_support import _instrumented, launch  # noqa: F401  (fixtures)

from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, Orchestration, RunRequest
from agentcompass._orchestration._launch import _LocalGrants
from agentcompass.runtime._results import RunBudget
from agentcompass.runtime._values import NetworkPolicy, PreparedTask, TaskSpec
from bench._noop import NOOP_SESSIONS, NoopEnvironment, NoopHarness


class _Steps(trio.abc.Instrument):
    """Counts the scheduler's steps of one task."""

    def __init__(self, task: trio.lowlevel.Task):
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def test_a_free_permit_and_an_unlimited_open_rate_are_checkpoints() -> None:
    grants = _LocalGrants()
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        await grants.acquire_capacity("schedule-points-free", object())
        assert steps.steps == 1  # a schedule point, though the permit was free
        await grants.open_token("schedule-points-free")
        assert steps.steps == 2
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert grants.registry.capacity("schedule-points-free").borrowed_tokens == 1
    with trio.CancelScope() as scope:
        scope.cancel()
        await grants.open_token("schedule-points-free")
    assert scope.cancelled_caught  # and a cancel point


async def test_a_cancelled_caller_takes_no_permit() -> None:
    grants = _LocalGrants()
    limiter = grants.registry.capacity("schedule-points-cancelled")
    with trio.CancelScope() as scope:
        scope.cancel()
        await grants.acquire_capacity("schedule-points-cancelled", object())
    assert scope.cancelled_caught
    assert limiter.borrowed_tokens == 0


async def test_a_busy_provider_still_queues_in_order() -> None:
    grants = _LocalGrants()
    grants.registry.configure("schedule-points-busy", 1, 0)
    first, second, third = object(), object(), object()
    got: list[object] = []
    await grants.acquire_capacity("schedule-points-busy", first)

    async def wait(holder: object) -> None:
        await grants.acquire_capacity("schedule-points-busy", holder)
        got.append(holder)
        grants.release_capacity("schedule-points-busy", holder)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, second)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, third)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        grants.release_capacity("schedule-points-busy", first)
    assert got == [second, third]


async def test_components_that_never_yield_do_not_starve_the_run(tmp_path: Path) -> None:
    # The no-op components make no schedule point unless asked to.
    tasks = 64
    request = RunRequest(
        name="instant",
        benchmark=ComponentRef("noop-bench", {"tasks": tasks}),
        harness=ComponentRef("noop-harness", {}),
        environment=ComponentRef("noop-env", {}),
        execution=ExecutionSpec(attempts=AttemptsSpec(k=1)),
        output_root=tmp_path,
    )
    seen: list[int] = []  # sessions opened so far, at each of the ticker's turns
    done = False

    async def ticker() -> None:
        while not done:
            seen.append(NOOP_SESSIONS["opened"])
            await trio.lowlevel.checkpoint()

    opened = NOOP_SESSIONS["opened"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        result = await launch(Orchestration([request], task_concurrency=1))
        done = True
    assert result.status == "succeeded"
    assert NOOP_SESSIONS["opened"] - opened == tasks
    # One slot, components that never yield: each task yields at least
    # once (it starts as a task of its own and awaits its record's write).
    # The ticker and the tasks run once per scheduler batch, in either
    # order, so the ticker sees at most two sandbox opens pass.
    gaps = [after - before for before, after in zip(seen, seen[1:], strict=False)]
    assert max(gaps) <= 2


@pytest.mark.parametrize("checkpoint", [False, True])
async def test_noop_components_yield_only_when_asked(checkpoint: bool) -> None:
    env = NoopEnvironment({"checkpoint": checkpoint})
    harness = NoopHarness({"checkpoint": checkpoint})
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        session = await env.open(None, NetworkPolicy())
        await harness.run_task(None, PreparedTask(TaskSpec("t"), {}), RunBudget(None))
        await session.close()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.steps == (2 if checkpoint else 0)
