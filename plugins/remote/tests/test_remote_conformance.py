"""The provider conformance kit against ``remote`` backed by ``local``, on a
real server: every check, with the leak probe on the server's sandbox directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from _remote_support import TOKEN, InProcess, start_in_process
from agentcompass_remote import RemoteEnvironment

from agentcompass.testing import EnvironmentConformance, hang_guard


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
