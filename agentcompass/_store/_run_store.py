"""The writer of one run directory (SPEC 8), at the paths ``._layout`` names.

A :class:`RunStore` (made by :func:`open_run_store`) owns one *committer*
task. Every write is queued; the committer takes what is queued as a batch
and makes it durable in one :meth:`Disk.run <._disk.Disk.run>` call (see
:mod:`._commit`): temporary files, one sync, renames, one sync of the
directories, then removal of what the batch supersedes.

A caller awaits its write: it returns once the write is durable, or raises
``OSError``; a cancelled caller's write still happens. Progress lines and
the ``progress.json`` snapshot have no caller: they ride with the next batch,
at most :data:`PROGRESS_BATCH_SECONDS` later, and a failure to write them is
kept in :attr:`RunStore.failure`. Closing commits what is left (writes
queued meanwhile included), shielded until the close deadline; past it the
disk's worker is abandoned and what was not written is lost, as in a crash
(the next ``--reuse`` recovers).

Non-goal: ordering between the writes of one batch; a caller that needs A
durable before B awaits A first.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import attrs
import orjson
import trio

from .. import _redact
from ..runtime._cleanup import cleanup_deadline
from ..runtime._convert import unstructure
from ..runtime._results import AttemptRecord, TaskRecord
from . import _commit
from ._commit import Write
from ._disk import Disk, RunLockedError, timed_out
from ._formats import FORMAT, Overlay, merge, stamp
from ._index import task_row
from ._keys import task_key
from ._layout import SEVERITIES, RunLayout
from ._trajectories import split_trajectories

__all__ = [
    "PROGRESS_BATCH_SECONDS",
    "PROGRESS_INTERVAL",
    "RUN_ID_PATTERN",
    "RunLockedError",
    "RunStore",
    "StoreClosedError",
    "new_run_id",
    "new_run_tag",
    "open_run_store",
    "run_dir_lock",
    "run_is_live",
    "write_journals_now",
]

#: Minimum seconds between two rewrites of ``progress.json``.
PROGRESS_INTERVAL = 0.5
#: How long progress lines and snapshots wait for a batch to ride with.
PROGRESS_BATCH_SECONDS = 0.05


def _json_default(value: Any) -> Any:
    # Free-form data never fails to serialize: an odd field (a Path, an
    # exception) is written as text rather than losing the line.
    return unstructure(value) if attrs.has(type(value)) else str(value)


_COMPACT = json.JSONEncoder(separators=(",", ":"), default=_json_default)
_PRETTY = json.JSONEncoder(indent=2, default=_json_default)
# Dates and dataclasses go through ``_json_default`` as with the standard encoder.
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _compact(data: Any) -> str:
    """One-line JSON text of ``data`` (records, checkpoints, journal and
    progress lines): orjson, as the standard encoder calls back into
    Python for every float (bench: overhead). The standard
    encoder takes what orjson refuses (a lone surrogate, an integer beyond
    64 bits). NaN and infinities are written as ``null``."""
    try:
        return orjson.dumps(data, default=_json_default, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return _COMPACT.encode(data)


#: Every store open in this process (for :func:`write_journals_now`).
_OPEN_STORES: weakref.WeakSet[RunStore] = weakref.WeakSet()


class StoreClosedError(RuntimeError):
    """The run store was already closed when asked to write."""


def write_journals_now() -> None:
    """Write the queued session journal lines of every open store, blocking.

    For a process about to exit without unwinding (a second Ctrl-C): the
    sandboxes it opened stay journalled, so ``compass reap`` or the next
    ``--reuse`` finds them. A line a batch writes at the same moment may
    appear twice (readers match lines by session id). Errors are ignored.
    """
    for store in list(_OPEN_STORES):
        lines = [w for w in (*store._pending, *store._in_flight) if w.path == store._sessions and not w.written]
        with contextlib.suppress(OSError):
            store._disk.append(store._sessions, b"".join(w.data for w in lines))
            for w in lines:
                w.written = True


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s writer lock (blocking, non-waiting): raise
    :class:`RunLockedError` when a live run holds it. For touching what a
    dead run left without racing a live one."""
    with Disk().lock(str(run_dir)):
        yield


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
    """A fresh run id, e.g. ``20261129T233501.482Z-a7f3``: UTC time to the
    millisecond (the greatest id is the latest run) and a random suffix (two
    runs never share a directory)."""
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


