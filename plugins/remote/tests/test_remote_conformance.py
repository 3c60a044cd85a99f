"""The provider conformance kit against ``remote`` backed by ``local``, on a
real server: every check, with the leak probe on the server's sandbox
directory; and backed by ``sandbox`` where the host can run it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import trio
from _common import poll_until
from _remote_support import TOKEN, InProcess, requires_sandbox, start_in_process
from agentcompass_remote import RemoteEnvironment, SandboxServer, serve_sandboxes

from agentcompass import NetworkPolicy
from agentcompass.testing import EnvironmentConformance, check_environment, hang_guard

try:
    from agentcompass_sandbox import _host as sandbox_host
except ImportError:  # the remote plugin does not need the sandbox plugin
    pass


@pytest.mark.parametrize("check", EnvironmentConformance.CHECKS)
async def test_remote_conforms(server: InProcess, check: str):
    kit = EnvironmentConformance(
        RemoteEnvironment({"url": server.url, "token": TOKEN}),
        # A plan the server's provider rejects: the open fails on the server.
        failing_config={"task_id": "x", "policies": {"baseline": {"mode": "none", "allow": []}}},
        count_sandboxes=server.settled_count,
        grace_seconds=10,
    )
    if check not in kit.checks():
        pytest.skip(f"{check} does not apply")
    with hang_guard(120):
        await kit.run(check)


async def test_a_pool_conforms(server: InProcess, nursery: trio.Nursery, tmp_path: Path):
    second = await start_in_process(nursery, tmp_path / "second")

    async def count() -> int:
        return await server.settled_count() + await second.settled_count()

    kit = EnvironmentConformance(
        RemoteEnvironment({"url": [server.url, second.url], "token": TOKEN}), count_sandboxes=count
    )
    with hang_guard(120):
        await kit.run_all()


@requires_sandbox
@pytest.mark.serial  # its leak probe counts every remote- sandbox on the host, another test's too
async def test_remote_backed_by_sandbox_conforms(nursery: trio.Nursery):
    # Skipped with the sandbox's own preflight message where this host cannot
    # create namespaces. The leak probe counts the sandbox's state directories
    # (as the sandbox's own conformance test does).
    server = SandboxServer("sandbox", TOKEN, grace=10.0)
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    tag = f"r{secrets.token_hex(4)}"

    async def count() -> int:
        await poll_until(lambda: server.load == 0, "the server to close its sessions")
        root = sandbox_host.STATE_ROOT
        # Only this test's sessions (named by the remote provider or with the
        # kit's tag): other runs on this host share the state root.
        ours = ("remote-", tag, f"x{tag}")
        return len([e for e in os.listdir(root) if e.startswith(ours)]) if root.is_dir() else 0

    env = RemoteEnvironment({"url": f"ws://127.0.0.1:{port}", "token": TOKEN, "provider": "sandbox"})
    try:
        with hang_guard(240):
            await check_environment(
                env,
                # A provider config the server's sandbox refuses: the open fails on the server.
                failing_config={"provider_config": {"bogus": 1}},
                count_sandboxes=count,
                isolated=True,
                tag=tag,
                # Literal addresses: this host may have no DNS.
                policies=[NetworkPolicy("none"), NetworkPolicy("allowlist", ("127.0.0.1:9",)), NetworkPolicy("full")],
                grace_seconds=10,
            )
        assert server.opened_total >= 10 and server.peak_load >= 3  # the sweep check held three at once
    finally:
        with trio.move_on_after(30, shield=True):
            await env.sweep(tag)
