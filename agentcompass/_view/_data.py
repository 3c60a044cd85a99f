"""What the viewer's pages show, read from run directories (SPEC 8).

Read-only: files are opened for reading and nothing is ever created, renamed
or locked in a run directory, so a live run can be viewed while it writes.
Records are read as plain JSON (not through the converter): a viewer must show
what is on disk, including records of an older or newer format.

Large trajectories are split into chunks of :data:`CHUNK_STEPS` messages that
the page loads one at a time. Parsed files are cached by (mtime, size), so a
live page that polls every few seconds re-reads only what changed.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

__all__ = ["CHUNK_STEPS", "RunData", "find_runs", "writer_alive"]

#: Messages per trajectory chunk: small enough to parse and render in a frame.
CHUNK_STEPS = 500
_SEVERITIES = ("fatal", "error", "normal")
_ATTEMPT_DIR = re.compile(r"attempt-(\d+)")
_RECORD_CACHE = 8  # whole task records (with trajectories) kept parsed
_PRIMARY_FALLBACK = ("reward", "passed", "correct", "score", "accuracy")


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories named by ``paths``: a run directory itself, or a
    request directory / output root searched two levels down, newest first
    within each."""
    found: list[Path] = []
    for path in paths:
        if (path / "run_info.json").is_file() or (path / "progress.jsonl").is_file():
            found.append(path)
            continue
        below: list[Path] = []
        for child in _subdirs(path):
            if (child / "run_info.json").is_file():
                below.append(child)
            else:
                below.extend(g for g in _subdirs(child) if (g / "run_info.json").is_file())
        found.extend(sorted(below, key=lambda p: (p.parent.name, p.name), reverse=True))
    unique: dict[Path, None] = {}
    for path in found:
        unique.setdefault(path.resolve(), None)
    return list(unique)


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def _stat_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _read_json(path: str | Path) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)) and value == value:  # not NaN
        return float(value)
    return None


