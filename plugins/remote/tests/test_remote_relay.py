"""Host sockets and directories exposed into ``remote`` sessions (protocol 5):
relayed connections over the session's WebSocket, flow-controlled, gone with
the session; small directories copied, agent cache entries served from the
server's own cache.

Real servers on 127.0.0.1 hosting ``sandbox`` (run policy ``none``) where
this host can run it, else ``local``."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio_websocket
from _common import poll_until
from _remote_support import SANDBOX_PROBLEM, TOKEN, WAIT_SECONDS, hello, remote
from agentcompass_remote import SandboxServer, serve_sandboxes
from agentcompass_remote._relay import WINDOW

import agentcompass._gateway._gateway as gateway_module
from agentcompass import IssueError, NetworkPolicy
from agentcompass._asgi import serve_asgi

FORWARDER = Path(gateway_module.__file__).with_name("_forwarder.py")
PROVIDER = "sandbox" if SANDBOX_PROBLEM is None else "local"
#: ``sandbox`` sessions get run policy ``none``: only the relay leads out.
POLICY = NetworkPolicy("none") if PROVIDER == "sandbox" else NetworkPolicy("full")


def _fresh_name() -> str:
    """A session name of this test's own: the server may still be closing another test's."""
    return f"raw-{secrets.token_hex(4)}"


@attrs.define(eq=False)
class Served:
    server: SandboxServer
    url: str

    def env(self) -> Any:
        return remote(self.url, provider=PROVIDER)

    def hosted(self) -> Any:
        (hosted,) = self.server.sessions.values()
        return hosted


@pytest.fixture
async def served(nursery: trio.Nursery, tmp_path: Path) -> Served:
    config = {"root": str(tmp_path / "sandboxes")} if PROVIDER == "local" else {}
    server = SandboxServer(PROVIDER, TOKEN, grace=5.0, default_config=config)
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    return Served(server, f"ws://127.0.0.1:{port}")


@pytest.fixture
async def session(served: Served) -> AsyncIterator[Any]:
    opened = await served.env().open(None, POLICY)
    try:
        yield opened
    finally:
        with trio.move_on_after(10, shield=True):
            await opened.close()


def _unix_listener(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    return listener


async def _echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An HTTP service on the host: the request body reversed, then a tail
    larger than a window (so both directions need several windows)."""
    if scope["type"] == "lifespan":
        while True:
            event = await receive()
            kind = event["type"].rsplit(".", 1)[1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    reply = body[::-1] + b"!" * (3 * WINDOW)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(reply))]})
    await send({"type": "http.response.body", "body": reply})


_POST = """
import hashlib, sys, urllib.request
body = bytes(range(256)) * 4000
reply = urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=body, method="POST"), timeout=30).read()
print(len(reply), hashlib.sha256(reply).hexdigest())
"""


async def test_an_exposed_socket_carries_an_http_exchange_through_the_forwarder(
    nursery: trio.Nursery, tmp_path: Path, session: Any, served: Served
):
    directory = tmp_path / "gw"
    directory.mkdir()
    shutil.copy(FORWARDER, directory / "forward.py")
    await nursery.start(serve_asgi, _echo_app, _unix_listener(directory / "app.sock"))
    inside = await session.expose_socket(str(directory / "app.sock"))
    forwarder = inside.rsplit("/", 1)[0] + "/forward.py"  # beside the socket, as the gateway finds it
    script = (
        f"read -r port pid < <(python3 {forwarder} {inside}) || exit 97\n"
        "trap 'kill \"$pid\"' EXIT\n"
        f'python3 -c "$POST" "http://127.0.0.1:$port/echo"\n'
    )
    with trio.fail_after(WAIT_SECONDS):
        result = await session.exec(script, env={"POST": _POST})
    assert result.exit_code == 0, result.stderr
    body = bytes(range(256)) * 4000
    expected = body[::-1] + b"!" * (3 * WINDOW)
    assert result.stdout.split() == [str(len(expected)), hashlib.sha256(expected).hexdigest()]
    if PROVIDER == "sandbox":
        # Under run policy none the session has no way out but the relay.
        probe = await session.exec("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=2)'")
        assert probe.exit_code != 0


