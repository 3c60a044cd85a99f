"""Exec output is streamed end to end: chunks reach the driver while the
command runs, a slow driver slows the command down instead of filling the
server's memory, and the driver keeps the tail the provider would keep."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import trio
import trio.testing
from _common import poll_until, processes_marked
from _remote_support import TOKEN, InProcess, exec_locally_and_remotely, remote, start_in_process
from agentcompass_remote import SandboxServer, serve_sandboxes

from agentcompass import EnvironmentSession, ExecResult, NetworkPolicy, register
from agentcompass.environments.local import LocalEnvironment

HANG_GUARD = 30


async def test_output_over_the_limit_reaches_the_driver_before_the_command_exits(server: InProcess):
    session = await remote(server.url, provider_config={"max_output_bytes": 1000}).open(None, NetworkPolicy())
    logs = Path(session.handle["inner"]["path"]) / "logs"
    os.mkfifo(logs / "go")
    expected = "".join(f"{i}\n" for i in range(1, 100001)).encode()
    received: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    streamed = trio.Event()

    async def on_output(stream: str, chunk: bytes) -> None:
        received[stream] += chunk
        if received["stdout"] == expected:
            streamed.set()

    async def release_when_streamed() -> None:
        await streamed.wait()
        # 588,895 bytes (589 x the limit) arrived, and the command is still
        # blocked on the FIFO: the server forwarded them as they came.
        await trio.to_thread.run_sync((logs / "go").write_text, "go\n")

    try:
        with trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_when_streamed)
                result = await session.exec_stream(
                    'seq 1 100000; read x < "$LOGS_DIR/go"; echo end; echo err >&2', on_output=on_output
                )
        assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (0, "", "", False)
        assert received == {"stdout": expected + b"end\n", "stderr": b"err\n"}
    finally:
        await session.close()


def _more_than_the_kernel_buffers() -> int:
    """Bytes of output that cannot all sit in the pipe, both sockets' buffers
    and the client's read at once (64 MiB, more where sockets may grow larger)."""
    most = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        try:
            most += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            most += 32 * 1024 * 1024
    return max(64 * 1024 * 1024, 2 * most + 16 * 1024 * 1024)


async def test_a_slow_driver_stalls_the_command_instead_of_filling_the_server(server: InProcess):
    size = _more_than_the_kernel_buffers()
    session = await remote(server.url, provider_config={"max_output_bytes": 1000}).open(None, NetworkPolicy())
    app = Path(session.handle["inner"]["path"]) / "app"
    taken = 0
    first = trio.Event()
    resume = trio.Event()

    async def stalled(stream: str, chunk: bytes) -> None:
        nonlocal taken
        taken += len(chunk)
        if not first.is_set():
            first.set()
            await resume.wait()

    try:
        with trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    result = await session.exec_stream(
                        f'head -c {size} /dev/zero; touch "$APP_DIR/done"', on_output=stalled
                    )
                    assert result.exit_code == 0

                nursery.start_soon(run)
                await first.wait()
                # Every task of this run, the server's included, stays blocked
                # for a while: the server reads no more output than the
                # connection takes, so the command is stuck on its full pipe.
                await trio.testing.wait_all_tasks_blocked(cushion=0.5)
                assert not (app / "done").exists()
                resume.set()
        assert taken == size and (app / "done").exists()
    finally:
        await session.close()


async def test_exec_result_over_the_limit_is_the_providers_marker_and_tail(nursery: trio.Nursery, tmp_path: Path):
    served = await start_in_process(nursery, tmp_path / "remote")
    # Invalid UTF-8 on both streams, cut mid-character: decoding must match too.
    command = "for i in $(seq 1 3000); do printf 'line %d \\xe2\\x82\\xac \\xff\\n' $i; done; seq 1 20000 >&2"
    expected, got = await exec_locally_and_remotely(served.url, tmp_path, command, 5001)
    assert got == expected
    assert got.stdout.startswith("[... ") and "earlier bytes dropped ...]\n" in got.stdout
    assert got.stderr.endswith("\n20000\n")


async def test_a_cancelled_exec_mid_stream_leaves_the_session_usable(server: InProcess):
    session = await remote(server.url).open(None, NetworkPolicy())
    sandbox = Path(session.handle["inner"]["path"])
    taken = 0
    flowing = trio.Event()

    async def count(stream: str, chunk: bytes) -> None:
        nonlocal taken
        taken += len(chunk)
        if taken > 8 * 1024 * 1024:
            flowing.set()

    try:
        with trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    await session.exec_stream("cat /dev/zero", on_output=count)

                nursery.start_soon(run)
                await flowing.wait()
                nursery.cancel_scope.cancel()  # output is in flight on every hop
            await poll_until(lambda: processes_marked(sandbox) == [], "cat to be killed", seconds=10)
            assert (await session.exec("echo again")).stdout == "again\n"
    finally:
        await session.close()


class _ExecOnlySession(EnvironmentSession):
    """A ``local`` session seen through ``exec`` alone: a provider without
    native streaming, so the server gets its output from the default
    ``exec_stream``, once the command has exited."""

    def __init__(self, inner: EnvironmentSession):
        self._inner = inner

    @property
    def handle(self) -> dict[str, Any]:
        return self._inner.handle

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        return await self._inner.exec(cmd, timeout, cwd, env)

    async def read_file(self, path: str) -> bytes:
        return await self._inner.read_file(path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._inner.write_file(path, data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._inner.set_network_policy(policy)

    async def close(self) -> None:
        await self._inner.close()


@register
class _ExecOnlyLocal(LocalEnvironment):
    id: ClassVar[str] = "test-exec-only-local"

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> EnvironmentSession:
        return _ExecOnlySession(await super().open(config, policy))


async def test_a_provider_without_streaming_gives_its_own_result(nursery: trio.Nursery, tmp_path: Path):
    # Its text is already cut (and decoded, which can make it longer than the
    # limit): the driver must not cut it again.
    command = "head -c 30000 /dev/zero | tr '\\0' '\\377'; echo; echo err >&2"
    provider = _ExecOnlyLocal({"root": str(tmp_path / "direct"), "max_output_bytes": 2000})
    session = await provider.open(None, NetworkPolicy())
    try:
        expected = await session.exec(command)
    finally:
        await session.close()
    assert len(expected.stdout.encode()) > 2000  # replacement characters are 3 bytes each
    server = SandboxServer("test-exec-only-local", TOKEN, default_config={"root": str(tmp_path / "served")})
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    env = remote(f"ws://127.0.0.1:{port}", provider="test-exec-only-local", provider_config={"max_output_bytes": 2000})
    session = await env.open(None, NetworkPolicy())
    try:
        assert await session.exec(command) == expected
    finally:
        await session.close()
