"""Exec output: the streaming callback type and the standard tail truncation.

Providers keep each stream's **tail** (the end of a log is where the verdict
and the traceback are) within their ``max_output_bytes``; :class:`OutputTail`
is that rule, shared so that every place that cuts output (a provider's
``exec``, a client rebuilding a result from streamed chunks) writes the same
marker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import attrs

from ._results import ExecResult

__all__ = ["COMMAND_TAIL_BYTES", "OutputCallback", "OutputStream", "OutputTail", "command_output", "exec_keeping_tails"]

OutputStream = Literal["stdout", "stderr"]
#: ``await on_output(stream, chunk)``: called by ``EnvironmentSession.exec_stream``.
OutputCallback = Callable[[OutputStream, bytes], Awaitable[None]]


class OutputTail:
    """The last ``limit`` bytes appended, in O(limit + one chunk) memory.

    :meth:`text` decodes them as UTF-8 with ``errors="replace"``; when bytes
    were dropped, the text starts with a ``[... N earlier bytes dropped ...]``
    line and stays within ``limit`` bytes before decoding. Don't confuse it
    with a buffer that keeps everything: it exists so that output larger
    than the limit is never held whole.
    """

    def __init__(self, limit: int):
        if limit <= 0:
            raise ValueError(f"limit must be positive, not {limit}")
        self._limit = limit
        self._chunks: deque[bytes | bytearray] = deque()
        self._size = 0
        self._dropped = 0

    def append(self, data: bytes | bytearray) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._chunks and self._size - len(self._chunks[0]) >= self._limit:
            first = self._chunks.popleft()
            self._size -= len(first)
            self._dropped += len(first)

    def text(self) -> str:
        data = b"".join(self._chunks)
        dropped = self._dropped + max(0, len(data) - self._limit)
        data = data[-self._limit :]
        if dropped:
            note = f"[... {dropped} earlier bytes dropped ...]\n".encode()
            if len(note) < self._limit:
                data = note + data[len(note) :]
        return data.decode("utf-8", errors="replace")


class _StreamingExec(Protocol):
    def __call__(
        self,
        cmd: str | list[str],
        timeout: float | None = ...,
        cwd: str | None = ...,
        env: dict[str, str] | None = ...,
        *,
        on_output: OutputCallback,
    ) -> Awaitable[ExecResult]: ...


async def exec_keeping_tails(
    exec_stream: _StreamingExec,
    limit: int,
    cmd: str | list[str],
    timeout: float | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> ExecResult:
    """Run ``exec_stream`` (a session's bound method) and return its result
    with each stream's tail kept by :class:`OutputTail` within ``limit``:
    how a provider that streams natively builds its ``exec``."""
    out, err = OutputTail(limit), OutputTail(limit)

    async def keep(stream: OutputStream, chunk: bytes) -> None:
        (out if stream == "stdout" else err).append(chunk)

    result = await exec_stream(cmd, timeout, cwd, env, on_output=keep)
    return attrs.evolve(result, stdout=out.text(), stderr=err.text())


#: How much of a command's stdout and stderr :func:`command_output` keeps (bytes, from the end).
COMMAND_TAIL_BYTES = 16 * 1024


def command_output(result: ExecResult, limit: int = COMMAND_TAIL_BYTES) -> dict[str, Any]:
    """``{"exit_code", "stdout", "stderr"}`` of a finished command for an
    attempt's artifacts: each stream's last ``limit`` bytes (UTF-8), cut at
    a character boundary, with no marker (unlike :class:`OutputTail`, which
    cuts output while it streams); ``exit_code`` is None when it timed out."""
    return {
        "exit_code": None if result.timed_out else result.exit_code,
        "stdout": _last_bytes(result.stdout, limit),
        "stderr": _last_bytes(result.stderr, limit),
    }


def _last_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8", errors="replace")
    return text if len(data) <= limit else data[-limit:].decode("utf-8", errors="ignore")