@attrs.define(eq=False)
class Flood:
    """A host service that writes ``total`` bytes to whoever connects,
    counting what the kernel took."""

    total: int
    sent: int = 0
    accepted: trio.Event = attrs.Factory(trio.Event)
    ended: trio.Event = attrs.Factory(trio.Event)

    async def serve(self, listener: socket.socket, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.from_stdlib_socket(listener)
        task_status.started()
        with sock:
            conn, _ = await sock.accept()
        self.accepted.set()
        with conn:
            chunk = b"x" * 65536
            try:
                while self.sent < self.total:
                    self.sent += await conn.send(chunk)
                while await conn.recv(65536):  # until the relay hangs up
                    pass
            except OSError:
                pass
            finally:
                self.ended.set()


_SILENT = (
    "nohup python3 -c 'import socket, sys, time\n"
    's = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"hi"); time.sleep(600)\' {sock}'
    " >/dev/null 2>&1 &"
)


async def _silent_reader(nursery: trio.Nursery, tmp_path: Path, session: Any, total: int) -> tuple[Flood, str]:
    """A host flood exposed into ``session``, and a process inside that
    connected to it and never reads; returns once the flood is connected."""
    directory = tmp_path / "flood"
    directory.mkdir()
    flood = Flood(total)
    await nursery.start(flood.serve, _unix_listener(directory / "flood.sock"))
    inside = await session.expose_socket(str(directory / "flood.sock"))
    assert (await session.exec(_SILENT.format(sock=inside))).exit_code == 0
    # The relay moves while an operation runs: run some until the channel is up.
    with trio.fail_after(WAIT_SECONDS):
        while not flood.accepted.is_set():
            assert (await session.exec("true")).exit_code == 0
    return flood, inside


async def test_a_silent_reader_inside_stalls_only_its_own_channel(
    nursery: trio.Nursery, tmp_path: Path, session: Any, served: Served
):
    flood, _ = await _silent_reader(nursery, tmp_path, session, total=64 * 1024 * 1024)
    other = await served.env().open(None, POLICY)
    try:
        with trio.fail_after(WAIT_SECONDS):
            for _ in range(10):
                # This session's operations, and another session's, go on.
                assert (await session.exec("echo ok")).stdout == "ok\n"
                await session.write_file("/app/f", b"data" * 100_000)
                assert await session.read_file("/app/f") == b"data" * 100_000
                assert (await other.exec("echo other")).stdout == "other\n"
        # Neither side holds more than a window of it; the flood is held back.
        hosted = next(h for h in served.server.sessions.values() if h.channels.open)
        assert hosted.channels.buffered <= WINDOW
        assert session._exchange.channels.buffered <= WINDOW
        assert flood.sent < 8 * 1024 * 1024
        assert not flood.ended.is_set()
    finally:
        await other.close()


async def test_channels_and_relays_are_gone_after_close(nursery: trio.Nursery, tmp_path: Path, served: Served):
    session = await served.env().open(None, POLICY)
    flood, _ = await _silent_reader(nursery, tmp_path, session, total=1024 * 1024)
    hosted = served.hosted()
    scratch = hosted.scratch
    assert scratch is not None and os.path.isdir(scratch) and hosted.channels.open
    await session.close()
    with trio.fail_after(WAIT_SECONDS):
        await flood.ended.wait()  # the host's end of the channel was closed
    assert served.server.sessions == {} and not os.path.exists(scratch)
    assert (
        hosted.channels.open == {} and session._exchange.channels.open == {} and session._exchange.channels.relays == {}
    )


async def test_channels_and_relays_are_gone_after_the_client_disconnects(
    nursery: trio.Nursery, tmp_path: Path, served: Served
):
    session = await served.env().open(None, POLICY)
    await _silent_reader(nursery, tmp_path, session, total=1024 * 1024)
    hosted = served.hosted()
    scratch = hosted.scratch
    assert scratch is not None
    await session._exchange.conn.abort()  # a driver killed mid-session
    await poll_until(lambda: served.server.load == 0, "the server to close the session", WAIT_SECONDS)
    assert hosted.closed.is_set() and hosted.channels.open == {} and hosted.channels.relays == {}
    assert not os.path.exists(scratch)


# -- directory copies ----------------------------------------------------------


async def test_a_small_directory_is_copied_read_only(tmp_path: Path, session: Any):
    source = tmp_path / "small"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("alpha")
    (source / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "sub" / "run.sh").chmod(0o755)
    inside = await session.expose_directory(str(source))
    result = await session.exec(f"cat {inside}/a.txt; {inside}/sub/run.sh; echo x > {inside}/a.txt")
    assert result.stdout.startswith("alpharan\n"), result
    if PROVIDER == "sandbox":
        assert result.exit_code != 0  # read-only inside
    assert (source / "a.txt").read_text() == "alpha"  # the host's directory is never written


@pytest.mark.parametrize("what", ["symlink", "linked-root", "fifo", "oversize", "too-many"])
async def test_a_directory_copy_refuses_links_devices_and_oversize(
    tmp_path: Path, session: Any, served: Served, what: str
):
    source = tmp_path / "refused"
    source.mkdir()
    (source / "ok.txt").write_text("fine")
    if what == "symlink":
        (source / "link").symlink_to("/etc/passwd")
    elif what == "fifo":
        os.mkfifo(source / "pipe")
    elif what == "oversize":
        (source / "big").write_bytes(b"\0" * (4 * 1024 * 1024 + 1))
    elif what == "too-many":
        for i in range(70):
            (source / f"f{i}").write_text("x")
    else:
        (tmp_path / "link").symlink_to(source)
        source = tmp_path / "link"
    with pytest.raises(NotImplementedError) as refused:
        await session.expose_directory(str(source))
    assert str(source) in str(refused.value)
    assert served.hosted().scratch is None  # nothing was made on the server
    assert (await session.exec("echo still")).stdout == "still\n"  # and the session is fine


@pytest.mark.parametrize(
    "listing",
    [
        {"files": [["../escape", 1, False]], "sockets": []},
        {"files": [["/etc/passwd", 1, False]], "sockets": []},
        {"files": [["a", 1, False], ["a", 1, False]], "sockets": []},
        {"files": [["big", 5 * 1024 * 1024, False]], "sockets": []},
        {"files": [], "sockets": ["x/../../s"]},
    ],
)
async def test_the_server_refuses_a_copy_that_leaves_its_directory_or_its_limits(
    served: Served, listing: dict[str, Any]
):
    async with trio_websocket.open_websocket_url(served.url) as ws:
        await hello(ws)
        policy = {"mode": POLICY.mode, "allow": []}
        await ws.send_message(json.dumps({"type": "open", "name": _fresh_name(), "provider": PROVIDER, "policy": policy}))
        assert json.loads(await ws.get_message())["type"] == "opened"
        await ws.send_message(json.dumps({"type": "expose", "id": 1, **listing}))
        replies = []
        with pytest.raises(trio_websocket.ConnectionClosed):  # a protocol error: the connection goes
            while True:
                replies.append(json.loads(await ws.get_message()))
        assert [(r["type"], r["id"]) for r in replies if r["type"] == "error"] == [("error", None)]
        assert "expose" in replies[-1]["message"]
    await poll_until(lambda: served.server.load == 0, "the server to close the session", WAIT_SECONDS)


# -- agent cache entries ----------------------------------------------------------


def _make_entry(root: Path, name: str, info: dict[str, Any]) -> Path:
    entry = root / name
    (entry / "venv" / "bin").mkdir(parents=True)
    (entry / "venv" / "bin" / "agent").write_text("#!/bin/sh\necho agent-ran\n")
    (entry / "venv" / "bin" / "agent").chmod(0o755)
    (entry / "venv" / "big.bin").write_bytes(b"\0" * (5 * 1024 * 1024))  # too large to copy
    (entry / "installed.json").write_text(json.dumps(info))
    return entry


INFO = {"requirements": ["fake-agent==1.0"], "python": "/usr/bin/python3", "install_seconds": 1.5, "created": 1.0}


async def test_a_cache_entry_is_served_from_the_servers_own_cache(
    tmp_path: Path, session: Any, served: Served, monkeypatch: pytest.MonkeyPatch
):
    # Client and server share this process, so one cache root: the server's entry is the client's.
    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(tmp_path / "cache"))
    entry = _make_entry(tmp_path / "cache", "fake-agent-1.0", INFO)
    inside = await session.expose_directory(str(entry))
    assert (await session.exec(f"{inside}/venv/bin/agent")).stdout == "agent-ran\n"
    assert served.hosted().scratch is None  # nothing copied


