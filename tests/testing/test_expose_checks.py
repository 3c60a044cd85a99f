"""The kit's exposure checks fail on providers that expose what they
shouldn't (the good providers, ``sandbox`` and ``docker``, run them in
their own tests)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agentcompass import NetworkPolicy
from agentcompass.environments.local import LocalEnvironment, LocalSession
from agentcompass.host import bind_read_only, unmount
from agentcompass.testing import check_exposed_directory, check_exposed_socket, check_sweep_detaches_exposures

FULL = NetworkPolicy("full")


async def test_handing_the_host_directory_itself_fails_the_directory_check(tmp_path: Path) -> None:
    # local's sessions run on the host's files: the directory is the host's, writable.
    env = LocalEnvironment({"root": str(tmp_path / "sessions")})
    (tmp_path / "scratch").mkdir()
    with pytest.raises(AssertionError, match="exposed_directory: .* succeeded inside the session"):
        await check_exposed_directory(env, None, tmp_path / "scratch", tag="bad", policy=FULL)


class _WrongSocket(LocalSession):
    async def expose_socket(self, host_path: str) -> str:
        return host_path + ".elsewhere/s"


class _WrongSocketEnvironment(LocalEnvironment):
    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> LocalSession:
        session = await super().open(config, FULL, name)
        session.__class__ = _WrongSocket
        return session


async def test_a_socket_that_does_not_answer_inside_fails_the_socket_check(tmp_path: Path) -> None:
    env = _WrongSocketEnvironment({"root": str(tmp_path / "sessions")})
    (tmp_path / "scratch").mkdir()
    with pytest.raises(AssertionError, match="exposed_socket"):
        await check_exposed_socket(env, None, tmp_path / "scratch", tag="bad")


class _Binding(LocalSession):
    """Binds each exposure read-only under ``<mounts>/<name>/`` (as a real provider's state directory)."""

    mounts: Path
    count = 0

    async def expose_directory(self, host_path: str) -> str:
        self.count += 1
        base = self.mounts / self.name
        await trio.Path(base).mkdir(parents=True, exist_ok=True)
        target = f"{base}/exposed-{self.count}"
        await trio.to_thread.run_sync(bind_read_only, host_path, f"{base}/stage-{self.count}", target)
        return target


class _ForgetfulSweep(LocalEnvironment):
    """Its sweep detaches nothing: what a killed runtime's exposures leave stays mounted."""

    mounts: Path

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> LocalSession:
        session = await super().open(config, FULL, name)
        session.__class__ = _Binding
        session.mounts = self.mounts  # type: ignore[attr-defined]
        return session

    async def sweep(self, tag: str) -> None:
        return None


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounting needs root")
async def test_a_sweep_that_leaves_the_binds_fails_the_sweep_check(tmp_path: Path) -> None:
    env = _ForgetfulSweep({"root": str(tmp_path / "sessions")})
    env.mounts = tmp_path / "mounts"
    (tmp_path / "scratch").mkdir()
    try:
        with pytest.raises(AssertionError, match=r"mounts left after sweep\('bad'\)"):
            await check_sweep_detaches_exposures(env, None, tmp_path / "scratch", tag="bad")
    finally:
        for entry in sorted((tmp_path / "mounts" / "bad-w").iterdir(), reverse=True):
            unmount(str(entry))  # the exposures first (they sort after the stages)
    assert sorted(p.name for p in (tmp_path / "mounts" / "bad-w").iterdir()) == [
        "exposed-1", "exposed-2", "exposed-3", "stage-1", "stage-2", "stage-3",
    ]  # fmt: skip
