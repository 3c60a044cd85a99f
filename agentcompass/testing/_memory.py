"""An in-memory Environment session: the base for a test's own small provider."""

from __future__ import annotations

from typing import Any

import trio

from agentcompass.runtime import EnvironmentSession, ExecResult, NetworkPolicy

__all__ = ["MemorySession"]


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

    async def read_file(self, path: str) -> bytes:
        await trio.lowlevel.checkpoint()
        try:
            return self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    async def write_file(self, path: str, data: bytes | str) -> None:
        await trio.lowlevel.checkpoint()
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await trio.lowlevel.checkpoint()
        self.policy = policy

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
