"""Network namespaces made ahead and reused: a session gets one as new (no
process, socket, rule or interface of the previous session), a namespace
that is not as new is destroyed instead, a sandbox cannot change its
namespace, and the pool is emptied when the run ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from _common import poll_until
from _sandbox_support import census, connects, first_line, listening, new_tag, requires_sandbox, veths, wait_for_file
from agentcompass_sandbox import SandboxEnvironment, SandboxSession, _host, _netlink, _pool, _spawner

from agentcompass import NetworkPolicy
from agentcompass.testing import hang_guard

pytestmark = requires_sandbox
FULL = NetworkPolicy("full")
NONE = NetworkPolicy("none")


async def netns_of(session: SandboxSession) -> str:
    """The network namespace a command of ``session`` runs in, as seen inside."""
    result = await session.exec("readlink /proc/self/ns/net")
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


@asynccontextmanager
async def holding_listener(address: str) -> AsyncIterator[int]:
    """A TCP listener on ``address`` (port 0) that accepts and keeps every
    connection open until the block ends (so the other side closes first)."""
    sock = trio.socket.socket()
    await sock.bind((address, 0))
    sock.listen(16)
    held: list[trio.SocketStream] = []

    async def accept_forever() -> None:
        listener = trio.SocketListener(sock)
        while True:
            held.append(await listener.accept())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_forever)
        try:
            yield sock.getsockname()[1]
        finally:
            nursery.cancel_scope.cancel()
            for stream in held:
                await stream.aclose()
            sock.close()


def _in_netns(init_pid: int, *argv: str) -> str:
    """Run a host command (as root) in the network namespace of ``init_pid``."""
    return subprocess.run(
        ["nsenter", "-t", str(init_pid), "-n", *argv], capture_output=True, check=True, text=True
    ).stdout


def _processes_in(netns_inode: int) -> dict[int, str]:
    """Every host process in the network namespace ``netns_inode``, with its cgroup."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == netns_inode:
                    with open(f"/proc/{entry}/cgroup") as f:
                        found[int(entry)] = f.read()
            except OSError:
                continue
    return found


