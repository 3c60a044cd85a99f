"""The store's disk work, and the writer process that can do it.

:class:`Disk` commits one round of writes (see :mod:`._group_commit` for
what a round is and why): every journal line and temporary file written,
the data synced, the temporary files renamed over their targets, the
renames synced. The group committer runs it either in a store thread or,
by default, in a *writer process*: this module run as a script
(:func:`serve`), fed rounds over a pipe.

Why a process: a store thread releases the GIL around each system call and
must take it back after, four times per record file. While the Trio thread
runs flat out (hundreds of attempts in flight), each of those hand-overs
waits for the Trio thread to let go, so both threads crawl and the records'
backlog fills up (measured: a no-op 10,000-task run spent about a third of
its wall time so). A process has its own interpreter: it uses the second
core without taking anything from the Trio thread, which only writes one
frame per round to a pipe and reads one back.

This module imports nothing but the standard library, so the writer
process starts in milliseconds (``python -I -S _writer.py``), not at the
cost of importing Trio.

Protocol (both ways: a 4-byte little-endian length, then a :mod:`marshal`
payload; both ends are the same interpreter, so the format matches):

* the first frame to the writer is ``{"journal_fd": fd, "dir_fds": {path:
  fd}, "known_dirs": [...], "syncfs": bool}``, the fds passed to it at spawn;
  the writer answers ``(-1, [], [])`` once it is ready;
* then one frame per round, ``(round_id, [(path or None, data, remove),
  ...])`` (``None``: append ``data`` to the journal; ``remove``: files to
  unlink once the write is durable);
* for each round it answers ``(round_id, [outcome, ...], [problem, ...])``,
  one outcome per write in order: ``None`` (durable), ``(errno, strerror,
  filename)`` (an OS error) or a string (a bug: the message); a problem is
  a line about a file of ``remove`` that could not be removed (the write
  itself is durable).

Rounds are committed in the order they arrive; rounds already waiting in
the pipe are committed together, sharing their syncs. At end of input the
writer commits what it has and exits, so a parent that dies leaves no
write half-done and no process behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import marshal
import os
import select
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = [
    "SYNCFS",
    "Disk",
    "fsync_dir",
    "read_frames",
    "serve",
    "temp_name",
    "unlink_quietly",
    "write_all",
]

_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC
_HEADER = struct.Struct("<I")
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


def temp_name(name: str) -> str:
    """A fresh temporary name for a file to be renamed to ``name``."""
    return f".{name}.{os.getpid()}-{next(_temp_counter)}.tmp"


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the directory entries of ``path`` (creations, renames) durable."""
    if not _O_DIRECTORY:  # Windows: directories cannot be opened, nor need it
        return
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: str | os.PathLike[str]) -> bool:
    """Remove a file; False if it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class Job(Protocol):
    """One write of a round: replace ``path`` by ``data``, or append ``data``
    to the journal when ``path`` is None; once it is durable, unlink the
    files of ``remove`` (e.g. checkpoints a record supersedes; not synced: a
    crash that undoes a removal leaves a file readers ignore).
    :meth:`Disk.commit` sets ``error`` (and ``written`` for a journal line)."""

    path: str | None
    data: bytes
    remove: tuple[str, ...]
    error: Exception | None
    written: bool


class Disk:
    """Commits rounds of writes to one run directory; see the module docstring.

    ``known_dirs`` are directories whose existence is durable (the run tree
    at first); any other parent is created on demand, made durable by the
    round that needed it, and only then added. ``dir_fds`` are open fds of
    directories fsynced often, to save an open per round. ``journal_fd`` is
    an ``O_APPEND`` fd for journal lines; it also names the filesystem for
    ``syncfs`` (``None``: fsync file by file and directory by directory).
    """

    def __init__(
        self,
        known_dirs: set[str],
        dir_fds: dict[str, int],
        journal_fd: int,
        syncfs: Callable[[int], None] | None,
    ):
        self.known_dirs = known_dirs
        self.dir_fds = dir_fds
        self.journal_fd = journal_fd
        self.syncfs = syncfs

    def commit(self, batch: Sequence[Job]) -> list[str]:
        """Commit ``batch``: every job ends with ``error`` None (durable) or
        set. Never raises: a failure that is not an OS error (a bug) fails
        every job of the batch not failed yet. Returns a line per file of a
        durable job's ``remove`` that could not be removed."""
        try:
            renamed = self._steps(batch)
        except Exception as exc:  # noqa: BLE001 - reported per job
            for job in batch:
                if job.error is None:
                    job.error = exc
            return []
        problems = []
        for job in renamed:
            for path in job.remove:
                try:
                    unlink_quietly(path)
                except OSError as exc:
                    problems.append(f"after writing {job.path}: {exc}")
        return problems

    def _steps(self, batch: Sequence[Job]) -> list[Job]:
        """Steps 1-4 of a round; returns the jobs whose files are durable."""
        whole_fs = self.syncfs is not None
        dirty_dirs: dict[str, None] = {}  # ordered set
        new_dirs: set[str] = set()
        temps: list[tuple[Job, str, str]] = []
        appends: list[Job] = []
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
            _fail([job for job in batch if job.error is None], exc)
            for _, tmp, _ in temps:
                unlink_quietly(tmp)
            return []
        renamed: list[Job] = []
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
                _fail(renamed, exc)
                return []
        self.known_dirs.update(new_dirs)
        return renamed

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


