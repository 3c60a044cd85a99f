"""The advisory file lock (see :class:`FileLock`)."""

from __future__ import annotations

import fcntl
import math
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType

import attrs
import trio


def _open(path: str, mode: int | None) -> int:
    if mode is None:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    except IsADirectoryError:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


@attrs.define(eq=False)
class FileLock:
    """An advisory lock (``flock``) held on ``path``: exclusive, or with
    ``shared=True`` one of any number of shared holders (none while an
    exclusive one holds it).

    Get one with :meth:`open` (Trio), :meth:`acquire` (a worker thread) or
    :meth:`try_acquire` (no wait). It is held until :meth:`release`, the end
    of its ``with`` / ``async with`` block, or the death of the process.
    ``path`` is a file, made (with ``mode``) when missing, or an existing
    directory; with ``mode=None`` nothing is made (a missing ``path``
    raises ``FileNotFoundError``). The file is never removed (removing it would let a second
    holder lock a new file of the same name)."""

    path: str
    _fd: int | None

    @classmethod
    def try_acquire(
        cls, path: str | os.PathLike[str], mode: int | None = 0o644, *, shared: bool = False
    ) -> FileLock | None:
        """The lock, or None at once when another holder has it. Blocking
        (it opens the file): call it from a worker thread in async code.
        Raises ``OSError`` when ``path`` cannot be opened."""
        fd = _open(os.fspath(path), mode)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(os.fspath(path), fd)

    @classmethod
    def acquire(cls, path: str | os.PathLike[str], mode: int | None = 0o644, *, shared: bool = False) -> FileLock:
        """The lock, waiting for it as long as another holder has it.
        Blocking and not cancellable: for code that runs in a worker
        thread; async code uses :meth:`open`."""
        fd = _open(os.fspath(path), mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return cls(os.fspath(path), fd)

    @classmethod
    @asynccontextmanager
    async def open(cls, path: str | os.PathLike[str], mode: int | None = 0o644) -> AsyncIterator[FileLock]:
        """``async with FileLock.open(path) as lock:`` holds the lock for the
        block, waiting for it in a worker thread (so the Trio loop runs on).

        Cancellation ends the wait at once; the abandoned thread closes the
        descriptor as soon as it gets the lock, so a cancelled waiter never
        keeps it. Within one process, waiters of the same path queue on a
        Trio lock first, so a queue of them holds one thread, not one each.
        The lock is released when the block ends, however it ends."""
        key = os.fspath(path)
        queues = _queues()
        queue = queues.setdefault(key, trio.Lock())
        try:
            async with queue:
                waiter = _Waiter(key, mode)
                try:
                    await trio.to_thread.run_sync(waiter.wait, abandon_on_cancel=True, limiter=_waiters())
                except BaseException:
                    waiter.abandon()
                    raise
                with cls(key, waiter.fd) as lock:
                    yield lock
        finally:
            stats = queue.statistics()
            if not stats.locked and not stats.tasks_waiting and queues.get(key) is queue:
                del queues[key]

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Release the lock (closing its descriptor); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


_QUEUES: trio.lowlevel.RunVar[dict[str, trio.Lock]] = trio.lowlevel.RunVar("agentcompass_host_lock_queues")
_WAITERS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("agentcompass_host_lock_waiters")


def _queues() -> dict[str, trio.Lock]:
    try:
        return _QUEUES.get()
    except LookupError:
        queues: dict[str, trio.Lock] = {}
        _QUEUES.set(queues)
        return queues


def _waiters() -> trio.CapacityLimiter:
    # Waiting threads of their own: a long wait never takes a token other blocking I/O needs.
    try:
        return _WAITERS.get()
    except LookupError:
        _WAITERS.set(limiter := trio.CapacityLimiter(math.inf))
        return limiter


class _Waiter:
    """A blocking open + ``flock`` in a worker thread that its caller may
    abandon: whichever side finishes second closes the descriptor."""

    def __init__(self, path: str, mode: int | None) -> None:
        self.path, self.mode = path, mode
        self.fd: int | None = None
        self._mutex = threading.Lock()
        self._abandoned = self._done = False

    def wait(self) -> None:
        fd = None
        try:
            fd = _open(self.path, self.mode)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            if fd is not None:
                os.close(fd)
            fd = None
            raise
        finally:
            with self._mutex:
                self._done = True
                if self._abandoned and fd is not None:
                    os.close(fd)
                else:
                    self.fd = fd

    def abandon(self) -> None:
        with self._mutex:
            self._abandoned = True
            fd, self.fd = self.fd, None
            if self._done and fd is not None:
                os.close(fd)
