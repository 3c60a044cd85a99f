"""Isolation of one sandbox session: the Harbor layout, the unprivileged user,
a read-only host, confined file paths, process trees killed at timeouts,
cancellation and close, and cgroup limits."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import trio
from _common import poll_until
from _sandbox_support import census, requires_sandbox
from agentcompass_sandbox import SandboxEnvironment

from agentcompass import FileRefusedError, IssueError, NetworkPolicy
from agentcompass.testing import hang_guard

pytestmark = requires_sandbox
NONE = NetworkPolicy("none")


async def test_commands_run_as_an_unprivileged_user_in_app(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            result = await session.exec("id -u; pwd; hostname; echo $APP_DIR $LOGS_DIR; ls -d /tests /logs /solution")
            assert result.exit_code == 0, result
            uid, cwd, host, dirs, *listed = result.stdout.splitlines()
            assert (uid, cwd, host, dirs) == ("1000", "/app", "sandbox", "/app /logs")
            assert listed == ["/logs", "/solution", "/tests"]
            # The pid namespace is the session's own: the host's processes are invisible.
            ps = await session.exec(["bash", "-c", "ls /proc | grep -c '^[0-9]'"])
            assert int(ps.stdout) < 10
            assert (await session.exec("ls", cwd="sub")).exit_code != 0  # missing cwd: a failure, not a crash
        finally:
            await session.close()


async def test_harbor_paths_are_literal_and_files_round_trip(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/tests/test.sh", "echo 1 > /logs/verifier/reward.txt\n")
            await session.write_file("data/in.txt", b"relative goes to /app\n")
            result = await session.exec("mkdir -p /logs/verifier && bash /tests/test.sh && cat /app/data/in.txt")
            assert result.exit_code == 0, result
            assert result.stdout == "relative goes to /app\n"
            assert await session.read_file("/logs/verifier/reward.txt") == b"1\n"
            # Files the runtime wrote belong to the sandbox user, who can change them.
            assert (await session.exec("echo more >> /app/data/in.txt")).exit_code == 0
        finally:
            await session.close()


async def test_a_write_to_a_host_path_does_not_reach_the_host(provider: SandboxEnvironment, tag: str) -> None:
    host_file = Path("/tmp") / f"agentcompass-escape-{secrets.token_hex(4)}"
    repo_file = Path(__file__).with_name(f"escape-{secrets.token_hex(4)}")
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            inside = await session.exec(
                f"echo x > {host_file} && cat {host_file}; echo y > {repo_file}; echo z > /etc/x"
            )
            # /tmp is the sandbox's own; the host's userland is read-only.
            assert inside.stdout == "x\n"
            assert "Read-only file system" in inside.stderr
            assert not host_file.exists() and not repo_file.exists()
            assert not Path("/etc/x").exists()
            # Only the host's userland is there: not this project, not /root.
            assert (await session.exec(f"ls {Path(__file__).parent} /root")).exit_code != 0
            assert (await session.exec("ls /usr/bin/python3 /etc/os-release")).exit_code == 0
            # The host's secrets stay unreadable: the sandbox user is nobody on the host.
            assert (await session.exec("cat /etc/shadow")).exit_code != 0
            # File paths are confined too, symlinks included.
            for path in ("/etc/passwd", "../../etc/passwd", str(host_file)):
                with pytest.raises(IssueError, match="outside"):
                    await session.read_file(path)
            assert (await session.exec("ln -s /etc/shadow /app/link")).exit_code == 0
            with pytest.raises(FileRefusedError, match="symbolic link"):
                await session.read_file("/app/link")
            # A write replaces the planted link; the host file is never opened.
            shadow = Path("/etc/shadow").read_bytes()
            await session.write_file("/app/link", "overwrite")
            assert Path("/etc/shadow").read_bytes() == shadow
            assert (await session.exec("test ! -L /app/link && cat /app/link")).stdout == "overwrite"
        finally:
            await session.close()
    assert not host_file.exists()


async def _running(marker: str) -> list[int]:
    def scan() -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    return await trio.to_thread.run_sync(scan)


async def test_a_background_process_is_gone_after_close(provider: SandboxEnvironment, tag: str) -> None:
    marker = f"agentcompass-bg-{secrets.token_hex(4)}"
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            # A daemon that leaves its session and process group, as agents' servers do.
            result = await session.exec(f"setsid bash -c 'exec -a {marker} sleep 600' > /dev/null 2>&1 &")
            assert result.exit_code == 0
            # Still alive after its exec returned (the daemon execs with its
            # marker a moment after the shell that started it exits).
            await poll_until(lambda: _running(marker), "the daemon to exec with its marker", 5)
            again = await session.exec(f"pgrep -f {marker}")
            assert again.exit_code == 0  # and visible to later commands, as in a container
        finally:
            await session.close()
        assert await _running(marker) == []
        assert await census(tag) == []


async def test_a_timeout_kills_the_whole_tree(provider: SandboxEnvironment, tag: str) -> None:
    marker = f"agentcompass-tree-{secrets.token_hex(4)}"
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            cmd = f"setsid bash -c 'exec -a {marker} sleep 600' & echo started; sleep 600"
            result = await session.exec(cmd, timeout=0.5)
            assert result.timed_out and result.exit_code == 124
            assert result.stdout == "started\n"
            assert await _running(marker) == []  # even the setsid daemon
            with trio.move_on_after(0.5) as cancelled:
                await session.exec(f"setsid bash -c 'exec -a {marker} sleep 600' & sleep 600")
            assert cancelled.cancelled_caught
            assert await _running(marker) == []
            assert (await session.exec("echo still usable")).stdout == "still usable\n"
        finally:
            await session.close()


async def test_output_is_truncated_to_its_tail(tag: str) -> None:
    env = SandboxEnvironment({"max_output_bytes": 1000})
    with hang_guard(30):
        session = await env.open(None, NONE, f"{tag}-a")
        try:
            result = await session.exec("seq 1 10000")
            assert len(result.stdout.encode()) <= 1000
            assert result.stdout.startswith("[... ") and result.stdout.endswith("10000\n")
        finally:
            await session.close()
            await env.sweep(tag)


async def test_cgroup_limits_hold(tag: str) -> None:
    env = SandboxEnvironment({"memory_mb": 64, "pids_max": 32})
    with hang_guard(60):
        session = await env.open(None, NONE, f"{tag}-a")
        try:
            forks = await session.exec("for i in $(seq 1 64); do sleep 5 & done; wait", timeout=20)
            assert "fork" in forks.stderr.lower() or "resource" in forks.stderr.lower(), forks
            hog = await session.exec(["python3", "-c", "b = bytearray(256 * 1024 * 1024); print('allocated')"])
            assert "allocated" not in hog.stdout
            assert hog.exit_code != 0
        finally:
            await session.close()
            await env.sweep(tag)
    assert await census(tag) == []


async def test_operations_after_close_fail(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        await session.close()
        await session.close()
        with pytest.raises(IssueError, match="closed"):
            await session.exec("true")
        with pytest.raises(IssueError, match="closed"):
            await session.write_file("x", "y")
