"""The run page's compact row per task: from ``index.jsonl``, a cache keyed by (mtime, size), or the record itself within a budget."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .._store._index import task_row
from .._store._layout import SEVERITIES, RunLayout
from .._store._load import IndexReader, list_records, stat_key
from ._record_cache import RecordCache
from ._trajectory import LARGE_RECORD

__all__ = ["TaskRows", "read_json"]


def read_json(path: str | Path) -> Any:
    """A file's JSON, read as plain JSON: the viewer shows what is on disk, whatever its format."""
    with open(path, "rb") as f:
        return json.loads(f.read())


@attrs.define(eq=False)
class TaskRows:
    """The rows of one run's tasks and the ``details/`` listing they come from
    (blocking reads from worker threads; the caches are shared under a lock)."""

    layout: RunLayout
    _cache: RecordCache
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _rows: dict[str, tuple[tuple[int, int], dict[str, Any]]] = attrs.Factory(dict)  # file -> (stat, row)
    _files: tuple[tuple[tuple[int, int] | None, ...], dict[str, tuple[str, str, tuple[int, int]]]] | None = None
    _index: IndexReader = attrs.field(
        init=False, default=attrs.Factory(lambda self: IndexReader(self.layout), takes_self=True)
    )

    def _chunk_path(self, key: str) -> Callable[[int, int], str]:
        return lambda attempt, index: self.layout.chunk(key, attempt, index)

    def warm(self, check: Callable[[], None] = lambda: None) -> None:
        """Read every row, small records first then large ones (whose parsed
        form the cache keeps for their attempt pages), from the end of the
        listing: a page request reads from its start, so the two rarely
        read the same record."""
        files = self.detail_files()
        small = [k for k, (_, _, st) in files.items() if st[1] < LARGE_RECORD]
        large = [k for k, (_, _, st) in files.items() if st[1] >= LARGE_RECORD]
        for key in sorted(small, reverse=True) + sorted(large, key=lambda k: files[k][2][1]):
            check()
            path, _, stat = files[key]
            self.row_of(key, path, stat)

    def detail_files(self) -> dict[str, tuple[str, str, tuple[int, int]]]:
        """Task key -> (path, severity, stat) of its countable record (the
        newest if two).

        Cached until one of the ``details/<severity>`` directories changes
        (the store renames records into them, which updates their mtime)."""
        stamp = tuple(stat_key(self.layout.severity_dir(s)) for s in SEVERITIES)
        with self._lock:
            if self._files is not None and self._files[0] == stamp:
                return self._files[1]
        files = self._scan_details()
        with self._lock:
            self._files = (stamp, files)
        return files

    def _scan_details(self) -> dict[str, tuple[str, str, tuple[int, int]]]:
        return list_records(self.layout)

    def rows(self, budget: float | None) -> tuple[list[dict[str, Any]], int]:
        files = self.detail_files()
        index = self._read_index()
        deadline = None if budget is None else time.monotonic() + budget
        rows = []
        pending = 0
        for key, (path, severity, stat) in sorted(files.items()):
            with self._lock:
                cached = self._rows.get(path)
            if cached is not None and cached[0] == stat:
                rows.append(cached[1])
                continue
            line = index.get(key)
            if line is not None and line["severity"] == severity and line["bytes"] == stat[1]:
                rows.append(line)
                continue
            if deadline is not None and (stat[1] >= LARGE_RECORD or time.monotonic() > deadline):
                rows.append(_placeholder(key, severity))
                pending += 1
                continue
            row = self.row_of(key, path, stat)
            if row is not None:
                rows.append(row)
        with self._lock:
            paths = {path for path, _, _ in files.values()}
            for path in [p for p in self._rows if p not in paths]:
                del self._rows[path]
        return rows, pending

    def _read_index(self) -> dict[str, dict[str, Any]]:
        """``index.jsonl``'s last valid line per task key (see ``_store._index``)."""
        with self._lock:
            return self._index.read()

    def row_of(self, key: str, path: str, stat: tuple[int, int]) -> dict[str, Any] | None:
        with self._lock:
            cached = self._rows.get(path)
        if cached is not None and cached[0] == stat:
            return cached[1]
        try:
            if stat[1] >= LARGE_RECORD:
                record = self._cache.load(path, stat, self._chunk_path(key))
            else:
                record = read_json(path)
            row = {**task_row(record), "key": key}
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            return None
        with self._lock:
            self._rows[path] = (stat, row)
        return row


def _placeholder(key: str, severity: str) -> dict[str, Any]:
    """A row not read yet: what the listing tells (key and severity)."""
    return {
        "task_id": key,
        "key": key,
        "category": None,
        "severity": severity,
        "statuses": ["loading"],
        "codes": [],
        "values": [],
        "usage": {},
        "timings": {},
        "seconds": 0.0,
        "retries": 0,
        "attempts": 0,
        "pending": True,
    }
