"""The private daemon changes nothing on the host it did not make (SPEC 12
"Host safety"): ``dockerd --bridge=none`` deletes an existing ``docker0``,
and a daemon with its default firewall handling adds iptables rules and
turns forwarding on."""

from __future__ import annotations

import os

import _hoststate
import pytest
from agentcompass_docker.testing import PrivateDaemon, daemon_problem

PROBLEM = daemon_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _sysctls() -> dict[str, str]:
    paths = ["/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"]
    return {path: open(path).read() for path in paths if os.path.exists(path)}


def test_a_private_daemon_leaves_docker0_the_firewall_and_the_links_as_they_were() -> None:
    with _hoststate.docker0() as docker0:
        assert docker0, "docker0 has an address to lose"
        rules, sysctls = _hoststate.firewall(), _sysctls()
        daemon = PrivateDaemon.start()
        try:
            assert _hoststate.addresses("docker0") == docker0
            assert daemon.bridge is not None and daemon.bridge in _links()
            assert _hoststate.firewall() == rules
        finally:
            daemon.stop()
        assert _hoststate.addresses("docker0") == docker0
        assert _hoststate.firewall() == rules
        assert _sysctls() == sysctls
        assert daemon.bridge not in _links()
