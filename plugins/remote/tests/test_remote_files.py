"""``read_file(path, max_bytes)`` over the protocol: the byte cap travels to
the server, which caps it by its own ``max_file_bytes``, and a refusal comes
back as :class:`~agentcompass.FileRefusedError`, not a generic failure.
``exec_private`` is forwarded with its inputs (to a provider written before
inputs, without them), or is :exc:`NotImplementedError` when the server's
provider lacks it; backed by ``sandbox``, the inputs are what the command
reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio_websocket
from _remote_support import TOKEN, ask, open_raw, requires_sandbox, start_in_process
from agentcompass_remote import PROTOCOL_VERSION, RemoteEnvironment, SandboxServer, serve_sandboxes

import agentcompass
from agentcompass import EnvironmentSession, FileRefusedError, IssueError, NetworkPolicy
from agentcompass.environments.local import LocalEnvironment
from agentcompass.testing import hang_guard


async def test_read_file_carries_max_bytes_and_a_refusal_comes_back_as_file_refused(
    nursery: trio.Nursery, tmp_path: Path
):
    served = await start_in_process(nursery, tmp_path / "sandboxes", max_file_bytes=1000)
    env = RemoteEnvironment({"url": served.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy())
    try:
        await session.write_file("/app/small", b"x" * 100)
        await session.write_file("/app/big", b"y" * 1000)
        assert await session.read_file("/app/small", max_bytes=100) == b"x" * 100
        with pytest.raises(FileRefusedError) as refused:
            await session.read_file("/app/small", max_bytes=99)
        assert "larger than 99 bytes" in str(refused.value)
        assert isinstance(refused.value, OSError) and not isinstance(refused.value, IssueError)
        # No max_bytes: the runtime's default, capped by the server's own limit.
        await session.exec("head -c 1001 /dev/zero > $APP_DIR/huge")
        with pytest.raises(FileRefusedError, match="larger than 1000 bytes"):
            await session.read_file("/app/huge")
        assert await session.read_file("/app/big") == b"y" * 1000
        # What the session made is refused by the provider behind the server, and comes back as such.
        await session.exec("ln -s /etc $APP_DIR/etc && mkfifo $APP_DIR/fifo")
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.read_file("/app/etc/passwd")
        with pytest.raises(FileRefusedError, match="not a regular file"):
            await session.read_file("/app/fifo")
        # A refusal is one operation's failure: the session goes on.
        with pytest.raises(FileNotFoundError):
            await session.read_file("/app/missing")
        assert (await session.exec("echo on")).stdout == "on\n"
    finally:
        await session.close()


async def test_the_wire_carries_max_bytes_and_the_file_refused_code(server):
    async with trio_websocket.open_websocket_url(server.url) as ws:
        await open_raw(ws)
        ok = await ask(ws, {"type": "write_file", "id": 1, "path": "/app/f", "size": 0})
        assert ok == {"type": "done", "id": 1}
        await ws.send_message(json.dumps({"type": "exec", "id": 2, "cmd": "printf 12345 > $APP_DIR/f"}))
        while not isinstance(reply := await ws.get_message(), str):
            pass
        assert json.loads(reply)["type"] == "exit"
        refused = await ask(ws, {"type": "read_file", "id": 3, "path": "/app/f", "max_bytes": 4})
        assert refused["type"] == "error" and refused["id"] == 3 and refused["code"] == "file_refused"
        assert (await ask(ws, {"type": "read_file", "id": 4, "path": "/app/f", "max_bytes": 5}))["size"] == 5
        # A max_bytes that is not a byte count is a protocol error: the server hangs up.
        await ws.send_message(json.dumps({"type": "read_file", "id": 5, "path": "/app/f", "max_bytes": "lots"}))
        replies = []
        with pytest.raises(trio_websocket.ConnectionClosed):
            while True:
                replies.append(json.loads(await ws.get_message()))
        assert [(r["type"], r["id"]) for r in replies if r["type"] == "error"] == [("error", None)]
        assert "max_bytes" in replies[-1]["message"]


async def test_a_client_of_the_previous_protocol_version_is_refused_with_both_versions(server):
    assert PROTOCOL_VERSION == 5
    async with trio_websocket.open_websocket_url(server.url) as ws:
        await ws.send_message(json.dumps({"type": "hello", "version": 4, "token": TOKEN}))
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason.code == 4002
        assert closed.value.reason.reason == "the client speaks protocol version 4, this server 5"
    # A stranger learns nothing: a wrong token with another version is the plain refusal.
    async with trio_websocket.open_websocket_url(server.url) as ws:
        await ws.send_message(json.dumps({"type": "hello", "version": 4, "token": "wrong"}))
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason.code == 4001


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        # A later server names both versions itself.
        (4002, "the client speaks protocol version 5, this server 6", "protocol version 5, this server 6"),
        # A server before protocol 5 refused another version as a wrong token: the driver says it may be that.
        (4001, "authentication failed", "another protocol than version 5"),
    ],
)
async def test_the_provider_names_the_version_when_a_server_of_another_version_refuses_it(
    nursery: trio.Nursery, code: int, reason: str, expected: str
):
    async def refuse(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()
        await ws.aclose(code, reason)

    listener = await nursery.start(trio_websocket.serve_websocket, refuse, "127.0.0.1", 0, None)
    url = f"ws://127.0.0.1:{listener.port}"
    with pytest.raises(IssueError) as refused:
        await RemoteEnvironment({"url": url, "token": TOKEN}).open(None, NetworkPolicy())
    assert expected in refused.value.message and "\n" not in refused.value.message


class _PrivateSession(EnvironmentSession):
    """A ``local`` session with a stand-in ``exec_private`` (not private at
    all: the command's directory is a fresh one under the sandbox), to see
    what the protocol carries."""

    def __init__(self, inner: EnvironmentSession):
        self._inner = inner

    @property
    def handle(self) -> dict:
        return self._inner.handle

    async def exec(self, cmd, timeout=None, cwd=None, env=None):
        return await self._inner.exec(cmd, timeout, cwd, env)

    async def exec_private(self, cmd, timeout=None, cwd=None, env=None, *, directory, max_bytes):
        _private_calls.append((directory, max_bytes))
        made = await self._inner.exec("d=$(mktemp -d -p $APP_DIR) && echo -n $d")
        result = await self._inner.exec(cmd, timeout, cwd, {**(env or {}), "PRIVATE_DIR": made.stdout})
        listing = await self._inner.exec(f"cd {made.stdout} && find . -type f -printf '%P\\n'")
        files = {}
        for name in listing.stdout.split():
            files[name] = (Path(made.stdout) / name).read_bytes()
        return result, files

    async def read_file(self, path, max_bytes=None):
        return await self._inner.read_file(path, max_bytes)

    async def write_file(self, path, data):
        await self._inner.write_file(path, data)

    async def set_network_policy(self, policy):
        await self._inner.set_network_policy(policy)

    async def close(self):
        await self._inner.close()


_private_calls: list[tuple[str, int]] = []
_received_inputs: list[dict[str, bytes] | None] = []


class _InputsSession(_PrivateSession):
    """The stand-in, with inputs: it records them and writes them under its
    directory's ``inputs/`` for the command."""

    async def exec_private(self, cmd, timeout=None, cwd=None, env=None, *, directory, max_bytes, inputs=None):
        _received_inputs.append(None if inputs is None else dict(inputs))
        return await super().exec_private(cmd, timeout, cwd, env, directory=directory, max_bytes=max_bytes)


@agentcompass.register
class _PrivateLocal(LocalEnvironment):
    id = "test-remote-private-local"

    async def open(self, config, policy, name=None):
        return _PrivateSession(await super().open(config, policy, name))


@agentcompass.register
class _InputsLocal(LocalEnvironment):
    id = "test-remote-inputs-local"

    async def open(self, config, policy, name=None):
        return _InputsSession(await super().open(config, policy, name))


async def test_exec_private_is_forwarded_with_its_files(nursery: trio.Nursery, tmp_path: Path):
    _private_calls.clear()
    root = tmp_path / "sandboxes"
    server = SandboxServer(_PrivateLocal.id, TOKEN, default_config={"root": str(root)}, max_file_bytes=5000)
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    env = RemoteEnvironment({"url": f"ws://127.0.0.1:{port}", "token": TOKEN, "provider": _PrivateLocal.id})
    session = await env.open(None, NetworkPolicy())
    try:
        script = 'echo out; echo err >&2; echo -n 1 > "$PRIVATE_DIR/reward.txt"; mkdir "$PRIVATE_DIR/d"; printf "\\xff" > "$PRIVATE_DIR/d/bin"; exit 3'
        result, files = await session.exec_private(script, 30, directory="/logs/verifier", max_bytes=1 << 20)
        assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
        assert files == {"reward.txt": b"1", "d/bin": b"\xff"}
        assert _private_calls == [("/logs/verifier", 5000)]  # capped by the server's limit
        # A directory outside the session never reaches the provider.
        with pytest.raises(IssueError, match="outside the session"):
            await session.exec_private("true", directory="/etc", max_bytes=10)
        assert len(_private_calls) == 1
        # Inputs for a provider written before them: an empty set is no inputs at all.
        result, _ = await session.exec_private("true", directory="/logs/verifier", max_bytes=10, inputs={})
        assert result.exit_code == 0 and len(_private_calls) == 2
    finally:
        await session.close()


_INPUTS = {
    "/tests/test.sh": b"echo 0 > /logs/verifier/reward.txt\n",
    "/tests/data/deep/big.bin": bytes(range(256)) * 4096,  # 1 MiB: several chunks each way
    "/tests/empty": b"",
    "/solution/solve.sh": b"\xff\x00",
}


async def test_exec_private_forwards_its_inputs_exactly(nursery: trio.Nursery, tmp_path: Path):
    _received_inputs.clear()
    root = tmp_path / "sandboxes"
    server = SandboxServer(_InputsLocal.id, TOKEN, default_config={"root": str(root)}, max_file_bytes=2 << 20)
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    env = RemoteEnvironment({"url": f"ws://127.0.0.1:{port}", "token": TOKEN, "provider": _InputsLocal.id})
    session = await env.open(None, NetworkPolicy())
    try:
        with hang_guard(30):
            result, _ = await session.exec_private("echo ran", directory="/logs/verifier", max_bytes=10, inputs=_INPUTS)
            assert result.stdout == "ran\n"
            result, _ = await session.exec_private("true", directory="/logs/verifier", max_bytes=10)
            assert result.exit_code == 0
            assert _received_inputs == [_INPUTS, None]  # and none when there are none
            # An input outside the session is refused before anything is sent.
            with pytest.raises(IssueError, match="outside the session"):
                await session.exec_private("true", directory="/logs/verifier", max_bytes=10, inputs={"/etc/x": b""})
            with pytest.raises(ValueError, match="not bytes"):
                await session.exec_private("true", directory="/logs/verifier", max_bytes=10, inputs={"/tests/x": "s"})
            assert len(_received_inputs) == 2
            # More than the server takes is a protocol error: the session goes, FATAL.
            with pytest.raises(IssueError) as lost:
                await session.exec_private(
                    "true", directory="/logs/verifier", max_bytes=10, inputs={"/tests/huge": b"x" * (3 << 20)}
                )
            assert (lost.value.severity, lost.value.code) == ("fatal", "environment_failed")
            assert len(_received_inputs) == 2
    finally:
        await session.close()


async def test_the_wire_carries_inputs_as_file_data_after_the_request(nursery: trio.Nursery, tmp_path: Path):
    _received_inputs.clear()
    server = SandboxServer(_InputsLocal.id, TOKEN, default_config={"root": str(tmp_path / "sandboxes")})
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}") as ws:
        await open_raw(ws, provider=_InputsLocal.id)
        request = {
            "type": "exec_private", "id": 1, "cmd": "true", "directory": "/logs/verifier", "max_bytes": 10,
            "inputs": [["/tests/a", 3], ["/tests/b/c", 2]],
        }  # fmt: skip
        await ws.send_message(json.dumps(request))
        await ws.send_message(b"\x00\x00\x00\x01\x03" + b"AAA")
        await ws.send_message(b"\x00\x00\x00\x01\x03" + b"BB")
        while not isinstance(reply := await ws.get_message(), str):
            pass
        assert json.loads(reply)["type"] == "private_exit"
        assert _received_inputs == [{"/tests/a": b"AAA", "/tests/b/c": b"BB"}]
        # An input named twice is a protocol error: the server hangs up.
        request = {**request, "id": 2, "inputs": [["/tests/a", 0], ["/tests/a", 0]]}
        await ws.send_message(json.dumps(request))
        with pytest.raises(trio_websocket.ConnectionClosed):
            while True:
                reply = await ws.get_message()
        assert "named twice" in json.loads(reply)["message"]
    assert len(_received_inputs) == 1


