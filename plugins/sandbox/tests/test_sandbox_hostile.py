"""What a hostile session tries against the runtime: reading the runtime's
environment, racing the root-side file operations with symlink swaps, and
killing its own init so that its pid number goes to another session."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import trio
from _sandbox_support import requires_sandbox, wait_for_file
from agentcompass_sandbox import SandboxEnvironment

from agentcompass import FileRefusedError, NetworkPolicy
from agentcompass.testing import hang_guard

pytestmark = requires_sandbox
NONE = NetworkPolicy("none")

# Every environment a process of the session can see, while execs come and go.
_ENVIRON_WATCH = r"""
import os, sys
secret = sys.argv[1].encode()
found = set()
for _ in range(4000):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if secret in f.read():
                        found.add(pid)
            except OSError:
                pass
open("/app/watch.out", "w").write(",".join(sorted(found)) or "none")
"""


async def test_no_process_of_a_session_sees_the_runtime_environment(
    provider: SandboxEnvironment, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"sk-{secrets.token_hex(12)}"
    monkeypatch.setenv("AGENTCOMPASS_TEST_API_KEY", secret)
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/app/watch.py", _ENVIRON_WATCH)
            started = await session.exec(f"setsid python3 /app/watch.py {secret} > /dev/null 2>&1 &")
            assert started.exit_code == 0, started
            # Execs start while the watcher scans every /proc/<pid>/environ.
            for _ in range(20):
                assert (await session.exec("true")).exit_code == 0
            direct = await session.exec("cat /proc/1/environ /proc/2/environ | tr '\\0' '\\n'; env")
            assert secret not in direct.stdout
            assert "AGENTCOMPASS_TEST_API_KEY" not in direct.stdout
            assert await wait_for_file(session, "/app/watch.out", 60) == b"none"
        finally:
            await session.close()


# Swaps /app/d between a directory of the session and a link to a root-only
# host directory, as fast as it can, until told to stop.
_SWAPPER = r"""
import os, shutil, sys
os.chdir("/app")
os.makedirs("real", exist_ok=True)
open("real/f", "w").write("inside")
os.symlink(sys.argv[1], "lnk")
swaps = 0
while not os.path.exists("/app/stop"):
    try:
        os.rename("real", "d"); os.rename("d", "real")
        os.rename("lnk", "d"); os.rename("d", "lnk")
        swaps += 2
    except OSError:  # the runtime made d (a write makes missing parents) meanwhile
        if os.path.isdir("d") and not os.path.islink("d"):
            shutil.rmtree("d", ignore_errors=True)
open("/app/swaps.part", "w").write(str(swaps))
os.rename("/app/swaps.part", "/app/swaps.out")  # whole once it is there: the test reads it as soon as it exists
"""


async def test_root_side_file_operations_never_follow_a_swapped_link_out(
    provider: SandboxEnvironment, tag: str, tmp_path: Path
) -> None:
    host_dir = tmp_path / "root-only"
    host_dir.mkdir(mode=0o700)
    (host_dir / "f").write_bytes(b"HOST SECRET")
    os.chmod(host_dir / "f", 0o600)
    outcomes: dict[str, int] = {}
    with hang_guard(120):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/app/swap.py", _SWAPPER)
            assert (await session.exec(f"setsid python3 /app/swap.py {host_dir} > /dev/null 2>&1 &")).exit_code == 0
            await wait_for_file(session, "/app/real/f")
            for i in range(3000):
                try:
                    if i % 2:
                        await session.write_file("/app/d/f", b"runtime wrote")
                        outcome = "written"
                    else:
                        got = await session.read_file("/app/d/f")
                        assert got != b"HOST SECRET"
                        outcome = "read"
                except (FileRefusedError, FileNotFoundError, NotADirectoryError) as exc:
                    outcome = type(exc).__name__
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                assert (host_dir / "f").read_bytes() == b"HOST SECRET"
            await session.write_file("/app/stop", b"")
            swaps = int(await wait_for_file(session, "/app/swaps.out", 30))
        finally:
            await session.close()
    assert (host_dir / "f").read_bytes() == b"HOST SECRET"
    assert sorted(os.listdir(host_dir)) == ["f"]  # nothing was created beside it either
    assert swaps >= 3000, swaps
    # The race was run: some operations met the directory, some the link.
    assert outcomes.get("read", 0) + outcomes.get("written", 0) > 0, outcomes
    assert outcomes.get("FileRefusedError", 0) > 0, outcomes


async def test_reads_of_what_a_session_made_are_bounded_and_never_block(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            made = await session.exec(
                "mkfifo /app/fifo && truncate -s 4G /app/sparse && head -c 2000 /dev/zero > /app/small"
                " && ln -s small /app/inner-link"
            )
            assert made.exit_code == 0, made
            with trio.fail_after(5):
                with pytest.raises(FileRefusedError, match="not a regular file"):
                    await session.read_file("/app/fifo")
                with pytest.raises(FileRefusedError, match="larger than"):
                    await session.read_file("/app/sparse")  # refused by its size, not read
                with pytest.raises(FileRefusedError, match="larger than 1000 bytes"):
                    await session.read_file("/app/small", max_bytes=1000)
                assert len(await session.read_file("/app/small", max_bytes=2000)) == 2000
                with pytest.raises(FileRefusedError, match="is a symbolic link"):
                    await session.read_file("/app/inner-link")
            # A FIFO at a written path is replaced, never written into (which would block).
            with trio.fail_after(5):
                await session.write_file("/app/fifo", b"plain")
            assert await session.read_file("/app/fifo") == b"plain"
        finally:
            await session.close()


def _set_next_pid(pid: int) -> None:
    """The host's next process gets ``pid`` (if nothing else forks first)."""
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))


