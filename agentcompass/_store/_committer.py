"""The run store's queue and its committer task: what is queued is made durable in one batch (see :mod:`._run_store`)."""

from __future__ import annotations

import errno
import math
from collections.abc import Callable
from typing import Any

import attrs
import trio

from . import _commit
from ._commit import Write
from ._disk import Disk, timed_out
from ._encode import encode_lines, pretty
from ._layout import RunLayout

__all__ = ["PROGRESS_BATCH_SECONDS", "PROGRESS_INTERVAL", "Committer", "StoreClosedError"]

#: Minimum seconds between two rewrites of ``progress.json``.
PROGRESS_INTERVAL = 0.5
#: How long progress lines and snapshots wait for a batch to ride with.
PROGRESS_BATCH_SECONDS = 0.05


class StoreClosedError(RuntimeError):
    """The run store was already closed when asked to write."""


@attrs.define(eq=False)
class Committer:
    """The writes queued for one run directory, the progress that rides with
    them, and the task (:meth:`serve`) that commits them in batches."""

    _disk: Disk
    _layout: RunLayout
    _known_dirs: set[str]
    #: Queued writes, and those of the batch being committed.
    pending: list[Write] = attrs.Factory(list)
    in_flight: list[Write] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    _lines: list[tuple[str, float, dict[str, Any]]] = attrs.Factory(list)
    _lines_due: float = math.inf
    _snapshot: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    _snapshot_due: float = math.inf
    _snapshot_written: float = -math.inf
    _deadline: float = math.inf
    _scopes: set[trio.CancelScope] = attrs.Factory(set)
    closed: bool = False
    #: The first error of a write nobody waited for, as one line.
    failure: str | None = None
    #: Problems that did not fail a write (a removal that failed).
    notes: list[str] = attrs.Factory(list)

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError("the run store is closed")

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue one ``progress.jsonl`` line; it rides with the next batch."""
        self.check_open()
        self._lines.append((kind, self._disk.now(), fields))
        if self._lines_due == math.inf:
            self._lines_due = trio.current_time() + PROGRESS_BATCH_SECONDS
            self._wake.set()

    def set_progress(self, snapshot: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Make ``snapshot`` the next ``progress.json``, written at most every :data:`PROGRESS_INTERVAL`."""
        self.check_open()
        self._snapshot = snapshot if callable(snapshot) else dict(snapshot)
        if self._snapshot_due == math.inf:
            now = trio.current_time()
            self._snapshot_due = max(now + PROGRESS_BATCH_SECONDS, self._snapshot_written + PROGRESS_INTERVAL)
            self._wake.set()

    def queue(self, write: Write) -> None:
        self.check_open()
        self.pending.append(write)
        self._wake.set()

    async def write(self, writes: list[Write]) -> None:
        """Queue ``writes``; return once every one is done, raising the first error."""
        done = []
        for write in writes:
            write.done = trio.Event()
            done.append(write.done)
            self.queue(write)
        for event in done:
            await event.wait()
        for write in writes:
            if write.error is not None:
                # A fresh exception per caller: one error may fail a whole batch.
                err = write.error
                if isinstance(err, OSError):
                    raise OSError(err.errno, err.strerror, err.filename) from err
                raise RuntimeError("the run store failed to write") from err

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the disk, shielded until the close deadline."""
        with trio.CancelScope(shield=True, deadline=self._deadline) as scope:
            self._scopes.add(scope)
            try:
                return await self._disk.run(fn, *args)
            finally:
                self._scopes.discard(scope)
        raise timed_out()

    def set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        for scope in self._scopes:
            scope.deadline = deadline

    async def serve(self) -> None:
        """The committer task: a batch whenever something is queued or progress is due."""
        while True:
            with trio.move_on_at(min(self._lines_due, self._snapshot_due)):
                await self._wake.wait()
            await self.commit(final=False)

    def has_work(self) -> bool:
        return bool(self.pending or self._lines or self._snapshot is not None)

    async def commit(self, *, final: bool) -> None:
        """Take what is queued and make it durable (one batch)."""
        self._wake = trio.Event()
        now = trio.current_time()
        batch, self.pending = self.pending, []
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
            unattended.append(Write(self._layout.progress_lines, encode_lines(lines), append=True))
        if snapshot is not None:
            unattended.append(Write(self._layout.progress, (pretty(snapshot) + "\n").encode()))
        self.in_flight = batch
        try:
            self.notes.extend(await self.run(_commit.commit, self._disk, batch + unattended, self._known_dirs))
        except Exception as exc:  # noqa: BLE001 - out of grace or a bug: every write of the batch fails
            for write in (*batch, *unattended):
                write.error = write.error or exc
        finally:
            self.in_flight = []
            for write in unattended:
                if write.error is not None and self.failure is None:
                    self.failure = f"could not write progress: {write.error}".splitlines()[0]
            for write in batch:
                if write.done is not None:
                    write.done.set()

    async def close(self, deadline: float) -> None:
        """Commit what is left (writes queued meanwhile included), shielded until
        ``deadline``; then refuse writes and fail what was not written."""
        try:
            with trio.move_on_at(deadline, shield=True):
                while self.has_work():
                    await self.commit(final=True)
        finally:
            self.closed = True
            leftovers, self.pending = self.pending, []
            for write in leftovers:
                write.error = OSError(errno.ECANCELED, "run store closed before this write")
                if write.done is not None:
                    write.done.set()
