"""Atomic, durable file replacement and the store's thread limiter.

A write goes to a hidden temporary file in the target's directory, is
fsynced, renamed over the target and the directory is fsynced: after a crash
at any instant a reader sees either the old content or the new, never a mix,
and once the call returns the new content survives a power loss. A crash can
leave a temporary file behind; its name starts with ``.`` and ends with
``.tmp`` (:func:`is_temp_name`) and every reader skips it.

Blocking calls run in worker threads with ``abandon_on_cancel=False``: a
cancelled caller waits for the thread, so no write is ever abandoned half-done.
A run store's own writes use :class:`StoreThreads` instead, which waits the
same way until the cleanup grace deadline and only then gives the thread up
(a stalled disk must not hold a shutdown forever).
They share one :class:`trio.CapacityLimiter` per Trio run
(:func:`store_limiter`), so a burst of writes cannot take every worker thread.
"""

from __future__ import annotations

import errno
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio

from ._writer import (
    _O_CLOEXEC,
    _O_DIRECTORY,
    _TEMP_FLAGS,
    SYNCFS,
    fsync_dir,
    temp_name,
    unlink_quietly,
    write_all,
)

__all__ = [
    "STORE_THREADS",
    "StoreThreads",
    "SYNCFS",
    "fsync_dir",
    "is_temp_name",
    "store_limiter",
    "temp_name",
    "to_store_thread",
    "unlink_quietly",
    "write_all",
    "write_atomic",
]

T = TypeVar("T")

#: Worker threads the store may use at once, per Trio run: room for the
#: group committer's concurrent rounds plus the progress writer. The threads
#: mostly wait on the disk, so more of them than cores is the point.
STORE_THREADS = 8

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("store_limiter")


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


class StoreThreads:
    """The blocking work of one run store, in store threads: never given up
    before :attr:`deadline`, given up at it.

    Each call waits for its thread, shielded, until ``deadline`` (the store's
    close sets it to the cleanup grace deadline; until then it is infinite);
    past it the thread is abandoned and the call raises ``OSError(ETIMEDOUT)``.
    An abandoned thread may still be using the store's file descriptors, so
    :meth:`release` closes them only once the last thread is done, and no
    thread starts its work after :meth:`release`. What an abandoned write
    leaves is what a crash leaves: every replacement is temp + rename.
    """

    def __init__(self) -> None:
        self.deadline = math.inf
        self._lock = threading.Lock()
        self._running = 0
        self._released = False
        self._on_idle: Callable[[], None] | None = None
        self._scopes: set[trio.CancelScope] = set()

    def set_deadline(self, deadline: float) -> None:
        """Give up threads at ``deadline``, those running now included."""
        self.deadline = deadline
        for scope in self._scopes:
            scope.deadline = deadline

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a store thread (see the class docstring)."""
        with trio.CancelScope(shield=True, deadline=self.deadline) as scope:
            self._scopes.add(scope)
            try:
                return await trio.to_thread.run_sync(
                    self._guarded, fn, *args, abandon_on_cancel=True, limiter=store_limiter()
                )
            finally:
                self._scopes.discard(scope)
        raise OSError(errno.ETIMEDOUT, "the run store's disk did not finish within the cleanup grace")

    def _guarded(self, fn: Callable[..., T], *args: object) -> T:
        with self._lock:
            if self._released:
                raise OSError(errno.ECANCELED, "the run store is closed")
            self._running += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._running -= 1
                on_idle = self._on_idle if self._running == 0 else None
                if on_idle is not None:
                    self._on_idle = None
            if on_idle is not None:
                on_idle()

    def release(self, close: Callable[[], None]) -> None:
        """Call ``close`` (freeing what the threads use) now, or once the
        last running (abandoned) thread is done; start no thread after."""
        with self._lock:
            self._released = True
            if self._running:
                self._on_idle = close
                return
        close()


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




def temp_path(path: Path) -> Path:
    return path.with_name(temp_name(path.name))




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


def open_dir_fd(path: str | Path) -> int | None:
    """An fd for fsyncing directory ``path`` repeatedly (``None`` where unsupported)."""
    if not _O_DIRECTORY:
        return None
    return os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)