def _fail(jobs: list[Job], exc: OSError) -> None:
    for job in jobs:
        job.error = exc


# -- the writer process ----------------------------------------------------------


def frame(payload: Any) -> bytes:
    """``payload`` as one frame of the protocol."""
    data = marshal.dumps(payload)
    return _HEADER.pack(len(data)) + data


def read_frames(buffer: bytearray) -> list[Any]:
    """Take every complete frame off the front of ``buffer`` (decoded)."""
    frames = []
    offset = 0
    size = _HEADER.size
    while len(buffer) - offset >= size:
        (length,) = _HEADER.unpack_from(buffer, offset)
        if len(buffer) - offset - size < length:
            break
        frames.append(marshal.loads(bytes(buffer[offset + size : offset + size + length])))
        offset += size + length
    del buffer[:offset]
    return frames


class _Op:
    __slots__ = ("data", "error", "path", "remove", "written")

    def __init__(self, path: str | None, data: bytes, remove: tuple[str, ...]):
        self.path = path
        self.data = data
        self.remove = remove
        self.error: Exception | None = None
        self.written = False


def _outcome(error: Exception | None) -> Any:
    if error is None:
        return None
    if isinstance(error, OSError):
        return (error.errno, error.strerror, None if error.filename is None else str(error.filename))
    return f"{type(error).__name__}: {error}"


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def serve(inp: int = 0, out: int = 1) -> None:
    """The writer process's loop: read rounds from ``inp``, commit them,
    answer on ``out``; return at end of input once all is committed."""
    buffer = bytearray()
    disk: Disk | None = None
    eof = False
    while not eof:
        rounds: list[Any] = []
        # Block for the first frame, then take whatever else already came:
        # rounds that queued up while the last one was committed share one.
        while True:
            rounds += read_frames(buffer)
            if (rounds and not _readable(inp)) or eof:
                break
            chunk = os.read(inp, 1 << 20)
            if not chunk:
                eof = True
            buffer += chunk
        if disk is None and rounds:
            init = rounds.pop(0)
            syncfs = SYNCFS if init["syncfs"] else None
            disk = Disk(set(init["known_dirs"]), dict(init["dir_fds"]), init["journal_fd"], syncfs)
            out = _answer(out, frame((-1, [], [])))  # ready
        if not rounds:
            continue
        assert disk is not None
        ops = [[_Op(path, data, remove) for path, data, remove in writes] for _, writes in rounds]
        problems = disk.commit([op for round_ops in ops for op in round_ops])
        answers: list[tuple[int, list[Any], list[str]]] = [
            (round_id, [_outcome(op.error) for op in round_ops], [])
            for (round_id, _), round_ops in zip(rounds, ops, strict=True)
        ]
        answers[-1][2].extend(problems)  # the merged rounds' problems go with the last answer
        answer = b"".join(frame(part) for part in answers)
        out = _answer(out, answer)


def _answer(out: int, data: bytes) -> int:
    """Write ``data`` to ``out``; once nobody reads the answers (the runtime
    died), stop answering but go on committing (returns -1 then)."""
    if out < 0:
        return out
    try:
        write_all(out, data)
    except BrokenPipeError:
        return -1
    return out


if __name__ == "__main__":
    serve()
    # Everything is committed and answered (``serve`` writes with ``os.write``
    # only: no buffer is left to flush), so skip the interpreter's shutdown:
    # it took 5-6 ms of the store's close, against 1 ms for this.
    os._exit(0)
