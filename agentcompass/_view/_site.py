"""The viewer's pages as a set of paths: one page, its script and style, and
data files that the page loads with ``<script>`` tags.

Data travels as JavaScript files (``COMPASS.put(id, data)``) rather than JSON
fetched with ``fetch()``, because browsers forbid ``fetch()`` of ``file://``
URLs: the same files work served by ``compass view`` and written by
``compass view --out`` and opened from disk. Every data file is redacted
again on the way out (run directories are already redacted; this is the
defence in depth), and the page renders data as text, never as HTML.

Paths::

    index.html  app.js  app.css
    data/config.js                        live (served) or static
    data/runs.js                          the list of runs
    data/<run>/run.js                     a run page: metrics, totals, task rows
    data/<run>/task/<key>.js              a task's record without trajectories
    data/<run>/traj/<key>/<attempt>-<chunk>.js   one chunk of a trajectory
    data/<run>/log/<key>/<attempt>-<file>.js     one kept log file (by its place in the attempt's listing)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from .._redact import redact_json_text
from ._data import RawJSON, RunData

__all__ = ["Site", "write_site"]

_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "app.css": "text/css; charset=utf-8"}
_JS = "text/javascript; charset=utf-8"
_RUN = re.compile(r"data/(\d+)/run\.js")
_TASK = re.compile(r"data/(\d+)/task/([a-z0-9._~-]+)\.js")
_TRAJ = re.compile(r"data/(\d+)/traj/([a-z0-9._~-]+)/(\d+)-(\d+)\.js")
_LOG = re.compile(r"data/(\d+)/log/([a-z0-9._~-]+)/(\d+)-(\d+)\.js")


class Site:
    """The viewer over ``run_dirs``; :meth:`get` is blocking (file reads):
    call it from worker threads (the per-run caches are thread-safe).

    ``row_budget`` bounds the seconds a run page request spends reading task
    rows (the rest come as placeholders until :meth:`warm` reads them); None
    reads every row, as the static site needs."""

    def __init__(self, run_dirs: list[Path], *, live: bool, row_budget: float | None = None) -> None:
        self.runs = [RunData(d) for d in run_dirs]
        self.live = live
        self.row_budget = row_budget

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The content and media type at ``path`` (no leading ``/``), or None."""
        path = path or "index.html"
        if path in _STATIC:
            return _static(path), _STATIC[path]
        data = self._data(path)
        if data is None:
            return None
        ident, value = data
        return _script(ident, value), _JS

    def warm(self, check: Callable[[], None] = lambda: None) -> None:
        """Read every run's task rows once (large records last), so pages
        find them cached; a request does not wait for this. ``check`` is
        called between records and may raise to stop early."""
        for run in self.runs:
            try:
                run.warm(check)
            except Exception:  # noqa: BLE001, S112 - the page reports what it cannot read
                continue

    def paths(self) -> Iterator[str]:
        """Every path :meth:`get` answers, for writing the site to disk."""
        yield from _STATIC
        yield "data/config.js"
        yield "data/runs.js"
        for index, run in enumerate(self.runs):
            yield f"data/{index}/run.js"
            for key in run.task_keys():
                yield f"data/{index}/task/{key}.js"
                task = run.task(key) or {}
                for attempt in task.get("attempts") or []:
                    chunks = (attempt.get("run_result") or {}).get("trajectory_chunks") or 0
                    for chunk in range(chunks):
                        yield f"data/{index}/traj/{key}/{attempt.get('attempt')}-{chunk}.js"
                    for file in range(len(attempt.get("logs") or [])):
                        yield f"data/{index}/log/{key}/{attempt.get('attempt')}-{file}.js"

    def _data(self, path: str) -> tuple[str, Any] | None:
        ident = path[len("data/"):-len(".js")] if path.startswith("data/") and path.endswith(".js") else ""
        if path == "data/config.js":
            return ident, {"live": self.live}
        if path == "data/runs.js":
            return ident, [run.header() for run in self.runs]
        if m := _RUN.fullmatch(path):
            run = self._run(m.group(1))
            return (ident, run.run(self.row_budget)) if run else None
        if m := _TASK.fullmatch(path):
            run = self._run(m.group(1))
            task = run.task(m.group(2)) if run else None
            return (ident, task) if task is not None else None
        if m := _TRAJ.fullmatch(path):
            run = self._run(m.group(1))
            chunk = run.trajectory_chunk(m.group(2), int(m.group(3)), int(m.group(4))) if run else None
            return (ident, chunk) if chunk is not None else None
        if m := _LOG.fullmatch(path):
            run = self._run(m.group(1))
            log = run.log_file(m.group(2), int(m.group(3)), int(m.group(4))) if run else None
            return (ident, log) if log is not None else None
        return None

    def _run(self, index: str) -> RunData | None:
        i = int(index)
        return self.runs[i] if i < len(self.runs) else None


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _script(ident: str, value: Any) -> bytes:
    text = value if isinstance(value, RawJSON) else json.dumps(value, separators=(",", ":"), default=str)
    text = redact_json_text(text)
    return f"COMPASS.put({json.dumps(ident)},{text});\n".encode()


def write_site(site: Site, out_dir: Path) -> int:
    """Write every page and data file under ``out_dir``; the number of files.

    Data files a previous write left there and this one does not (a task or
    run no longer shown) are removed; only paths this function writes are
    touched, so nothing else in ``out_dir`` is."""
    stale = set(_written_before(out_dir))
    count = 0
    for path in site.paths():
        found = site.get(path)
        if found is None:
            continue
        target = out_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(found[0])
        os.replace(tmp, target)
        stale.discard(path)
        count += 1
    for path in sorted(stale):
        (out_dir / path).unlink(missing_ok=True)
    for directory in sorted({(out_dir / p).parent for p in stale}, key=lambda d: len(d.parts), reverse=True):
        while directory != out_dir / "data" and directory.is_relative_to(out_dir / "data"):
            try:
                directory.rmdir()  # only if empty
            except OSError:
                break
            directory = directory.parent
    return count


def _written_before(out_dir: Path) -> Iterator[str]:
    """The data files under ``out_dir`` whose paths :meth:`Site.get` answers."""
    data = out_dir / "data"
    if not data.is_dir():
        return
    for dirpath, _, names in os.walk(data):
        for name in names:
            path = Path(dirpath, name).relative_to(out_dir).as_posix()
            if path in ("data/config.js", "data/runs.js") or any(p.fullmatch(path) for p in (_RUN, _TASK, _TRAJ, _LOG)):
                yield path