async def test_a_dead_init_never_lets_an_exec_into_another_session(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(120):
        first = await provider.open(None, NONE, f"{tag}-a")
        second = None
        try:
            old_pid = first._init_pid
            killed = await first.exec("kill -9 -1; sleep 5")
            assert killed.exit_code != 0
            # The next sessions' inits are steered to the dead init's pid number.
            # (Processes the open starts before bwrap's child take numbers first: try a few offsets.)
            for attempt in range(30):
                await trio.to_thread.run_sync(_set_next_pid, old_pid - 1 - attempt % 6)
                second = await provider.open(None, NONE, f"{tag}-b{secrets.token_hex(2)}")
                if second._init_pid == old_pid:
                    break
                await second.close()
                second = None
            if second is None:
                pytest.skip("the host gave the dead init's pid number to another process")
            await second.write_file("/app/theirs.txt", b"second's file")
            # The first session's exec fails; it runs nowhere, least of all in the second.
            result = await first.exec("cat /app/theirs.txt; touch /app/planted")
            assert result.exit_code != 0
            assert "second's file" not in result.stdout
            with pytest.raises(FileNotFoundError):
                await second.read_file("/app/planted")
            assert (await second.exec("ls /app")).stdout.split() == ["theirs.txt"]
            # The dead session is still a session: its files and policy switch work, close cleans up.
            await first.set_network_policy(NetworkPolicy("full"))
            with pytest.raises(FileNotFoundError):
                await first.read_file("/app/theirs.txt")
        finally:
            await first.close()
            if second is not None:
                await second.close()


async def test_each_session_tmpfs_has_a_bounded_size(tag: str) -> None:
    provider = SandboxEnvironment({"tmpfs_mb": 8})
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            for directory in ("/tmp", "/app", "/logs"):
                filled = await session.exec(f"head -c 12M /dev/zero > {directory}/fill")
                assert filled.exit_code != 0 and "No space left" in filled.stderr, (directory, filled)
                assert (await session.exec(f"rm {directory}/fill")).exit_code == 0
            # The default, with no memory_mb: 1 GiB each, not half of the host's memory.
            assert SandboxEnvironment({}).options.tmpfs_mb == 1024
        finally:
            await session.close()
            await provider.sweep(tag)


async def test_the_session_root_cannot_be_rearranged(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            # Replacing /lib64 would hand every later command (the runtime's own
            # verifier commands included) the agent's ELF interpreter.
            for attempt in ("mv /lib64 /lib64.old", "mkdir /fake", "ln -sfn /tmp /bin", "touch /x"):
                result = await session.exec(attempt)
                assert result.exit_code != 0 and "Read-only file system" in result.stderr, (attempt, result)
            writable = await session.exec("touch /tmp/a /app/a /logs/a /tests/a /solution/a")
            assert writable.exit_code == 0, writable
        finally:
            await session.close()


async def test_host_users_files_are_not_in_the_session(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            listed = await session.exec("ls -d /home /srv /root /mnt 2>&1; ls /")
            for hidden in ("/home", "/srv", "/root", "/mnt"):
                assert f"cannot access '{hidden}'" in listed.stdout, listed
        finally:
            await session.close()
