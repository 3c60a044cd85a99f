"""Network policies, enforced and switched live. Every server here listens
on loopback, on the host end of a sandbox's veth, or inside a sandbox this
test opened; nothing outside the host is ever contacted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from _sandbox_support import connects, docker_forward_rules, listening, requires_sandbox, wait_for_file
from agentcompass_sandbox import SandboxEnvironment

from agentcompass import ComponentError, ComponentRef, ExecutionPlan, IssueError, NetworkPolicy
from agentcompass.testing import hang_guard

pytestmark = requires_sandbox
FULL = NetworkPolicy("full")
NONE = NetworkPolicy("none")


@asynccontextmanager
async def listener(address: str) -> AsyncIterator[int]:
    """A TCP listener on ``address`` (port 0) that accepts and closes; yields its port."""
    sock = trio.socket.socket()
    await sock.bind((address, 0))
    sock.listen(64)
    port = sock.getsockname()[1]

    async def accept_forever() -> None:
        listener = trio.SocketListener(sock)
        while True:
            stream = await listener.accept()
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_forever)
        try:
            yield port
        finally:
            nursery.cancel_scope.cancel()
            sock.close()


async def test_none_reaches_neither_the_host_nor_another_namespace(provider: SandboxEnvironment, tag: str) -> None:
    await _none_reaches_neither(provider, tag)


@pytest.mark.serial  # it sets the host's FORWARD policy to DROP for its duration
async def test_none_reaches_neither_the_host_nor_another_namespace_beside_dockers_forward_drop(
    provider: SandboxEnvironment, tag: str
) -> None:
    # b's server reverse-resolves its address at start (through the host's
    # resolver: forwarded), and a reaches b through the host: both need the
    # sandbox's DOCKER-USER rules where Docker's firewall drops what it forwards.
    with docker_forward_rules():
        await _none_reaches_neither(provider, tag)


async def _none_reaches_neither(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        a = await provider.open(None, FULL, f"{tag}-a")
        b = await provider.open(None, FULL, f"{tag}-b")
        try:
            assert a.addresses is not None and b.addresses is not None
            host_end = a.addresses[0]
            # A server inside b, on every address of b's own namespace.
            await b.exec("python3 -m http.server --bind 0.0.0.0 8000 > /dev/null 2>&1 &")
            await listening(b, 8000)
            async with listener("127.0.0.1") as loop_port, listener(host_end) as veth_port:
                # Under full, the host (on its side of the veth) and b are reachable:
                # what none takes away below is really there.
                assert await connects(a, host_end, veth_port)
                assert await connects(a, b.addresses[1], 8000)
                await a.set_network_policy(NONE)
                assert not await connects(a, host_end, veth_port)
                assert not await connects(a, b.addresses[1], 8000)
                # The host's loopback is not the sandbox's: 127.0.0.1 inside is its own.
                assert not await connects(a, "127.0.0.1", loop_port)
            # Opened under none from the start: no interface but loopback at all.
            c = await provider.open(None, NONE, f"{tag}-c")
            try:
                links = await c.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
                assert links.stdout.split() == ["lo"]
                assert not await connects(c, b.addresses[1], 8000)
                # Loopback inside still works under none.
                await c.exec("python3 -m http.server --bind 127.0.0.1 8001 > /dev/null 2>&1 &")
                await listening(c, 8001)
            finally:
                await c.close()
        finally:
            await a.close()
            await b.close()


async def test_allowlist_reaches_only_the_listed_address(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, FULL, f"{tag}-a")
        try:
            assert session.addresses is not None
            host_end = session.addresses[0]
            async with listener(host_end) as allowed, listener(host_end) as other:
                assert await connects(session, host_end, other)
                await session.set_network_policy(NetworkPolicy("allowlist", (f"{host_end}:{allowed}",)))
                assert await connects(session, host_end, allowed)
                assert not await connects(session, host_end, other)
                # A host name is resolved once, on the host, at the switch.
                await session.set_network_policy(NetworkPolicy("allowlist", (f"localhost:{allowed}",)))
                assert not await connects(session, host_end, allowed)
                await session.set_network_policy(NetworkPolicy("allowlist", (host_end,)))  # any port
                assert await connects(session, host_end, allowed)
                assert await connects(session, host_end, other)
        finally:
            await session.close()


# Connects once per line read from the FIFO /app/go and writes its verdict
# into the FIFO /app/verdict: the test's exec blocks on both, nothing polls.
_PROBER = """
import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
os.mkfifo("/app/go")
os.mkfifo("/app/verdict")
open("/app/pid.tmp", "w").write(str(os.getpid()))
os.rename("/app/pid.tmp", "/app/pid")
while True:
    with open("/app/go") as go:
        go.read()
    try:
        socket.create_connection((host, port), timeout=3).close()
        verdict = "ok"
    except OSError:
        verdict = "refused"
    with open("/app/verdict", "w") as out:
        out.write(verdict)
