"""Cancellation at every schedule point of open, exec and close: nothing
leaks on the server, and whatever survives still works."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from _common import poll_until, processes_marked
from _remote_support import TOKEN, InProcess
from agentcompass_remote import RemoteEnvironment

from agentcompass import NetworkPolicy
from agentcompass.testing import hang_guard

MAX_STEPS = 500


class _CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` right after the ``n``-th step of ``task``: the task
    is then suspended at a checkpoint, as if another task cancelled it."""

    def __init__(self, n: int, task: trio.lowlevel.Task, scope: trio.CancelScope):
        self.n, self.task, self.scope = n, task, scope
        self.steps = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.n:
                self.scope.cancel()


async def _cancelled_at(n: int, call: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
    """Run ``call()`` in a task of its own, cancelled after its ``n``-th step:
    (whether the cancellation landed, what it returned if it finished)."""
    result: list[Any] = []
    landed = False

    async def child(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal landed
        with trio.CancelScope() as scope:
            instrument = _CancelAtStep(n, trio.lowlevel.current_task(), scope)
            trio.lowlevel.add_instrument(instrument)
            try:
                task_status.started()
                result.append(await call())
            finally:
                trio.lowlevel.remove_instrument(instrument)
        landed = scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        await nursery.start(child)
    return landed, result[0] if result else None


async def test_open_cancelled_at_every_step(server: InProcess):
    env = RemoteEnvironment({"url": server.url, "token": TOKEN})
    with hang_guard(240):
        for n in range(1, MAX_STEPS):
            landed, session = await _cancelled_at(n, lambda: env.open(None, NetworkPolicy()))
            if session is not None:
                await session.close()
            assert await server.settled_count() == 0, f"a sandbox leaked when open was cancelled at step {n}"
            if not landed:
                break
        else:
            raise AssertionError("open never finished")
    assert n > 3  # the cancellation did land at several points along the way
    session = await env.open(None, NetworkPolicy())
    try:
        assert (await session.exec("echo still")).stdout == "still\n"
    finally:
        await session.close()


async def test_exec_cancelled_at_every_step_leaves_no_process_and_a_working_session(server: InProcess):
    env = RemoteEnvironment({"url": server.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy())
    sandbox = Path(session.handle["inner"]["path"])
    try:
        with hang_guard(240):
            for n in range(1, MAX_STEPS):
                landed, _ = await _cancelled_at(n, lambda: session.exec("sleep 0.05; echo done"))
                await poll_until(lambda: processes_marked(sandbox) == [], f"no process after a cancel at step {n}")
                assert (await session.exec("echo alive")).stdout == "alive\n", n
                if not landed:
                    break
            else:
                raise AssertionError("exec never finished")
    finally:
        await session.close()
    assert n > 3 and await server.settled_count() == 0


async def test_close_cancelled_at_every_step_then_closed_again_and_reaped(server: InProcess):
    env = RemoteEnvironment({"url": server.url, "token": TOKEN})
    with hang_guard(240):
        for n in range(1, MAX_STEPS):
            session = await env.open(None, NetworkPolicy())
            handle = json.loads(json.dumps(session.handle))
            landed, _ = await _cancelled_at(n, session.close)
            await session.close()
            await env.reap(handle)
            assert await server.settled_count() == 0, f"a sandbox leaked when close was cancelled at step {n}"
            if not landed:
                break
        else:
            raise AssertionError("close never finished")
