"""An in-memory Environment session: the base for a test's own small provider."""

from __future__ import annotations

from typing import Any

import trio

from agentcompass.runtime import (
    DEFAULT_MAX_READ_BYTES,
    EnvironmentSession,
    ExecResult,
    FileRefusedError,
    NetworkPolicy,
)

__all__ = ["MemorySession"]


def within_limit(path: str, data: bytes, max_bytes: int | None) -> bytes:
    """``data``, or :class:`FileRefusedError` when it is longer than ``max_bytes``
    (``None``: :data:`DEFAULT_MAX_READ_BYTES`): what the fakes' ``read_file`` returns."""
    limit = DEFAULT_MAX_READ_BYTES if max_bytes is None else max_bytes
    if len(data) > limit:
        raise FileRefusedError(f"{path!r} is larger than {limit} bytes")
    return data


class MemorySession(EnvironmentSession):
    """A session with no sandbox behind it: files live in :attr:`files`, every command exits 0.

    Subclass it in a test provider and override only what the test is
    about (a ``close`` that hangs, an ``exec`` that reports something).
    Every method is one schedule point, as a real provider's would be;
    ``close`` is idempotent. :attr:`handle` is ``{"number": number}``.
    """

    def __init__(self, number: int = 0) -> None:
        self.number = number
        self.files: dict[str, bytes] = {}
        self.policy: NetworkPolicy | None = None
        self.closed = False

    @property
    def handle(self) -> dict[str, Any]:
        return {"number": self.number}

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        await trio.lowlevel.checkpoint()
        return ExecResult(0)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes stored at ``path``; :class:`FileRefusedError` past ``max_bytes``
        (default :data:`DEFAULT_MAX_READ_BYTES`), as a real provider refuses."""
        await trio.lowlevel.checkpoint()
        try:
            data = self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None
        return within_limit(path, data, max_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await trio.lowlevel.checkpoint()
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await trio.lowlevel.checkpoint()
        self.policy = policy

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