@requires_sandbox
async def test_inputs_reach_a_sandbox_behind_the_server(nursery: trio.Nursery):
    server = SandboxServer("sandbox", TOKEN, grace=10.0)
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    env = RemoteEnvironment({"url": f"ws://127.0.0.1:{port}", "token": TOKEN, "provider": "sandbox"})
    session = await env.open(None, NetworkPolicy("none"))
    try:
        with hang_guard(60):
            await session.write_file("/tests/test.sh", "echo 1 > /logs/verifier/reward.txt\n")
            result, files = await session.exec_private(
                "bash /tests/test.sh && cp -r /tests /solution /logs/verifier/ && echo $HOME",
                directory="/logs/verifier",
                max_bytes=4 << 20,
                inputs=_INPUTS,
            )
            assert result.exit_code == 0 and result.stdout == "/root\n", result
            assert files == {
                "reward.txt": b"0\n",
                **{path.removeprefix("/"): data for path, data in _INPUTS.items()},
            }
            # The session's own /tests is untouched.
            assert await session.read_file("/tests/test.sh") == b"echo 1 > /logs/verifier/reward.txt\n"
    finally:
        await session.close()


async def test_exec_private_of_a_provider_without_it_is_not_implemented(server):
    env = RemoteEnvironment({"url": server.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy())
    try:
        with pytest.raises(NotImplementedError):
            await session.exec_private("true", directory="/logs/verifier", max_bytes=100)
        assert (await session.exec("echo on")).stdout == "on\n"  # the session goes on
    finally:
        await session.close()