async def test_a_missing_or_different_cache_entry_is_refused_with_the_install_line(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(tmp_path / "cache"))
    _make_entry(tmp_path / "cache", "fake-agent-1.0", INFO)
    (tmp_path / "cache" / "linked-agent-1.0").symlink_to(tmp_path / "cache" / "fake-agent-1.0")
    async with trio_websocket.open_websocket_url(served.url) as ws:
        await hello(ws)
        policy = {"mode": POLICY.mode, "allow": []}
        await ws.send_message(json.dumps({"type": "open", "name": _fresh_name(), "provider": PROVIDER, "policy": policy}))
        opened = json.loads(await ws.get_message())
        assert opened["type"] == "opened", opened

        async def ask(op: int, entry: Any, installed: Any) -> dict[str, Any]:
            await ws.send_message(
                json.dumps({"type": "expose_cached", "id": op, "entry": entry, "installed": installed})
            )
            return json.loads(await ws.get_message())

        # Build timings differ between two builds of one install: still the same install.
        same = await ask(1, "fake-agent-1.0", {**INFO, "install_seconds": 99.0, "created": 2.0})
        assert same["type"] == "exposed" and same["path"]
        for op, (entry, installed) in enumerate(
            [
                ("other-agent-2.0", INFO),  # the server has no such entry
                ("fake-agent-1.0", {**INFO, "requirements": ["fake-agent==1.1"]}),  # another install
                ("linked-agent-1.0", INFO),  # a link in the server's cache is not an entry
            ],
            start=2,
        ):
            reply = await ask(op, entry, installed)
            assert (reply["type"], reply["code"], reply["severity"]) == ("error", "environment_unsupported", "fatal")
            agent = entry.rsplit("-", 1)[0]
            assert reply["message"].endswith(f"install it there with: python -m agentcompass.agents install {agent}")
        # A path instead of an entry name is never looked up.
        for op, entry in enumerate(["../../etc", "/etc", "fake-agent-1.0/venv", ".."], start=10):
            reply = await ask(op, entry, INFO)
            assert reply["type"] == "error" and "not an agent cache entry name" in reply["message"]