async def test_a_reused_namespace_has_no_process_socket_or_rule_of_the_previous_session(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(60):
        a = await provider.open(None, FULL, f"{tag}-a")
        try:
            first = await netns_of(a)
            # A server and a daemon left running, and the rules of a policy left in force.
            await a.exec(
                "setsid sleep 600 > /dev/null 2>&1 & python3 -m http.server --bind 127.0.0.1 8000 > /dev/null 2>&1 &"
            )
            await listening(a, 8000)
            await a.set_network_policy(NONE)
            assert a._init_pid is not None
            assert "table inet" in await trio.to_thread.run_sync(_in_netns, a._init_pid, "nft", "list", "ruleset")
        finally:
            await a.close()
        # The spawner entered the namespace only to start bwrap, and came back.
        spawner = _spawner._current.get(_host.HOST_UID)
        assert spawner is not None
        spawner_netns = await trio.to_thread.run_sync(os.stat, f"/proc/{spawner.proc.pid}/ns/net")
        assert spawner_netns.st_ino == (await trio.to_thread.run_sync(os.stat, "/proc/self/ns/net")).st_ino
        b = await provider.open(None, FULL, f"{tag}-b")
        try:
            assert await netns_of(b) == first, "the namespace was not reused"
            assert b._init_pid is not None
            assert await trio.to_thread.run_sync(_in_netns, b._init_pid, "nft", "list", "ruleset") == ""
            inode = (await trio.to_thread.run_sync(os.stat, f"/proc/{b._init_pid}/ns/net")).st_ino
            processes = await trio.to_thread.run_sync(_processes_in, inode)
            assert processes and all(f"/{tag}-b/" in cgroup for cgroup in processes.values()), processes
            # Nothing of a listens, and under full the host end is reachable again.
            assert not await connects(b, "127.0.0.1", 8000)
            assert b.addresses is not None
            async with holding_listener(b.addresses[0]) as port:
                assert await connects(b, b.addresses[0], port)
            assert (await b.exec("pgrep -x sleep")).exit_code == 1
        finally:
            await b.close()


async def test_a_loopback_namespace_given_a_veth_is_reused_without_it(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        a = await provider.open(None, NONE, f"{tag}-a")
        try:
            first = await netns_of(a)
            await a.set_network_policy(FULL)  # a veth of the session's own, deleted at close
            assert a._init_pid is not None
            assert "eth0" in await trio.to_thread.run_sync(_in_netns, a._init_pid, "ip", "-o", "link")
            veth = _host.veth_name(a.name)
            assert veth in veths()
        finally:
            await a.close()
        assert veth not in veths()
        b = await provider.open(None, NONE, f"{tag}-b")
        try:
            assert await netns_of(b) == first
            assert b._init_pid is not None
            links = await trio.to_thread.run_sync(_in_netns, b._init_pid, "ip", "-o", "link")
            assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]
        finally:
            await b.close()


def _socket_in(init_pid: int, family: int, kind: int, address: object) -> socket.socket:
    """A socket of root's, bound inside the network namespace of ``init_pid``."""
    fd = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        sock = _netlink.in_namespace_fd(fd, lambda: socket.socket(family, kind))
    finally:
        os.close(fd)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen()
    return sock


async def test_a_namespace_not_as_new_is_destroyed_not_reused(provider: SandboxEnvironment, tag: str) -> None:
    """What no sandbox can leave (it has no CAP_NET_ADMIN over its namespace,
    and its sockets die with its processes), done behind the runtime's back
    by root: an interface, an nftables table, sockets. Recycling sees each
    and destroys the namespace."""
    changes: list[tuple[str, ...] | tuple[int, int, object]] = [
        ("ip", "link", "add", "extra0", "type", "veth", "peer", "name", "extra1"),
        ("nft", "add", "table", "inet", "extra"),
        (socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)),
        (socket.AF_INET6, socket.SOCK_DGRAM, ("::1", 0)),
        (socket.AF_UNIX, socket.SOCK_STREAM, f"\0{tag}"),
    ]
    with hang_guard(60):
        pool = _pool.current(veth=True)
        for n, change in enumerate(changes):
            held = None
            a = await provider.open(None, FULL, f"{tag}-a{n}")
            try:
                first = await netns_of(a)
                assert a._init_pid is not None
                if isinstance(change[0], str):
                    await trio.to_thread.run_sync(_in_netns, a._init_pid, *change)
                else:
                    held = await trio.to_thread.run_sync(_socket_in, a._init_pid, *change)
                await a.close()
            finally:
                await a.close()
                if held is not None:
                    held.close()
            assert pool.destroyed == n + 1, change
            b = await provider.open(None, FULL, f"{tag}-b{n}")
            try:
                assert await netns_of(b) != first
            finally:
                await b.close()


async def test_a_sandbox_cannot_change_its_namespace(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, FULL, f"{tag}-a")
        try:
            for command in (
                "ip link set lo down",
                "ip route del default",
                "ip addr add 10.9.9.9/32 dev eth0",
                "nft add table inet mine",
                "echo 0 > /proc/sys/net/ipv4/ip_forward",
            ):
                result = await session.exec(command)
                assert result.exit_code != 0, command
            assert session._init_pid is not None
            assert await trio.to_thread.run_sync(_in_netns, session._init_pid, "nft", "list", "ruleset") == ""
            assert session.addresses is not None
            async with holding_listener(session.addresses[0]) as port:
                assert await connects(session, session.addresses[0], port)
            await session.exec("echo ok > /app/done")
            assert await wait_for_file(session, "/app/done") == b"ok\n"
        finally:
            await session.close()


def test_the_pool_is_emptied_when_the_run_ends() -> None:
    """Free namespaces and the one of a session left open: every veth and
    lease is gone once ``trio.run`` returns; the open session closes later."""
    tag = new_tag()
    pooled: list[tuple[str | None, int | None, str]] = []
    left_open: list[SandboxSession] = []

    async def main() -> None:
        env = SandboxEnvironment({})
        with hang_guard(60):
            sessions = [await env.open(None, FULL, f"{tag}-{i}") for i in range(3)]
            sessions.append(await env.open(None, NONE, f"{tag}-n"))
            left_open.append(sessions.pop(0))
            for session in sessions:
                await session.close()
            for veth in (True, False):
                pool = _pool.current(veth)
                pooled.extend((e.veth, e.lease, e.owner) for e in [*pool._idle, *pool._lent])
        assert len(pooled) == 4
        assert {veth for veth, _, _ in pooled if veth is not None} <= veths()

    trio.run(main)
    assert not {veth for veth, _, _ in pooled} & veths()
    for _, lease, owner in pooled:
        if lease is not None:
            path = _host.LEASE_DIR / str(lease)
            assert not path.exists() or path.read_text() != owner

    async def close_later() -> None:
        with hang_guard(30):
            await left_open[0].close()
            assert await census(tag) == []

    trio.run(close_later)


