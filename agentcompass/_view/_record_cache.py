"""Records parsed in full for attempt pages, kept within a character budget; two threads asking for one file wait for one read."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from .._store._formats import Undetermined, upgrade
from ._trajectory import read_record

__all__ = ["RECORD_CACHE_CHARS", "RecordCache"]

#: Characters of parsed records (trajectory chunks as JSON text) kept per run.
RECORD_CACHE_CHARS = 256 * 1024 * 1024


@attrs.define(eq=False)
class RecordCache:
    """Parsed records (trajectories as :class:`~._trajectory.Trajectory`) by path, least recently used out first."""

    _max_chars: int = RECORD_CACHE_CHARS
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    # file -> (stat, value, chars), least recently used first
    _records: OrderedDict[str, tuple[tuple[int, int], Any, int]] = attrs.Factory(OrderedDict)
    _chars: int = 0
    _loading: dict[str, threading.Lock] = attrs.Factory(dict)
    #: Files parsed in full so far (records and checkpoints): what the cache saves.
    records_read: int = 0

    def load(self, path: str, stat: tuple[int, int], chunk_path: Callable[[int, int], str]) -> Any:
        """The parsed file at ``path`` with its trajectories as
        :class:`Trajectory`, from the bounded cache or read once (two
        threads asking for the same file wait for one read)."""
        with self._lock:
            cached = self._records.get(path)
            if cached is not None and cached[0] == stat:
                self._records.move_to_end(path)
                return cached[1]
            gate = self._loading.setdefault(path, threading.Lock())
        with gate:
            with self._lock:
                cached = self._records.get(path)
                if cached is not None and cached[0] == stat:
                    self._records.move_to_end(path)
                    return cached[1]
            try:
                value, chars = read_record(path, chunk_path)
                value = _current_shape(value)
                with self._lock:
                    self.records_read += 1
            finally:
                with self._lock:
                    self._loading.pop(path, None)
            with self._lock:
                old = self._records.pop(path, None)
                if old is not None:
                    self._chars -= old[2]
                self._records[path] = (stat, value, chars)
                self._chars += chars
                while self._chars > self._max_chars and len(self._records) > 1:
                    _, (_, _, freed) = self._records.popitem(last=False)
                    self._chars -= freed
            return value


def _current_shape(record: Any) -> Any:
    """A record of any results format as the store reads it (``_formats``): the viewer shows what ``show`` does."""
    try:
        return upgrade(record, "record")
    except Undetermined:  # shown as written: the store does not reuse it, the viewer still lists it
        return record
