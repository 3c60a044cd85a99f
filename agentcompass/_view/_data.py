"""What the viewer's pages show, read from run directories (SPEC 8).

Read-only: files are opened for reading and nothing is ever created, renamed
or locked in a run directory, so a live run can be viewed while it writes.
Records are read as plain JSON (not through the converter): a viewer must show
what is on disk, including records of an older or newer format.

Serving is lazy. The run page's task index comes from the ``details/``
listing and a compact row per record, cached by (mtime, size) so a live page
that polls re-reads only what changed; a request reads rows for a bounded time
and answers the rest as placeholders (``pending``) that a background pass
fills in, so the first page of a 10,000-task run does not wait for every
record. A record is read in full only for its attempt page, its trajectories
split into chunks as :mod:`._trajectory` reads them, in a cache bounded by
characters. A task's value reduces its attempts as the store's metrics do.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._store._keys import task_key
from .._store._layout import SEVERITIES, RunLayout, has_run_info, is_run_dir
from .._store._load import attempt_numbers, read_retries, stat_key
from .._store._metrics import reduce_attempt_values
from ._live import LiveProgress
from ._live import writer_alive as writer_alive
from ._logs import list_logs, read_log
from ._record_cache import RECORD_CACHE_CHARS as RECORD_CACHE_CHARS
from ._record_cache import RecordCache
from ._rows import TaskRows, read_json
from ._trajectory import CHUNK_STEPS, RawJSON, Trajectory
from ._trajectory import LARGE_RECORD as LARGE_RECORD  # noqa: F401 - imported from here by tests
from ._trajectory import read_record as read_record  # noqa: F401 - imported from here by tests

__all__ = ["CHUNK_STEPS", "RunData", "find_runs", "writer_alive"]

#: How long a run page request reads rows before answering with placeholders.
ROW_BUDGET_SECONDS = 0.3
_PRIMARY_FALLBACK = ("reward", "passed", "correct", "score", "accuracy")


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories named by ``paths``: a run directory itself, or a
    request directory / output root searched two levels down, newest first
    within each."""
    found: list[Path] = []
    for path in paths:
        if is_run_dir(path):
            found.append(path)
            continue
        below: list[Path] = []
        for child in _subdirs(path):
            if has_run_info(child):
                below.append(child)
            else:
                below.extend(g for g in _subdirs(child) if has_run_info(g))
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


