"""The progress display of ``compass launch``.

On a TTY a live ``rich`` table (one row per request: tasks done / total,
active (``act``), retries, errors (``err``: tasks with an ERROR left),
invalidated (``invalid``: tasks with a FATAL left), rate, ETA), redrawn a
few times a second. Rate and ETA count
only the tasks run in this process, not results a ``--reuse`` copied. The
ETA comes from the tasks themselves (:func:`eta_seconds`): what the finished
ones took, else each task's own timeouts, and how long each running one has
run; never a fixed figure. Anywhere
else, one plain line per request every ``interval`` seconds on stderr, so
logs and CI output stay readable and stdout keeps only the results.

The display only reads the driver's counters; it never blocks the run, and
it is cancelled with the orchestration like everything else.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import trio

__all__ = ["ProgressDisplay", "eta_seconds", "progress_line", "task_budget"]


def task_budget(request: Any, task: Any) -> float | None:
    """The most a task may take by its own timeouts: ``k`` times its run and
    evaluation timeouts (the request's, else the task's ``agent_timeout_sec``
    / ``verifier_timeout_sec`` metadata, as ``terminal`` loads them); None
    when neither is known."""
    execution = request.execution
    metadata = task.metadata or {}
    parts = [
        execution.run_timeout_seconds or metadata.get("agent_timeout_sec"),
        execution.evaluation_timeout_seconds or metadata.get("verifier_timeout_sec"),
    ]
    known = [float(p) for p in parts if isinstance(p, int | float) and not isinstance(p, bool) and p > 0]
    return sum(known) * execution.attempts.k if known else None


def eta_seconds(
    now: float,
    running: dict[str, tuple[float, float | None]],
    pending: Sequence[float | None],
    durations: Sequence[float],
    width: int,
) -> float | None:
    """Seconds until a request's tasks are done, or None when nothing says.

    A task is expected to take the mean of the finished ones' durations, or
    before any finished, its own budget (:func:`task_budget`). A running
    task has what it is expected to take left, less what it has run; one
    that ran past that has half of what its budget still allows (its own
    timeouts end it). The work left is spread over ``width`` slots (the
    tasks running now), and is at least the longest running task's rest.
    """
    mean = sum(durations) / len(durations) if durations else None
    rests = []
    for start, budget in running.values():
        ran = max(0.0, now - start)
        expected = mean if mean is not None else budget
        if expected is None:
            return None
        if ran < expected:
            rests.append(expected - ran)
        else:
            rests.append((budget - ran) / 2 if budget is not None and budget > ran else 0.0)
    queued = 0.0
    for budget in pending:
        expected = mean if mean is not None else budget
        if expected is None:
            return None
        queued += expected
    return max(max(rests, default=0.0), (sum(rests) + queued) / max(width, 1))


def _format(remaining: float) -> str:
    if remaining >= 3600:
        return f"{remaining / 3600:.1f}h"
    return f"{remaining / 60:.0f}m" if remaining >= 120 else f"{remaining:.0f}s"


def _eta(ran: int, left: int, elapsed: float) -> str:
    if left <= 0:
        return "0s"
    if ran == 0 or elapsed <= 0:
        return "?"
    return _format(left * elapsed / ran)


def _task_eta(run: Any, now: float) -> str | None:
    """The ETA from the tasks' own durations and timeouts (:func:`eta_seconds`), when known."""
    tasks = run.tasks
    running = getattr(tasks, "running", None)
    if running is None or (not running and not tasks.pending):
        return None
    pending = [task_budget(run.request, p.task) for p in tasks.pending]
    seconds = eta_seconds(now, running, pending, tasks.durations, tasks.active)
    return None if seconds is None else _format(seconds)


def _fields(run: Any, now: float) -> dict[str, Any]:
    tally = run.tally
    done = len(tally.records)
    # Rate and ETA count only tasks run in this process, not results a reuse copied.
    reused = len(run.prepared.reused) if run.prepared is not None else 0
    ran = max(0, done - reused)
    elapsed = max(0.0, now - run.started_clock) if run.life.ready else 0.0
    return {
        "name": run.request.name,
        "done": done,
        "total": run.total,
        "active": run.tasks.active,
        "retries": tally.retries,
        "errors": tally.counts["error"],
        "invalidated": tally.counts["fatal"],
        "rate": ran / elapsed if elapsed > 0 else 0.0,
        "eta": (run.total > done and _task_eta(run, now)) or _eta(ran, run.total - done, elapsed),
        "status": tally.status or ("running" if run.life.ready else "waiting"),
    }


def progress_line(run: Any, now: float) -> str:
    """One plain progress line for a request (retries, errors and invalidated when not 0)."""
    f = _fields(run, now)
    # Zero counts are left out, so that a line usually fits 80 columns.
    counts = "".join(f", {f[key]} {key}" for key in ("retries", "errors", "invalidated") if f[key])
    return (
        f"[{f['name']}] {f['done']}/{f['total']} done, {f['active']} active{counts}, "
        f"{f['rate']:.1f} tasks/s, ETA {f['eta']} ({f['status']})"
    )


class ProgressDisplay:
    def __init__(self, runs: Sequence[Any], *, stream: TextIO | None = None, interval: float = 10.0):
        self.runs = runs
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def lines(self) -> list[str]:
        now = trio.current_time()
        return [progress_line(run, now) for run in self.runs]

    async def run(self) -> None:
        """Render until cancelled (the caller cancels it when the work is done)."""
        if self.tty:
            await self._run_live()
        else:
            await self._run_plain()

    async def _run_plain(self) -> None:
        try:
            while True:
                await trio.sleep(self.interval)
                self._write_plain()
        finally:
            self._write_plain()

    def _write_plain(self) -> None:
        for line in self.lines():
            print(line, file=self.stream, flush=True)

    def _table(self) -> Any:
        from rich import box
        from rich.table import Table

        # Short headers and a light box, so a request name of ~20 characters fits 80 columns.
        table = Table(
            title="agentcompass", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True
        )
        for column in ("request", "done", "act", "retry", "err", "invalid", "rate", "ETA", "status"):
            table.add_column(column, justify="left" if column in ("request", "status") else "right", no_wrap=True)
        now = trio.current_time()
        for run in self.runs:
            f = _fields(run, now)
            table.add_row(
                f["name"],
                f"{f['done']}/{f['total']}",
                str(f["active"]),
                str(f["retries"]),
                str(f["errors"]),
                str(f["invalidated"]),
                f"{f['rate']:.1f}/s" if math.isfinite(f["rate"]) else "-",
                f["eta"],
                f["status"],
            )
        return table

    async def _run_live(self) -> None:
        from rich.console import Console
        from rich.live import Live

        console = Console(file=self.stream)
        with Live(self._table(), console=console, auto_refresh=False, transient=False) as live:
            try:
                while True:
                    await trio.sleep(0.25)
                    live.update(self._table(), refresh=True)
            finally:
                live.update(self._table(), refresh=True)
