"""One output pipe of a ``local`` exec, read until EOF or until a short drain after the command exited."""

from __future__ import annotations

import fcntl
import math

import trio

from agentcompass.runtime import OutputCallback, OutputStream

__all__ = ["Pipe"]

_CHUNK = 65536
# A pipe that a read fills is given this much buffer where the kernel allows
# (Linux, within the user's pipe quota): the command and the reader then take
# turns 16 times less often (bench scenario remote_stream).
_BUSY_PIPE_BYTES = 1 << 20
# After the command exits, how long to keep waiting for output that a background
# process holding the pipes might still write; exec never waits for its EOF.
# Time spent handing output to a streaming consumer is not counted.
_DRAIN_SECONDS = 0.5


class Pipe:
    """One output pipe of an exec: read until EOF or, once the command has
    exited, until :data:`_DRAIN_SECONDS` of waiting for more have passed."""

    def __init__(self, name: OutputStream, stream: trio.lowlevel.FdStream):
        self._name: OutputStream = name
        self._stream = stream
        self._wait_left = math.inf
        self._waiting_since = 0.0
        self._scope: trio.CancelScope | None = None
        self._read_size = _CHUNK
        self._grown = False

    def command_exited(self) -> None:
        now = trio.current_time()
        self._wait_left, self._waiting_since = _DRAIN_SECONDS, now
        if self._scope is not None:  # waiting right now: from now on, for at most the drain
            self._scope.deadline = now + _DRAIN_SECONDS

    async def pump(self, on_output: OutputCallback) -> None:
        while True:
            self._waiting_since = trio.current_time()
            chunk = b""
            with trio.CancelScope(deadline=self._waiting_since + self._wait_left) as self._scope:
                chunk = await self._stream.receive_some(self._read_size)
            self._scope = None
            self._wait_left -= trio.current_time() - self._waiting_since
            if not chunk:
                return
            if len(chunk) == _CHUNK and not self._grown:
                self._grown = True
                self._read_size = _grow_pipe(self._stream)
            await on_output(self._name, chunk)


def _grow_pipe(stream: trio.lowlevel.FdStream) -> int:
    """Give a busy pipe a larger buffer where the kernel allows; the read size to use."""
    fileno = getattr(stream, "fileno", None)
    if fileno is None or not hasattr(fcntl, "F_SETPIPE_SZ"):
        return _CHUNK
    try:
        return max(_CHUNK, fcntl.fcntl(fileno(), fcntl.F_SETPIPE_SZ, _BUSY_PIPE_BYTES))
    except OSError:  # EPERM beyond the user's pipe quota: the pipe keeps its size
        return _CHUNK
