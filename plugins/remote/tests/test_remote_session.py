"""A remote session behaves like the provider behind the server: exec
semantics, output limits, files; and the pool: capacity, reap, sweep."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import trio
import trio_websocket
from _common import poll_until, processes_marked
from _remote_support import TOKEN, InProcess, exec_locally_and_remotely, hello, remote, start_in_process
from agentcompass_remote import RemoteEnvironment

from agentcompass import ComponentError, ComponentRef, ExecutionPlan, IssueError, NetworkPolicy


async def test_exec_runs_like_local(server: InProcess):
    session = await remote(server.url).open(None, NetworkPolicy())
    try:
        result = await session.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
        assert (await session.exec(["printf", "%s|", "a b", "c"])).stdout == "a b|c|"
        await session.write_file("/app/sub/x.txt", "")
        result = await session.exec("pwd; echo $GREETING", cwd="app/sub", env={"GREETING": "hello"})
        assert result.stdout.endswith("/app/sub\nhello\n")
    finally:
        await session.close()


async def test_a_timeout_kills_the_tree_and_the_session_goes_on(server: InProcess):
    session = await remote(server.url).open(None, NetworkPolicy())
    sandbox = Path(session.handle["inner"]["path"])
    try:
        result = await session.exec("echo before; sleep 1000 & wait", timeout=0.5)
        assert (result.exit_code, result.timed_out, result.stdout) == (124, True, "before\n")
        await poll_until(lambda: processes_marked(sandbox) == [], "the killed processes to be gone", seconds=5)
        assert (await session.exec("echo again")).stdout == "again\n"
    finally:
        await session.close()


async def test_a_cancelled_exec_kills_the_tree_on_the_server_and_the_session_goes_on(server: InProcess):
    session = await remote(server.url).open(None, NetworkPolicy())
    sandbox = Path(session.handle["inner"]["path"])
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.exec, 'sleep 1000 & touch "$APP_DIR/started"; wait')
            await poll_until(lambda: (sandbox / "app" / "started").exists(), "the exec to start")
            nursery.cancel_scope.cancel()
        await poll_until(lambda: processes_marked(sandbox) == [], "the killed processes to be gone", seconds=5)
        assert (await session.exec("echo again")).stdout == "again\n"
    finally:
        await session.close()


async def test_output_is_truncated_as_the_provider_truncates_it(nursery: trio.Nursery, tmp_path: Path):
    served = await start_in_process(nursery, tmp_path / "remote")
    expected, got = await exec_locally_and_remotely(served.url, tmp_path, "seq 1 100000; seq 1 50000 >&2", 1000)
    assert got == expected
    assert got.stdout.startswith("[... ") and got.stdout.endswith("\n100000\n") and len(got.stdout) == 1000


async def test_files_of_many_chunks_and_missing_files(server: InProcess):
    session = await remote(server.url).open(None, NetworkPolicy())
    try:
        data = bytes(range(256)) * (5 * 4096 + 17)  # 5 MiB and a bit: many chunks each way
        await session.write_file("/logs/big.bin", data)
        assert await session.read_file("/logs/big.bin") == data
        assert (await session.exec('wc -c < "$LOGS_DIR/big.bin"')).stdout.strip() == str(len(data))
        with pytest.raises(FileNotFoundError):
            await session.read_file("/app/missing.txt")
        with pytest.raises(OSError) as failed:
            await session.read_file("/app")
        assert failed.value.errno == errno.EISDIR
    finally:
        await session.close()


async def test_concurrent_operations_on_one_session_all_complete(server: InProcess):
    session = await remote(server.url).open(None, NetworkPolicy())
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        await session.write_file(f"f{i}.txt", str(i))
        results[i] = (await session.exec(f'cat "$APP_DIR/../f{i}.txt"')).stdout

    try:
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
    finally:
        await session.close()
    assert results == {i: str(i) for i in range(8)}


async def test_the_server_advertises_capacity_and_load(nursery: trio.Nursery, tmp_path: Path):
    served = await start_in_process(nursery, tmp_path / "s", capacity=2)
    session = await remote(served.url).open(None, NetworkPolicy())
    try:
        async with trio_websocket.open_websocket_url(served.url) as ws:
            welcome = await hello(ws)
        assert (welcome["capacity"], welcome["load"], welcome["provider"]) == (2, 1, "local")
    finally:
        await session.close()


async def test_each_open_goes_to_the_server_with_the_most_free_capacity(nursery: trio.Nursery, tmp_path: Path):
    small = await start_in_process(nursery, tmp_path / "small", capacity=1)
    large = await start_in_process(nursery, tmp_path / "large", capacity=3)
    env = remote([small.url, large.url])
    sessions = []
    try:
        for _ in range(4):
            sessions.append(await env.open(None, NetworkPolicy()))
        with pytest.raises(IssueError, match="full"):
            await env.open(None, NetworkPolicy())
        assert (small.server.load, large.server.load) == (1, 3)
        # Opened one at a time: the first two went where 3 were free, then the
        # servers were level (1 free each) and both filled up.
        assert [s.handle["url"] for s in sessions[:2]] == [large.url, large.url]
    finally:
        for session in sessions:
            await session.close()
    assert (small.server.load, large.server.load) == (0, 0)


async def test_sweep_and_reap_close_sessions_by_name_across_the_pool(nursery: trio.Nursery, tmp_path: Path):
    pool = [await start_in_process(nursery, tmp_path / f"s{i}") for i in range(2)]
    env = remote([s.url for s in pool])
    names = ["run-a-1", "run-a-2", "run-a-3", "run-b-1"]
    sessions = {name: await env.open(None, NetworkPolicy(), name) for name in names}
    try:
        assert {s.handle["url"] for s in sessions.values()} == {s.url for s in pool}
        await env.sweep("run-a")
        await env.sweep("run-a")  # idempotent
        assert sorted(n for s in pool for n in s.server.sessions) == ["run-b-1"]
        with pytest.raises(IssueError) as swept:
            await sessions["run-a-1"].exec("true")
        assert (swept.value.severity, swept.value.code) == ("fatal", "environment_failed")
        handle = json.loads(json.dumps(sessions["run-b-1"].handle))
        await env.reap(handle)
        await env.reap(handle)
        assert all(not s.server.sessions for s in pool)
        assert all(s.sandboxes() == [] for s in pool)
        with pytest.raises(IssueError, match="not a session of this pool"):
            await env.reap({"url": "ws://127.0.0.1:1", "name": "run-b-1"})
    finally:
        for session in sessions.values():
            await session.close()


async def test_sweep_reports_a_server_it_cannot_reach_after_sweeping_the_others(server: InProcess):
    env = remote([server.url, "ws://127.0.0.1:1"], connect_timeout_seconds=2)
    session = await env.open(None, NetworkPolicy(), "run-c-1")
    try:
        with pytest.raises(IssueError) as failed:
            await env.sweep("run-c")
        assert (failed.value.severity, failed.value.code) == ("warning", "cleanup_failed")
        assert "ws://127.0.0.1:1" in failed.value.message
        assert server.server.sessions == {}
    finally:
        await session.close()


async def test_a_bad_provider_config_fails_that_open_and_the_server_serves_on(server: InProcess):
    with pytest.raises(IssueError) as failed:
        await remote(server.url, provider_config={"bogus": 1}).open(None, NetworkPolicy())
    assert (failed.value.severity, failed.value.code) == ("fatal", "environment_failed")
    assert "bogus" in failed.value.message
    session = await remote(server.url).open(None, NetworkPolicy())
    try:
        assert (await session.exec("echo ok")).stdout == "ok\n"
    finally:
        await session.close()
    assert server.server.load == 0


async def test_a_protocol_violation_is_answered_and_hung_up_on(server: InProcess):
    async with trio_websocket.open_websocket_url(server.url) as ws:
        await hello(ws)
        await ws.send_message("not json")
        reply = json.loads(await ws.get_message())
        assert reply["type"] == "error" and reply["id"] is None and "not valid JSON" in reply["message"]
        with pytest.raises(trio_websocket.ConnectionClosed):
            await ws.get_message()
    assert server.server.load == 0


def test_config_errors_name_the_key():
    with pytest.raises(ComponentError, match="needs a token"):
        RemoteEnvironment({"url": "ws://127.0.0.1:1"})
    with pytest.raises(ComponentError, match=r"\$\{NO_SUCH_TOKEN_VAR\} is empty or unset"):
        RemoteEnvironment({"url": "ws://127.0.0.1:1", "token": "${NO_SUCH_TOKEN_VAR}"})
    with pytest.raises(ComponentError, match="not a ws://host:port URL: 'http://x:1'"):
        remote("http://x:1")
    with pytest.raises(ComponentError, match="url lists a server twice"):
        remote(["ws://a:1", "ws://a:1"])
    with pytest.raises(ComponentError, match="url must be"):
        remote([])


def test_a_plan_the_served_provider_cannot_enforce_is_rejected_before_anything_runs():
    plan = ExecutionPlan("t", 0, ComponentRef("remote"), run_network_policy=NetworkPolicy("none"))
    with pytest.raises(ComponentError, match="cannot enforce network policy 'none'"):
        remote("ws://127.0.0.1:1").build_config(plan)


def test_keepalive_settings_are_inherited_by_accepted_connections():
    import socket

    from agentcompass_remote import _protocol

    with socket.socket() as listener:
        _protocol.set_keepalive(listener)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == _protocol.KEEPALIVE_IDLE
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == _protocol.KEEPALIVE_COUNT


async def test_a_close_that_fails_on_the_server_is_a_cleanup_warning(nursery: trio.Nursery):
    from agentcompass_remote import SandboxServer, serve_sandboxes

    import agentcompass.testing  # noqa: F401 - registers fake-env, the server's provider here

    served = SandboxServer("fake-env", TOKEN, default_config={"script": {"*": {"close": ["raise"]}}})
    port = await nursery.start(serve_sandboxes, served, "127.0.0.1", 0)
    env = remote(f"ws://127.0.0.1:{port}", provider="fake-env")
    plan = ExecutionPlan("t", 0, ComponentRef("remote"))
    session = await env.open(env.build_config(plan), NetworkPolicy())
    with pytest.raises(IssueError) as failed:
        await session.close()
    assert (failed.value.severity, failed.value.code) == ("warning", "cleanup_failed")
    await session.close()  # idempotent: the session is gone either way
    assert served.load == 0
