"""The ``docker`` tests: the private daemon is the ``docker_daemon`` fixture of
:mod:`agentcompass_docker.testing` (a pytest plugin the distribution
registers); the repository's ``tests/`` helpers (``_common``) are importable
here too, whichever test directories a run collects."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[3] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))


@pytest.fixture(scope="session", autouse=True)
def host_network_untouched() -> Iterator[None]:
    """The docker tests (the private daemon's start and stop included) leave
    the host's ``docker0`` (one is made for them where the host has none), its
    addresses and the host's firewall rules as they found them (SPEC 12)."""
    if os.geteuid() != 0:
        yield
        return
    import _hoststate

    with _hoststate.docker0() as before:
        rules = _hoststate.firewall()
        yield
        assert _hoststate.addresses("docker0") == before, "the docker tests removed or changed docker0"
        assert _hoststate.firewall() == rules, "the docker tests changed the host's firewall rules"