class RunData:
    """One run directory as the viewer sees it (blocking reads: call from
    worker threads; the caches are shared under a lock)."""

    def __init__(self, run_dir: Path, *, record_cache_chars: int = RECORD_CACHE_CHARS) -> None:
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self._cache = RecordCache(record_cache_chars)
        self._rows = TaskRows(self.layout, self._cache)
        self._progress = LiveProgress(self.layout.progress_lines)

    @property
    def records_read(self) -> int:
        """Files parsed in full so far (records and checkpoints): what the cache saves."""
        return self._cache.records_read

    def warm(self, check: Callable[[], None] = lambda: None) -> None:
        """Read every row ahead of the page requests (see :meth:`TaskRows.warm <._rows.TaskRows.warm>`)."""
        self._rows.warm(check)

    def _load(self, path: str, stat: tuple[int, int], key: str) -> Any:
        """The parsed file at ``path``, from the bounded cache or read once."""
        return self._cache.load(path, stat, lambda attempt, index: self.layout.chunk(key, attempt, index))

    def _live(self) -> dict[str, Any]:
        return self._progress.read()

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

    def signature(self) -> tuple[tuple[int, int] | None, ...]:
        """The state of the files a run page is read from (their mtimes and
        sizes, and those of the ``details/`` directories, which every record
        written renames into): equal signatures, equal pages, once no row is
        a placeholder and the run is not live."""
        layout = self.layout
        files = (layout.run_info, layout.metrics, layout.progress, layout.progress_lines)
        return (*(stat_key(f) for f in files), *(stat_key(layout.severity_dir(s)) for s in SEVERITIES))

    def run(self, budget: float | None = None) -> dict[str, Any]:
        """Everything the run page shows, with one compact row per task.

        With ``budget`` (seconds), rows not read yet after that long, and
        rows of large records, are placeholders from the listing (task key
        and severity) and ``pending`` counts them; None reads everything."""
        info = self._run_info()
        metrics = self._optional_json(self.layout.metrics)
        progress = self._optional_json(self.layout.progress)
        series = list(((metrics or {}).get("series") or {}).keys())
        rows, pending = self._rows.rows(budget)
        if not series:
            series = _guess_series([r for r in rows if r is not None and "pending" not in r])
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
            for name, amount in row["usage"].items():  # not Counter.update: its loop is Python's (bench: view)
                usage[name] += amount
            for name, amount in row["timings"].items():
                timings[name] += amount
            retries += row["retries"]
            tasks.append(
                [
                    row["task_id"],
                    row["key"],
                    row["category"],
                    row["severity"],
                    row["statuses"],
                    value,
                    row["codes"],
                    row["retries"],
                    row["attempts"],
                    round(row["seconds"], 3),
                ]
            )
        for task_id in live["active"]:
            if task_id not in done:
                state = "running" if header["status"] == "running" else "unfinished"
                key, statuses = self._checkpointed(task_id)
                tasks.append([task_id, key, None, state, statuses or [state], None, [], 0, len(statuses), 0.0])
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
            "pending": pending,
            "columns": [
                "task_id",
                "key",
                "category",
                "severity",
                "statuses",
                "value",
                "codes",
                "retries",
                "attempts",
                "seconds",
            ],
            "tasks": tasks,
        }

    def _run_info(self) -> dict[str, Any]:
        info = self._optional_json(self.layout.run_info)
        return info if isinstance(info, dict) else {}

    def _optional_json(self, path: str) -> Any:
        try:
            return read_json(path)
        except (OSError, ValueError):
            return None

    def _checkpointed(self, task_id: str) -> tuple[str | None, list[Any]]:
        """The key and attempt statuses of a task that so far only has
        checkpoints (no record yet); no key when it has none either."""
        attempts = self._checkpoints(task_key(task_id))
        if not attempts:
            return None, []
        return task_key(task_id), [a.get("status") for a in attempts]

    def _checkpoints(self, key: str) -> list[dict[str, Any]]:
        """The attempt records checkpointed under ``tasks/<key>``, in order."""
        found = []
        for number in attempt_numbers(self.layout, key):
            path = self.layout.checkpoint(key, number)
            stat = stat_key(path)
            if stat is None:
                continue
            try:
                attempt = self._load(path, stat, key)
            except (OSError, ValueError):
                continue  # being replaced right now: the next refresh shows it
            if isinstance(attempt, dict) and isinstance(attempt.get("record"), dict):
                attempt = attempt["record"]  # the store's form: {"task_id", "record"}
            if isinstance(attempt, dict):
                found.append((number, attempt))
        return [a for _, a in sorted(found, key=lambda x: x[0])]

    # ------------------------------------------------------------ attempt page

    def task(self, key: str, group: int = 1) -> dict[str, Any] | None:
        """A task's record with each trajectory replaced by its length and
        chunk count (``group`` of :data:`CHUNK_STEPS`-message chunks to a
        file), plus its discarded tries. A trajectory of one chunk comes
        inline (``trajectory_inline``), so a short attempt is one file. A
        task that has no record yet shows the attempts it has checkpointed."""
        record = self._record(key)
        if record is None:
            return None
        attempts = []
        for attempt in record.get("attempts") or []:
            attempt = dict(attempt)
            run_result = dict(attempt.get("run_result") or {})
            trajectory = run_result.pop("trajectory", None)
            if not isinstance(trajectory, Trajectory):
                trajectory = Trajectory.of(trajectory)
            run_result["trajectory_steps"] = trajectory.steps
            run_result["trajectory_chunks"] = -(-len(trajectory.chunks) // group)
            run_result["trajectory_chunk_steps"] = CHUNK_STEPS * group
            run_result["tool_calls"] = trajectory.tool_calls
            if len(trajectory.chunks) == 1:
                run_result["trajectory_inline"] = json.loads(trajectory.chunks[0])
            attempt["run_result"] = run_result
            attempt["logs"] = list_logs(self._logs_dir(key, attempt.get("attempt")))
            attempts.append(attempt)
        return {
            "task_id": record.get("task_id"),
            "key": key,
            "category": record.get("category"),
            "severity": record.get("severity"),
            "checkpointed": bool(record.get("checkpointed")),
            "attempts": attempts,
            "discarded": self._discarded(key),
        }

    def trajectory(self, key: str, attempt_index: int) -> Trajectory | None:
        """The trajectory of one attempt of a task (or of its checkpoint)."""
        record = self._record(key)
        if record is None:
            return None
        for attempt in record.get("attempts") or []:
            if attempt.get("attempt") == attempt_index:
                trajectory = (attempt.get("run_result") or {}).get("trajectory")
                return trajectory if isinstance(trajectory, Trajectory) else Trajectory.of(trajectory)
        return None

    def trajectory_chunk(self, key: str, attempt_index: int, chunk: int, group: int = 1) -> RawJSON | None:
        """Chunk ``chunk`` (of ``group`` stored chunks) of a trajectory as JSON text."""
        trajectory = self.trajectory(key, attempt_index)
        text = trajectory.group(chunk, group) if trajectory is not None else None
        return None if text is None else RawJSON(text)

    def find(self, key: str, attempt_index: int, query: str, group: int = 1) -> dict[str, Any] | None:
        """The chunks (of ``group``) of a trajectory that may hold ``query``."""
        trajectory = self.trajectory(key, attempt_index)
        if trajectory is None:
            return None
        return {"query": query, "chunks": sorted({n // group for n in trajectory.find(query)})}

    def log_file(self, key: str, attempt_index: int, index: int) -> dict[str, Any] | None:
        """The ``index``-th kept log file of an attempt (see :mod:`._logs`)."""
        return read_log(self._logs_dir(key, attempt_index), index)

    def _logs_dir(self, key: str, attempt_index: Any) -> Path:
        """What the attempt's verifier and agent left in ``/logs`` (``RunLayout.logs``)."""
        n = attempt_index if isinstance(attempt_index, int) and not isinstance(attempt_index, bool) else -1
        return Path(self.layout.logs(key, n))

    def task_keys(self) -> list[str]:
        return sorted(self._rows.detail_files())

    def _record(self, key: str) -> dict[str, Any] | None:
        found = self._rows.detail_files().get(key)
        if found is None:
            attempts = self._checkpoints(key)
            if not attempts:
                return None
            return {
                "task_id": _task_id_of(attempts) or key,
                "key": key,
                "category": None,
                "severity": None,
                "checkpointed": True,
                "attempts": attempts,
            }
        path, _, stat = found
        try:
            record = self._load(path, stat, key)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _discarded(self, key: str) -> list[dict[str, Any]]:
        """Discarded tries of every attempt, in attempt then try order."""
        return read_retries(self.layout, key)


def _task_id_of(attempts: list[dict[str, Any]]) -> str | None:
    for attempt in attempts:
        plan = attempt.get("plan")
        if isinstance(plan, dict) and isinstance(plan.get("task_id"), str):
            return plan["task_id"]
    return None


def _ref_id(ref: Any) -> str | None:
    if isinstance(ref, dict):
        return ref.get("id")
    return ref if isinstance(ref, str) else None


def _guess_series(rows: list[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        for values in row["values"]:
            names.update(dict.fromkeys(values))
    ordered = [n for n in _PRIMARY_FALLBACK if n in names]
    return ordered + [n for n in names if n not in ordered]


def _reduce(values: list[dict[str, Any]], series: str, strategy: str) -> float | None:
    """A task's value for ``series`` as SPEC 6 reduces attempts (avg or pass;
    another strategy is read as avg)."""
    return reduce_attempt_values(values, series, "pass" if strategy == "pass" else "avg")
