"""``compass show``: a run directory, or the runs of a request, as plain text.

A run's table shows what is on disk even for a run that never finalized: finished tasks
from ``details/``, unfinished ones from their checkpoints, sessions still
open, and what the loader had to skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._store import LoadedRun
from .._store._run_store import run_is_live
from ._end import read_json
from ._format import (
    METRIC_COLUMNS,
    attempt_counts,
    attempt_values,
    fmt_metric,
    issue_text,
    metric_cells,
    no_score_sentence,
    primary_series,
    severity_phrase,
    sorted_for_report,
    text_table,
    worst_issue,
)

__all__ = ["TERMINAL_STATUSES", "render_run_list", "render_run_table", "run_status"]


#: Statuses a run ends with; any other (``running``, none) means it has not ended.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


def run_status(info: dict[str, Any], live: bool) -> str:
    """The status to show: ``interrupted`` for a run whose process died
    (its lock is free) before it wrote a terminal status."""
    status = info.get("status") if isinstance(info, dict) else None
    if status in TERMINAL_STATUSES:
        return str(status)
    return "running" if live else "interrupted"


def render_run_table(
    loaded: LoadedRun, metrics: dict[str, Any] | None, *, live: bool = False, total: int | None = None
) -> str:
    """Metrics (if the run wrote ``metrics.json``), then one row per task.

    ``live``: a process still holds the run (else a run that never ended is
    ``interrupted``). ``total``: the run's selected tasks (``progress.json``),
    so that tasks that never started count as unfinished too."""
    records = list(loaded.details.values())
    status = run_status(loaded.run_info, live)
    unfinished = len(loaded.checkpoints)
    if total is not None and status in ("interrupted", "running"):
        unfinished = max(unfinished, total - len(records))
    out = [
        f"Run:    {loaded.run_dir}",
        f"Status: {status}",
        f"Tasks:  {len(records)} finished ({severity_phrase(records)}), {unfinished} unfinished",
    ]
    if status == "interrupted":
        out.append(
            "The process running it died before it ended: `compass launch CONFIG --reuse` "
            "runs the unfinished tasks (and reaps what it left open)"
        )
    if loaded.open_sessions:
        out.append(f"Open sessions: {len(loaded.open_sessions)} (never closed; `compass reap` cleans them up)")
    out.append("")

    if metrics is None:
        out += ["Metrics: none (the run did not finalize)", ""]
    else:
        if metrics.get("evaluation_failed"):
            out += [no_score_sentence(metrics, records), ""]
        rows = [[name, *metric_cells(s)] for name, s in metrics.get("series", {}).items()]
        for category, block in metrics.get("categories", {}).items():
            rows += [[f"{category} / {name}", *metric_cells(s)] for name, s in block.get("series", {}).items()]
        header = ("series", "value", "reference", *METRIC_COLUMNS)
        out += [text_table(header, rows) if rows else "Metrics: no series", ""]

    primary = primary_series(metrics, records)
    rows = [
        [
            r.task_id,
            r.category or "",
            r.severity,
            attempt_counts(r.attempts),
            attempt_values(r.attempts, primary),
            issue_text(worst_issue(r), 80),
        ]
        for r in sorted_for_report(records)
    ]
    for task_id, attempts in sorted(loaded.checkpoints.items()):
        ordered = [attempts[n] for n in sorted(attempts)]
        counts = attempt_counts(ordered, by_frequency=False)
        rows.append([task_id, "", "unfinished", counts, attempt_values(ordered, primary or None), ""])
    task_header = ("task", "category", "severity", "attempts", primary or "value", "issue")
    out.append(text_table(task_header, rows) if rows else "No tasks.")

    if loaded.notes:
        out += ["", "Notes:"] + [f"- {note}" for note in loaded.notes]
    return "\n".join(out) + "\n"


def render_run_list(request_dir: Path) -> str:
    """The runs of one request directory, oldest first: id, status, tasks, primary value."""
    rows = []
    for run_dir in sorted(p for p in request_dir.iterdir() if (p / "run_info.json").is_file()):
        info = read_json(run_dir / "run_info.json") or {}
        metrics = read_json(run_dir / "metrics.json") or {}
        series = metrics.get("series", {})
        primary = next(iter(series), None)
        value = fmt_metric(series[primary].get("value")) if primary else "-"
        total = str(series[primary].get("total", "")) if primary else "-"
        # A run whose process died before it ended is "interrupted", never "running".
        status = run_status(info, run_is_live(run_dir)) if isinstance(info, dict) else "unknown"
        rows.append([run_dir.name, status, total, f"{primary}={value}" if primary else "-"])
    if not rows:
        return f"No runs in {request_dir}."
    return f"Runs of {request_dir.name} in {request_dir}:\n" + text_table(["run", "status", "tasks", "primary"], rows)