async def test_a_large_directory_outside_the_cache_is_neither_copied_nor_served(
    tmp_path: Path, session: Any, served: Served, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(tmp_path / "cache"))
    # An entry's look-alike outside the cache root, by the name of one inside it.
    _make_entry(tmp_path / "cache", "fake-agent-1.0", INFO)
    elsewhere = _make_entry(tmp_path / "elsewhere", "fake-agent-1.0", INFO)
    with pytest.raises(NotImplementedError) as refused:
        await session.expose_directory(str(elsewhere))
    assert "more than" in str(refused.value)
    assert served.hosted().scratch is None


async def test_the_provider_reports_a_missing_server_entry_as_environment_unsupported(
    spawn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The server's cache root (its own environment) lacks what the driver's holds.
    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(tmp_path / "server-cache"))
    server = await spawn("cacheless")
    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(tmp_path / "cache"))
    entry = _make_entry(tmp_path / "cache", "fake-agent-1.0", INFO)
    session = await remote(server.url).open(None, NetworkPolicy())
    try:
        with pytest.raises(IssueError) as refused:
            await session.expose_directory(str(entry))
    finally:
        await session.close()
    assert (refused.value.severity, refused.value.code) == ("fatal", "environment_unsupported")
    assert "install it there with: python -m agentcompass.agents install fake-agent" in refused.value.message
    assert str(tmp_path / "server-cache") in refused.value.message


@pytest.mark.skipif(PROVIDER != "sandbox", reason=SANDBOX_PROBLEM or "a local session shares the host's files")
async def test_a_session_cannot_reach_another_sessions_relay(
    nursery: trio.Nursery, tmp_path: Path, session: Any, served: Served
):
    flood, inside = await _silent_reader(nursery, tmp_path, session, total=1024)
    mine = next(h for h in served.server.sessions.values() if h.channels.open)
    other = await served.env().open(None, POLICY)
    try:
        # Neither the path the first session sees nor the server's own copy exists for the second.
        connect = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
        for path in (inside, os.path.join(mine.scratch, "1", "flood.sock")):
            result = await other.exec(["python3", "-c", connect, path])
            assert result.exit_code != 0 and "FileNotFoundError" in result.stderr, result
    finally:
        await other.close()
    assert len(mine.channels.open) == 1  # the first session's one channel, nothing more


_MANY = """
import select, socket, sys
conns = []
for _ in range(40):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"x"); conns.append(s)
answered = ended = 0
for s in conns:
    if not select.select([s], [], [], 10)[0]:
        continue
    try:
        data = s.recv(1)
    except ConnectionResetError:  # closed with our byte unread
        data = b""
    answered += data == b"y"
    ended += data == b""
print(answered, ended)
"""


async def test_a_session_relays_at_most_32_connections_at_once(nursery: trio.Nursery, tmp_path: Path, session: Any):
    directory = tmp_path / "many"
    directory.mkdir()
    held: list[Any] = []

    async def answer(listener: socket.socket, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.from_stdlib_socket(listener)
        task_status.started()
        with sock:
            while True:
                conn, _ = await sock.accept()
                held.append(conn)  # held open: every channel stays in use
                await conn.recv(1)
                await conn.send(b"y")

    await nursery.start(answer, _unix_listener(directory / "many.sock"))
    inside = await session.expose_socket(str(directory / "many.sock"))
    with trio.fail_after(WAIT_SECONDS):
        result = await session.exec(["python3", "-c", _MANY, inside])
    # The first 32 reach the host; the rest are closed at once, without reaching it.
    assert result.stdout.split() == ["32", "8"], result
    assert len(held) == 32


async def test_a_session_relays_at_most_8_sockets(tmp_path: Path, session: Any):
    directory = tmp_path / "sockets"
    directory.mkdir()
    listeners = [_unix_listener(directory / f"s{i}.sock") for i in range(9)]
    try:
        with pytest.raises(IssueError) as refused:
            await session.expose_directory(str(directory))
        assert "at most 8 sockets" in refused.value.message
        assert (await session.exec("echo fine")).stdout == "fine\n"
    finally:
        for listener in listeners:
            listener.close()
