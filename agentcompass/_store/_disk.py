"""Everything the store does to the filesystem, behind one seam.

:class:`Disk` has small blocking primitives (write a file, append, rename,
link, unlink, list, mkdir, make durable) and one async :meth:`Disk.run`
that calls a blocking function made of them in a worker thread. The run
store composes a whole commit batch into one such function, so a batch costs
one thread hop whatever its size. :class:`~agentcompass._store._fake_disk.FakeDisk` keeps the
primitives but runs inline with latency in Trio time and injected errors.

Crash safety (SPEC 8: temp file, sync, rename): a reader sees a file's old
content or its new one, never a mix. A crash can leave a temporary file; its
name starts with ``.`` and ends with ``.tmp`` (:func:`is_temp_name`) and every
reader skips it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import trio

from ..host import FileLock

__all__ = ["Disk", "RunLockedError", "is_temp_name", "temp_name"]

T = TypeVar("T")

#: Worker threads the store may use at once, per Trio run.
STORE_THREADS = 4

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
_temp_counter = itertools.count()
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("store_limiter")


class RunLockedError(RuntimeError):
    """The run directory is locked by a live run (in this or another process)."""


def temp_name(name: str) -> str:
    """A fresh hidden temporary name for a file to be renamed to ``name``."""
    return f".{name}.{os.getpid()}-{next(_temp_counter)}.tmp"


def is_temp_name(name: str) -> bool:
    """True for a temporary file name :func:`temp_name` makes."""
    return name.startswith(".") and name.endswith(".tmp")


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


# One flush of the whole filesystem costs what one fsync costs, so a batch of
# hundreds of files needs two disk flushes instead of hundreds (bench: overhead).
_SYNCFS = _load_syncfs()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Disk:
    """The real filesystem. Primitives block; call them inside :meth:`run`.

    ``sync`` makes the data of files and the entries of directories durable:
    one ``syncfs(2)`` on Linux, else an ``fsync`` per path.
    """

    def __init__(self, *, syncfs: bool = True) -> None:
        self._syncfs = _SYNCFS if syncfs else None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a store thread. The caller owns cancellation: the
        store shields this until its close deadline, then abandons the thread
        (what it leaves is what a crash leaves)."""
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=_limiter())

    def now(self) -> float:
        """The Unix time the store stamps on the lines it writes (``t`` of
        ``progress.jsonl`` and ``sessions.jsonl``): a fake disk brings its own clock."""
        return time.time()

    # -- primitives (blocking) ----------------------------------------------

    def mkdir(self, path: str) -> bool:
        """Create directory ``path``; False if it existed."""
        try:
            os.mkdir(path)
        except FileExistsError:
            return False
        return True

    def makedirs(self, path: str) -> None:
        """Create directory ``path`` and its missing parents."""
        os.makedirs(path, exist_ok=True)

    def write(self, path: str, data: bytes) -> None:
        """Create or truncate ``path`` and write ``data`` (not yet durable)."""
        fd = os.open(path, _WRITE_FLAGS, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def append(self, path: str, data: bytes) -> None:
        """Append ``data`` to ``path``; if a crash cut its last line short,
        end that line first so ``data`` starts on a fresh one."""
        fd = os.open(path, _APPEND_FLAGS, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            _write_all(fd, data)
        finally:
            os.close(fd)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def link(self, source: str, target: str) -> None:
        os.link(source, target)

    def unlink(self, path: str) -> bool:
        """Remove file ``path``; False if it was not there."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def listdir(self, path: str) -> list[str]:
        """Names in ``path``; empty if it does not exist."""
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def sync(self, paths: Iterable[str]) -> None:
        """Make the data of the files and the entries of the directories of
        ``paths`` durable."""
        for path in paths:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if self._syncfs is None:
                    os.fsync(fd)
                    continue
                if self._syncfs(fd) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code))
                return  # the run directory is on one filesystem: one syncfs covers every path
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        """Hold directory ``path``'s writer lock, without waiting: raise
        :class:`RunLockedError` when a live run holds it."""
        held = FileLock.try_acquire(path, mode=None)
        if held is None:
            raise RunLockedError(f"{path} is already open by another writer")
        with held:
            yield


def _limiter() -> trio.CapacityLimiter:
    """The store threads' limiter for the current Trio run (a ``RunVar``, so
    no token leaks from one ``trio.run`` into the next)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(STORE_THREADS)
        _LIMITER.set(limiter)
        return limiter


def timed_out() -> OSError:
    return OSError(errno.ETIMEDOUT, "the run store's disk did not finish within the cleanup grace")
