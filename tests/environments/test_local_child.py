"""The ``local`` environment's spawned command: waiting for its exit with and
without a pidfd, killing its group, closing its pipes."""

from __future__ import annotations

import os

import pytest
import trio

from agentcompass.environments._child import Child, _spawn, spawn

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfds")
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


async def _drain(stream: trio.abc.ReceiveStream) -> bytes:
    out = b""
    while chunk := await stream.receive_some(65536):
        out += chunk
    return out


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "thread"])
async def test_wait_reaps_the_exit_status_and_the_pipes_carry_both_streams(use_pidfd, tmp_path):
    child = Child(*_spawn(["bash", "-c", "echo out; echo err >&2; exit 3"], str(tmp_path), ENV), use_pidfd=use_pidfd)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                outputs: dict[str, bytes] = {}

                async def read(name: str, stream: trio.abc.ReceiveStream) -> None:
                    outputs[name] = await _drain(stream)

                nursery.start_soon(read, "out", child.stdout)
                nursery.start_soon(read, "err", child.stderr)
                assert await child.wait() == 3
        assert outputs == {"out": b"out\n", "err": b"err\n"} and child.returncode == 3
        assert await child.wait() == 3  # waiting again answers at once
    finally:
        await child.aclose()
        await child.aclose()  # idempotent


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "thread"])
async def test_kill_group_kills_the_command_and_what_it_started(use_pidfd, tmp_path):
    child = Child(*_spawn(["bash", "-c", "sleep 600 & echo $!; wait"], str(tmp_path), ENV), use_pidfd=use_pidfd)
    try:
        with trio.fail_after(20):
            grandchild = int((await child.stdout.receive_some(100)).strip())
            assert os.getpgid(grandchild) == child.pid  # the command leads its own group
            watch = os.pidfd_open(grandchild)
            try:
                child.kill_group()
                assert await child.wait() == -9
                await trio.lowlevel.wait_readable(watch)  # the group's other process died too
            finally:
                os.close(watch)
        child.kill_group()  # after reaping, the pgid may be someone else's: nothing is signalled
    finally:
        await child.aclose()


async def test_a_command_that_cannot_start_raises_and_leaves_no_descriptor(tmp_path):
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        await spawn(["/nonexistent/command"], str(tmp_path), ENV)
    with pytest.raises(FileNotFoundError):
        await spawn(["true"], str(tmp_path / "missing-dir"), ENV)
    assert set(os.listdir("/proc/self/fd")) <= before
