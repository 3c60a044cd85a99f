"""The writer of one run directory (SPEC 8).

::

    <output_root>/<request name>/<run id>/
      run_info.json  progress.jsonl  progress.json  sessions.jsonl
      details/{fatal,error,normal}/<task key>.json
      tasks/<task key>/attempt-<n>/checkpoint.json
      tasks/<task key>/attempt-<n>/retries/<try>.json
      metrics.json  summary.md

A :class:`RunStore` is opened with :func:`open_run_store` and owns a nursery
with two actor tasks: the progress actor (``progress.jsonl`` lines in batches,
``progress.json`` at most every :data:`PROGRESS_INTERVAL` seconds) and the
group committer (:mod:`._group_commit`), through which every durable write
goes: records, checkpoints, retries, session journal lines, JSON and text
files. Closing flushes both, shielded, until the caller's close deadline
(the cleanup grace), so a cancelled caller loses no event unless the disk
stalls past it.

Per-record work is kept small because the runtime persists thousands of
records per second: task keys and paths are cached, an attempt serialized for
its checkpoint is reused verbatim in the task record, JSON is compact, and the
blocking work of many records shares one thread hop and one fsync round.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from .. import _redact
from .._convert import unstructure
from ..runtime._results import AttemptRecord, TaskRecord
from ._atomic import (
    _O_CLOEXEC,
    fsync_dir,
    open_dir_fd,
    to_store_thread,
    unlink_quietly,
    write_all,
    write_atomic_sync,
)
from ._group_commit import GroupCommitter, StoreClosedError
from ._keys import task_key
from ._records import attempt_to_data
from ._writer import SYNCFS, Disk

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no flock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CLOSE_GRACE_SECONDS",
    "new_run_tag",
    "write_journals_now",
    "PROGRESS_INTERVAL",
    "RunLockedError",
    "RunStore",
    "StoreClosedError",
    "run_dir_lock",
    "run_is_live",
    "new_run_id",
    "open_run_store",
]

#: Minimum seconds between two rewrites of ``progress.json``.
PROGRESS_INTERVAL = 0.5
#: How long the progress actor lets events gather before writing a batch.
PROGRESS_BATCH_SECONDS = 0.05
#: How long closing may take to flush queued writes once the caller is cancelled.
CLOSE_GRACE_SECONDS = 30.0
#: How long a writer process may take to exit once its input ended (it has
#: answered every round when closing finished in time); then it is killed,
#: which leaves the directory as a crash would.
WRITER_STOP_SECONDS = 5.0

SEVERITIES = ("fatal", "error", "normal")
CHECKPOINT = "checkpoint.json"

_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if attrs.has(type(value)):
        return unstructure(value)
    return str(value)


# Progress events and free-form data never fail to serialize: an odd field
# (a Path, an exception) is written as text rather than losing the line.
_LENIENT = json.JSONEncoder(separators=(",", ":"), default=_json_default)
_PRETTY = json.JSONEncoder(indent=2, default=_json_default)

# The record JSON is assembled from pre-serialized attempts; that is only right
# while TaskRecord has exactly these fields (else: the generic path).
_FAST_TASK_JSON = tuple(f.name for f in attrs.fields(TaskRecord)) == (
    "task_id",
    "category",
    "attempts",
    "severity",
)

_SEP = os.sep
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | _O_CLOEXEC


def _mask(text: str) -> str:
    """``text`` with every registered secret value masked (SPEC 8: no secret
    in any file). Applied to everything the store writes, since a component
    may put a credential anywhere (an agent's output or trajectory that echoes
    its API key), and every recognized credential shape (``sk-...``,
    ``Bearer ...``, ``api_key=...``) without ever breaking the JSON. A value is
    masked as it appears in the JSON text, i.e. when JSON escapes none of its
    characters (true of API keys and tokens)."""
    return _redact.redact_json_text(text)


#: Every store open in this process (for :func:`write_journals_now`).
_OPEN_STORES: weakref.WeakSet[RunStore] = weakref.WeakSet()


def write_journals_now() -> None:
    """Write the queued session journal lines of every open store, blocking.

    For a process about to exit without unwinding (a second Ctrl-C): the
    sandboxes it opened stay journalled, so ``compass reap`` or the next
    ``--reuse`` finds them. Errors are ignored: the process is leaving.
    """
    for store in list(_OPEN_STORES):
        try:
            store._committer.write_journal_now()
        except OSError:
            pass


class RunLockedError(RuntimeError):
    """The run directory is locked by a live run (in this or another process)."""


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold the writer lock of ``run_dir`` (blocking, non-waiting): raise
    :class:`RunLockedError` when a live run holds it. For touching what a
    dead run left (reaping its sandboxes) without racing a live one. Where
    there is no ``flock`` (Windows) nothing is locked."""
    fd = open_dir_fd(Path(run_dir))
    try:
        if fcntl is not None and fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunLockedError(f"{run_dir} is already open by another writer") from None
        yield
    finally:
        if fd is not None:
            os.close(fd)


