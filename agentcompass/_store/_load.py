"""The reader of run directories: reuse, reaping, ``compass show``, the
end-of-run report, the SDK and (for its primitives) the viewer read runs here.

Written for directories a SIGKILL may have interrupted at any instant: hidden
temporary files are skipped, a cut-short line in a ``.jsonl`` journal is
skipped. Files are read by format (``._formats``): a key this version does
not know is kept, never a reason to skip; a file that cannot be read at all
is named in :attr:`LoadedRun.unreadable`, a record whose severity cannot be
determined in :attr:`LoadedRun.undetermined`. The loader never decodes task
keys; every file carries its task id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import orjson

from ..runtime._convert import error_line
from ..runtime._results import AttemptRecord, TaskRecord
from ._disk import is_temp_name
from ._formats import Overlay, Undetermined, structure, upgrade
from ._index import valid_row
from ._keys import task_key
from ._layout import SEVERITIES, RunLayout, attempt_number, record_key
from ._run_store import RUN_ID_PATTERN
from ._trajectories import join_trajectories

__all__ = [
    "IndexReader", "LoadedRun", "attempt_numbers", "latest_run", "list_records", "load_run", "read_retries", "stat_key",
]  # fmt: skip


@attrs.frozen
class LoadedRun:
    """What a run directory holds.

    ``details`` are the countable records (task id -> record). When a crash
    left one task under two severities (between writing the new record and
    removing the old), the most recently written wins. ``checkpoints`` are the
    evaluated attempts of tasks that have no record yet (task id -> attempt
    -> record); checkpoints of tasks with a record are stale and left out.
    ``open_sessions`` are ``(session_id, provider, handle)`` journalled as
    opened and never as closed, in opening order. ``notes`` say what was
    skipped and why. ``files`` is filled only when asked for (see
    :func:`load_run`): the file each record in ``details`` was read from and
    its content (task id -> (path, bytes)), for records whole in their file
    (a record whose long trajectory is beside it, see ``._trajectories``, is
    read whole into ``details`` but has no entry: it is written anew).
    """

    run_dir: Path
    run_info: dict[str, Any]
    details: dict[str, TaskRecord]
    checkpoints: dict[str, dict[int, AttemptRecord]]
    open_sessions: list[tuple[str, str, dict[str, Any]]]
    notes: list[str] = attrs.Factory(list)
    files: dict[str, tuple[str, bytes]] = attrs.Factory(dict)
    #: Every provider ``sessions.jsonl`` names (opened or closed).
    providers: frozenset[str] = frozenset()
    #: Files that could not be read at all (relative paths; each also a note).
    unreadable: list[str] = attrs.Factory(list)
    #: Tasks whose record was read but whose severity cannot be determined
    #: (task id -> file and why): not in ``details``, never reused.
    undetermined: dict[str, str] = attrs.Factory(dict)
    #: What records and checkpoints held that this version does not know,
    #: as ``(value, overlay)`` (see ``_formats.structure``): a copy of the
    #: value keeps it (``RunStore.carry``).
    unknown: list[tuple[Any, Overlay]] = attrs.Factory(list)

    @property
    def tag(self) -> str | None:
        """The run's tag (``run_info.json``): the prefix of its session names."""
        tag = self.run_info.get("tag")
        return tag if isinstance(tag, str) and tag else None

    def used_providers(self) -> list[str]:
        """The providers the run used or may have used: its request's
        environment and every provider its journal names."""
        found = set(self.providers)
        request = self.run_info.get("request")
        environment = request.get("environment") if isinstance(request, dict) else None
        if isinstance(environment, dict) and isinstance(environment.get("id"), str):
            found.add(environment["id"])
        return sorted(found)


def load_run(run_dir: Path, *, keep_files: bool = False, records: bool = True) -> LoadedRun:
    """Read ``run_dir`` (blocking: call it from a worker thread in async code).

    With ``keep_files`` the records' files and contents are kept too
    (:attr:`LoadedRun.files`): reuse copies them verbatim. Without
    ``records`` only ``run_info.json`` and the session journal are read
    (``details`` and ``checkpoints`` stay empty): what ``compass reap``
    needs, without reading thousands of record files."""
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    run = _Reading()
    run_info = _load_run_info(layout, run.notes)
    files: dict[str, tuple[str, bytes]] = {}
    details: dict[str, TaskRecord] = {}
    checkpoints: dict[str, dict[int, AttemptRecord]] = {}
    if records:
        details = _load_details(layout, run, files if keep_files else None)
        checkpoints = _load_checkpoints(layout, details, run)
    providers: set[str] = set()
    open_sessions = _load_sessions(layout, run.notes, providers)
    return LoadedRun(
        run_dir, run_info, details, checkpoints, open_sessions, run.notes, files, frozenset(providers),
        unreadable=run.files, undetermined=run.undetermined, unknown=run.unknown,
    )  # fmt: skip


