"""The viewer's pages as a set of paths: one page, its script and style, and
data files that the page loads with ``<script>`` tags.

Data travels as JavaScript files (``COMPASS.put(id, data)``) rather than JSON
fetched with ``fetch()``, because browsers forbid ``fetch()`` of ``file://``
URLs: the same files work served by ``compass view`` and written by
``compass view --out`` and opened from disk. Every data file is redacted
again on the way out (run directories are already redacted; this is the
defence in depth), and the page renders data as text, never as HTML.

Paths::

    index.html  app.js  app.css           served, the page names the last two by content (?v=...)
    data/config.js                        live (served) or static
    data/runs.js                          the list of runs
    data/<run>/run.js                     a run page: metrics, totals, task rows
    data/<run>/since/<version>.js         what changed since that version (served)
    data/<run>/task/<key>.js              a task's record without trajectories (served)
    data/<run>/tasks/<bundle>.js          many tasks' records in one file (static)
    data/<run>/traj/<key>/<attempt>-<chunk>.js   one chunk of a trajectory
    data/<run>/find/<key>/<attempt>/<hex query>.js   the chunks that may hold a text (served)
    data/<run>/log/<key>/<attempt>-<file>.js     one kept log file (by its place in the attempt's listing)

A run page's data is cached with the state of the files it was read from
(:meth:`RunData.signature`): a finished run is read, serialized and redacted
once, and a live page asks only for what changed since the version it holds.
The static site bundles tasks (:data:`TASKS_PER_BUNDLE` to a file) and
trajectory chunks (:data:`STATIC_GROUP` to a file), so that ``--out`` of a
10,000-task run is a few hundred files, not one per task.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from .._redact import redact_json_text
from ._atif_page import atif_page
from ._data import RunData
from ._trajectory import RawJSON

__all__ = ["STATIC_GROUP", "TASKS_PER_BUNDLE", "Site", "versioned", "write_site"]

#: Trajectory chunks to a file in the static site.
STATIC_GROUP = 8
#: Tasks to a file in the static site.
TASKS_PER_BUNDLE = 200
#: Versions of a run page a live page may ask the changes since.
_VERSIONS_KEPT = 4

_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "app.css": "text/css; charset=utf-8"}
_ASSETS = ("app.js", "app.css")
_JS = "text/javascript; charset=utf-8"
_RUN = re.compile(r"data/(\d+)/run\.js")
_ATIF = re.compile(r"atif/(\d+)\.html")
_TASK = re.compile(r"data/(\d+)/task/([a-z0-9._~-]+)\.js")
_TRAJ = re.compile(r"data/(\d+)/traj/([a-z0-9._~-]+)/(\d+)-(\d+)\.js")
_LOG = re.compile(r"data/(\d+)/log/([a-z0-9._~-]+)/(\d+)-(\d+)\.js")
_SINCE = re.compile(r"data/(\d+)/since/(\d+)\.js")
_BUNDLE = re.compile(r"data/(\d+)/tasks/(\d+)\.js")
_FIND = re.compile(r"data/(\d+)/find/([a-z0-9._~-]+)/(\d+)/((?:[0-9a-f]{2}){1,800})\.js")  # 200 characters of UTF-8


class _Version:
    """One state of a run page: its rows' JSON texts by task id and the
    rest of it, and the redacted script, built once."""

    __slots__ = ("number", "rest", "rows", "script", "signature")

    def __init__(self, number: int, signature: Any, rest: dict[str, Any], rows: dict[str, str]) -> None:
        self.number = number
        self.signature = signature
        self.rest = rest
        self.rows = rows
        self.script: bytes | None = None


class _RunPages:
    """The versions of one run's page (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.versions: OrderedDict[int, _Version] = OrderedDict()
        self.next = 1

    def latest(self) -> _Version | None:
        return next(reversed(self.versions.values()), None)