def run_is_live(run_dir: Path) -> bool:
    """Whether a live run holds ``run_dir``'s writer lock (blocking)."""
    try:
        with run_dir_lock(run_dir):
            return False
    except RunLockedError:
        return True
    except OSError:
        return False


def new_run_id() -> str:
    """A fresh run id, e.g. ``20261129T233501.482Z-a7f3``.

    Fixed-width UTC time to the millisecond, so the lexically greatest id is the
    latest run, plus a random suffix so that two runs never share a directory.
    """
    now = datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(2)}"


def new_run_tag() -> str:
    """A fresh run tag, e.g. ``ac3f9a1c2b7d``: the prefix of every Environment
    session name of one run, recorded in its ``run_info.json`` so that
    ``sweep(tag)`` finds what a killed run left. Fixed length, so that no
    run's tag is a prefix of another's."""
    return f"ac{secrets.token_hex(5)}"


#: What :func:`new_run_id` makes (and the older second-resolution form).
RUN_ID_PATTERN = re.compile(r"\d{8}T\d{6}(\.\d{3})?Z(-[0-9a-f]+)?")


def _check_name(name: str, what: str) -> None:
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"{what} {name!r} cannot be used as a directory name")


@attrs.define(eq=False)
class RunStore:
    """The one writer of a run directory; make it with :func:`open_run_store`.

    All methods are called from the Trio thread. ``event`` and
    ``set_progress`` never block; every ``async`` method returns once its
    data is durable (if its caller is cancelled while waiting, the write still
    completes). Records are values: mutating one after handing it to the store
    is unsupported, since its serialized form may be cached.
    """

    run_dir: Path
    _committer: GroupCommitter
    _progress_fd: int
    _sessions_fd: int
    _dir_fds: dict[str, int]
    # Plain strings, not Paths: path building is on the per-record hot path.
    _details_dirs: dict[str, str]
    _tasks_dir: str
    _keys: dict[str, str] = attrs.Factory(dict)
    _attempt_json: dict[str, dict[int, tuple[AttemptRecord, str]]] = attrs.Factory(dict)
    _lines: list[tuple[str, float, dict[str, Any]]] = attrs.Factory(list)
    _snapshot: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    _snapshot_due: float = -float("inf")
    _progress_wake: trio.Event = attrs.Factory(trio.Event)
    _closed: bool = False
    # What this store wrote, so that a record's clean-up knows its targets
    # without listing directories. Only complete when the store created the
    # run directory (``_fresh``); a reopened one may hold older files.
    _fresh: bool = False
    _saved_severity: dict[str, str] = attrs.Factory(dict)
    _checkpointed: dict[str, set[int]] = attrs.Factory(dict)
    _failure: str | None = None

    @property
    def failure(self) -> str | None:
        """The first error of a write nobody waited for (``progress.jsonl``,
        ``progress.json``), as one line; None while there was none. Such a
        write is dropped, not retried: the request fails instead (its owner
        reads this when it finalizes)."""
        return self._failure

    @property
    def closed(self) -> bool:
        """The store refuses writes and events (it is closing or closed)."""
        return self._closed

    @property
    def notes(self) -> list[str]:
        """Problems that did not fail a write, for ``run_info.json``: e.g. a
        checkpoint that could not be removed after its record was saved."""
        return list(self._committer.cleanup_errors)

    # -- progress (non-blocking) --------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        """Queue one ``progress.jsonl`` line ``{"event": kind, "t": <unix time>, **fields}``.

        Kinds used by the runtime: ``run_started``, ``task_started``,
        ``attempt_started``, ``attempt_retry``, ``retry_wait``,
        ``attempt_finished``, ``task_finished``, ``run_finished``. Lines are
        appended in batches and fsynced at the end of each batch; all queued
        lines are on disk once the store is closed. A value JSON cannot hold
        is written as text; fields named ``event`` or ``t`` are overridden.
        """
        if self._closed:
            raise StoreClosedError("the run store is closed")
        # Encoded by the progress actor, a batch at a time (see _encode).
        self._lines.append((kind, time.time(), fields))
        self._progress_wake.set()

    def set_progress(self, snapshot: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Make ``snapshot`` the next ``progress.json`` (total, pending, active,
        completed, failed_tasks, error_tasks, warning_tasks, elapsed).

        Only the latest snapshot is kept; it is written at most every
        :data:`PROGRESS_INTERVAL` seconds and at close. A callable is called
        when the snapshot is written (so a caller whose counts change often
        builds it only that often).
        """
        if self._closed:
            raise StoreClosedError("the run store is closed")
        self._snapshot = snapshot if callable(snapshot) else dict(snapshot)
        self._progress_wake.set()

    # -- durable writes -------------------------------------------------------

    async def write_run_info(self, info: dict[str, Any]) -> None:
        """Write ``run_info.json`` (the caller redacts the request)."""
        await self.write_json("run_info.json", info)

    async def write_json(self, name: str, data: Any) -> None:
        """Write ``data`` as indented JSON to ``name`` (relative to the run directory)."""
        payload = _mask(_PRETTY.encode(unstructure(data))) + "\n"
        await self._committer.write(self._path(name), payload.encode())

    async def write_text(self, name: str, text: str) -> None:
        """Write ``text`` (UTF-8) to ``name`` (relative to the run directory)."""
        await self._committer.write(self._path(name), _redact.redact(text).encode("utf-8", "backslashreplace"))

    async def save_checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        """Write ``tasks/<key>/attempt-<n>/checkpoint.json`` for an evaluated attempt.

        The file is ``{"task_id": ..., "record": <AttemptRecord>}``; ``n`` is
        ``record.attempt``. Durable when this returns.
        """
        await self._committer.write(*self._checkpoint_write(task_id, record))

    def save_checkpoint_soon(
        self, task_id: str, record: AttemptRecord, notify: Callable[[Exception | None], None]
    ) -> None:
        """:meth:`save_checkpoint` without waiting: ``notify(error)`` runs in
        the Trio thread once the checkpoint is durable (``error`` None) or
        could not be written. Commit rounds may finish out of order: a
        caller that also saves the task's record queues it only once its
        checkpoints were notified (the record's round removes them)."""
        path, data = self._checkpoint_write(task_id, record)
        self._committer.write_soon(path, data, None, notify)

    def _checkpoint_write(self, task_id: str, record: AttemptRecord) -> tuple[str, bytes]:
        attempt_json = self._attempt_to_json(task_id, record)
        data = f'{{"task_id":{_COMPACT.encode(task_id)},"record":{attempt_json}}}'
        path = f"{self._tasks_dir}{_SEP}{self._key(task_id)}{_SEP}attempt-{record.attempt}{_SEP}{CHECKPOINT}"
        self._checkpointed.setdefault(task_id, set()).add(record.attempt)
        return path, data.encode()

    async def save_retry(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        """Write a discarded try to ``tasks/<key>/attempt-<n>/retries/<try_number>.json``.

        ``data`` is free-form (diagnostics, stage, matched pattern, delay,
        redacted plan); the task id is added to it.
        """
        payload = _mask(_LENIENT.encode({"task_id": task_id, **unstructure(data)}))
        key = self._key(task_id)
        path = f"{self._tasks_dir}{_SEP}{key}{_SEP}attempt-{attempt}{_SEP}retries{_SEP}{try_number}.json"
        await self._committer.write(path, payload.encode())

    async def save_task(self, record: TaskRecord) -> None:
        """Write the countable record to ``details/<severity>/<key>.json``.

        Once it is durable, the task's checkpoints are removed (``retries/``
        stays) and so is a record of the same task under another severity (a
        reused task may change severity); a failed removal does not fail the
        call (see :attr:`notes`). Concurrent calls share fsync rounds (group
        commit); each returns once its own record is durable.
        """
        path, data, remove, after, rollback = self._task_write(record)
        try:
            await self._committer.write(path, data, after, remove)
        except BaseException:
            rollback()
            raise

    def save_task_soon(self, record: TaskRecord, notify: Callable[[Exception | None], None]) -> None:
        """:meth:`save_task` without waiting: ``notify(error)`` runs in the
        Trio thread once the record is durable (``error`` None) or could not
        be written. Lets a worker take its next task while the disk works."""
        self._queue_task(record, None, notify)

    def save_task_data_soon(
        self, record: TaskRecord, data: bytes, notify: Callable[[Exception | None], None]
    ) -> None:
        """:meth:`save_task_soon` with ``data``, a JSON form of ``record``
        already masked (e.g. a reused record's file), as the file's content
        instead of ``record`` serialized again."""
        self._queue_task(record, data, notify)

    def _queue_task(
        self, record: TaskRecord, data: bytes | None, notify: Callable[[Exception | None], None]
    ) -> None:
        path, content, remove, after, rollback = self._task_write(record, data)

        def written(error: Exception | None) -> None:
            if error is not None:
                rollback()
            notify(error)

        self._committer.write_soon(path, content, after, written, remove)

    async def link_tasks(
        self, links: list[tuple[TaskRecord, str, bytes]], notify: Callable[[Exception | None], None]
    ) -> None:
        """Store records whose files already exist elsewhere, unchanged and
        masked (``links``: record, that file's path, its content): each file
        is hard-linked to its place here, then the new entries are made
        durable; a record that cannot be linked (another filesystem, one
        without hard links, or a run directory this store did not create) is
        written instead. ``notify(error)`` runs once per record, as for
        :meth:`save_task_soon`.

        Creating a file costs an inode, which on the virtual disks we measured
        takes 0.3-1 ms, and a link about 25 us: most of the time a reuse of
        thousands of records took before its first new attempt. Sharing a file
        with another run is safe because no store ever changes a file in place
        (every write replaces it by a rename, a clean-up unlinks it), and its
        content is durable since that run wrote it. Only into a fresh run
        directory: there no older record of the task can exist, so the shared
        (older) modification time cannot lose a "newest record wins" contest
        (see :mod:`._load`). Non-goal: a record file edited in place by hand
        changes in both runs.
        """
        if not self._fresh:
            for record, _, data in links:
                self.save_task_data_soon(record, data, notify)
            return
        targets = []
        for record, source, _ in links:
            self._saved_severity[record.task_id] = record.severity
            targets.append((source, f"{self._details_dirs[record.severity]}{_SEP}{self._key(record.task_id)}.json"))
        try:
            failed = await to_store_thread(_link_sync, targets)
        except OSError as exc:  # the directories could not be synced: none is known durable
            for record, _, _ in links:
                self._saved_severity.pop(record.task_id, None)
                notify(exc)
            return
        for index in failed:
            record, _, data = links[index]
            self._saved_severity.pop(record.task_id, None)
            self.save_task_data_soon(record, data, notify)
        for _ in range(len(links) - len(failed)):
            notify(None)

    def _task_write(
        self, record: TaskRecord, data: bytes | None = None
    ) -> tuple[str, bytes, tuple[str, ...], Callable[[], None] | None, Callable[[], None]]:
        if record.severity not in self._details_dirs:
            raise ValueError(f"unknown task severity {record.severity!r}")
        task_id = record.task_id
        key = self._key(task_id)
        if data is None:
            data = self._task_to_json(record).encode()
        path = f"{self._details_dirs[record.severity]}{_SEP}{key}.json"
        previous = self._saved_severity.get(task_id)
        attempts = self._checkpointed.pop(task_id, set())
        remove, after = self._superseded_cleanup(task_id, key, record.severity, previous, attempts)
        self._saved_severity[task_id] = record.severity

        def rollback() -> None:
            # Maybe not written: a later save_task must still find what to clean.
            self._checkpointed.setdefault(task_id, set()).update(attempts)
            if previous is not None and previous != record.severity:
                self._saved_severity[task_id] = previous

        return path, data, remove, after, rollback

    async def journal_session(
        self,
        event: Literal["opened", "closed"],
        session_id: str,
        provider: str,
        handle: dict[str, Any],
        *,
        durable: bool = True,
        written: Callable[[Exception | None], None] | None = None,
        name: str | None = None,
    ) -> None:
        """Append ``{"event", "session", "provider", "name", "handle", "t"}`` to
        ``sessions.jsonl`` (``name``, the session name the provider labelled
        the sandbox with, only when given).

        With ``durable`` (the default) this returns once the line is durable.
        ``durable=False`` only queues it: the next commit round writes and
        syncs it, then calls ``written(error)`` if given. ``handle`` must be
        enough to find the session again and must hold no secret. Lines of
        concurrent rounds may land out of order, so a reader matches
        "closed" to "opened" by session id, not by position.
        """
        if event not in ("opened", "closed"):
            raise ValueError(f"session event must be 'opened' or 'closed', not {event!r}")
        fields: dict[str, Any] = {"session": session_id, "provider": provider}
        if name is not None:
            fields["name"] = name
        fields["handle"] = handle
        data = (_mask(_line(event, time.time(), fields, "event", last="t")) + "\n").encode()
        if durable:
            await self._committer.append(data)
            if written is not None:
                written(None)
        else:
            self._committer.append_nowait(data, written)

    # -- helpers ----------------------------------------------------------------

    def _key(self, task_id: str) -> str:
        key = self._keys.get(task_id)
        if key is None:
            key = self._keys[task_id] = task_key(task_id)
        return key

    def _path(self, name: str) -> Path:
        relative = Path(name)
        if not name or relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"{name!r} is not a path inside the run directory")
        return self.run_dir / relative

    def _attempt_to_json(self, task_id: str, record: AttemptRecord) -> str:
        cached = self._attempt_json.get(task_id, {}).get(record.attempt)
        if cached is not None and cached[0] is record:
            return cached[1]
        text = _mask(_compact(attempt_to_data(record)))
        self._attempt_json.setdefault(task_id, {})[record.attempt] = (record, text)
        return text

    def _task_to_json(self, record: TaskRecord) -> str:
        if not _FAST_TASK_JSON:
            self._attempt_json.pop(record.task_id, None)
            return _mask(_COMPACT.encode(unstructure(record)))
        attempts = ",".join(self._attempt_to_json(record.task_id, a) for a in record.attempts)
        self._attempt_json.pop(record.task_id, None)
        return (
            f'{{"task_id":{_COMPACT.encode(record.task_id)},'
            f'"category":{_COMPACT.encode(record.category)},'
            f'"attempts":[{attempts}],'
            f'"severity":{_COMPACT.encode(record.severity)}}}'
        )

    def _superseded_cleanup(
        self, task_id: str, key: str, severity: str, previous: str | None, attempts: set[int]
    ) -> tuple[tuple[str, ...], Callable[[], None] | None]:
        """What to remove once a record is durable: the task's checkpoints and
        its record under another severity. Files this store wrote are named
        (the round removes them, in the writer process); in a run directory
        it did not create, an after-hook lists the task's directory first
        (in a store thread).

        No fsync: if a crash undoes these removals, readers still prefer the
        details record (and the newest of two, see _load). The emptied attempt
        directories stay: removing a directory frees a disk block, which on a
        virtual disk can block for milliseconds per call.
        """
        name = f"{_SEP}{key}.json"
        task_dir = f"{self._tasks_dir}{_SEP}{key}"
        if self._fresh:
            stale = [] if previous in (None, severity) else [self._details_dirs[previous] + name]
            stale += [f"{task_dir}{_SEP}attempt-{n}{_SEP}{CHECKPOINT}" for n in sorted(attempts)]
            return tuple(stale), None
        others = [d + name for sev, d in self._details_dirs.items() if sev != severity]
        return (), partial(_unlink_all_and_checkpoints, others, task_dir)

    # -- progress actor and lifetime -------------------------------------------

    async def _progress_actor(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            deadline = self._snapshot_due if self._snapshot is not None else float("inf")
            with trio.move_on_at(deadline):
                await self._progress_wake.wait()
                # Let a batch gather: one thread hop and fsync per batch, not
                # per burst of events (several are reported per attempt).
                await trio.sleep(PROGRESS_BATCH_SECONDS)
            await self._flush_progress(final=False)

    async def _flush_progress(self, *, final: bool) -> None:
        self._progress_wake = trio.Event()
        lines, self._lines = self._lines, []
        snapshot = None
        now = trio.current_time()
        if self._snapshot is not None and (final or now >= self._snapshot_due):
            snapshot, self._snapshot = self._snapshot, None
            self._snapshot_due = now + PROGRESS_INTERVAL
            if callable(snapshot):
                snapshot = snapshot()
        if not lines and snapshot is None:
            return
        text = _encode(lines)
        try:
            await to_store_thread(self._write_progress_sync, text, snapshot)
        except OSError as exc:
            # A full or failing disk: the lines are lost, the request fails
            # (see ``failure``), and the actor goes on.
            if self._failure is None:
                self._failure = f"could not write progress: {exc}".splitlines()[0]
        except BaseException:
            # Cancelled before the thread started: keep it for the final flush.
            self._lines[:0] = lines
            if self._snapshot is None:
                self._snapshot = snapshot
            raise

    def _write_progress_sync(self, text: str, snapshot: dict[str, Any] | None) -> None:
        if text:
            write_all(self._progress_fd, text.encode())
            os.fsync(self._progress_fd)
        if snapshot is not None:
            data = (_PRETTY.encode(snapshot) + "\n").encode()
            write_atomic_sync(self.run_dir / "progress.json", data)

    async def _close(self) -> None:
        self._closed = True
        try:
            await self._committer.close()
        finally:
            await self._flush_progress(final=True)

    def _release(self) -> None:
        fds = {self._progress_fd, self._sessions_fd, *self._dir_fds.values()}
        for fd in fds:  # the run directory's fd goes too, releasing the writer lock
            os.close(fd)

    @classmethod
    def _open_sync(cls, output_root: Path, request_name: str, run_id: str | None) -> RunStore:
        _check_name(request_name, "request name")
        request_dir = Path(output_root) / request_name
        request_dir.mkdir(parents=True, exist_ok=True)
        fresh = True
        if run_id is None:
            while True:
                run_dir = request_dir / new_run_id()
                try:
                    run_dir.mkdir()
                except FileExistsError:
                    continue
                break
        else:
            _check_name(run_id, "run id")
            run_dir = request_dir / run_id
            try:
                run_dir.mkdir()
            except FileExistsError:
                fresh = False
        details = {severity: run_dir / "details" / severity for severity in SEVERITIES}
        tasks_dir = run_dir / "tasks"
        for directory in (*details.values(), tasks_dir):
            directory.mkdir(parents=True, exist_ok=True)
        dir_fds: dict[str, int] = {}
        opened: list[int] = []
        try:
            for directory in (run_dir, run_dir / "details", *details.values(), tasks_dir):
                fd = open_dir_fd(directory)
                if fd is not None:
                    dir_fds[str(directory)] = fd
                    opened.append(fd)
            run_fd = dir_fds.get(str(run_dir))
            if fcntl is not None and run_fd is not None:
                try:
                    fcntl.flock(run_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise RunLockedError(f"{run_dir} is already open by another writer") from None
            progress_fd = _open_journal(run_dir / "progress.jsonl")
            opened.append(progress_fd)
            sessions_fd = _open_journal(run_dir / "sessions.jsonl")
            opened.append(sessions_fd)
            # The new tree itself must survive a crash: fsync each parent once.
            for fd in dir_fds.values():
                os.fsync(fd)
            fsync_dir(request_dir)
            fsync_dir(request_dir.parent)
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        committer = GroupCommitter(
            Disk(
                known_dirs={str(d) for d in (run_dir, *details.values(), tasks_dir)},
                dir_fds=dir_fds,
                journal_fd=sessions_fd,
                syncfs=SYNCFS,
            )
        )
        return cls(
            run_dir=run_dir,
            committer=committer,
            progress_fd=progress_fd,
            sessions_fd=sessions_fd,
            dir_fds=dir_fds,
            details_dirs={severity: str(d) for severity, d in details.items()},
            tasks_dir=str(tasks_dir),
            fresh=fresh,
        )


def _encode(events: list[tuple[str, float, dict[str, Any]]]) -> str:
    """``progress.jsonl`` lines for queued events, masked as one text (no
    pattern spans a line: JSON escapes every newline inside a string)."""
    if not events:
        return ""
    lines = [_line(kind, now, fields) for kind, now, fields in events]
    lines.append("")
    return _mask("\n".join(lines))


def _make_encoder() -> Any:
    """The C encoder behind ``_LENIENT``, made once instead of per call
    (``JSONEncoder.encode`` builds a new one every time: a third of its cost
    on a progress line). Without circular-reference markers it keeps no
    state, so any thread may use it (a cycle raises RecursionError instead
    of ValueError). None where the C accelerator is missing."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    return make(None, _json_default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)


_ENCODER = _make_encoder()


def _compact(value: Any) -> str:
    """``_LENIENT.encode(value)``, faster."""
    if _ENCODER is None:
        return _LENIENT.encode(value)
    return "".join(_ENCODER(value, 0))


def _line(kind: str, now: float, fields: dict[str, Any], key: str = "event", last: str | None = None) -> str:
    """``{key: kind, "t": now, **fields}`` (or with ``"t"`` last) as compact
    JSON; fields named like the fixed keys are dropped (ours win)."""
    entry: dict[str, Any] = {key: kind} if last is not None else {key: kind, "t": now}
    for name, value in fields.items():
        if name != key and name != "t":
            entry[name] = value
    if last is not None:
        entry[last] = now
    return _compact(entry)


def _link_sync(targets: list[tuple[str, str]]) -> list[int]:
    """Link each ``(source, target)``, then fsync the targets' directories
    (blocking). Returns the indexes of the pairs that could not be linked."""
    failed: list[int] = []
    directories: dict[str, None] = {}
    for index, (source, target) in enumerate(targets):
        try:
            os.link(source, target)
        except OSError:
            failed.append(index)
        else:
            directories[os.path.dirname(target)] = None
    for directory in directories:
        fsync_dir(directory)
    return failed


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        unlink_quietly(path)


def _unlink_all_and_checkpoints(paths: list[str], task_dir: str) -> None:
    _unlink_all(paths)
    try:
        with os.scandir(task_dir) as entries:
            attempt_dirs = [e.name for e in entries if e.name.startswith("attempt-")]
    except FileNotFoundError:
        return
    _unlink_all([os.path.join(task_dir, name, CHECKPOINT) for name in attempt_dirs])


def _open_journal(path: Path) -> int:
    """Open a ``.jsonl`` file for appending; if a crash cut its last line short,
    end that line so the next one starts clean (readers skip the fragment)."""
    fd = os.open(path, _APPEND_FLAGS, 0o644)
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        write_all(fd, b"\n")
    return fd


@asynccontextmanager
async def open_run_store(
    output_root: Path,
    request_name: str,
    run_id: str | None = None,
    *,
    close_deadline: Callable[[], float] | None = None,
) -> AsyncIterator[RunStore]:
    """Create (or reopen) ``<output_root>/<request_name>/<run_id>/`` and write to it.

    ``run_id`` defaults to :func:`new_run_id`. Reopening an existing run id is
    allowed (e.g. to journal reaped sessions); a second writer of the same
    directory, in any process, gets ``RuntimeError``. On exit every queued
    write and event is flushed, shielded even when the caller is cancelled,
    until ``close_deadline()`` (the orchestration's cleanup grace; default
    :data:`CLOSE_GRACE_SECONDS` from the exit). Past it, the writer process
    is killed and what was not written is lost, as in a crash (the next
    ``--reuse`` recovers from that).
    """
    store = await to_store_thread(RunStore._open_sync, output_root, request_name, run_id)
    _OPEN_STORES.add(store)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store._progress_actor)
            await nursery.start(store._committer.run)
            # Rounds run in store threads until the writer answers.
            nursery.start_soon(store._committer.start_writer, store._dir_fds.get(str(store.run_dir)))
            try:
                yield store
            finally:
                # Actors stop between batches (a batch in a thread always
                # finishes, one in the writer process by the close deadline);
                # _close() then commits what is left, shielded.
                if close_deadline is not None:
                    store._committer.set_deadline(close_deadline())
                nursery.cancel_scope.cancel()
    finally:
        if close_deadline is not None:
            limit = close_deadline()
            store._committer.set_deadline(limit)
        else:
            limit = trio.current_time() + CLOSE_GRACE_SECONDS
        try:
            with trio.move_on_at(limit, shield=True):
                await store._close()
            remaining = max(0.0, limit - trio.current_time())
            await store._committer.stop_writer(min(WRITER_STOP_SECONDS, remaining))
        finally:
            _OPEN_STORES.discard(store)
            store._release()