@attrs.define
class _Reading:
    """What reading a run found besides its records."""

    notes: list[str] = attrs.Factory(list)
    files: list[str] = attrs.Factory(list)
    undetermined: dict[str, str] = attrs.Factory(dict)
    unknown: list[tuple[Any, Overlay]] = attrs.Factory(list)

    def unreadable(self, where: str, exc: BaseException) -> None:
        self.files.append(where)
        self.notes.append(f"skipped unreadable {where}: {_short(exc)}")


def latest_run(output_root: Path, request_name: str, exclude: Path | None = None) -> Path | None:
    """The latest run directory of a request, or ``None`` if it has none.

    Runs are ordered by their ids (UTC time first, see ``new_run_id``); a
    directory whose name is not such an id (a hand-picked run id) is never
    the latest. ``exclude`` is skipped: the run being written, which would
    otherwise be the latest.
    """
    request_dir = Path(output_root) / request_name
    try:
        with os.scandir(request_dir) as entries:
            names = [e.name for e in entries if e.is_dir() and RUN_ID_PATTERN.fullmatch(e.name)]
    except (FileNotFoundError, NotADirectoryError):
        return None
    if exclude is not None:
        skip = Path(exclude).resolve()
        names = [n for n in names if (request_dir / n).resolve() != skip]
    return request_dir / max(names) if names else None


def _loads(data: bytes) -> Any:
    """JSON ``data``: orjson, as the standard decoder is slower (bench:
    reuse), which takes what orjson refuses (NaN, a lone surrogate, a BOM)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _read_json(path: str) -> Any:
    return _loads(_read_bytes(path))


def _read_bytes(path: Path | str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _json_files(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return [e for e in entries if record_key(e.name) is not None and not is_temp_name(e.name)]
    except FileNotFoundError:
        return []


def _load_run_info(layout: RunLayout, notes: list[str]) -> dict[str, Any]:
    where = layout.relative(layout.run_info)
    try:
        info = _loads(_read_bytes(layout.run_info))
    except FileNotFoundError:
        notes.append(f"{where} is missing")
        return {}
    except (OSError, ValueError) as exc:
        notes.append(f"{where} is unreadable: {exc}")
        return {}
    if not isinstance(info, dict):
        notes.append(f"{where} is not a JSON object")
        return {}
    return info


def _load_details(layout: RunLayout, run: _Reading, files: dict[str, tuple[str, bytes]] | None) -> dict[str, TaskRecord]:
    """The records (task id -> record); their files and contents go to
    ``files`` if it is given. A file's mtime is only read when its task id was seen
    before (a crash left the task under two severities): the newest wins."""
    details: dict[str, TaskRecord] = {}
    kept: dict[str, tuple[str, bytes, bool]] = {}  # task id -> (path, content, trajectory beside it)
    for severity in SEVERITIES:
        for entry in _json_files(layout.severity_dir(severity)):
            where = layout.relative(entry.path)
            try:
                content = _read_bytes(entry.path)
                raw = _loads(content)
                task_id = raw.get("task_id") if isinstance(raw, dict) else None
                if not isinstance(task_id, str):
                    raise ValueError("not a task record: no task_id")
                data = upgrade(raw, "record")
                split = join_trajectories(data.get("attempts"), layout, task_key(task_id), _read_json)
            except Undetermined as exc:  # raised once task_id is known to be a string
                run.undetermined[str(task_id)] = f"{where}: {_short(exc)}"
                continue
            except Exception as exc:  # noqa: BLE001 - any malformed file is reported, not fatal
                run.unreadable(where, exc)
                continue
            try:
                record, unknown = structure(data, TaskRecord)
            except Undetermined as exc:
                run.undetermined[task_id] = f"{where}: {_short(exc)}"
                continue
            if record.severity != severity:
                run.notes.append(f"{where} says severity {record.severity!r}; kept as written")
            previous = kept.get(record.task_id)
            if previous is not None:
                run.notes.append(f"task {record.task_id!r} has records under two severities; kept the newest")
                if _mtime_ns(previous[0]) > _mtime_ns(entry.path):
                    continue
            details[record.task_id] = record
            run.unknown.extend(unknown)
            kept[record.task_id] = (entry.path, content, bool(split))
    for task_id in details:
        run.undetermined.pop(task_id, None)
    if files is not None:
        files.update((task_id, (path, content)) for task_id, (path, content, split) in kept.items() if not split)
    return details


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1  # gone since it was read: the other one is newer


def _load_checkpoints(
    layout: RunLayout, details: dict[str, TaskRecord], run: _Reading
) -> dict[str, dict[int, AttemptRecord]]:
    checkpoints: dict[str, dict[int, AttemptRecord]] = {}
    try:
        keys = [e.name for e in os.scandir(layout.tasks) if e.is_dir()]
    except FileNotFoundError:
        return checkpoints
    for key in sorted(keys):
        with os.scandir(layout.task_dir(key)) as entries:
            attempts = sorted(n for n in (attempt_number(e.name) for e in entries) if n is not None)
        for attempt in attempts:
            path = layout.checkpoint(key, attempt)
            where = layout.relative(path)
            try:
                data = upgrade(_loads(_read_bytes(path)), "checkpoint")
                task_id = data["task_id"]
                if not isinstance(task_id, str):
                    raise TypeError("task_id is not a string")
                raw = data["record"]
                if not isinstance(raw, dict):
                    raise TypeError("record is not an object")
                join_trajectories([raw], layout, key, _read_json)
                record, unknown = structure(raw, AttemptRecord)
            except FileNotFoundError:
                continue  # an attempt with only discarded tries
            except Exception as exc:  # noqa: BLE001 - any malformed file is reported, not fatal
                # An attempt not read runs again: the task is not finished, so no record is lost.
                run.unreadable(where, exc)
                continue
            if task_id not in details:
                checkpoints.setdefault(task_id, {})[record.attempt] = record
                run.unknown.extend(unknown)
    return checkpoints


def _load_sessions(layout: RunLayout, notes: list[str], providers: set[str]) -> list[tuple[str, str, dict[str, Any]]]:
    try:
        lines = _read_bytes(layout.sessions).split(b"\n")
    except FileNotFoundError:
        return []
    opened: dict[str, tuple[str, str, dict[str, Any]]] = {}  # insertion-ordered
    # Matched by id, not position: a line may appear twice (see
    # write_journals_now) and a cut-short one is skipped.
    closed: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = _loads(line)
            event, session, provider = entry["event"], entry["session"], entry["provider"]
            handle = entry.get("handle") or {}
            if not isinstance(session, str) or not isinstance(provider, str):
                raise TypeError("session and provider must be strings")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            notes.append(f"skipped unreadable line {number} of {layout.relative(layout.sessions)}: {_short(exc)}")
            continue
        providers.add(provider)
        if event == "opened":
            opened[session] = (session, provider, handle)
        elif event == "closed":
            closed.add(session)
    return [entry for session, entry in opened.items() if session not in closed]


def _short(exc: BaseException) -> str:
    return (error_line(exc) or type(exc).__name__).splitlines()[0][:200]


# -- primitives for readers that keep their own caches (the viewer) ---------------------


def stat_key(path: str) -> tuple[int, int] | None:
    """``(mtime_ns, size)`` of ``path``, None if it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def list_records(layout: RunLayout) -> dict[str, tuple[str, str, tuple[int, int]]]:
    """Task key -> (path, severity, (mtime_ns, size)) of each countable record
    on disk, the newest of two; nothing is read but the listings."""
    files: dict[str, tuple[str, str, tuple[int, int]]] = {}
    for severity in SEVERITIES:
        for entry in _json_files(layout.severity_dir(severity)):
            key = record_key(entry.name)
            try:
                st = entry.stat()
            except OSError:
                continue
            stat = (st.st_mtime_ns, st.st_size)
            if key is not None and (key not in files or stat > files[key][2]):
                files[key] = (entry.path, severity, stat)
    return files


