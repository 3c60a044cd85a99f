"""The accept loop's logic under a mock clock: an accept starved of
descriptors is one log line per episode and a retry every
``BACKOFF_SECONDS``; past the admission cap a connection is closed unread."""

from __future__ import annotations

import errno
import logging

import pytest
import trio
import trio.testing
from agentcompass_remote._listen import BACKOFF_SECONDS, Admission, accept_loop

from agentcompass.testing import hang_guard


class _ScriptedListener(trio.abc.Listener[trio.abc.Stream]):
    """``accept`` raises or returns what the script says, then waits forever."""

    def __init__(self, script: list[int | trio.abc.Stream]):
        self.script = list(script)
        self.accepts_at: list[float] = []

    async def accept(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.accepts_at.append(trio.current_time())
        if not self.script:
            await trio.sleep_forever()
        step = self.script.pop(0)
        if isinstance(step, int):
            raise OSError(step, "scripted")
        return step

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _stream() -> trio.abc.Stream:
    return trio.testing.memory_stream_pair()[0]


async def test_a_starved_accept_logs_once_per_episode_and_backs_off(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="agentcompass_remote.server")
    first, second = _stream(), _stream()
    listener = _ScriptedListener([errno.EMFILE] * 30 + [first, errno.ENFILE, errno.ENFILE, second])
    handled: list[trio.abc.Stream] = []
    both = trio.Event()

    async def handler(stream: trio.abc.Stream) -> None:
        handled.append(stream)
        if len(handled) == 2:
            both.set()

    with hang_guard(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_loop, listener, Admission(0), handler, nursery)
            await both.wait()
            nursery.cancel_scope.cancel()
    assert handled == [first, second]
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [
        "accept failed",
        "accepting connections again after 3.0s",
        "accept failed",
        "accepting connections again after 0.2s",
    ]
    assert "EMFILE" in lines[0] and "ENFILE" in lines[2]
    gaps = [b - a for a, b in zip(listener.accepts_at, listener.accepts_at[1:], strict=False)]
    assert gaps[:30] == pytest.approx([BACKOFF_SECONDS] * 30)


async def test_other_accept_errors_propagate(autojump_clock):
    listener = _ScriptedListener([errno.EBADF])

    async def handler(stream: trio.abc.Stream) -> None:
        raise AssertionError("nothing is accepted")

    with pytest.RaisesGroup(pytest.RaisesExc(OSError, check=lambda exc: exc.errno == errno.EBADF)):
        async with trio.open_nursery() as nursery:
            await accept_loop(listener, Admission(0), handler, nursery)


async def test_past_the_cap_a_connection_is_closed_without_a_handler(autojump_clock):
    streams = [trio.testing.memory_stream_pair() for _ in range(3)]
    listener = _ScriptedListener([ours for ours, _ in streams])
    admission = Admission(2)
    handled: list[trio.abc.Stream] = []

    async def handler(stream: trio.abc.Stream) -> None:
        handled.append(stream)  # holds its place: never leaves

    with hang_guard(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_loop, listener, admission, handler, nursery)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert handled == [streams[0][0], streams[1][0]]
    assert (admission.pending, admission.refused) == (2, 1)
    assert await streams[2][1].receive_some(10) == b""  # the third was hung up on