class Site:
    """The viewer over ``run_dirs``; :meth:`get` is blocking (file reads):
    call it from worker threads (the per-run caches are thread-safe).

    ``row_budget`` bounds the seconds a run page request spends reading task
    rows (the rest come as placeholders until :meth:`warm` reads them); None
    reads every row, as the static site needs. ``static`` lays the data out
    for ``--out``: tasks and trajectory chunks bundled, no server-side search."""

    def __init__(
        self,
        run_dirs: list[Path],
        *,
        live: bool,
        row_budget: float | None = None,
        static: bool = False,
        atif_files: list[Path] | None = None,
    ) -> None:
        self.runs = [RunData(d) for d in run_dirs]
        #: ATIF files shown at ``atif/<i>.html`` (``compass view FILE``).
        self.atif_files = list(atif_files or ())
        self.live = live
        self.row_budget = row_budget
        self.static = static
        self.group = STATIC_GROUP if static else 1
        self._pages = [_RunPages() for _ in self.runs]

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The content and media type at ``path`` (no leading ``/``), or None."""
        path = path or "index.html"
        if path in _STATIC:
            page = _served_index() if path == "index.html" and not self.static else _static(path)
            return page, _STATIC[path]
        if (m := _ATIF.fullmatch(path)) and int(m.group(1)) < len(self.atif_files):
            return atif_page(self.atif_files[int(m.group(1))]), _STATIC["index.html"]
        if m := _RUN.fullmatch(path):
            script = self._run_page(int(m.group(1)), None)
            return (script, _JS) if script is not None else None
        if not self.static and (m := _SINCE.fullmatch(path)):
            script = self._run_page(int(m.group(1)), int(m.group(2)))
            return (script, _JS) if script is not None else None
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
        """Every path :meth:`get` answers (but searches and changes since a
        version), for writing the static site to disk or walking the served one."""
        yield from _STATIC
        yield from (f"atif/{i}.html" for i in range(len(self.atif_files)))
        yield "data/config.js"
        yield "data/runs.js"
        for index, run in enumerate(self.runs):
            yield f"data/{index}/run.js"
            keys = run.task_keys()
            if self.static:
                for bundle in range(-(-len(keys) // TASKS_PER_BUNDLE)):
                    yield f"data/{index}/tasks/{bundle}.js"
            for key in keys:
                if not self.static:
                    yield f"data/{index}/task/{key}.js"
                task = run.task(key, self.group) or {}
                for attempt in task.get("attempts") or []:
                    rr = attempt.get("run_result") or {}
                    if not (self.static and "trajectory_inline" in rr):  # the bundle has it
                        for chunk in range(rr.get("trajectory_chunks") or 0):
                            yield f"data/{index}/traj/{key}/{attempt.get('attempt')}-{chunk}.js"
                    for file in range(len(attempt.get("logs") or [])):
                        yield f"data/{index}/log/{key}/{attempt.get('attempt')}-{file}.js"

    def _run_page(self, index: int, since: int | None) -> bytes | None:
        """A run page's script: the whole page, or (``since`` a version the
        page holds) what changed since then; from the cache while the run's
        files are as they were."""
        if index >= len(self.runs):
            return None
        run, pages = self.runs[index], self._pages[index]
        signature = run.signature()
        with pages.lock:
            version = pages.latest()
        if version is None or version.signature != signature or signature is None:
            version = self._new_version(run, pages, signature)
        ident = f"{index}/run" if since is None else f"{index}/since/{since}"
        if since is None:
            with pages.lock:
                if version.script is None:
                    version.script = _page_script(ident, version.rest, list(version.rows.values()))
                return version.script
        with pages.lock:
            base = pages.versions.get(since)
        if base is None:  # unknown or forgotten: the whole page
            return _page_script(ident, version.rest, list(version.rows.values()))
        changed = [text for task_id, text in version.rows.items() if base.rows.get(task_id) != text]
        removed = [task_id for task_id in base.rows if task_id not in version.rows]
        rest = {**version.rest, "delta": {"since": since, "removed": removed}}
        return _page_script(ident, rest, changed)

    def _new_version(self, run: RunData, pages: _RunPages, signature: Any) -> _Version:
        page = run.run(self.row_budget)
        if self.static:
            keys = run.task_keys()
            page["task_bundles"] = keys[::TASKS_PER_BUNDLE]
        tasks = page.pop("tasks")
        rows = {}
        for row in tasks:
            # Redacted row by row: a row is a whole JSON value, so no secret or
            # credential shape spans two, and most rows pass the redactor's
            # cheap test, where the whole page would not.
            rows[str(row[0])] = redact_json_text(orjson.dumps(row, default=str).decode())
        # Placeholders and live rows change without their files: never a cache hit.
        cacheable = signature is not None and not page["pending"] and not page["live"]["running"]
        with pages.lock:
            latest = pages.latest()
            if latest is not None and {k: v for k, v in latest.rest.items() if k != "version"} == page and latest.rows == rows:
                latest.signature = signature if cacheable else None
                return latest
            version = _Version(pages.next, signature if cacheable else None, page, rows)
            page["version"] = version.number
            pages.next += 1
            pages.versions[version.number] = version
            while len(pages.versions) > _VERSIONS_KEPT:
                pages.versions.popitem(last=False)
            return version

    def _data(self, path: str) -> tuple[str, Any] | None:
        ident = path[len("data/"):-len(".js")] if path.startswith("data/") and path.endswith(".js") else ""
        if path == "data/config.js":
            return ident, {"live": self.live, "static": self.static}
        if path == "data/runs.js":
            return ident, [run.header() for run in self.runs]
        if not self.static and (m := _TASK.fullmatch(path)):
            run = self._run(m.group(1))
            task = run.task(m.group(2), self.group) if run else None
            return (ident, task) if task is not None else None
        if self.static and (m := _BUNDLE.fullmatch(path)):
            run = self._run(m.group(1))
            if run is None:
                return None
            keys = run.task_keys()[int(m.group(2)) * TASKS_PER_BUNDLE:][:TASKS_PER_BUNDLE]
            tasks = {key: run.task(key, self.group) for key in keys}
            return (ident, tasks) if tasks else None
        if m := _TRAJ.fullmatch(path):
            run = self._run(m.group(1))
            chunk = run.trajectory_chunk(m.group(2), int(m.group(3)), int(m.group(4)), self.group) if run else None
            return (ident, chunk) if chunk is not None else None
        if not self.static and (m := _FIND.fullmatch(path)):
            run = self._run(m.group(1))
            try:
                query = bytes.fromhex(m.group(4)).decode("utf-8")
            except ValueError:
                return None
            found = run.find(m.group(2), int(m.group(3)), query, self.group) if run else None
            return (ident, found) if found is not None else None
        if m := _LOG.fullmatch(path):
            run = self._run(m.group(1))
            log = run.log_file(m.group(2), int(m.group(3)), int(m.group(4))) if run else None
            return (ident, log) if log is not None else None
        return None

    def _run(self, index: str) -> RunData | None:
        i = int(index)
        return self.runs[i] if i < len(self.runs) else None


@functools.cache
def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


@functools.cache
def _asset_query(name: str) -> str:
    return "v=" + hashlib.sha256(_static(name)).hexdigest()[:16]


def versioned(path: str, query: bytes) -> bool:
    """Whether ``path?query`` names the page's script or style by its
    content, as the served ``index.html`` does: the same URL, the same bytes,
    so a browser may keep it (and its compiled script) for good."""
    return path in _ASSETS and query.decode("latin-1") == _asset_query(path)


@functools.cache
def _served_index() -> bytes:
    """``index.html`` with its script and style named by content (see :func:`versioned`)."""
    page = _static("index.html")
    for name in _ASSETS:
        ref = f'"{name}"'.encode()
        assert page.count(ref) == 1, name
        page = page.replace(ref, f'"{name}?{_asset_query(name)}"'.encode())
    return page


def _script(ident: str, value: Any) -> bytes:
    text = value if isinstance(value, RawJSON) else json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)
    text = redact_json_text(text)
    return f"COMPASS.put({json.dumps(ident)},{text});\n".encode("utf-8", "backslashreplace")


def _page_script(ident: str, rest: dict[str, Any], rows: list[str]) -> bytes:
    """A run page's script from its parts: the rest, redacted here, and the
    rows, already JSON and redacted."""
    head = redact_json_text(orjson.dumps(rest, default=str, option=orjson.OPT_NON_STR_KEYS).decode())
    text = f"{head[:-1]},\"tasks\":[{','.join(rows)}]}}" if head != "{}" else f"{{\"tasks\":[{','.join(rows)}]}}"
    return f"COMPASS.put({json.dumps(ident)},{text});\n".encode("utf-8", "backslashreplace")


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
            if path in ("data/config.js", "data/runs.js") or any(p.fullmatch(path) for p in (_RUN, _TASK, _BUNDLE, _TRAJ, _LOG)):
                yield path