def attempt_numbers(layout: RunLayout, key: str) -> list[int]:
    """The attempts that have a directory under ``tasks/<key>``, in order."""
    try:
        with os.scandir(layout.task_dir(key)) as entries:
            return sorted(n for n in (attempt_number(e.name) for e in entries if e.is_dir()) if n is not None)
    except OSError:
        return []


def read_retries(layout: RunLayout, key: str) -> list[dict[str, Any]]:
    """The discarded tries of a task, in attempt then try order:
    ``{"attempt", "try", "data"}``, ``data`` in the current format's shape
    (a file that cannot be read is left out)."""
    tries: list[dict[str, Any]] = []
    for attempt in attempt_numbers(layout, key):
        entries = _json_files(layout.retries(key, attempt))
        for name in sorted((e.name for e in entries), key=lambda n: (len(n), n)):
            try:
                data = upgrade(_read_json(os.path.join(layout.retries(key, attempt), name)), "retry")
            except (OSError, ValueError):
                continue
            tries.append({"attempt": attempt, "try": record_key(name), "data": data})
    return tries


@attrs.define(eq=False)
class IndexReader:
    """``index.jsonl`` (see ``._index``) read on from where the last call
    stopped while the file only grows: the last valid line per task key."""

    layout: RunLayout
    rows: dict[str, dict[str, Any]] = attrs.Factory(dict)
    _at: tuple[int, int] = (0, 0)  # (inode, bytes read)

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.layout.index, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self._at[0]:
                    self._at, self.rows = (inode, 0), {}
                f.seek(self._at[1])
                data = f.read()
        except OSError:
            return self.rows
        end = data.rfind(b"\n") + 1  # a line being appended is read next time
        for raw in data[:end].splitlines():
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # cut short by a crash
            if valid_row(line):
                line["key"] = task_key(line["task_id"])
                self.rows[line["key"]] = line
        self._at = (inode, self._at[1] + end)
        return self.rows
