"""Group commit: many durable writes share one fsync round.

Callers queue a write and wait for it; one actor task takes everything queued
so far as a batch and commits it in a single worker-thread call:

1. create missing directories, write every temporary file, append journal lines;
2. fsync every temporary file and the journal;
3. rename every temporary file over its target;
4. fsync each distinct directory that was renamed into or created in, once;
5. run the writes' after-hooks (e.g. drop checkpoints superseded by a record);

then it wakes every caller of the batch, each learning only its own outcome.
While one batch is on disk the next accumulates, so under load the rounds per
second stay bounded by disk latency while the writes per round grow. On ext4
(``data=ordered``) the first fsync of a round commits the journal for the whole
batch and the later ones find little left to do, so a round costs about two
journal commits however many records it holds.

Crash safety is that of :mod:`._atomic` per file: a crash before step 3
leaves old content and hidden temp files; after-hooks run only for writes that
are durable. Non-goal: ordering between writes of one batch; callers that need
A durable before B await A first.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from ._atomic import (
    _O_CLOEXEC,
    fsync_dir,
    temp_path,
    to_store_thread,
    unlink_quietly,
    write_all,
)

__all__ = ["GroupCommitter", "StoreClosedError"]

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC


class StoreClosedError(RuntimeError):
    """The run store was already closed when asked to write."""


@attrs.define(eq=False, slots=True)
class _Write:
    """One queued write: replace ``path`` by ``data`` or, when ``path`` is None,
    append ``data`` to the journal."""

    path: Path | None
    data: bytes
    after: Callable[[], None] | None
    done: trio.Event = attrs.Factory(trio.Event)
    error: Exception | None = None


@attrs.define(eq=False)
class GroupCommitter:
    """Commits queued writes in batches; see the module docstring.

    ``known_dirs`` are directories known to exist (the run tree); any other
    parent is created on demand and its creation made durable. ``dir_fds``
    are open fds of directories fsynced often, to save an open per round.
    ``journal_fd`` is an ``O_APPEND`` fd for journal lines.
    """

    known_dirs: set[Path]
    dir_fds: dict[Path, int]
    journal_fd: int
    _pending: list[_Write] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    _closed: bool = False

    async def write(self, path: Path, data: bytes, after: Callable[[], None] | None = None) -> None:
        """Replace ``path`` with ``data``; return once it is durable.

        ``after`` runs in the worker thread once the write is durable. If the
        caller is cancelled while waiting, the write still happens.
        """
        await self._submit(_Write(path, data, after))

    async def append(self, data: bytes) -> None:
        """Append ``data`` to the journal; return once it is durable."""
        await self._submit(_Write(None, data, None))

    async def _submit(self, job: _Write) -> None:
        if self._closed:
            raise StoreClosedError("the run store is closed")
        self._pending.append(job)
        self._wake.set()
        await job.done.wait()
        err = job.error
        if err is not None:
            # A fresh exception per caller: one error may fail a whole batch,
            # and raising one object in several tasks would tangle tracebacks.
            if isinstance(err, OSError):
                raise OSError(err.errno, err.strerror, err.filename) from err
            raise RuntimeError("the run store failed to write") from err

    def forget_dir(self, path: Path) -> None:
        """``path`` was removed (only call from an after-hook)."""
        self.known_dirs.discard(path)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor: commit whatever is queued, batch after batch, until cancelled."""
        task_status.started()
        while True:
            await self._wake.wait()
            await self._commit_pending()

    async def close(self) -> None:
        """Refuse new writes and commit everything still queued.

        Call after the actor stopped, inside the caller's shielded cleanup.
        """
        self._closed = True
        try:
            while self._pending:
                await self._commit_pending()
        finally:
            # Out of grace time: tell whoever still waits that nothing was written.
            for job in self._pending:
                job.error = OSError(errno.ECANCELED, "run store closed before this write")
                job.done.set()
            self._pending.clear()

    async def _commit_pending(self) -> None:
        # Replace the event before taking the batch: a write queued after the
        # take sets the new event, so the actor cannot sleep on it.
        self._wake = trio.Event()
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            await to_store_thread(self._commit_sync, batch)
        except BaseException:
            # Only possible before the thread started (_commit_sync never
            # raises): the batch is untouched, queue it again for close().
            self._pending[:0] = batch
            raise
        for job in batch:
            job.done.set()

    def _commit_sync(self, batch: list[_Write]) -> None:
        try:
            self._commit_steps(batch)
        # Not an I/O error (those are per write): a bug. Fail every write of the
        # batch rather than the actor, so no caller waits forever.
        except Exception as exc:  # noqa: BLE001
            for job in batch:
                if job.error is None:
                    job.error = exc

    def _commit_steps(self, batch: list[_Write]) -> None:
        dirty_dirs: dict[Path, None] = {}  # ordered set
        temps: list[tuple[_Write, Path, int]] = []
        appends: list[_Write] = []
        for job in batch:
            try:
                if job.path is None:
                    write_all(self.journal_fd, job.data)
                    appends.append(job)
                    continue
                self._ensure_dir(job.path.parent, dirty_dirs)
                tmp = temp_path(job.path)
                fd = os.open(tmp, _TEMP_FLAGS, 0o644)
                temps.append((job, tmp, fd))
                write_all(fd, job.data)
            except OSError as exc:
                job.error = exc
        for job, _, fd in temps:
            try:
                if job.error is None:
                    os.fsync(fd)
            except OSError as exc:
                job.error = exc
            finally:
                os.close(fd)
        if appends:
            try:
                os.fsync(self.journal_fd)
            except OSError as exc:
                for job in appends:
                    job.error = exc
        renamed: list[_Write] = []
        for job, tmp, _ in temps:
            if job.error is None:
                try:
                    os.replace(tmp, job.path)  # type: ignore[arg-type]
                except OSError as exc:
                    job.error = exc
                else:
                    renamed.append(job)
                    dirty_dirs[job.path.parent] = None  # type: ignore[union-attr]
                    continue
            unlink_quietly(tmp)
        for directory in dirty_dirs:
            try:
                self._fsync_dir(directory)
            except OSError as exc:
                # Rare (EIO) and not worth tracking which rename needed which
                # directory: none of this round's renames is known durable.
                for job in renamed:
                    job.error = exc
                return
        for job in renamed:
            if job.after is not None:
                try:
                    job.after()
                except OSError as exc:
                    job.error = exc

    def _ensure_dir(self, path: Path, dirty_dirs: dict[Path, None]) -> None:
        if path in self.known_dirs or path.parent == path:
            return
        self._ensure_dir(path.parent, dirty_dirs)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        else:
            dirty_dirs[path.parent] = None
        self.known_dirs.add(path)

    def _fsync_dir(self, path: Path) -> None:
        fd = self.dir_fds.get(path)
        if fd is None:
            fsync_dir(path)
        else:
            os.fsync(fd)
