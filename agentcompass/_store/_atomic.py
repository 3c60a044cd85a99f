"""Atomic, durable file replacement and the store's thread limiter.

A write goes to a hidden temporary file in the target's directory, is
fsynced, renamed over the target and the directory is fsynced: after a crash
at any instant a reader sees either the old content or the new, never a mix,
and once the call returns the new content survives a power loss. A crash can
leave a temporary file behind; its name starts with ``.`` and ends with
``.tmp`` (:func:`is_temp_name`) and every reader skips it.

Blocking calls run in worker threads with ``abandon_on_cancel=False``: a
cancelled caller waits for the thread, so no write is ever abandoned half-done.
They share one :class:`trio.CapacityLimiter` per Trio run
(:func:`store_limiter`), so a burst of writes cannot take every worker thread.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio

__all__ = [
    "STORE_THREADS",
    "SYNCFS",
    "is_temp_name",
    "store_limiter",
    "to_store_thread",
    "write_atomic",
]

T = TypeVar("T")

#: Worker threads the store may use at once, per Trio run: room for the
#: group committer's concurrent rounds plus the progress writer. The threads
#: mostly wait on the disk, so more of them than cores is the point.
STORE_THREADS = 8

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("store_limiter")

_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC
# pid + a per-process counter keeps temp names apart without a random source;
# ``next()`` on ``itertools.count`` is atomic under the GIL.
_temp_counter = itertools.count()


def _load_syncfs() -> Callable[[int], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        # A CDLL call releases the GIL, like os.fsync.
        if fn(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    return syncfs


#: ``syncfs(fd)``: flush the whole filesystem holding ``fd`` (Linux), else None.
SYNCFS = _load_syncfs()


def store_limiter() -> trio.CapacityLimiter:
    """The store's limiter for the current Trio run (created on first use).

    Kept in a ``RunVar`` rather than a module global so that a token can never
    leak from one ``trio.run`` into the next.
    """
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(STORE_THREADS)
        _LIMITER.set(limiter)
        return limiter


async def to_store_thread(fn: Callable[..., T], *args: object) -> T:
    """Run blocking ``fn(*args)`` in a store thread; never abandoned on cancel.

    Cancellation is only honoured before the thread starts; once it runs, the
    caller waits for it and gets its result.
    """
    return await trio.to_thread.run_sync(
        fn, *args, abandon_on_cancel=False, limiter=store_limiter()
    )


async def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The parent directory must exist. Returns once the new content is on disk.
    """
    await to_store_thread(write_atomic_sync, path, data)


def is_temp_name(name: str) -> bool:
    """True for a temporary file name this module makes (``.<name>.<n>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def temp_name(name: str) -> str:
    """A fresh temporary name for a file to be renamed to ``name``."""
    return f".{name}.{os.getpid()}-{next(_temp_counter)}.tmp"


def temp_path(path: Path) -> Path:
    return path.with_name(temp_name(path.name))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_temp_sync(path: Path, data: bytes) -> Path:
    """Write ``data`` to a fresh temporary file next to ``path`` and fsync it.

    Returns the temporary path; the caller renames it over ``path``. Between
    the two steps the old ``path`` is untouched.
    """
    tmp = temp_path(path)
    fd = os.open(tmp, _TEMP_FLAGS, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def write_atomic_sync(path: Path, data: bytes) -> None:
    """Blocking :func:`write_atomic`."""
    tmp = write_temp_sync(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """Make the directory entries of ``path`` (creations, renames) durable."""
    if not _O_DIRECTORY:  # Windows: directories cannot be opened, nor need it
        return
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_dir_fd(path: str | Path) -> int | None:
    """An fd for fsyncing directory ``path`` repeatedly (``None`` where unsupported)."""
    if not _O_DIRECTORY:
        return None
    return os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)


def unlink_quietly(path: Path | str) -> bool:
    """Remove a file; False if it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
