"""``agentcompass.host.FileLock``: holders exclude each other across
processes and within one; a cancelled wait or block never keeps the lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agentcompass.host import FileLock

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock and /proc/locks")

_HOLDER = (
    "import sys\n"
    "from agentcompass.host import FileLock\n"
    "with FileLock.acquire(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


def _blocked_on(path: Path) -> int:
    """How many ``flock`` requests wait on ``path`` now (``->`` lines of /proc/locks)."""
    inode = os.stat(path).st_ino
    count = 0
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields and "FLOCK" in fields and int(fields[-3].rsplit(":", 1)[1]) == inode:
                count += 1
    return count


async def _until_blocked(path: Path, waiters: int = 1) -> None:
    with trio.fail_after(10):
        while _blocked_on(path) < waiters:  # noqa: ASYNC110 - the kernel signals no waiter; /proc/locks shows it
            await trio.sleep(0.001)


async def test_a_holder_in_another_process_excludes_until_it_releases(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        said = b""
        with trio.fail_after(30):
            while not said.endswith(b"\n"):
                said += await holder.stdout.receive_some(64)
        assert said == b"held\n"
        assert FileLock.try_acquire(path) is None
        entered = trio.Event()

        async def second() -> None:
            async with FileLock.open(path) as lock:
                assert lock.held
                entered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await _until_blocked(path)
            assert not entered.is_set()
            await holder.stdin.aclose()  # the holder releases and exits
            with trio.fail_after(10):
                await entered.wait()
    finally:
        holder.kill()
        with trio.move_on_after(10, shield=True):
            await holder.wait()


async def test_waiters_in_one_process_take_the_lock_one_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    inside, most = 0, 0

    async def user() -> None:
        nonlocal inside, most
        async with FileLock.open(path):
            inside += 1
            most = max(most, inside)
            await trio.sleep(0.01)
            assert FileLock.try_acquire(path) is None
            inside -= 1

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(user)
    assert most == 1


async def test_a_cancelled_wait_never_keeps_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fds = len(os.listdir("/proc/self/fd"))
    first = FileLock.acquire(path)
    with trio.CancelScope() as scope:

        async def cancel_once_blocked() -> None:
            await _until_blocked(path)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_blocked)
            async with FileLock.open(path):
                pytest.fail("entered while another holder had the lock")
    assert scope.cancelled_caught
    first.release()
    # The abandoned thread gets the lock now and must let it go at once.
    with trio.fail_after(10):
        async with FileLock.open(path):
            pass
    assert len(os.listdir("/proc/self/fd")) == fds


async def test_a_block_that_ends_by_cancellation_releases(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with trio.CancelScope() as scope:
        async with FileLock.open(path):
            assert FileLock.try_acquire(path) is None
            scope.cancel()
            await trio.sleep_forever()
    again = FileLock.try_acquire(path)
    assert again is not None
    again.release()
    again.release()  # a second release does nothing
    assert not again.held


def test_a_directory_locks_and_mode_none_makes_nothing(tmp_path: Path) -> None:
    with FileLock.try_acquire(tmp_path, mode=None) as held:  # type: ignore[union-attr]
        assert held.held
        assert FileLock.try_acquire(tmp_path) is None
    with pytest.raises(FileNotFoundError):
        FileLock.try_acquire(tmp_path / "missing", mode=None)
    assert not (tmp_path / "missing").exists()
    made = FileLock.acquire(tmp_path / "made.lock", mode=0o600)
    made.release()
    assert (tmp_path / "made.lock").stat().st_mode & 0o777 == 0o600


def test_shared_holders_coexist_and_exclude_an_exclusive_one(tmp_path: Path) -> None:
    path = tmp_path / "root.lock"
    first = FileLock.acquire(path, shared=True)
    second = FileLock.try_acquire(path, shared=True)
    assert second is not None and second.held
    assert FileLock.try_acquire(path) is None  # exclusive: not while any shared holder is there
    first.release()
    assert FileLock.try_acquire(path) is None
    second.release()
    exclusive = FileLock.try_acquire(path)
    assert exclusive is not None
    assert FileLock.try_acquire(path, shared=True) is None
    exclusive.release()
