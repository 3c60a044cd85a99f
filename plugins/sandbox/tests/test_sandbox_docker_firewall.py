"""Egress beside Docker's firewall: a Docker daemon with its default firewall
handling sets the ``FORWARD`` policy to ``DROP`` and jumps to ``DOCKER-USER``
first; the test makes the same rules (with the ``iptables`` Docker uses) and
removes them after, checking the host's rules are exactly as before. The
server reached is the test's own, in a network namespace of its own beyond
a veth of its own (on a 10.x.0.0/30 no route of the host uses)."""

from __future__ import annotations

import functools
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import _hoststate
import pytest
import trio
from _sandbox_support import docker_forward_rules, requires_sandbox
from agentcompass_sandbox import SandboxEnvironment, _forward, _host

from agentcompass import NetworkPolicy
from agentcompass.testing import hang_guard

pytestmark = [requires_sandbox, pytest.mark.serial]  # it changes the host's FORWARD policy for its duration
FULL = NetworkPolicy("full")
#: A name the host resolves through its resolver (not /etc/hosts) where it has one.
DNS_NAME = "deb.debian.org"


_SERVER = """
import socket, sys
sock = socket.socket()
sock.bind((sys.argv[1], 0))
sock.listen(16)
print(sock.getsockname()[1], flush=True)
while True:
    conn, _ = sock.accept()
    conn.sendall(b"hello from beyond\\n")
    conn.close()
"""


def _make_netns(netns: str, veth: str, prefix: str) -> None:
    subprocess.run(["ip", "netns", "add", netns], check=True)
    for argv in (
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns],
        ["ip", "addr", "add", f"{prefix}.0.1/30", "dev", veth],
        ["ip", "link", "set", veth, "up"],
        ["ip", "-n", netns, "addr", "add", f"{prefix}.0.2/30", "dev", "eth0"],
        ["ip", "-n", netns, "link", "set", "eth0", "up"],
        ["ip", "-n", netns, "link", "set", "lo", "up"],
    ):
        subprocess.run(argv, check=True, capture_output=True)


def _remove_netns(netns: str, veth: str) -> None:
    subprocess.run(["ip", "link", "del", veth], capture_output=True)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)


@asynccontextmanager
async def server_beyond_a_veth() -> AsyncIterator[tuple[str, int]]:
    """A TCP server at 10.x.0.2 in a network namespace of its own, joined to
    the host by a veth (10.x.0.1 on the host): reaching it from a sandbox is
    forwarded. Yields its address and port; removes the namespace and veth after."""
    suffix = secrets.token_hex(4)
    netns, veth = f"acfw{suffix}", f"fw{suffix}"
    prefix = _hoststate.free_prefix()
    try:
        await trio.to_thread.run_sync(_make_netns, netns, veth, prefix)
        argv = ["ip", "netns", "exec", netns, sys.executable, "-c", _SERVER, f"{prefix}.0.2"]
        async with trio.open_nursery() as nursery:
            run = functools.partial(trio.run_process, argv, stdout=subprocess.PIPE, check=False)
            process = await nursery.start(run)
            try:
                assert process.stdout is not None
                line = b""
                while not line.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(64)
                    assert chunk, "the test's server exited"
                    line += chunk
                yield f"{prefix}.0.2", int(line)
            finally:
                process.kill()
    finally:
        await trio.to_thread.run_sync(_remove_netns, netns, veth)


def _ours() -> dict[str, set[str]]:
    return _forward.owners()


async def _fetch(session, server: tuple[str, int]) -> str:  # type: ignore[no-untyped-def]
    probe = f"exec 3<>/dev/tcp/{server[0]}/{server[1]} && head -n 1 <&3"
    result = await session.exec(["bash", "-c", probe], timeout=20)
    return result.stdout if result.exit_code == 0 else f"failed: {result}"


async def test_a_full_session_has_egress_beside_dockers_forward_drop_and_leaves_the_rules_as_they_were(
    tag: str,
) -> None:
    try:
        expected = {info[4][0] for info in socket.getaddrinfo(DNS_NAME, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        expected = set()  # no resolver on this host: the name part is not shown here
    # A host that forwards nothing (turned on for the session, off again after it) and
    # a namespace made per session, destroyed at close: what close removes is seen here.
    provider = SandboxEnvironment({"reuse_network_namespaces": False})
    with hang_guard(120), _hoststate.forwarding_off():
        rules = _hoststate.firewall(whole=True)
        assert "table ip agentcompass_sandbox" not in rules, "a sandbox's leases left from before"
        try:
            with docker_forward_rules():
                async with server_beyond_a_veth() as server:
                    session = await provider.open(None, FULL, f"{tag}-a")
                    try:
                        assert await _fetch(session, server) == "hello from beyond\n"
                        if expected:
                            found = await session.exec(["getent", "hosts", DNS_NAME], timeout=20)
                            assert found.exit_code == 0, found
                            assert {line.split()[0] for line in found.stdout.splitlines()} <= expected
                        await session.set_network_policy(NetworkPolicy("allowlist", (f"{server[0]}:{server[1]}",)))
                        assert await _fetch(session, server) == "hello from beyond\n"
                        assert any(owner.startswith("@pool-") for owner in _ours()), "rules for its veth"
                        assert _hoststate.ip_forward() == "1"
                    finally:
                        await session.close()
                    assert not _ours(), "close removes the rules its namespace had"
        finally:
            await provider.sweep(tag)
        # The NAT table and forwarding went with the last lease: the host as it was.
        assert _hoststate.firewall(whole=True) == rules


async def test_sweep_removes_the_rules_a_killed_runtime_left(tag: str) -> None:
    rules = _hoststate.firewall()
    # A pool of a process that is gone (pid 1 did not start at tick 0), and a session of the tag.
    dead_pool = f"@pool-1-0-{secrets.randbelow(10**6)}"
    session_name = f"{tag}-gone"
    provider = SandboxEnvironment({})
    with docker_forward_rules():
        assert _forward.admit(_host.veth_name(dead_pool), dead_pool)
        assert _forward.admit(_host.veth_name(session_name), session_name)
        assert set(_ours()) >= {dead_pool, session_name}
        await provider.sweep(tag)
        assert not ({dead_pool, session_name} & set(_ours()))
    assert _hoststate.firewall() == rules


def test_nothing_is_added_where_there_is_no_docker_user_chain() -> None:
    if subprocess.run(["iptables", "-w", "-S", _forward.CHAIN], capture_output=True).returncode == 0:
        pytest.skip("this host has a DOCKER-USER chain")
    rules = _hoststate.firewall()
    assert not _forward.admit("ac000000000000", f"t{os.getpid()}")
    assert _hoststate.firewall() == rules
