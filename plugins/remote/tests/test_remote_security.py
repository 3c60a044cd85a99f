"""What the server refuses: clients without the token, oversized messages,
paths outside the session; and what it cleans up after a client killed mid-exec."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio_websocket
from _common import poll_until, processes_marked
from _remote_support import TOKEN, InProcess, ask, open_raw, start_in_process
from agentcompass_remote import PROTOCOL_VERSION, RemoteEnvironment

from agentcompass import IssueError, NetworkPolicy

OPEN = {"type": "open", "name": "intruder", "provider": "local", "policy": {"mode": "full", "allow": []}}


async def _refused(ws: trio_websocket.WebSocketConnection) -> int | None:
    """Wait for the server to close the connection; its close code."""
    with pytest.raises(trio_websocket.ConnectionClosed) as closed:
        while True:
            await ws.get_message()
    return closed.value.reason.code


@pytest.mark.parametrize("token", [None, "", "wrong-token", TOKEN + "x", TOKEN[:-1]])
async def test_a_missing_or_wrong_token_is_refused_before_any_session(server: InProcess, token: str | None):
    async with trio_websocket.open_websocket_url(server.url) as ws:
        message = {"type": "hello", "version": PROTOCOL_VERSION} | ({} if token is None else {"token": token})
        await ws.send_message(json.dumps(message))
        # An open sent right behind the bad hello must not create anything.
        await ws.send_message(json.dumps(OPEN))
        assert await _refused(ws) == 4001
    assert server.server.load == 0 and server.sandboxes() == []


async def test_an_open_instead_of_a_hello_is_refused(server: InProcess):
    async with trio_websocket.open_websocket_url(server.url) as ws:
        await ws.send_message(json.dumps(OPEN | {"token": TOKEN}))
        assert await _refused(ws) == 4001
    assert server.sandboxes() == []


async def test_a_token_sent_after_the_auth_timeout_is_refused(nursery: trio.Nursery, tmp_path: Path):
    served = await start_in_process(nursery, tmp_path / "sandboxes", auth_timeout=0.3)
    started = trio.current_time()  # the deadline runs from the accept, upgrade included
    async with trio_websocket.open_websocket_url(served.url) as ws:
        assert await _refused(ws) == 4001  # the server hangs up on its own
        assert trio.current_time() - started >= 0.3
        with pytest.raises(trio_websocket.ConnectionClosed):
            await ws.send_message(json.dumps({"type": "hello", "version": PROTOCOL_VERSION, "token": TOKEN}))
    assert served.server.load == 0 and served.sandboxes() == []


async def test_the_provider_refuses_a_wrong_token_as_environment_failed(server: InProcess):
    env = RemoteEnvironment({"url": server.url, "token": "not-it"})
    with pytest.raises(IssueError) as failed:
        await env.open(None, NetworkPolicy())
    assert (failed.value.severity, failed.value.code) == ("fatal", "environment_failed")
    assert "not-it" not in failed.value.message and TOKEN not in failed.value.message
    assert server.sandboxes() == []


@pytest.mark.parametrize("authenticated", [False, True])
async def test_an_oversized_message_closes_the_connection_and_the_server_lives_on(
    server: InProcess, authenticated: bool
):
    async with trio_websocket.open_websocket_url(server.url) as ws:
        if authenticated:
            await open_raw(ws)
            assert server.server.load == 1
        try:
            await ws.send_message(b"\0" * (2 * 1024 * 1024))
        except trio_websocket.ConnectionClosed as closed:  # closed while we were still sending
            code = closed.reason.code
        else:
            code = await _refused(ws)
        assert code == 1009
    # The session of that connection is closed, and the server still serves.
    assert await server.settled_count() == 0
    env = RemoteEnvironment({"url": server.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy())
    try:
        assert (await session.exec("echo alive")).stdout == "alive\n"
    finally:
        await session.close()


ESCAPES = ["../outside.txt", "app/../../outside.txt", "/etc/passwd", "/app/../../outside.txt", "//etc/passwd", "/"]


async def test_paths_outside_the_session_are_refused_by_the_server(server: InProcess, tmp_path: Path):
    secret = tmp_path / "host" / "outside.txt"
    secret.parent.mkdir()
    secret.write_text("host file")
    async with trio_websocket.open_websocket_url(server.url) as ws:
        await open_raw(ws)
        op = 0
        for path in ESCAPES:
            op += 1
            reply = await ask(ws, {"type": "read_file", "id": op, "path": path})
            assert reply["type"] == "error" and "outside the session" in reply["message"], (path, reply)
            op += 1
            await ws.send_message(json.dumps({"type": "write_file", "id": op, "path": path, "size": 1}))
            await ws.send_message(b"\0\0\0" + bytes([op, 3]) + b"x")
            reply = json.loads(await ws.get_message())
            assert reply["type"] == "error" and "outside the session" in reply["message"], (path, reply)
            op += 1
            reply = await ask(ws, {"type": "exec", "id": op, "cmd": "pwd", "cwd": path})
            assert reply["type"] == "error", (path, reply)
        # A symlink pointing out is caught by the provider behind the server.
        op += 1
        assert (await ask(ws, {"type": "exec", "id": op, "cmd": f"ln -s {secret.parent} out"}))["exit_code"] == 0
        op += 1
        reply = await ask(ws, {"type": "read_file", "id": op, "path": "/app/out/outside.txt"})
        assert reply["type"] == "error" and reply["code"] == "file_refused" and "symbolic link" in reply["message"]
        # The session still works for paths inside it, however they are spelled.
        op += 1
        await ws.send_message(json.dumps({"type": "write_file", "id": op, "path": "/logs/../app/in.txt", "size": 2}))
        await ws.send_message(b"\0\0\0" + bytes([op, 3]) + b"ok")
        assert json.loads(await ws.get_message())["type"] == "done"
        op += 1
        await ws.send_message(json.dumps({"type": "read_file", "id": op, "path": "app/in.txt"}))
        assert await ws.get_message() == b"\0\0\0" + bytes([op, 3]) + b"ok"
        assert json.loads(await ws.get_message()) == {"type": "done", "id": op, "size": 2}
    assert await server.settled_count() == 0
    assert secret.read_text() == "host file"
    assert sorted(p.name for p in secret.parent.iterdir()) == ["outside.txt"]


async def test_the_provider_refuses_paths_outside_the_session(server: InProcess):
    session = await RemoteEnvironment({"url": server.url, "token": TOKEN}).open(None, NetworkPolicy())
    try:
        for path in ESCAPES:
            with pytest.raises(IssueError, match="outside the session"):
                await session.read_file(path)
            with pytest.raises(IssueError, match="outside the session"):
                await session.write_file(path, b"x")
        await session.write_file("/app/inside.txt", b"ok")
        assert await session.read_file("app/inside.txt") == b"ok"
    finally:
        await session.close()


CLIENT = """
import json, sys, trio
from agentcompass import NetworkPolicy
from agentcompass_remote import RemoteEnvironment

