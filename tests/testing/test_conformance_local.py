"""The conformance kit against a real provider (``local``): real processes,
real blocking points for the cancelled-open and cancelled-close checks."""

from __future__ import annotations

from pathlib import Path

from agentcompass.environments.local import LocalEnvironment
from agentcompass.testing import check_environment, hang_guard


async def test_local_environment_conforms(tmp_path: Path) -> None:
    with hang_guard(180):
        await check_environment(
            LocalEnvironment({"root": str(tmp_path)}),
            count_sandboxes=lambda: len(list(tmp_path.iterdir())),
            # local shares the host's network: the host is on its loopback.
            host_address=lambda session: "127.0.0.1",
        )
