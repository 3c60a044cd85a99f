"""The provider conformance kit against ``docker`` on a private daemon:
every check, the hostile-session ones included, with the leak probe on the
daemon's labelled containers and networks."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from _docker_support import labelled, provider

from agentcompass import NetworkPolicy
from agentcompass.testing import EnvironmentConformance, hang_guard

#: The gateway checks' in-session client (and the gateway's forwarder) need python3.
PYTHON_IMAGE = Path(__file__).parent / "images" / "python3"


@pytest.mark.parametrize("check", EnvironmentConformance.CHECKS)
async def test_docker_conforms(docker_daemon, check: str):
    if check.startswith("gateway_"):
        env = provider(docker_daemon, default_image=docker_daemon.test_image("test-python3", PYTHON_IMAGE))
    else:
        env = provider(docker_daemon)
    kit = EnvironmentConformance(
        env,
        # An image the daemon lacks, with pull "never": open fails before making anything.
        failing_config=attrs.evolve(env.build_config(EnvironmentConformance(env).plan), image="agentcompass/absent:1"),
        count_sandboxes=lambda: len(labelled(docker_daemon)),
        host_address=lambda session: session.gateway,
        isolated=True,
        kill_init="kill -9 -1",
        grace_seconds=20,
        # Literal addresses: this host may have no DNS (names are resolved at the switch).
        policies=[NetworkPolicy("none"), NetworkPolicy("allowlist", ("127.0.0.1:9",)), NetworkPolicy("full")],
    )
    if check not in kit.checks():
        pytest.skip(f"{check} does not apply")
    with hang_guard(120):
        await kit.run(check)