"""


async def test_a_switch_applies_to_the_next_connection_of_a_running_process(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(60):
        session = await provider.open(None, FULL, f"{tag}-a")
        try:
            assert session.addresses is not None
            host_end = session.addresses[0]
            async with listener(host_end) as port:
                await session.write_file("/app/prober.py", _PROBER)
                await session.exec(f"python3 /app/prober.py {host_end} {port} > /app/prober.log 2>&1 &")
                pid = await wait_for_file(session, "/app/pid")
                verdicts = []
                for policy in [FULL, NONE, NetworkPolicy("allowlist", (f"{host_end}:{port}",)), NONE, FULL]:
                    await session.set_network_policy(policy)
                    probe = await session.exec("echo > /app/go && cat /app/verdict", timeout=30)
                    assert probe.exit_code == 0, probe
                    verdicts.append(probe.stdout)
                assert verdicts == ["ok", "refused", "ok", "refused", "ok"]
                # One process saw every policy: it was never restarted.
                assert (await session.exec(f"kill -0 {int(pid)} && cat /app/pid")).stdout == pid.decode()
        finally:
            await session.close()


def _plan(**policies: NetworkPolicy) -> ExecutionPlan:
    return ExecutionPlan("t", 0, ComponentRef("sandbox", {}), **policies)


def test_build_config_accepts_what_it_enforces_and_rejects_the_rest() -> None:
    env = SandboxEnvironment({})
    for policy in (NONE, FULL, NetworkPolicy("allowlist", ("example.com", "10.0.0.1:80", "[::1]:443"))):
        env.build_config(_plan(run_network_policy=policy))
    for bad in ("example.com:0", "example.com:http", "a b", "[::1", ""):
        with pytest.raises(ComponentError, match="allowlist entry"):
            env.build_config(_plan(evaluation_network_policy=NetworkPolicy("allowlist", (bad,))))


async def test_an_unresolvable_allowlist_fails_the_switch_and_keeps_the_old_policy(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            with pytest.raises(IssueError, match="does not resolve"):
                await session.set_network_policy(NetworkPolicy("allowlist", ("no-such-host.invalid",)))
            assert session.policy == NONE
        finally:
            await session.close()


class _Resolving(SandboxEnvironment):
    """Resolves names from a table: a host name without DNS on this host."""

    names: dict[str, list[str]] = {}

    def resolve_host(self, host: str) -> list[str]:
        if host not in self.names:
            raise ValueError(f"allowlist host {host!r} does not resolve")
        return self.names[host]


async def test_allowlisted_names_resolve_inside_to_the_allowed_addresses(tag: str) -> None:
    env = _Resolving({})
    with hang_guard(30):
        session = await env.open(None, FULL, f"{tag}-a")
        try:
            assert session.addresses is not None
            host_end = session.addresses[0]
            env.names = {"packages.test": [host_end]}
            async with listener(host_end) as port:
                await session.set_network_policy(NetworkPolicy("allowlist", (f"packages.test:{port}",)))
                looked_up = await session.exec("getent hosts packages.test")
                assert looked_up.stdout.split() == [host_end, "packages.test"]
                assert await connects(session, "packages.test", port)
                # Renamed, the old name no longer resolves inside (nor is it allowed).
                env.names = {"mirror.test": [host_end]}
                await session.set_network_policy(NetworkPolicy("allowlist", (f"mirror.test:{port}",)))
                assert (await session.exec("getent hosts packages.test")).exit_code != 0
                assert await connects(session, "mirror.test", port)
                await session.set_network_policy(NONE)
                assert (await session.exec("getent hosts mirror.test")).exit_code != 0
                # The host's own /etc/hosts is untouched.
                assert "mirror.test" not in await trio.Path("/etc/hosts").read_text()
        finally:
            await session.close()
            await env.sweep(tag)


async def test_a_failed_switch_never_widens_access(tag: str) -> None:
    """A first switch to an allowlist that cannot be resolved fails before
    any interface exists: the session stays offline."""
    env = _Resolving({})
    with hang_guard(30):
        session = await env.open(None, NONE, f"{tag}-a")
        try:
            with pytest.raises(IssueError, match="does not resolve"):
                await session.set_network_policy(NetworkPolicy("allowlist", ("nowhere.test",)))
            links = await session.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
            assert links.stdout.split() == ["lo"]
            assert session.addresses is None
        finally:
            await session.close()
            await env.sweep(tag)
