"""The ``local`` environment's worker-thread hop: results, errors, and
cancellation with and without abandoning the call."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from agentcompass.environments._worker import in_worker

GUARD = 20


async def test_returns_the_value_or_raises_the_error_of_the_call():
    assert await in_worker(lambda a, b: (threading.current_thread() is threading.main_thread(), a + b), 2, 3) == (
        False,
        5,
    )
    with pytest.raises(ZeroDivisionError):
        await in_worker(lambda: 1 / 0)


async def test_a_cancelled_call_that_is_not_abandoned_finishes_and_then_the_caller_is_cancelled():
    may_finish = threading.Event()
    seen: list[str] = []

    async def caller(scope: trio.CancelScope) -> None:
        with scope:
            seen.append(await in_worker(lambda: may_finish.wait(GUARD) and "finished"))
            await trio.lowlevel.checkpoint()
            seen.append("not cancelled")
        seen.append("cancelled" if scope.cancelled_caught else "completed")

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            nursery.start_soon(caller, scope)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert seen == []  # still waiting for the call, cancelled or not
            may_finish.set()
    assert seen == ["finished", "cancelled"]


async def test_an_abandoned_call_returns_cancelled_at_once_and_keeps_its_thread_token_until_it_ends():
    limiter = trio.to_thread.current_default_thread_limiter()
    before = limiter.borrowed_tokens
    may_finish = threading.Event()
    ended = threading.Event()

    def call() -> None:
        may_finish.wait(5)  # bounded: a call that is not abandoned ends the test with a failure, not a hang
        ended.set()

    with trio.fail_after(GUARD):
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 0.05
            await in_worker(call, abandon_on_cancel=True)
        assert scope.cancelled_caught and not ended.is_set()
        assert limiter.borrowed_tokens == before + 1
        may_finish.set()
        for _ in range(GUARD * 1000):  # bounded: handed back once the thread has reported
            if limiter.borrowed_tokens == before:
                break
            await trio.sleep(0.001)
        else:
            pytest.fail("the abandoned call never gave its thread token back")
    assert ended.is_set()
