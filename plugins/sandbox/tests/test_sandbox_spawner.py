"""The spawner process that starts every bwrap: its failures are reported
without taking it down, and the sandboxes it started end with the runtime."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from _common import poll_until
from _sandbox_support import census, first_line, leftovers, requires_sandbox
from agentcompass_sandbox import SandboxEnvironment, _host, _spawner

from agentcompass.runtime._cleanup import using_cleanup_clock
from agentcompass.testing import hang_guard

pytestmark = requires_sandbox

# A runtime that opens one session with a background process inside, says
# its name, and waits to be killed.
_RUNTIME = """
import sys, trio
from agentcompass import NetworkPolicy
from agentcompass_sandbox import SandboxEnvironment

async def main():
    session = await SandboxEnvironment({}).open(None, NetworkPolicy("none"), sys.argv[1])
    await session.exec("sleep 600 > /dev/null 2>&1 &")
    print("open", flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


async def _spawn(argv: list[str], cgroups: list[str], stdin: int, stdout: int) -> tuple[int, int]:
    info_read, info_write = os.pipe()
    block_read, block_write = os.pipe()
    fds = [os.dup(stdin), os.dup(stdout), os.dup(2), info_write, block_read, info_read, block_write]
    return await _spawner.spawn(["bwrap", "--info-fd", "3", "--block-fd", "4", *argv], fds, cgroups)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


async def test_the_spawner_starts_bwrap_as_nobody_in_its_cgroups_and_reports_failures(tmp_path: Path, tag: str) -> None:
    sandbox = ["--unshare-all", "--ro-bind", "/", "/", "--", "sh", "-c", "echo ready; read _"]
    with hang_guard(30):
        leaf = _host.cgroup_bases()["track"] / tag
        await trio.to_thread.run_sync(lambda: leaf.mkdir(parents=True))
        stdin_read, stdin_write = os.pipe()
        out_read, out_write = os.pipe()
        try:
            missing = str(tmp_path / "no-such-cgroup" / "cgroup.procs")
            with pytest.raises(_host.HostError, match="could not move bwrap into its cgroup.*no-such-cgroup"):
                await _spawn(sandbox, [missing], stdin_read, out_write)
            with pytest.raises(_host.HostError, match="bwrap exited before"):
                await _spawn(["--no-such-option"], [str(leaf / "cgroup.procs")], stdin_read, out_write)
            # The spawner keeps serving after both failures.
            pid, child = await _spawn(sandbox, [str(leaf / "cgroup.procs")], stdin_read, out_write)
            os.close(out_write)
            out_write = -1
            async with trio.lowlevel.FdStream(out_read) as stream:
                out_read = -1
                assert await stream.receive_some(64) == b"ready\n"
                status = await trio.to_thread.run_sync(_status, pid)
                assert status["Uid"].split() == [str(_host.HOST_UID)] * 4
                assert status["Gid"].split() == [str(_host.HOST_UID)] * 4
                assert status["Groups"] == "" and status["CapEff"] == "0000000000000000"
                for member in (pid, child):
                    cgroup = await trio.Path(f"/proc/{member}/cgroup").read_text()
                    assert any(line.startswith("0::") and line.endswith(f"/{tag}") for line in cgroup.splitlines())
                os.close(stdin_write)  # the command's stdin ends: the sandbox exits
                stdin_write = -1
                assert await stream.receive_some(64) == b""
        finally:
            for fd in (stdin_read, stdin_write, out_read, out_write):
                if fd >= 0:
                    os.close(fd)
            await trio.to_thread.run_sync(_host.kill_cgroup, str(leaf), True)


class _Deadline:
    """A cleanup clock whose deadline is fixed (``using_cleanup_clock``'s seam)."""

    def __init__(self, at: float) -> None:
        self.at = at

    def deadline(self) -> float:
        return self.at


async def test_a_spawner_that_does_not_answer_is_given_up_at_the_cleanup_deadline(tmp_path: Path) -> None:
    spawner = await trio.to_thread.run_sync(_spawner._prepare, "bwrap")
    missing = [str(tmp_path / "no-such-cgroup" / "cgroup.procs")]
    os.kill(spawner.proc.pid, signal.SIGSTOP)
    try:
        with hang_guard(30), using_cleanup_clock(_Deadline(trio.current_time() + 0.5)):
            start = trio.current_time()
            with pytest.raises(_host.HostError, match="did not answer"):
                await _spawn(["--no-such-option"], missing, 0, 1)
            assert trio.current_time() - start < 5  # the deadline, not the spawner's own 10 s
    finally:
        os.kill(spawner.proc.pid, signal.SIGCONT)


async def test_sandboxes_end_with_the_runtime_that_started_them(tag: str) -> None:
    """SIGKILL of the runtime: its spawner sees the socket close and exits,
    and bwrap's --die-with-parent ends every process of its sandboxes, even
    before anything reaps them."""
    name = f"{tag}-killed"
    with hang_guard(60):
        try:
            runtime = await trio.lowlevel.open_process(
                [sys.executable, "-c", _RUNTIME, name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            try:
                assert await first_line(runtime) == b"open\n"
                assert [p for p in await census(name) if p.startswith("process")], "the sandbox should be running"
            finally:
                runtime.send_signal(signal.SIGKILL)
                await runtime.wait()

            async def gone() -> bool:
                return not [p for p in await census(name) if p.startswith("process")]

            await poll_until(gone, "the sandbox's processes to end with its runtime", 10, every=0.05)
        finally:
            await SandboxEnvironment({}).sweep(name)
        assert await trio.to_thread.run_sync(leftovers, name) == []
