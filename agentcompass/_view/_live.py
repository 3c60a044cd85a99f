"""Whether a run is live: its active tasks and last event from ``progress.jsonl``, and whether its writer's process holds its lock."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import attrs

from .._store._load import stat_key

__all__ = ["LiveProgress", "writer_alive"]


@attrs.define(eq=False)
class LiveProgress:
    """``progress.jsonl`` read again only when its (mtime, size) changed."""

    path: str
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _progress: tuple[tuple[int, int], dict[str, Any]] | None = None

    def read(self) -> dict[str, Any]:
        """Active tasks and the last event, from ``progress.jsonl``."""
        path = self.path
        stat = stat_key(path)
        if stat is None:
            return {"running": False, "active": [], "events": 0, "last": None}
        with self._lock:
            if self._progress is not None and self._progress[0] == stat:
                return self._progress[1]
        started: dict[str, None] = {}
        finished: set[str] = set()
        running = False
        events = 0
        last = None
        with open(path, "rb") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                events += 1
                kind = event.get("event")
                last = {"event": kind, "t": event.get("t")}
                if kind == "run_started":
                    running = True
                elif kind == "run_finished":
                    running = False
                elif kind == "task_started":
                    started[str(event.get("task"))] = None
                elif kind == "task_finished":
                    finished.add(str(event.get("task")))
        live = {
            "running": running,
            "active": [t for t in started if t not in finished],
            "events": events,
            "last": last,
        }
        with self._lock:
            self._progress = (stat, live)
        return live


def writer_alive(run_dir: Path) -> bool | None:
    """Whether a process holds the run directory's writer lock (the store's
    ``flock``), read from ``/proc/locks`` so the viewer never takes a lock
    itself; None where that cannot be told (no ``/proc/locks``)."""
    try:
        st = os.stat(run_dir)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(
        len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == ident for fields in (line.split() for line in lines)
    )