def test_leases_of_a_pool_whose_process_is_gone_are_released() -> None:
    _host.ensure_state_root()
    _host.LEASE_DIR.mkdir(exist_ok=True)
    mine = f"{_pool.LEASE_OWNER_PREFIX}{os.getpid()}-{_pool._start_time(os.getpid())}-999999"
    gone = f"{_pool.LEASE_OWNER_PREFIX}{os.getpid()}-1-999999"  # this pid, another start time
    leases = [_host.acquire_lease(owner) for owner in (mine, gone)]
    try:
        _pool.reclaim_stale_leases()
        assert (_host.LEASE_DIR / str(leases[0])).read_text() == mine
        assert not (_host.LEASE_DIR / str(leases[1])).exists()
    finally:
        for owner, lease in zip((mine, gone), leases, strict=True):
            _host.release_lease(owner, lease)


# A runtime with two free pooled namespaces and a lent one: it says their
# veths and waits to be killed.
_RUNTIME = """
import sys, trio
from agentcompass import NetworkPolicy
from agentcompass_sandbox import SandboxEnvironment, _pool

async def main():
    env = SandboxEnvironment({})
    sessions = [await env.open(None, NetworkPolicy("full"), f"{sys.argv[1]}-{i}") for i in range(3)]
    for session in sessions[1:]:
        await session.close()
    await sessions[0].exec("sleep 600 > /dev/null 2>&1 &")
    pool = _pool.current(veth=True)
    print(" ".join(e.veth for e in [*pool._idle, *pool._lent]), flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


async def test_sigkill_of_the_runtime_leaves_no_pooled_namespace(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        runtime = await trio.lowlevel.open_process(
            [sys.executable, "-c", _RUNTIME, tag], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            pooled = set((await first_line(runtime)).decode().split())
            assert len(pooled) == 3 and pooled <= veths()
        finally:
            runtime.send_signal(signal.SIGKILL)
            await runtime.wait()
        # Bounded wait on a real condition: the kernel removes the namespaces,
        # and their veths, once the sandboxes in them are dead.
        await poll_until(lambda: not pooled & veths(), "the pooled veths to go with their runtime", 20, every=0.05)
        await provider.sweep(tag)  # also releases the dead pool's leases
        owners = []
        if _host.LEASE_DIR.is_dir():
            for entry in os.listdir(_host.LEASE_DIR):
                with contextlib.suppress(OSError):
                    owners.append((_host.LEASE_DIR / entry).read_text())
        assert not [o for o in owners if o.startswith(f"{_pool.LEASE_OWNER_PREFIX}{runtime.pid}-")]


async def test_without_reuse_close_destroys_the_namespace_and_its_veth(tag: str) -> None:
    provider = SandboxEnvironment({"reuse_network_namespaces": False})
    pool = _pool.current(veth=True)
    try:
        with hang_guard(60):
            made, recycled, destroyed = pool.made, pool.recycled, pool.destroyed
            a = await provider.open(None, FULL, f"{tag}-a")
            try:
                assert a._netns is not None
                veth = a._netns.veth
                assert veth is not None and veth in veths()
            finally:
                await a.close()
            assert (pool.recycled, pool.destroyed) == (recycled, destroyed + 1)
            # The kernel removes the namespace, and its veth with it, once nothing holds it.
            await poll_until(lambda: veth not in veths(), f"{veth} to go after close", 4)
            b = await provider.open(None, FULL, f"{tag}-b")
            try:
                assert pool.made == made + 2, "open did not make a new namespace"
            finally:
                await b.close()
    finally:
        left = await census(tag)
        await provider.sweep(tag)
        assert not left, f"the test left {left}"
