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
from _sandbox_support import census, leftovers, requires_sandbox
from agentcompass_sandbox import SandboxEnvironment, _host, _spawner

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


async def test_a_failed_spawn_is_reported_and_the_next_one_works(tmp_path: Path, tag: str) -> None:
    with hang_guard(30):
        leaf = _host.cgroup_bases()["track"] / tag
        await trio.to_thread.run_sync(lambda: leaf.mkdir(parents=True))
        try:
            out_read, out_write = os.pipe()
            try:
                procs = [str(leaf / "cgroup.procs")]
                missing = str(tmp_path / "no-such-cgroup" / "cgroup.procs")
                with pytest.raises(_host.HostError, match="no-such-cgroup"):
                    await _spawner.spawn(["true"], [0, out_write, 2], [missing], _host.HOST_UID, _host.HOST_UID)
                # The child ran as nobody, with no supplementary groups, in the cgroup asked for.
                await _spawner.spawn(
                    ["sh", "-c", "id -u; id -G; cat /proc/self/cgroup"],
                    [0, out_write, 2],
                    procs,
                    _host.HOST_UID,
                    _host.HOST_UID,
                )
                os.close(out_write)
                out_write = -1
                async with trio.lowlevel.FdStream(out_read) as stream:
                    out_read = -1
                    output = b""
                    while chunk := await stream.receive_some(4096):
                        output += chunk
            finally:
                for fd in (out_read, out_write):
                    if fd >= 0:
                        os.close(fd)
            uid, groups, *cgroups = output.decode().splitlines()
            assert (uid, groups) == (str(_host.HOST_UID), str(_host.HOST_UID))
            assert any(line.startswith("0::") and line.endswith(f"/{tag}") for line in cgroups), cgroups
        finally:
            await trio.to_thread.run_sync(_host.kill_cgroup, str(leaf), True)


async def test_sandboxes_end_with_the_runtime_that_started_them(tag: str) -> None:
    """SIGKILL of the runtime: its spawner sees the socket close and exits,
    and bwrap's --die-with-parent ends every process of its sandboxes, even
    before anything reaps them."""
    name = f"{tag}-killed"
    with hang_guard(60):
        runtime = await trio.lowlevel.open_process(
            [sys.executable, "-c", _RUNTIME, name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            assert runtime.stdout is not None
            said = b""
            while b"\n" not in said and (chunk := await runtime.stdout.receive_some(64)):
                said += chunk
            assert said == b"open\n"
            assert [p for p in await census(name) if p.startswith("process")], "the sandbox should be running"
        finally:
            runtime.send_signal(signal.SIGKILL)
            await runtime.wait()
        try:
            # Bounded wait on a real condition: no process of the session is left.
            for _ in range(200):
                processes = [p for p in await census(name) if p.startswith("process")]
                if not processes:
                    break
                await trio.sleep(0.05)
            else:
                pytest.fail(f"the sandbox outlived its runtime: {processes}")
        finally:
            await SandboxEnvironment({}).sweep(name)
        assert await trio.to_thread.run_sync(leftovers, name) == []
