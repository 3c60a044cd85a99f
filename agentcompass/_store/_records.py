"""A run's task records: the countable record that replaces its checkpoints, its index line, its long trajectories in chunks, and the keys carried for records read back."""

from __future__ import annotations

import json
from typing import Any

import attrs
import orjson

from ..runtime._convert import unstructure
from ..runtime._results import AttemptRecord, TaskRecord
from . import _commit
from ._commit import Write
from ._committer import Committer
from ._disk import Disk
from ._encode import compact, mask
from ._formats import FORMAT, Overlay, merge
from ._index import task_row
from ._keys import task_key
from ._layout import SEVERITIES, RunLayout
from ._trajectories import split_trajectories

__all__ = ["TaskRecords"]


@attrs.define(eq=False)
class TaskRecords:
    """The records a :class:`~._run_store.RunStore` saves, and which files of each task it wrote."""

    _disk: Disk
    layout: RunLayout
    _fresh: bool
    _committer: Committer
    #: The files of each task this store wrote (its record, its checkpoints), so
    #: that a record's clean-up knows its targets without listing directories
    #: (complete only in a run directory it created).
    written: dict[str, set[str]] = attrs.Factory(dict)
    # Keys this version does not know, to write again with values read back (see carry).
    _carried: dict[int, tuple[Any, Overlay]] = attrs.Factory(dict)

    async def save_checkpoint(self, task_id: str, record: AttemptRecord) -> None:
        """See :meth:`RunStore.save_checkpoint <._run_store.RunStore.save_checkpoint>`."""
        attempt = unstructure(record)
        if self._carried:
            self._put_back(record, attempt)
        key = task_key(task_id)
        chunks = self._chunk_writes(key, [attempt])
        data = mask(compact({"task_id": task_id, "record": attempt, "format": FORMAT}))
        path = self.layout.checkpoint(key, record.attempt)
        self.written.setdefault(task_id, set()).add(path)
        await self._committer.write([*chunks, Write(path, data.encode())])

    async def link(self, links: list[tuple[TaskRecord, str, bytes]]) -> None:
        """See :meth:`RunStore.link_tasks <._run_store.RunStore.link_tasks>`."""
        if self._fresh:
            targets = []
            for record, source, _ in links:
                targets.append((source, self._record_path(record.severity, record.task_id)))
                self.written.setdefault(record.task_id, set()).add(targets[-1][1])
            failed = set(range(len(links)))  # until the links are known durable
            try:
                failed = await self._committer.run(_commit.link, self._disk, targets)
            finally:
                for index in failed:
                    self.written[links[index][0].task_id].discard(targets[index][1])
            for k, (record, _, data) in enumerate(links):
                if k not in failed:
                    self._committer.queue(self._index_line(record, None, data))
            links = [links[index] for index in sorted(failed)]
        await self.save([(record, data) for record, _, data in links])

    def carry(self, unknown: list[tuple[Any, Overlay]]) -> None:
        """See :meth:`RunStore.carry <._run_store.RunStore.carry>`."""
        for value, overlay in unknown:
            self._carried[id(value)] = (value, overlay)

    async def save(self, records: list[tuple[TaskRecord, bytes | None]]) -> None:
        """Write task records (see :meth:`RunStore.save_task <._run_store.RunStore.save_task>`), in the same batches."""
        self._committer.check_open()
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
                data = mask(compact(unstructured)).encode()
            else:
                unstructured = None
            lines.append(self._index_line(record, unstructured, data))
            path = self._record_path(record.severity, task_id)
            # No sync for the removals: if a crash undoes one, readers still
            # prefer the record (and the newest of two, see _load).
            if self._fresh:
                older = self.written.pop(task_id, set()) - {path}
                write = Write(path, data, remove=tuple(sorted(older)))
            else:  # files of an earlier writer may be anywhere
                others = tuple(self._record_path(s, task_id) for s in SEVERITIES if s != record.severity)
                write = Write(path, data, remove=others, sweep=(self.layout, task_key(task_id)))
            self.written[task_id] = {path}
            writes.append(write)
        try:
            # Index lines are not waited for (the index only speeds readers
            # up, see _index); the chunks are renamed before the records naming them.
            for line in lines:
                self._committer.queue(line)
            await self._committer.write([*chunks, *writes])
        finally:
            for write, (record, _) in zip(writes, records, strict=True):
                if write.error is not None:  # maybe not written: a later save still cleans up all
                    self.written.setdefault(record.task_id, set()).update(write.remove)

    def _record_path(self, severity: str, task_id: str) -> str:
        return self.layout.record(severity, task_key(task_id))

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
        return Write(self.layout.index, (mask(compact(line)) + "\n").encode(), append=True)

    def _chunk_writes(self, key: str, attempts: list[Any]) -> list[Write]:
        """The files of the long trajectories of ``attempts`` (unstructured,
        each replaced by its reference), each masked on its own."""
        return [
            Write(path, mask(compact(messages)).encode())
            for path, messages in split_trajectories(attempts, self.layout, key)
        ]
