"""Group commit: many durable writes share one flush of the disk.

Callers queue a write and wait for it; an actor task takes what is queued as
a batch and commits it, a *round*, in a single worker-thread call:

1. create missing directories, write every temporary file, append journal lines;
2. make all that data durable;
3. rename every temporary file over its target;
4. make the renames (and new directories) durable;
5. run the writes' after-hooks (e.g. drop checkpoints superseded by a record);

then it wakes every caller of the batch, each learning only its own outcome
(an after-hook's failure is not the caller's: its write is durable; it is
kept in :attr:`GroupCommitter.cleanup_errors`).
Up to :data:`MAX_ROUNDS` rounds run at once, sharing the backlog; when all
are busy the queue accumulates, so under load the rounds per second stay
bounded by disk latency while the writes per round grow. Concurrent rounds
matter because much of a round is waiting, not work: on the virtual disk we
measured, removing a file often blocks for ~3 ms (the bitmap block is read
back from disk), so one round at a time gave ~200 records/s and six
about 600. More is not better: rounds creating files in one directory
contend for its lock (the kernel spins on it), and every round is a thread
switch; once workers stopped waiting for their records (the backlog absorbs
a slow round), three rounds cut context switches several-fold against six
at the same throughput.

Steps 2 and 4 use ``syncfs(2)`` on Linux: one call per step whatever the batch
size. An ``fsync`` per file and per directory costs a disk cache flush each
(about 2 ms on a virtual disk, measured), which caps a single writer at a few
hundred records per second; two ``syncfs`` per round do not grow with the
batch. The price: the run directory's filesystem is synced as a whole, so
other processes' dirty data on it (an image pull) can lengthen a round; with
ext4 ``data=ordered`` a plain fsync pays much of that too. Elsewhere the
committer falls back to fsync file by file and directory by directory.

Crash safety is that of :mod:`._atomic` per file: a crash before step 3
leaves old content and hidden temp files; after-hooks run only for writes that
are durable. Non-goal: ordering between writes that are in flight together
(same batch or concurrent rounds); a caller that needs A durable before B, or
B to replace A, awaits A first.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

import attrs
import trio

from ._atomic import (
    _O_CLOEXEC,
    SYNCFS,
    fsync_dir,
    temp_name,
    to_store_thread,
    unlink_quietly,
    write_all,
)

__all__ = ["MAX_ROUNDS", "GroupCommitter", "StoreClosedError"]

#: Commit rounds in flight at once (each in its own worker thread).
MAX_ROUNDS = 3

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC


class StoreClosedError(RuntimeError):
    """The run store was already closed when asked to write."""


@attrs.define(eq=False, slots=True)
class _Write:
    """One queued write: replace ``path`` by ``data`` or, when ``path`` is None,
    append ``data`` to the journal."""

    path: str | None
    data: bytes
    after: Callable[[], None] | None
    #: Set once the round finished (for a caller that waits).
    done: trio.Event | None = None
    #: Called in the Trio thread once the round finished, with the write's
    #: error or None (for a caller that does not wait).
    notify: Callable[[Exception | None], None] | None = None
    error: Exception | None = None
    #: A journal line is in the file (set by the round's thread).
    written: bool = False

    def finish(self) -> None:
        if self.done is not None:
            self.done.set()
        if self.notify is not None:
            self.notify(self.error)


def _finish_all(jobs: list[_Write], journal: dict[int, _Write]) -> None:
    """Finish every job; a failing ``notify`` (a bug) is raised only after
    the others, so no waiter of the batch is left waiting."""
    failure: BaseException | None = None
    for job in jobs:
        if job.path is None:
            journal.pop(id(job), None)
        try:
            job.finish()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failure = failure or exc
    if failure is not None:
        raise failure


@attrs.define(eq=False)
class GroupCommitter:
    """Commits queued writes in batches; see the module docstring.

    ``known_dirs`` are directories whose existence is durable (the run tree
    at first); any other parent is created on demand, made durable by the
    round that needed it, and only then added. ``dir_fds``
    are open fds of directories fsynced often, to save an open per round.
    ``journal_fd`` is an ``O_APPEND`` fd for journal lines; it also names the
    filesystem for ``syncfs`` (``None``: fsync file by file and directory by
    directory instead).
    """

    known_dirs: set[str]
    dir_fds: dict[str, int]
    journal_fd: int
    syncfs: Callable[[int], None] | None = SYNCFS
    #: One line per failed after-hook (the write itself succeeded).
    cleanup_errors: list[str] = attrs.Factory(list)
    _pending: list[_Write] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    _closed: bool = False
    #: Journal lines queued and not yet finished by a round.
    _journal: dict[int, _Write] = attrs.Factory(dict)

    async def write(
        self, path: str | os.PathLike[str], data: bytes, after: Callable[[], None] | None = None
    ) -> None:
        """Replace ``path`` with ``data``; return once it is durable.

        ``after`` runs in the worker thread once the write is durable. If the
        caller is cancelled while waiting, the write still happens.
        """
        await self._submit(_Write(os.fspath(path), data, after))

    def write_soon(
        self,
        path: str,
        data: bytes,
        after: Callable[[], None] | None,
        notify: Callable[[Exception | None], None],
    ) -> None:
        """Queue a replacement of ``path`` by ``data`` without waiting:
        ``notify(error)`` runs in the Trio thread once the round finished
        (``error`` is None when the write is durable), also when the store
        closes before the write could be made."""
        if self._closed:
            raise StoreClosedError("the run store is closed")
        self._pending.append(_Write(path, data, after, notify=notify))
        self._wake.set()

    async def append(self, data: bytes) -> None:
        """Append ``data`` to the journal; return once it is durable."""
        await self._submit(_Write(None, data, None))

    def append_nowait(self, data: bytes, notify: Callable[[Exception | None], None] | None = None) -> None:
        """Queue ``data`` for the journal without waiting: it is written by
        the next round (``notify(error)`` runs in the Trio thread once the
        round finished). Lines queued together keep their order; lines of
        concurrent rounds may land in either order."""
        if self._closed:
            raise StoreClosedError("the run store is closed")
        job = _Write(None, data, None, notify=notify)
        self._journal[id(job)] = job
        self._pending.append(job)
        self._wake.set()

    def write_journal_now(self) -> None:
        """Write every journal line not yet in the file, here and now
        (blocking). Only for a process about to exit at once (a second
        Ctrl-C), so that every sandbox it opened stays reapable. A line a
        round is writing at the same moment may appear twice: readers
        match lines by session id, so that is harmless."""
        for job in list(self._journal.values()):
            if not job.written:
                write_all(self.journal_fd, job.data)
                job.written = True

    async def _submit(self, job: _Write) -> None:
        if self._closed:
            raise StoreClosedError("the run store is closed")
        job.done = trio.Event()
        if job.path is None:
            self._journal[id(job)] = job
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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor: commit whatever is queued, in up to :data:`MAX_ROUNDS`
        concurrent rounds, until cancelled."""
        slots = trio.Semaphore(MAX_ROUNDS)
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                await self._wake.wait()
                # Waiting for a slot first lets the next batch grow meanwhile.
                await slots.acquire()
                # Share the backlog among the free rounds: one huge round
                # would wait on its disk operations one by one.
                batch = self._take(-(-len(self._pending) // (slots.value + 1)))
                if batch:
                    nursery.start_soon(self._round, batch, slots)
                else:
                    slots.release()

    async def close(self) -> None:
        """Refuse new writes and commit everything still queued.

        Call after the actor stopped, inside the caller's shielded cleanup.
        """
        self._closed = True
        try:
            while self._pending:
                await self._commit(self._take(len(self._pending)))
        finally:
            # Out of grace time: tell whoever still waits that nothing was written.
            pending, self._pending = self._pending, []
            for job in pending:
                job.error = OSError(errno.ECANCELED, "run store closed before this write")
            _finish_all(pending, self._journal)

    def _take(self, count: int) -> list[_Write]:
        # Replace the event before taking the batch: a write queued after the
        # take sets the new event, so the actor cannot sleep on it; what is
        # left over is the next round's, so set it again.
        self._wake = trio.Event()
        batch, self._pending = self._pending[:count], self._pending[count:]
        if self._pending:
            self._wake.set()
        return batch

    async def _round(self, batch: list[_Write], slots: trio.Semaphore) -> None:
        try:
            await self._commit(batch)
        finally:
            slots.release()

    async def _commit(self, batch: list[_Write]) -> None:
        try:
            await to_store_thread(self._commit_sync, batch)
        except BaseException:
            # Only possible before the thread started (_commit_sync never
            # raises): the batch is untouched, queue it again for close().
            self._pending[:0] = batch
            raise
        _finish_all(batch, self._journal)

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
        whole_fs = self.syncfs is not None
        dirty_dirs: dict[str, None] = {}  # ordered set
        new_dirs: set[str] = set()
        temps: list[tuple[_Write, str, str]] = []
        appends: list[_Write] = []
        lines = [job for job in batch if job.path is None]
        if lines:
            # One write for all the round's journal lines, in queue order.
            try:
                write_all(self.journal_fd, b"".join(job.data for job in lines if not job.written))
            except OSError as exc:
                for job in lines:
                    job.error = exc
            else:
                for job in lines:
                    job.written = True
                appends = lines
        for job in batch:
            if job.path is None:
                continue
            try:
                parent, name = os.path.split(job.path)
                self._ensure_dir(parent, dirty_dirs, new_dirs)
                tmp = os.path.join(parent, temp_name(name))
                temps.append((job, tmp, parent))
                fd = os.open(tmp, _TEMP_FLAGS, 0o644)
                try:
                    write_all(fd, job.data)
                    if not whole_fs:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                job.error = exc
        try:
            if whole_fs:
                self._syncfs()
            elif appends:
                os.fsync(self.journal_fd)
        except OSError as exc:
            self._fail([job for job in batch if job.error is None], exc)
            for _, tmp, _ in temps:
                unlink_quietly(tmp)
            return
        renamed: list[_Write] = []
        for job, tmp, parent in temps:
            if job.error is None:
                try:
                    os.replace(tmp, job.path)  # type: ignore[arg-type]
                except OSError as exc:
                    job.error = exc
                else:
                    renamed.append(job)
                    dirty_dirs[parent] = None
                    continue
            unlink_quietly(tmp)
        if dirty_dirs:
            try:
                if whole_fs:
                    self._syncfs()
                else:
                    for directory in dirty_dirs:
                        self._fsync_dir(directory)
            except OSError as exc:
                # Rare (EIO) and not worth tracking which rename needed which
                # directory: none of this round's renames is known durable.
                self._fail(renamed, exc)
                return
        self.known_dirs.update(new_dirs)
        for job in renamed:
            if job.after is not None:
                try:
                    job.after()
                except OSError as exc:
                    self.cleanup_errors.append(f"after writing {job.path}: {exc}")

    @staticmethod
    def _fail(jobs: list[_Write], exc: OSError) -> None:
        for job in jobs:
            job.error = exc

    def _syncfs(self) -> None:
        assert self.syncfs is not None
        self.syncfs(self.journal_fd)

    def _ensure_dir(self, path: str, dirty_dirs: dict[str, None], new_dirs: set[str]) -> None:
        if path in self.known_dirs or path in new_dirs:
            return
        parent = os.path.dirname(path)
        if parent == path:
            return
        self._ensure_dir(parent, dirty_dirs, new_dirs)
        # Existing but not known durable (another round may be creating it
        # right now): this round makes the entry durable itself.
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        dirty_dirs[parent] = None
        new_dirs.add(path)

    def _fsync_dir(self, path: str) -> None:
        fd = self.dir_fds.get(path)
        if fd is None:
            fsync_dir(path)
        else:
            os.fsync(fd)
