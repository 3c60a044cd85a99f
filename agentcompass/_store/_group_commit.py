"""Group commit: many durable writes share one flush of the disk.

Callers queue a write and wait for it; an actor task takes what is queued as
a batch and commits it, a *round*:

1. create missing directories, write every temporary file, append journal lines;
2. make all that data durable;
3. rename every temporary file over its target;
4. make the renames (and new directories) durable;
5. remove the files the writes supersede (e.g. a task's checkpoints, once
   its record is durable), then run the writes' after-hooks;

then it wakes every caller of the batch, each learning only its own outcome
(a failed removal or after-hook is not the caller's: its write is durable;
it is kept in :attr:`GroupCommitter.cleanup_errors`).

Steps 1-5 (:class:`._writer.Disk`) run in a *writer process* by default
(see :mod:`._writer` for why), else in a store thread; after-hooks (rare:
removals that need a directory listed first) always run in a store thread. Up to
:data:`MAX_ROUNDS` rounds are in flight at once, sharing the backlog; when
all are busy the queue accumulates, so under load the rounds per second
stay bounded by disk latency while the writes per round grow. In threads,
concurrent rounds matter because much of a round is waiting, not work: on
the virtual disk we measured, removing a file often blocks for ~3 ms (the
bitmap block is read back from disk), so one round at a time gave ~200
records/s and six about 600. More is not better: rounds creating files in
one directory contend for its lock (the kernel spins on it), and every
round is a thread switch; once workers stopped waiting for their records
(the backlog absorbs a slow round), three rounds cut context switches
several-fold against six at the same throughput. The writer process takes
rounds in order and commits those that queued up meanwhile as one.

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

import errno
import itertools
import math
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import attrs
import trio

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from . import _writer
from ._atomic import StoreThreads, write_all
from ._writer import Disk, frame, read_frames

__all__ = ["MAX_ROUNDS", "WRITER_PROCESS", "GroupCommitter", "StoreClosedError"]

#: Commit rounds in flight at once.
MAX_ROUNDS = 3

#: Commit in a writer process (see :mod:`._writer`) rather than in store
#: threads. ``AGENTCOMPASS_STORE_WRITER=thread`` keeps every write in this
#: process; a writer that cannot be started or dies falls back to threads.
WRITER_PROCESS = os.environ.get("AGENTCOMPASS_STORE_WRITER", "process") != "thread"
#: How long a new writer process may take to answer its first frame (until
#: then rounds run in store threads; the store's close cancels the wait).
WRITER_START_SECONDS = 10.0
#: How long to wait for a killed writer to be reaped before leaving it be.
_KILL_WAIT_SECONDS = 0.1


class StoreClosedError(RuntimeError):
    """The run store was already closed when asked to write."""


@attrs.define(eq=False, slots=True)
class _Write:
    """One queued write: replace ``path`` by ``data`` or, when ``path`` is None,
    append ``data`` to the journal."""

    path: str | None
    data: bytes
    after: Callable[[], None] | None
    #: Files to remove once this write is durable (by the round itself).
    remove: tuple[str, ...] = ()
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


class _WriterGone(Exception):
    """The writer process exited or its pipe broke."""


class _WriterProcess:
    """The parent's end of a writer process (see :mod:`._writer`).

    Rounds are sent in order and answered in order; any round's caller may
    read answers for the others (under a lock), so no reader task is needed
    and ``close`` works after the committer's actor has stopped.
    """

    def __init__(self, process: trio.Process):
        self.process = process
        self._stdin: Any = process.stdin
        self._stdout: Any = process.stdout
        self._ids = itertools.count()
        self._send_lock = trio.Lock()
        self._recv_lock = trio.Lock()
        self._buffer = bytearray()
        self._answers: dict[int, tuple[list[Any], list[str]]] = {}

    @classmethod
    async def start(cls, disk: Disk, keep_fd: int | None) -> _WriterProcess | None:
        """Spawn a writer for ``disk`` (None if one cannot be started).
        ``keep_fd`` (the run directory's lock) is not passed to it."""
        dir_fds = {path: fd for path, fd in disk.dir_fds.items() if fd != keep_fd}
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-I", "-S", _writer.__file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(disk.journal_fd, *dir_fds.values()),
                # Not in the terminal's process group: a Ctrl-C is the
                # parent's to handle; the writer ends with its input.
                start_new_session=True,
            )
        except OSError:
            return None
        writer = cls(process)
        _grow_pipe(writer._stdin)
        init = {
            "journal_fd": disk.journal_fd,
            "dir_fds": dir_fds,
            "known_dirs": sorted(disk.known_dirs),
            "syncfs": disk.syncfs is not None,
        }
        ready = False
        try:
            # The writer answers its first frame (round -1) once it is set
            # up: proof that ``sys.executable`` ran our script (in an
            # embedding application it may be some other program).
            with trio.move_on_after(WRITER_START_SECONDS):
                await writer._stdin.send_all(frame(init))
                while -1 not in writer._answers:
                    await writer._receive()
                ready = True
        except (trio.BrokenResourceError, trio.ClosedResourceError, _WriterGone):
            pass
        finally:
            if not ready:  # failed, too slow or cancelled: leave nothing behind
                with trio.CancelScope(shield=True):
                    await writer.stop(0)
        if not ready:
            return None
        del writer._answers[-1]
        return writer

    async def commit(self, batch: list[_Write]) -> list[str]:
        """Commit ``batch`` in the writer and return its removal problems
        (see :meth:`Disk.commit`); raises :class:`_WriterGone` (the batch's
        outcome unknown) if the writer is gone."""
        round_id = next(self._ids)
        payload = frame((round_id, [(job.path, job.data, job.remove) for job in batch]))
        try:
            async with self._send_lock:
                await self._stdin.send_all(payload)
            while round_id not in self._answers:
                async with self._recv_lock:
                    if round_id not in self._answers:
                        await self._receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _WriterGone from exc
        outcomes, problems = self._answers.pop(round_id)
        for job, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                if job.path is None:
                    job.written = True
            elif isinstance(outcome, str):
                job.error = RuntimeError(outcome)
            else:
                code, message, filename = outcome
                job.error = OSError(code, message, filename)
        return problems

    async def _receive(self) -> None:
        while True:
            answers = read_frames(self._buffer)
            if answers:
                break
            chunk = await self._stdout.receive_some(1 << 16)
            if not chunk:
                raise _WriterGone
            self._buffer += chunk
        for round_id, outcomes, problems in answers:
            self._answers[round_id] = (outcomes, problems)

    async def stop(self, grace: float, reap_within: float = _KILL_WAIT_SECONDS) -> None:
        """End the writer's input and wait (up to ``grace`` seconds) for it
        to commit what it has and exit; kill it after that, and wait at most
        ``reap_within`` seconds for it to die."""
        with trio.move_on_after(grace):
            try:
                await self._stdin.aclose()
            except trio.BrokenResourceError:  # already gone
                pass
            await self.process.wait()
        if self.process.returncode is None:
            self.kill()
            # A process blocked on a stalled disk dies only once its I/O
            # returns: out of grace, do not wait for that (it is reaped at our exit).
            with trio.move_on_after(reap_within):
                await self.process.wait()
        await self._stdout.aclose()

    def kill(self) -> None:
        """SIGKILL the writer now (a round it was doing is left as a crash leaves it)."""
        if self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass


