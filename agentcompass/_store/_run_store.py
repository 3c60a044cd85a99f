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
import os
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from .. import _redact
from ..runtime._cleanup import cleanup_deadline
from ..runtime._convert import unstructure
from ..runtime._results import AttemptRecord, TaskRecord
from ._commit import Write
from ._committer import PROGRESS_BATCH_SECONDS as PROGRESS_BATCH_SECONDS
from ._committer import PROGRESS_INTERVAL as PROGRESS_INTERVAL
from ._committer import Committer
from ._committer import StoreClosedError as StoreClosedError
from ._disk import Disk, RunLockedError
from ._encode import compact, mask, pretty
from ._formats import FORMAT, Overlay, stamp
from ._keys import task_key
from ._layout import SEVERITIES, RunLayout
from ._records import TaskRecords
from ._run_ids import RUN_ID_PATTERN as RUN_ID_PATTERN
from ._run_ids import check_name
from ._run_ids import new_run_id as new_run_id
from ._run_ids import new_run_tag as new_run_tag

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


#: Every store open in this process (for :func:`write_journals_now`).
_OPEN_STORES: weakref.WeakSet[RunStore] = weakref.WeakSet()


def write_journals_now() -> None:
    """Write the queued session journal lines of every open store, blocking.

    For a process about to exit without unwinding (a second Ctrl-C): the
    sandboxes it opened stay journalled, so ``compass reap`` or the next
    ``--reuse`` finds them. A line a batch writes at the same moment may
    appear twice (readers match lines by session id). Errors are ignored.
    """
    for store in list(_OPEN_STORES):
        lines = [
            w
            for w in (*store._committer.pending, *store._committer.in_flight)
            if w.path == store._sessions and not w.written
        ]
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
    _committer: Committer = attrs.field(
        init=False,
        default=attrs.Factory(lambda self: Committer(self._disk, self.layout, self._known_dirs), takes_self=True),
    )
    _records: TaskRecords = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda self: TaskRecords(self._disk, self.layout, self._fresh, self._committer), takes_self=True
        ),
    )

    @property
    def failure(self) -> str | None:
        """The first error of a write nobody waited for (``progress.jsonl``,
        ``progress.json``), as one line; None while there was none."""
        return self._committer.failure

    @property
    def closed(self) -> bool:
        """The store refuses writes and events (it is closing or closed)."""
        return self._committer.closed

    @property
    def notes(self) -> list[str]:
        """Problems that did not fail a write, for ``run_info.json``: e.g. a
        checkpoint that could not be removed after its record was saved."""
        return list(self._committer.notes)

    # -- progress (non-blocking) --------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        """Queue one ``progress.jsonl`` line ``{"event": kind, "t": <unix time>, **fields}``.

        Kinds used by the runtime: ``run_started``, ``task_started``,
        ``attempt_started``, ``attempt_retry``, ``retry_wait``,
        ``attempt_finished``, ``task_finished``, ``run_finished``. A value
        JSON cannot hold is written as text; fields named ``event`` or ``t``
        are overridden. All queued lines are on disk once the store closed.
        """
        self._committer.event(kind, fields)

    def set_progress(self, snapshot: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Make ``snapshot`` the next ``progress.json`` (total, pending, active,
        completed, failed_tasks, error_tasks, warning_tasks, elapsed).

        Only the latest is kept; it is written at most every
        :data:`PROGRESS_INTERVAL` seconds and at close. A callable is called
        when the snapshot is written.
        """
        self._committer.set_progress(snapshot)

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
        payload = mask(pretty(unstructure(data))) + "\n"
        await self._committer.write([Write(self._path(name), payload.encode())])

    async def write_text(self, name: str, text: str) -> None:
        """Write ``text`` (UTF-8) to ``name`` (relative to the run directory)."""
        data = _redact.redact(text).encode("utf-8", "backslashreplace")
        await self._committer.write([Write(self._path(name), data)])

    async def save_checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        """Write ``tasks/<key>/attempt-<n>/checkpoint.json`` for an evaluated
        attempt: ``{"task_id": ..., "record": <AttemptRecord>}``, ``n`` being
        ``record.attempt``."""
        await self._records.save_checkpoint(task_id, record)

    async def save_plan(self, task_id: str, attempt: int, plan: Any) -> None:
        """Write ``tasks/<key>/attempt-<n>/plan.json`` (``{"task_id", "attempt",
        "plan", "format"}``, the plan unstructured and masked as in records);
        returns once it is durable, so the caller opens the attempt's
        environment only then."""
        data = compact({"task_id": task_id, "attempt": attempt, "plan": unstructure(plan), "format": FORMAT})
        await self._committer.write([Write(self.layout.plan(task_key(task_id), attempt), mask(data).encode())])

    async def save_retry(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        """Write a discarded try to ``tasks/<key>/attempt-<n>/retries/<try_number>.json``.

        ``data`` is free-form (diagnostics, stage, matched pattern,
        ``retry_delay_seconds``, redacted plan); the task id and the results
        ``format`` are added to it.
        """
        payload = mask(compact({"task_id": task_id, **unstructure(data), "format": FORMAT}))
        path = self.layout.retry(task_key(task_id), attempt, try_number)
        await self._committer.write([Write(path, payload.encode())])

    async def save_logs(self, task_id: str, attempt: int, files: dict[str, bytes]) -> None:
        """Write an attempt's kept logs under ``tasks/<key>/attempt-<n>/logs/``
        (``files``: safe relative path -> bytes, see ``_logs.take_logs``), each
        passed through the one redaction (a session's log may hold what it was given)."""
        top = self.layout.logs(task_key(task_id), attempt)
        await self._committer.write(
            [Write(os.path.join(top, *rel.split("/")), _redact.redact_bytes(data)) for rel, data in files.items()]
        )

    async def save_agent_trajectories(self, task_id: str, documents: dict[int, dict[str, Any]]) -> None:
        """Write attempts' ATIF trajectories (attempt -> document) in one batch,
        ``tasks/<key>/attempt-<n>/agent/trajectory.json``, each masked."""
        key = task_key(task_id)
        await self._committer.write(
            [Write(self.layout.agent_trajectory(key, n), mask(compact(d)).encode()) for n, d in documents.items()]
        )

    async def save_task(self, record: TaskRecord, data: bytes | None = None) -> None:
        """Write ``details/<severity>/<key>.json``, the task's countable record.

        ``data``, if given, is the file's content (a JSON form of ``record``
        already masked, e.g. a reused record's file). Once it is durable the
        task's checkpoints and its record under another severity are removed.
        """
        await self._records.save([(record, data)])

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
        await self._records.link(links)

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
        write = Write(self._sessions, (mask(compact(entry)) + "\n").encode(), append=True)
        if durable:
            await self._committer.write([write])
        else:
            self._committer.queue(write)

    # -- helpers ----------------------------------------------------------------

    def _path(self, name: str) -> str:
        """``name``: a path of :attr:`layout`, or one relative to the run directory."""
        if name.startswith(self.layout.root + "/"):
            name = self.layout.relative(name)
        relative = Path(name)
        if not name or relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"{name!r} is not a path inside the run directory")
        return str(self.run_dir / relative)

    def carry(self, unknown: list[tuple[Any, Overlay]]) -> None:
        """Write with each value of ``unknown`` (a record or an attempt read
        back, see ``LoadedRun.unknown``) the keys it held that this version
        does not know, whenever it is saved (e.g. copied by ``--reuse``)."""
        self._records.carry(unknown)

    @classmethod
    def _open_sync(cls, disk: Disk, output_root: Path, request_name: str, run_id: str | None) -> RunStore:
        check_name(request_name, "request name")
        request_dir = Path(output_root) / request_name
        disk.makedirs(str(request_dir))
        if run_id is not None:
            check_name(run_id, "run id")
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
            nursery.start_soon(store._committer.serve)
            try:
                yield store
            finally:
                store._committer.set_deadline(close_deadline())
                nursery.cancel_scope.cancel()  # a batch in flight finishes (shielded)
    finally:
        try:
            # Writes queued meanwhile (by tasks ending at the same deadline) still go.
            await store._committer.close(close_deadline())
        finally:
            _OPEN_STORES.discard(store)
            store._lock.close()