async def main():
    env = RemoteEnvironment({"url": sys.argv[1], "token": sys.argv[2]})
    session = await env.open(None, NetworkPolicy(), "killed-client")
    print(json.dumps(session.handle), flush=True)
    await session.exec('sleep 1000 & echo started > "$APP_DIR/started"; wait')

trio.run(main)
"""


async def test_a_client_killed_mid_exec_leaves_no_session_and_no_process(nursery: trio.Nursery, tmp_path: Path):
    served = await start_in_process(nursery, tmp_path / "sandboxes", grace=3.0)
    client = await trio.lowlevel.open_process([sys.executable, "-c", CLIENT, served.url, TOKEN], stdout=subprocess.PIPE)
    try:
        assert client.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                line += await client.stdout.receive_some(4096)
        sandbox = Path(json.loads(line)["inner"]["path"])
        await poll_until(lambda: (sandbox / "app" / "started").exists(), "the exec to start")
        assert processes_marked(sandbox)  # bash and sleep are running
        client.send_signal(signal.SIGKILL)
        await client.wait()
        killed_at = trio.current_time()
        await poll_until(lambda: served.server.load == 0, "the server to close the session", seconds=3.0 + 1)
        assert trio.current_time() - killed_at <= 3.0
        assert not sandbox.exists()
        assert processes_marked(sandbox) == []
    finally:
        if client.returncode is None:
            client.kill()
        with trio.move_on_after(5, shield=True):
            await client.wait()
    assert os.listdir(tmp_path / "sandboxes") == []