def _mask(text: str) -> str:
    """``text`` with every registered secret and credential shape masked,
    without breaking the JSON (SPEC 8: no secret in any file)."""
    return _redact.redact_json_text(text)


@attrs.define(eq=False)
class RunStore:
    """The one writer of a run directory; make it with :func:`open_run_store`.

    Call it from the Trio thread. ``event`` and ``set_progress`` never block;
    every ``async`` method returns once its data is durable or raises
    ``OSError`` (if its caller is cancelled while waiting, the write still
    happens).
    """

    run_dir: Path
    _disk: Disk
    _fresh: bool
    _lock: contextlib.ExitStack
    _known_dirs: set[str]
    layout: RunLayout = attrs.field(
        init=False, default=attrs.Factory(lambda self: RunLayout(self.run_dir), takes_self=True)
    )
    _sessions: str = attrs.field(init=False, default=attrs.Factory(lambda self: self.layout.sessions, takes_self=True))
    _index: str = attrs.field(init=False, default=attrs.Factory(lambda self: self.layout.index, takes_self=True))
    _pending: list[Write] = attrs.Factory(list)
    _in_flight: list[Write] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    _lines: list[tuple[str, float, dict[str, Any]]] = attrs.Factory(list)
    _lines_due: float = math.inf
    _snapshot: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    _snapshot_due: float = math.inf
    _snapshot_written: float = -math.inf
    _deadline: float = math.inf
    _scopes: set[trio.CancelScope] = attrs.Factory(set)
    _closed: bool = False
    _failure: str | None = None
    _notes: list[str] = attrs.Factory(list)
    # The files of each task this store wrote (its record, its checkpoints), so
    # that a record's clean-up knows its targets without listing directories
    # (complete only in a run directory it created).
    _written: dict[str, set[str]] = attrs.Factory(dict)
    # Keys this version does not know, to write again with values read back (see carry).
    _carried: dict[int, tuple[Any, Overlay]] = attrs.Factory(dict)

    @property
    def failure(self) -> str | None:
        """The first error of a write nobody waited for (``progress.jsonl``,
        ``progress.json``), as one line; None while there was none."""
        return self._failure

    @property
    def closed(self) -> bool:
        """The store refuses writes and events (it is closing or closed)."""
        return self._closed

    @property
    def notes(self) -> list[str]:
        """Problems that did not fail a write, for ``run_info.json``: e.g. a
        checkpoint that could not be removed after its record was saved."""
        return list(self._notes)

    # -- progress (non-blocking) --------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        """Queue one ``progress.jsonl`` line ``{"event": kind, "t": <unix time>, **fields}``.

        Kinds used by the runtime: ``run_started``, ``task_started``,
        ``attempt_started``, ``attempt_retry``, ``retry_wait``,
        ``attempt_finished``, ``task_finished``, ``run_finished``. A value
        JSON cannot hold is written as text; fields named ``event`` or ``t``
        are overridden. All queued lines are on disk once the store closed.
        """
        self._check_open()
        self._lines.append((kind, self._disk.now(), fields))
        if self._lines_due == math.inf:
            self._lines_due = trio.current_time() + PROGRESS_BATCH_SECONDS
            self._wake.set()

    def set_progress(self, snapshot: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Make ``snapshot`` the next ``progress.json`` (total, pending, active,
        completed, failed_tasks, error_tasks, warning_tasks, elapsed).

        Only the latest is kept; it is written at most every
        :data:`PROGRESS_INTERVAL` seconds and at close. A callable is called
        when the snapshot is written.
        """
        self._check_open()
        self._snapshot = snapshot if callable(snapshot) else dict(snapshot)
        if self._snapshot_due == math.inf:
            now = trio.current_time()
            self._snapshot_due = max(now + PROGRESS_BATCH_SECONDS, self._snapshot_written + PROGRESS_INTERVAL)
            self._wake.set()

    # -- durable writes -------------------------------------------------------

    async def write_run_info(self, info: dict[str, Any]) -> None:
        """Write ``run_info.json`` (the caller redacts the request), with its results ``format``."""
        await self.write_json(self.layout.run_info, stamp(dict(info)))

    async def write_metrics(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics.json``."""
        await self.write_json(self.layout.metrics, metrics)

    async def write_summary(self, text: str) -> None:
        """Write ``summary.md``."""
        await self.write_text(self.layout.summary, text)

    async def write_json(self, name: str, data: Any) -> None:
        """Write ``data`` as indented JSON to ``name`` (relative to the run directory)."""
        payload = _mask(_PRETTY.encode(unstructure(data))) + "\n"
        await self._write([Write(self._path(name), payload.encode())])

    async def write_text(self, name: str, text: str) -> None:
        """Write ``text`` (UTF-8) to ``name`` (relative to the run directory)."""
        data = _redact.redact(text).encode("utf-8", "backslashreplace")
        await self._write([Write(self._path(name), data)])

    async def save_checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        """Write ``tasks/<key>/attempt-<n>/checkpoint.json`` for an evaluated
        attempt: ``{"task_id": ..., "record": <AttemptRecord>}``, ``n`` being
        ``record.attempt``."""
        attempt = unstructure(record)
        if self._carried:
            self._put_back(record, attempt)
        key = task_key(task_id)
        chunks = self._chunk_writes(key, [attempt])
        data = _mask(_compact({"task_id": task_id, "record": attempt, "format": FORMAT}))
        path = self.layout.checkpoint(key, record.attempt)
        self._written.setdefault(task_id, set()).add(path)
        await self._write([*chunks, Write(path, data.encode())])

    async def save_plan(self, task_id: str, attempt: int, plan: Any) -> None:
        """Write ``tasks/<key>/attempt-<n>/plan.json`` (``{"task_id", "attempt",
        "plan", "format"}``, the plan unstructured and masked as in records);
        returns once it is durable, so the caller opens the attempt's
        environment only then."""
        data = _compact({"task_id": task_id, "attempt": attempt, "plan": unstructure(plan), "format": FORMAT})
        await self._write([Write(self.layout.plan(task_key(task_id), attempt), _mask(data).encode())])

    async def save_retry(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        """Write a discarded try to ``tasks/<key>/attempt-<n>/retries/<try_number>.json``.

        ``data`` is free-form (diagnostics, stage, matched pattern,
        ``retry_delay_seconds``, redacted plan); the task id and the results
        ``format`` are added to it.
        """
        payload = _mask(_compact({"task_id": task_id, **unstructure(data), "format": FORMAT}))
        path = self.layout.retry(task_key(task_id), attempt, try_number)
        await self._write([Write(path, payload.encode())])

    async def save_logs(self, task_id: str, attempt: int, files: dict[str, bytes]) -> None:
        """Write an attempt's kept logs under ``tasks/<key>/attempt-<n>/logs/``
        (``files``: safe relative path -> bytes, see ``_logs.take_logs``), each
        passed through the one redaction (a session's log may hold what it was given)."""
        top = self.layout.logs(task_key(task_id), attempt)
        await self._write(
            [Write(os.path.join(top, *rel.split("/")), _redact.redact_bytes(data)) for rel, data in files.items()]
        )

    async def save_agent_trajectories(self, task_id: str, documents: dict[int, dict[str, Any]]) -> None:
        """Write attempts' ATIF trajectories (attempt -> document) in one batch,
        ``tasks/<key>/attempt-<n>/agent/trajectory.json``, each masked."""
        key = task_key(task_id)
        await self._write(
            [Write(self.layout.agent_trajectory(key, n), _mask(_compact(d)).encode()) for n, d in documents.items()]
        )

    async def save_task(self, record: TaskRecord, data: bytes | None = None) -> None:
        """Write ``details/<severity>/<key>.json``, the task's countable record.

        ``data``, if given, is the file's content (a JSON form of ``record``
        already masked, e.g. a reused record's file). Once it is durable the
        task's checkpoints and its record under another severity are removed.
        """
        await self._save_tasks([(record, data)])

    async def link_tasks(self, links: list[tuple[TaskRecord, str, bytes]]) -> None:
        """Store records whose files already exist elsewhere, unchanged and
        masked (``links``: record, that file's path, its content): each file
        is hard-linked to its place here and the links are made durable; a
        record that cannot be linked (another filesystem, or a run directory
        this store did not create) is written instead, as :meth:`save_task`
        with its content. Returns once all are durable, else raises the first
        error once every write is done.

        Creating a file costs an inode, a link much less (bench: reuse).
        Sharing a file with another run is safe because no store changes a
        file in place (every write renames, a clean-up unlinks). Only into a
        fresh run directory: there no older record of the task can lose a
        "newest record wins" contest against the shared older mtime.
        """
        if self._fresh:
            targets = []
            for record, source, _ in links:
                targets.append((source, self._record_path(record.severity, record.task_id)))
                self._written.setdefault(record.task_id, set()).add(targets[-1][1])
            failed = set(range(len(links)))  # until the links are known durable
            try:
                failed = await self._run(_commit.link, self._disk, targets)
            finally:
                for index in failed:
                    self._written[links[index][0].task_id].discard(targets[index][1])
            for k, (record, _, data) in enumerate(links):
                if k not in failed:
                    self._queue(self._index_line(record, None, data))
            links = [links[index] for index in sorted(failed)]
        await self._save_tasks([(record, data) for record, _, data in links])

    async def journal_session(
        self,
        event: Literal["opened", "closed"],
        session_id: str,
        provider: str,
        handle: dict[str, Any],
        *,
        durable: bool = True,
        name: str | None = None,
    ) -> None:
        """Append ``{"event", "session", "provider", "name", "handle", "t"}`` to
        ``sessions.jsonl`` (``name``, the session name the provider labelled
        the sandbox with, only when given). ``handle`` must be enough to find
        the session again and must hold no secret.

        With ``durable`` (the default) this returns once the line is
        durable; ``durable=False`` only queues it (a failure to write it is
        not reported). Readers match "closed" to "opened" by session id, not
        by position.
        """
        if event not in ("opened", "closed"):
            raise ValueError(f"session event must be 'opened' or 'closed', not {event!r}")
        entry: dict[str, Any] = {"event": event, "session": session_id, "provider": provider}
        if name is not None:
            entry["name"] = name
        entry["handle"] = handle
        entry["t"] = self._disk.now()
        write = Write(self._sessions, (_mask(_compact(entry)) + "\n").encode(), append=True)
        if durable:
            await self._write([write])
        else:
            self._queue(write)

    # -- helpers ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the run store is closed")

    def _record_path(self, severity: str, task_id: str) -> str:
        return self.layout.record(severity, task_key(task_id))

    def _path(self, name: str) -> str:
        """``name``: a path of :attr:`layout`, or one relative to the run directory."""
        if name.startswith(self.layout.root + "/"):
            name = self.layout.relative(name)
        relative = Path(name)
        if not name or relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"{name!r} is not a path inside the run directory")
        return str(self.run_dir / relative)

    async def _save_tasks(self, records: list[tuple[TaskRecord, bytes | None]]) -> None:
        """Write task records (see :meth:`save_task`), all in the same batches."""
        self._check_open()
        for record, _ in records:
            if record.severity not in SEVERITIES:
                raise ValueError(f"unknown task severity {record.severity!r}")
        writes = []
        chunks: list[Write] = []
        lines: list[Write] = []
        for record, data in records:
            task_id = record.task_id
            if data is None:
                unstructured = unstructure(record)
                if self._carried:
                    self._put_back(record, unstructured)
                chunks += self._chunk_writes(task_key(task_id), unstructured["attempts"])
                unstructured["format"] = FORMAT
                data = _mask(_compact(unstructured)).encode()
            else:
                unstructured = None
            lines.append(self._index_line(record, unstructured, data))
            path = self._record_path(record.severity, task_id)
            # No sync for the removals: if a crash undoes one, readers still
            # prefer the record (and the newest of two, see _load).
            if self._fresh:
                older = self._written.pop(task_id, set()) - {path}
                write = Write(path, data, remove=tuple(sorted(older)))
            else:  # files of an earlier writer may be anywhere
                others = tuple(self._record_path(s, task_id) for s in SEVERITIES if s != record.severity)
                write = Write(path, data, remove=others, sweep=(self.layout, task_key(task_id)))
            self._written[task_id] = {path}
            writes.append(write)
        try:
            # Index lines are not waited for (the index only speeds readers
            # up, see _index); the chunks are renamed before the records naming them.
            for line in lines:
                self._queue(line)
            await self._write([*chunks, *writes])
        finally:
            for write, (record, _) in zip(writes, records, strict=True):
                if write.error is not None:  # maybe not written: a later save still cleans up all
                    self._written.setdefault(record.task_id, set()).update(write.remove)

    def carry(self, unknown: list[tuple[Any, Overlay]]) -> None:
        """Write with each value of ``unknown`` (a record or an attempt read
        back, see ``LoadedRun.unknown``) the keys it held that this version
        does not know, whenever it is saved (e.g. copied by ``--reuse``)."""
        for value, overlay in unknown:
            self._carried[id(value)] = (value, overlay)

    def _put_back(self, record: TaskRecord | AttemptRecord, unstructured: dict[str, Any]) -> None:
        """Merge the carried keys of ``record`` (and of its attempts) into its JSON form."""
        found = self._carried.get(id(record))
        if found is not None and found[0] is record:
            merge(unstructured, found[1])
        if isinstance(record, TaskRecord):
            for attempt, data in zip(record.attempts, unstructured["attempts"], strict=True):
                found = self._carried.get(id(attempt))
                if found is not None and found[0] is attempt:
                    merge(data, found[1])

    def _index_line(self, record: TaskRecord, unstructured: Any, data: bytes) -> Write:
        """The ``index.jsonl`` line of a record saved as ``data`` (see
        ``_index``); ``unstructured`` is its JSON form, None to parse ``data``."""
        if unstructured is None:
            try:
                unstructured = orjson.loads(data)
            except orjson.JSONDecodeError:  # a lone surrogate, escaped
                unstructured = json.loads(data.decode("utf-8", "surrogateescape"))
        line = {"bytes": len(data), **task_row(unstructured)}
        return Write(self._index, (_mask(_compact(line)) + "\n").encode(), append=True)

    def _chunk_writes(self, key: str, attempts: list[Any]) -> list[Write]:
        """The files of the long trajectories of ``attempts`` (unstructured,
        each replaced by its reference), each masked on its own."""
        return [Write(path, _mask(_compact(messages)).encode())
                for path, messages in split_trajectories(attempts, self.layout, key)]

    def _queue(self, write: Write) -> None:
        self._check_open()
        self._pending.append(write)
        self._wake.set()

    async def _write(self, writes: list[Write]) -> None:
        """Queue ``writes``; return once every one is done, raising the first error."""
        done = []
        for write in writes:
            write.done = trio.Event()
            done.append(write.done)
            self._queue(write)
        for event in done:
            await event.wait()
        for write in writes:
            if write.error is not None:
                # A fresh exception per caller: one error may fail a whole batch.
                err = write.error
                if isinstance(err, OSError):
                    raise OSError(err.errno, err.strerror, err.filename) from err
                raise RuntimeError("the run store failed to write") from err

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the disk, shielded until the close deadline."""
        with trio.CancelScope(shield=True, deadline=self._deadline) as scope:
            self._scopes.add(scope)
            try:
                return await self._disk.run(fn, *args)
            finally:
                self._scopes.discard(scope)
        raise timed_out()

    def _set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        for scope in self._scopes:
            scope.deadline = deadline

    # -- the committer -----------------------------------------------------------

    async def _committer(self) -> None:
        while True:
            with trio.move_on_at(min(self._lines_due, self._snapshot_due)):
                await self._wake.wait()
            await self._commit(final=False)

    def _has_work(self) -> bool:
        return bool(self._pending or self._lines or self._snapshot is not None)

    async def _commit(self, *, final: bool) -> None:
        """Take what is queued and make it durable (one batch)."""
        self._wake = trio.Event()
        now = trio.current_time()
        batch, self._pending = self._pending, []
        lines: list[tuple[str, float, dict[str, Any]]] = []
        if final or batch or now >= self._lines_due:
            lines, self._lines, self._lines_due = self._lines, [], math.inf
        snapshot = None
        if self._snapshot is not None and (final or now >= self._snapshot_due):
            snapshot, self._snapshot, self._snapshot_due = self._snapshot, None, math.inf
            self._snapshot_written = now
            if callable(snapshot):
                snapshot = snapshot()
        if not (batch or lines or snapshot is not None):
            return
        unattended = []  # writes nobody waits for
        if lines:
            unattended.append(Write(self.layout.progress_lines, _encode_lines(lines), append=True))
        if snapshot is not None:
            unattended.append(Write(self.layout.progress, (_PRETTY.encode(snapshot) + "\n").encode()))
        self._in_flight = batch
        try:
            self._notes.extend(await self._run(_commit.commit, self._disk, batch + unattended, self._known_dirs))
        except Exception as exc:  # noqa: BLE001 - out of grace or a bug: every write of the batch fails
            for write in (*batch, *unattended):
                write.error = write.error or exc
        finally:
            self._in_flight = []
            for write in unattended:
                if write.error is not None and self._failure is None:
                    self._failure = f"could not write progress: {write.error}".splitlines()[0]
            for write in batch:
                if write.done is not None:
                    write.done.set()

    @classmethod
    def _open_sync(cls, disk: Disk, output_root: Path, request_name: str, run_id: str | None) -> RunStore:
        _check_name(request_name, "request name")
        request_dir = Path(output_root) / request_name
        disk.makedirs(str(request_dir))
        if run_id is not None:
            _check_name(run_id, "run id")
            run_dir = request_dir / run_id
            fresh = disk.mkdir(str(run_dir))
        else:  # a fresh id until one is free: two runs may start in the same millisecond
            while not disk.mkdir(str(run_dir := request_dir / new_run_id())):
                pass
            fresh = True
        layout = RunLayout(run_dir)
        subdirs = [layout.details, *(layout.severity_dir(s) for s in SEVERITIES), layout.tasks]
        for path in subdirs:
            disk.mkdir(path)
        lock = contextlib.ExitStack()
        lock.enter_context(disk.lock(str(run_dir)))
        try:
            for path in (layout.progress_lines, layout.sessions):  # exist from the start; a cut line is ended
                disk.append(path, b"")
            # The new tree itself must survive a crash.
            disk.sync([str(run_dir), *subdirs, str(request_dir), str(request_dir.parent)])
        except BaseException:
            lock.close()
            raise
        return cls(run_dir=run_dir, disk=disk, fresh=fresh, lock=lock, known_dirs={str(run_dir), *subdirs})


def _encode_lines(events: list[tuple[str, float, dict[str, Any]]]) -> bytes:
    """``progress.jsonl`` lines, masked as one text (no pattern spans a line:
    JSON escapes every newline inside a string)."""
    lines = []
    for kind, now, fields in events:
        if "event" in fields or "t" in fields:
            fields = {name: value for name, value in fields.items() if name != "event" and name != "t"}
        lines.append(_compact({"event": kind, "t": now, **fields}))
    lines.append("")
    return _mask("\n".join(lines)).encode()


@contextlib.asynccontextmanager
async def open_run_store(
    output_root: Path,
    request_name: str,
    run_id: str | None = None,
    *,
    close_deadline: Callable[[], float] | None = None,
    disk: Disk | None = None,
) -> AsyncIterator[RunStore]:
    """Create (or reopen) ``<output_root>/<request_name>/<run_id>/`` and write to it.

    ``run_id`` defaults to :func:`new_run_id`. Reopening an existing run id is
    allowed (e.g. to journal reaped sessions); a second writer of the same
    directory, in any process, gets :class:`RunLockedError`. ``disk``
    defaults to the real one. On exit
    every queued write and event is committed, shielded even when the caller
    is cancelled, until ``close_deadline()`` (default:
    :func:`agentcompass.runtime.cleanup_deadline`); past it what was not
    written is lost, as in a crash. Opening is cancellable like any call: a
    disk thread it abandons finishes the open, and the store it made, left
    unreferenced, lets go of its lock.
    """
    if close_deadline is None:
        close_deadline = cleanup_deadline
    disk = disk or Disk()
    store = await disk.run(RunStore._open_sync, disk, output_root, request_name, run_id)
    _OPEN_STORES.add(store)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._committer)
            try:
                yield store
            finally:
                store._set_deadline(close_deadline())
                nursery.cancel_scope.cancel()  # a batch in flight finishes (shielded)
    finally:
        try:
            # Writes queued meanwhile (by tasks ending at the same deadline) still go.
            with trio.move_on_at(close_deadline(), shield=True):
                while store._has_work():
                    await store._commit(final=True)
        finally:
            store._closed = True
            leftovers, store._pending = store._pending, []
            for write in leftovers:
                write.error = OSError(errno.ECANCELED, "run store closed before this write")
                if write.done is not None:
                    write.done.set()
            _OPEN_STORES.discard(store)
            store._lock.close()