#: ``fcntl.F_SETPIPE_SZ`` (Linux; Python 3.10+ names it).
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031) if fcntl is not None else None
#: The pipe buffer asked for (Linux lets an unprivileged process have up to
#: ``/proc/sys/fs/pipe-max-size``, 1 MiB by default).
_PIPE_BYTES = 1 << 20


def _grow_pipe(stream: Any) -> None:
    """Make the pipe to the writer hold a whole round: with the default
    64 KiB a round of a few hundred records is sent in a dozen pieces, and
    the Trio thread, busy with hundreds of tasks, gets back to the next
    piece only once per scheduler pass (measured: rounds of 1,500 writes
    took about 0.9 s to send while the writer committed them in 60 ms)."""
    if _F_SETPIPE_SZ is None or not sys.platform.startswith("linux"):
        return
    for size in (_PIPE_BYTES, 1 << 18):
        try:
            fcntl.fcntl(stream.fileno(), _F_SETPIPE_SZ, size)
        except OSError:  # above pipe-max-size: try less, else keep the default
            continue
        return


@attrs.define(eq=False)
class GroupCommitter:
    """Commits queued writes in batches; see the module docstring.

    ``disk`` does the blocking work of a round; it runs in a writer process
    once :meth:`start_writer` started one, else in a store thread.
    """

    disk: Disk
    #: One line per failed after-hook (the write itself succeeded).
    cleanup_errors: list[str] = attrs.Factory(list)
    _pending: list[_Write] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    _closed: bool = False
    #: Journal lines queued and not yet finished by a round.
    _journal: dict[int, _Write] = attrs.Factory(dict)
    _writer: _WriterProcess | None = None
    #: Set once :meth:`start_writer` is done (for tests and diagnostics).
    writer_started: trio.Event = attrs.Factory(trio.Event)
    #: When a round in the writer process is given up (the store's close sets
    #: it to the cleanup grace deadline): past it the writer is killed and the
    #: round's writes fail, leaving the directory as a crash would.
    deadline: float = math.inf
    #: The shielded scopes of rounds in the writer now (see :meth:`set_deadline`).
    _round_scopes: set[trio.CancelScope] = attrs.Factory(set)
    #: The store's threads, given up at the same deadline (see :class:`StoreThreads`).
    threads: StoreThreads = attrs.Factory(StoreThreads)

    def set_deadline(self, deadline: float) -> None:
        """Give up rounds at ``deadline``, in the writer process or in store
        threads, those in flight included (the store's close: the cleanup
        grace)."""
        self.deadline = deadline
        for scope in self._round_scopes:
            scope.deadline = deadline
        self.threads.set_deadline(deadline)

    async def start_writer(self, keep_fd: int | None = None) -> None:
        """Commit in a writer process once one is up and answering, if
        :data:`WRITER_PROCESS` (else, or until then, rounds run in store
        threads). Run it as a task beside the actor: writes need not wait
        for a process to start. :attr:`writer_started` is set when it is
        done, with or without a writer."""
        try:
            if WRITER_PROCESS and self._writer is None and not self._closed:
                writer = await _WriterProcess.start(self.disk, keep_fd)
                if writer is not None:
                    if self._closed:  # too late to be of use
                        with trio.CancelScope(shield=True):
                            await writer.stop(0)
                    else:
                        self._writer = writer
        finally:
            self.writer_started.set()

    async def stop_writer(self, grace: float) -> None:
        """Let the writer process finish and exit (after :meth:`close`),
        within ``grace`` seconds; with none left, kill it and move on."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with trio.CancelScope(shield=True):
                await writer.stop(grace)

    @property
    def journal_fd(self) -> int:
        return self.disk.journal_fd

    async def write(
        self,
        path: str | os.PathLike[str],
        data: bytes,
        after: Callable[[], None] | None = None,
        remove: tuple[str, ...] = (),
    ) -> None:
        """Replace ``path`` with ``data``; return once it is durable.

        Once the write is durable the round removes the files of ``remove``,
        then ``after`` runs in a store thread. If the caller is cancelled
        while waiting, the write still happens.
        """
        await self._submit(_Write(os.fspath(path), data, after, remove))

    def write_soon(
        self,
        path: str,
        data: bytes,
        after: Callable[[], None] | None,
        notify: Callable[[Exception | None], None],
        remove: tuple[str, ...] = (),
    ) -> None:
        """Queue a replacement of ``path`` by ``data`` (as :meth:`write`)
        without waiting: ``notify(error)`` runs in the Trio thread once the
        round finished (``error`` is None when the write is durable), also
        when the store closes before the write could be made."""
        if self._closed:
            raise StoreClosedError("the run store is closed")
        self._pending.append(_Write(path, data, after, remove, notify=notify))
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
        writer = self._writer
        if writer is not None:
            # Shielded like a store thread, which always finishes its round:
            # a round is never left half-answered - until the grace deadline
            # (a stalled disk): then the writer is killed and the round fails.
            with trio.CancelScope(shield=True, deadline=self.deadline) as scope:
                self._round_scopes.add(scope)
                try:
                    problems = await writer.commit(batch)
                except _WriterGone:
                    # Its outcome is unknown: commit the batch again here (a
                    # replacement is idempotent, a journal line read twice is
                    # harmless) and every later round too.
                    if self._writer is writer:
                        self._writer = None
                        await writer.stop(0)
                    for job in batch:
                        job.error = None
                else:
                    self.cleanup_errors.extend(problems)
                    if any(job.after is not None and job.error is None for job in batch):
                        try:
                            await self.threads.run(self._after_sync, batch)
                        except OSError as exc:  # out of grace: the writes themselves are durable
                            self.cleanup_errors.append(f"after-hooks given up: {exc}")
                    _finish_all(batch, self._journal)
                    return
                finally:
                    self._round_scopes.discard(scope)
            if scope.cancelled_caught or trio.current_time() >= self.deadline:
                # Out of grace (a stalled disk): no second try in a thread.
                if self._writer is writer:
                    self._writer = None
                writer.kill()
                for job in batch:
                    job.error = OSError(errno.ETIMEDOUT, "the run store's writer did not finish within the cleanup grace")
                _finish_all(batch, self._journal)
                return
        try:
            await self.threads.run(self._commit_sync, batch)
        except OSError as exc:
            # Out of grace (a stalled disk): the thread is given up, and the
            # batch's outcome is what a crash would leave.
            for job in batch:
                job.error = OSError(exc.errno, exc.strerror)
        _finish_all(batch, self._journal)

    def _commit_sync(self, batch: list[_Write]) -> None:
        self.cleanup_errors.extend(self.disk.commit(batch))
        self._after_sync(batch)

    def _after_sync(self, batch: list[_Write]) -> None:
        """Run the after-hooks of the durable writes (blocking)."""
        for job in batch:
            if job.after is not None and job.error is None and job.path is not None:
                try:
                    job.after()
                except OSError as exc:
                    self.cleanup_errors.append(f"after writing {job.path}: {exc}")
