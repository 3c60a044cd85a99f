"""Connections that never authenticate: held at most ``auth_timeout`` from
the accept, at most ``max_unauthenticated`` at once, and an accept starved
of descriptors is one log line, not a traceback per connection. A real
client is served throughout."""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

import pytest
import trio
import trio.testing
from _common import processes_marked
from _remote_support import TOKEN, start_in_process, start_spawned
from agentcompass_remote import RemoteEnvironment

from agentcompass import IssueError, NetworkPolicy
from agentcompass.testing import hang_guard

#: The start of a WebSocket upgrade that never ends (no blank line).
PARTIAL_UPGRADE = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"


async def _silent(port: int, count: int, partial: int = 0) -> list[trio.SocketStream]:
    """``count`` connections that send nothing, the last ``partial`` of them
    a WebSocket upgrade cut short."""
    streams = []
    for i in range(count):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        streams.append(stream)
        if i >= count - partial:
            await stream.send_all(PARTIAL_UPGRADE)
    return streams


async def _hung_up_on(stream: trio.SocketStream) -> None:
    """Return when the server closed ``stream`` (an EOF or a reset), having
    sent nothing before."""
    try:
        data = await stream.receive_some(65536)
    except trio.BrokenResourceError:
        return
    assert data == b"", data


async def _use(env: RemoteEnvironment) -> None:
    session = await env.open(None, NetworkPolicy())
    try:
        assert (await session.exec("echo served")).stdout == "served\n"
    finally:
        await session.close()


def _ensure_descriptors(needed: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    return soft, hard


async def test_a_thousand_silent_connections_neither_block_a_client_nor_outlive_the_deadline(
    nursery: trio.Nursery, tmp_path: Path
):
    limits = _ensure_descriptors(2600)  # both ends of each connection live in this process
    silent: list[trio.SocketStream] = []
    try:
        # The default cap (1,024 connections not authenticated yet) and a deadline
        # long enough that the thousand are all held at once on a loaded host too.
        served = await start_in_process(nursery, tmp_path / "sandboxes", auth_timeout=20.0)
        port = int(served.url.rsplit(":", 1)[1])
        connected = trio.current_time()
        silent = await _silent(port, 1000, partial=200)
        with hang_guard(60):
            while served.server.admission.pending < 1000:  # the server accepts them as the kernel hands them over
                await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert served.server.admission.pending == 1000

        env = RemoteEnvironment({"url": served.url, "token": TOKEN})
        with hang_guard(served.server.auth_timeout):
            await _use(env)
        # Every silent connection is still held: the client did not wait for them.
        assert served.server.admission.pending == 1000
        assert served.server.admission.refused == 0

        async with hang_guard(served.server.auth_timeout + 10), trio.open_nursery() as waiting:
            for stream in silent:
                waiting.start_soon(_hung_up_on, stream)
        assert trio.current_time() - connected >= served.server.auth_timeout
        assert served.server.admission.pending == 0
        assert served.sandboxes() == []
    finally:
        for stream in silent:
            await trio.aclose_forcefully(stream)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


async def test_past_the_cap_a_connection_is_closed_at_once_until_the_deadline_frees_places(
    nursery: trio.Nursery, tmp_path: Path
):
    served = await start_in_process(nursery, tmp_path / "sandboxes", auth_timeout=2.0, max_unauthenticated=5)
    port = int(served.url.rsplit(":", 1)[1])
    silent = await _silent(port, 5, partial=2)
    try:
        with hang_guard(10):
            await trio.testing.wait_all_tasks_blocked()
        assert served.server.admission.pending == 5
        [extra] = await _silent(port, 1)
        refused_at = trio.current_time()
        with hang_guard(1):  # at once, not at the deadline
            await _hung_up_on(extra)
        assert trio.current_time() - refused_at < served.server.auth_timeout
        await extra.aclose()
        env = RemoteEnvironment({"url": served.url, "token": TOKEN, "retry_down_seconds": 0})
        with pytest.raises(IssueError) as full:
            await env.open(None, NetworkPolicy())
        assert full.value.code == "environment_failed"
        assert served.server.admission.refused == 3  # the stray one, the provider's probe and its open

        async with hang_guard(served.server.auth_timeout + 5), trio.open_nursery() as waiting:
            for stream in silent:
                waiting.start_soon(_hung_up_on, stream)
        with hang_guard(10):
            await _use(env)
        assert served.server.admission.pending == 0
    finally:
        for stream in silent:
            await trio.aclose_forcefully(stream)


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _read_line_with(process: trio.Process, needle: bytes, seen: bytearray) -> None:
    assert process.stderr is not None
    while needle not in seen:
        chunk = await process.stderr.receive_some(65536)
        assert chunk, f"the server exited first: {bytes(seen).decode()}"
        seen += chunk


async def test_a_server_out_of_descriptors_logs_one_line_and_serves_again_once_they_free_up(
    token_file: Path, tmp_path: Path
):
    spawned = await start_spawned(token_file, tmp_path / "server", 0, "--auth-timeout-seconds", "2")
    process = spawned.process
    stderr = bytearray()
    silent: list[trio.SocketStream] = []
    try:
        # Room for 20 more descriptors than the listening server holds.
        free = 20
        base = _descriptors(process.pid)
        resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (base + free, base + free))
        silent = await _silent(spawned.port, free + 5)
        with hang_guard(60):  # a hang guard only: the line comes once the descriptors run out
            await _read_line_with(process, b"EMFILE", stderr)

        # The silent connections' deadline frees the descriptors; the client,
        # waiting in the backlog meanwhile, is served.
        env = RemoteEnvironment({"url": spawned.url, "token": TOKEN, "connect_timeout_seconds": 60})
        with hang_guard(120):
            await _use(env)
            await _read_line_with(process, b"accepting connections again", stderr)
        assert processes_marked(spawned.root) == []
    finally:
        for stream in silent:
            await trio.aclose_forcefully(stream)
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(15, shield=True):
            await process.wait()
            assert process.stderr is not None
            while chunk := await process.stderr.receive_some(65536):
                stderr += chunk
        if process.returncode is None:
            process.kill()
    text = stderr.decode()
    assert process.returncode == 0, text
    # One line per starvation, not one per retry: each EMFILE line is followed by
    # its recovery before the next. (On a loaded host the deadlines free the
    # descriptors one by one, and the backlog can starve the server once more.)
    lines = [("EMFILE" if "EMFILE" in line else "again") for line in text.splitlines()
             if "EMFILE" in line or "accepting connections again" in line]  # fmt: skip
    assert lines[:2] == ["EMFILE", "again"], text
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False)), text
    assert "Traceback" not in text
