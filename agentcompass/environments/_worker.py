"""Blocking calls of the ``local`` environment in a worker thread, with a lighter hop.

:func:`in_worker` is ``trio.to_thread.run_sync`` for the calls a session
makes on every task and every exec (making and removing its directory,
spawning a command, scanning ``/proc``): the same worker threads and the
same default thread limiter, without copying the context and renaming the
OS thread before and after each call, which cost about a third of a hop
(bench scenario ``agent``). Don't use it for code that reads context
variables or calls back into Trio from the thread: it runs neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    import outcome

__all__ = ["in_worker"]

T = TypeVar("T")


async def in_worker(fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
    """Run ``fn(*args)`` in a worker thread and return (or raise) what it did.

    As in ``trio.to_thread.run_sync``: without ``abandon_on_cancel`` a
    cancellation waits for the call to finish, and then takes effect at the
    caller's next checkpoint; with it, the caller gets ``Cancelled`` at once
    and the call finishes unobserved (holding its thread-limiter token until
    then).
    """
    limiter = trio.to_thread.current_default_thread_limiter()
    placeholder = object()  # the token is the thread's, released when it reports back
    await limiter.acquire_on_behalf_of(placeholder)
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    abandoned = False

    def report(result: outcome.Outcome[T]) -> None:  # in the Trio thread
        limiter.release_on_behalf_of(placeholder)
        if not abandoned:
            trio.lowlevel.reschedule(task, result)

    def deliver(result: outcome.Outcome[T]) -> None:  # in the worker thread
        try:
            token.run_sync_soon(report, result)
        except trio.RunFinishedError:
            pass  # an abandoned call outlived the run: nobody is left to tell

    def abort(_: Any) -> trio.lowlevel.Abort:
        nonlocal abandoned
        if abandon_on_cancel:
            abandoned = True
            return trio.lowlevel.Abort.SUCCEEDED
        return trio.lowlevel.Abort.FAILED

    try:
        trio.lowlevel.start_thread_soon(lambda: fn(*args), deliver)
    except BaseException:
        limiter.release_on_behalf_of(placeholder)
        raise
    return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]