class RunData:
    """One run directory as the viewer sees it (blocking reads: call from a thread)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._rows: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}  # file -> (stat, row)
        self._records: OrderedDict[str, tuple[tuple[int, int], dict[str, Any]]] = OrderedDict()
        self._progress: tuple[tuple[int, int], dict[str, Any]] | None = None
        self._files: tuple[tuple[tuple[int, int] | None, ...], dict[str, str]] | None = None

    # ------------------------------------------------------------ run page

    def header(self) -> dict[str, Any]:
        """Name, id, status and request: enough for the list of runs."""
        info = self._run_info()
        request = info.get("request") or {}
        live = self._live()
        status = info.get("status") or ("running" if live["running"] else "unknown")
        if status == "running":
            alive = writer_alive(self.run_dir)
            if alive is False or (alive is None and not live["running"]):
                status = "interrupted"  # its process died: it will never finish
        return {
            "name": request.get("name") or self.run_dir.parent.name,
            "run_id": self.run_dir.name,
            "run_dir": str(self.run_dir),
            "status": status,
            "benchmark": _ref_id(request.get("benchmark")),
            "harness": _ref_id(request.get("harness")),
            "environment": _ref_id(request.get("environment")),
            "model": (request.get("model") or {}).get("name"),
            "started_at": info.get("started_at"),
            "ended_at": info.get("ended_at"),
        }

    def run(self) -> dict[str, Any]:
        """Everything the run page shows, with one compact row per task."""
        info = self._run_info()
        metrics = self._optional_json("metrics.json")
        progress = self._optional_json("progress.json")
        series = list(((metrics or {}).get("series") or {}).keys())
        rows = self._task_rows()
        if not series:
            series = _guess_series(rows)
        primary = series[0] if series else None
        strategy = ((info.get("request") or {}).get("execution") or {}).get("attempts", {}).get("strategy", "avg")
        live = self._live()
        header = self.header()
        tasks = []
        issue_counts: Counter[str] = Counter()
        usage: Counter[str] = Counter()
        timings: Counter[str] = Counter()
        retries = 0
        done = set()
        for row in rows:
            done.add(row["task_id"])
            value = _reduce(row["values"], primary, strategy) if primary else None
            for code in row["codes"]:
                issue_counts[code] += 1
            usage.update(row["usage"])
            timings.update(row["timings"])
            retries += row["retries"]
            tasks.append([
                row["task_id"], row["key"], row["category"], row["severity"], row["statuses"],
                value, row["codes"], row["retries"], row["attempts"], round(row["seconds"], 3),
            ])
        for task_id in live["active"]:
            if task_id not in done:
                state = "running" if header["status"] == "running" else "unfinished"
                tasks.append([task_id, None, None, state, [state], None, [], 0, 0, 0.0])
        return {
            "header": header,
            "request": info.get("request"),
            "versions": info.get("versions"),
            "notes": info.get("notes"),
            "metrics": metrics,
            "progress": progress,
            "live": {"running": header["status"] == "running", "events": live["events"], "last": live["last"]},
            "series": series,
            "primary": primary,
            "strategy": strategy,
            "issues_by_code": dict(issue_counts.most_common()),
            "usage": dict(usage),
            "timings": {k: round(v, 3) for k, v in timings.items()},
            "retries": retries,
            "columns": ["task_id", "key", "category", "severity", "statuses", "value", "codes",
                        "retries", "attempts", "seconds"],
            "tasks": tasks,
        }

    def _run_info(self) -> dict[str, Any]:
        info = self._optional_json("run_info.json")
        return info if isinstance(info, dict) else {}

    def _optional_json(self, name: str) -> Any:
        try:
            return _read_json(self.run_dir / name)
        except (OSError, ValueError):
            return None

    def _detail_files(self) -> dict[str, str]:
        """Task key -> path of its countable record (the newest if two).

        Cached until one of the ``details/<severity>`` directories changes
        (the store renames records into them, which updates their mtime)."""
        stamp = tuple(_stat_key(str(self.run_dir / "details" / s)) for s in _SEVERITIES)
        if self._files is not None and self._files[0] == stamp:
            return self._files[1]
        files = self._scan_details()
        self._files = (stamp, files)
        return files

    def _scan_details(self) -> dict[str, str]:
        files: dict[str, str] = {}
        for severity in _SEVERITIES:
            try:
                entries = list(os.scandir(self.run_dir / "details" / severity))
            except OSError:
                continue
            for entry in entries:
                if entry.name.endswith(".json") and not entry.name.startswith("."):
                    key = entry.name[: -len(".json")]
                    if key not in files or _stat_key(entry.path) > _stat_key(files[key]):  # type: ignore[operator]
                        files[key] = entry.path
        return files

    def _task_rows(self) -> list[dict[str, Any]]:
        files = self._detail_files()
        rows = []
        seen = set()
        for key, path in sorted(files.items()):
            stat = _stat_key(path)
            if stat is None:
                continue
            seen.add(path)
            cached = self._rows.get(path)
            if cached is None or cached[0] != stat:
                try:
                    row = _row(key, _read_json(path))
                except (OSError, ValueError, TypeError, AttributeError, KeyError):
                    continue
                self._rows[path] = (stat, row)
                cached = self._rows[path]
            rows.append(cached[1])
        for path in list(self._rows):
            if path not in seen:
                del self._rows[path]
        return rows

    def _live(self) -> dict[str, Any]:
        """Active tasks and the last event, from ``progress.jsonl``."""
        path = str(self.run_dir / "progress.jsonl")
        stat = _stat_key(path)
        if stat is None:
            return {"running": False, "active": [], "events": 0, "last": None}
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
        self._progress = (stat, live)
        return live

    # ------------------------------------------------------------ attempt page

    def task(self, key: str) -> dict[str, Any] | None:
        """A task's record with each trajectory replaced by its length and
        chunk count, plus its discarded tries."""
        record = self._record(key)
        if record is None:
            return None
        attempts = []
        for attempt in record.get("attempts") or []:
            attempt = dict(attempt)
            run_result = dict(attempt.get("run_result") or {})
            trajectory = run_result.pop("trajectory", None) or []
            steps = len(trajectory)
            run_result["trajectory_steps"] = steps
            run_result["trajectory_chunks"] = (steps + CHUNK_STEPS - 1) // CHUNK_STEPS
            run_result["trajectory_chunk_steps"] = CHUNK_STEPS
            run_result["tool_calls"] = sum(len(m.get("tool_calls") or []) for m in trajectory if isinstance(m, dict))
            attempt["run_result"] = run_result
            attempts.append(attempt)
        return {
            "task_id": record.get("task_id"),
            "key": key,
            "category": record.get("category"),
            "severity": record.get("severity"),
            "attempts": attempts,
            "discarded": self._discarded(key),
        }

    def trajectory_chunk(self, key: str, attempt_index: int, chunk: int) -> list[Any] | None:
        record = self._record(key)
        if record is None:
            return None
        for attempt in record.get("attempts") or []:
            if attempt.get("attempt") == attempt_index:
                trajectory = (attempt.get("run_result") or {}).get("trajectory") or []
                start = chunk * CHUNK_STEPS
                if chunk < 0 or (start >= len(trajectory) and chunk > 0):
                    return None
                return list(trajectory[start : start + CHUNK_STEPS])
        return None

    def task_keys(self) -> list[str]:
        return sorted(self._detail_files())

    def _record(self, key: str) -> dict[str, Any] | None:
        path = self._detail_files().get(key)
        if path is None:
            return None
        stat = _stat_key(path)
        cached = self._records.get(path)
        if cached is not None and cached[0] == stat:
            self._records.move_to_end(path)
            return cached[1]
        try:
            record = _read_json(path)
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or stat is None:
            return None
        self._records[path] = (stat, record)
        while len(self._records) > _RECORD_CACHE:
            self._records.popitem(last=False)
        return record

    def _discarded(self, key: str) -> list[dict[str, Any]]:
        """Discarded tries of every attempt, in attempt then try order."""
        task_dir = self.run_dir / "tasks" / key
        tries: list[dict[str, Any]] = []
        for attempt_dir in _subdirs(task_dir):
            match = _ATTEMPT_DIR.fullmatch(attempt_dir.name)
            if not match:
                continue
            retries_dir = attempt_dir / "retries"
            names = [p.name for p in _files(retries_dir) if p.name.endswith(".json") and not p.name.startswith(".")]
            for name in sorted(names, key=lambda n: (len(n), n)):
                try:
                    data = _read_json(retries_dir / name)
                except (OSError, ValueError):
                    continue
                tries.append({"attempt": int(match.group(1)), "try": name[: -len(".json")], "data": data})
        return tries


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
    return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == ident
               for fields in (line.split() for line in lines))


def _files(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_file()]
    except OSError:
        return []


def _ref_id(ref: Any) -> str | None:
    if isinstance(ref, dict):
        return ref.get("id")
    return ref if isinstance(ref, str) else None


def _row(key: str, record: dict[str, Any]) -> dict[str, Any]:
    """The task table's summary of one record (everything else stays on disk)."""
    attempts = record.get("attempts") or []
    codes: list[str] = []
    usage: Counter[str] = Counter()
    timings: Counter[str] = Counter()
    values: list[dict[str, Any]] = []
    retries = 0
    for attempt in attempts:
        for issue in attempt.get("issues") or []:
            code = f"{issue.get('severity', '?')}:{issue.get('code', '?')}"
            if code not in codes:
                codes.append(code)
        run_usage = (attempt.get("run_result") or {}).get("usage") or {}
        usage.update({k: v for k, v in run_usage.items() if isinstance(v, (int, float))})
        timings.update({k: v for k, v in (attempt.get("timings") or {}).items() if isinstance(v, (int, float))})
        values.append(attempt.get("values") or {})
        retries += int(attempt.get("retries") or 0)
    return {
        "task_id": str(record["task_id"]),
        "key": key,
        "category": record.get("category"),
        "severity": record.get("severity"),
        "statuses": [a.get("status") for a in attempts],
        "codes": codes,
        "values": values,
        "usage": dict(usage),
        "timings": dict(timings),
        "seconds": float(sum(timings.values())),
        "retries": retries,
        "attempts": len(attempts),
    }


def _guess_series(rows: list[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        for values in row["values"]:
            names.update(dict.fromkeys(values))
    ordered = [n for n in _PRIMARY_FALLBACK if n in names]
    return ordered + [n for n in names if n not in ordered]


def _reduce(values: list[dict[str, Any]], series: str, strategy: str) -> float | None:
    """A task's value for ``series`` as SPEC 6 reduces attempts (avg or pass)."""
    numbers = [n for n in (_number(v.get(series)) for v in values) if n is not None]
    if not numbers:
        return None
    if strategy == "pass":
        return 1.0 if any(n >= 1 for n in numbers) else 0.0
    return sum(numbers) / len(numbers)
