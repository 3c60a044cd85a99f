"""One host process run to its end for a provider: its output's tails kept,
its timeout and every other way out ending it through the provider's kill."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ._cleanup import cleanup_deadline
from ._output import OutputTail
from ._results import ExecResult

if TYPE_CHECKING:
    import trio

#: ``exit_code`` of a command killed at its timeout, as coreutils ``timeout`` reports it.
TIMEOUT_EXIT_CODE = 124
# After the process exits, how long output a background process still holds is read.
_DRAIN_SECONDS = 0.5
_CHUNK = 65536


async def supervise_process(
    proc: trio.Process,
    max_output: int,
    timeout: float | None,
    kill: Callable[[], Awaitable[None]],
    first: Callable[[], Awaitable[None]] | None = None,
) -> ExecResult:
    """Keep the tails of ``proc``'s stdout and stderr (each at most
    ``max_output`` bytes, :class:`OutputTail`) until it exits and return its
    result. ``timeout`` (from now, ``first`` included: what to do with the
    running process before waiting for it) calls ``kill`` (which must end
    ``proc`` and whatever it started) and gives ``timed_out`` with exit code
    :data:`TIMEOUT_EXIT_CODE`; any other way out calls it too, shielded until
    the grace deadline, and propagates. Output still held open by a
    background process is read for half a second after ``proc`` exits."""
    import trio  # here, not at the top: importing the contracts loads no engine

    out, err = OutputTail(max_output), OutputTail(max_output)
    timed_out = False
    try:
        async with trio.open_nursery() as nursery:
            done = [trio.Event(), trio.Event()]
            nursery.start_soon(_pump, proc.stdout, out, done[0])
            nursery.start_soon(_pump, proc.stderr, err, done[1])
            with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
                if first is not None:
                    await first()
                await proc.wait()
            if deadline.cancelled_caught:
                timed_out = True
                await kill()
                await proc.wait()
            with trio.move_on_after(_DRAIN_SECONDS):
                for event in done:
                    await event.wait()
            nursery.cancel_scope.cancel()
    except BaseException:
        with trio.move_on_at(cleanup_deadline(), shield=True):
            await kill()
            await proc.wait()
        raise
    finally:
        with trio.move_on_at(cleanup_deadline(), shield=True):
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    await stream.aclose()
    code = TIMEOUT_EXIT_CODE if timed_out else proc.returncode
    assert code is not None
    return ExecResult(exit_code=code, stdout=out.text(), stderr=err.text(), timed_out=timed_out)


async def _pump(stream: trio.abc.ReceiveStream | None, buffer: OutputTail, done: trio.Event) -> None:
    assert stream is not None
    while chunk := await stream.receive_some(_CHUNK):
        buffer.append(chunk)
    done.set()
