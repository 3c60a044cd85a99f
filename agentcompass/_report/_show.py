"""``compass show``: a run directory, or the runs of a request, as plain
text or (``--json``) one JSON document for scripts.

A run's table shows what is on disk even for a run that never finalized: finished tasks
from ``details/``, unfinished ones from their checkpoints, sessions still
open, and what the loader had to skip.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from .._store import LoadedRun, load_run
from .._store._layout import RunLayout, has_run_info
from .._store._run_store import run_is_live
from ._end import display_path, read_json
from ._format import (
    METRIC_COLUMNS,
    MISSING,
    attempt_counts,
    attempt_values,
    fmt_metric,
    headline_sentence,
    issue_text,
    metric_cells,
    no_score_sentence,
    primary_series,
    severity_counts,
    severity_phrase,
    sorted_for_report,
    text_table,
    worst_issue,
)

__all__ = [
    "TERMINAL_STATUSES",
    "overview",
    "render_overview",
    "render_run_list",
    "render_run_table",
    "run_overview",
    "run_status",
]


#: Statuses a run ends with; any other (``running``, none) means it has not ended.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


def run_status(info: dict[str, Any], live: bool) -> str:
    """The status to show: ``interrupted`` for a run whose process died
    (its lock is free) before it wrote a terminal status."""
    status = info.get("status") if isinstance(info, dict) else None
    if status in TERMINAL_STATUSES:
        return str(status)
    return "running" if live else "interrupted"


def run_overview(run_dir: Path) -> tuple[LoadedRun, dict[str, Any]]:
    """What ``compass show`` says of ``run_dir``, read from its files: the
    loaded run and the document ``compass show --json`` prints (see
    :func:`overview`)."""
    metrics = read_json(Path(RunLayout(run_dir).metrics))
    loaded = load_run(run_dir)
    info = loaded.run_info if isinstance(loaded.run_info, dict) else {}
    total = info.get("tasks")
    return loaded, overview(
        loaded,
        metrics if isinstance(metrics, dict) else None,
        live=run_is_live(run_dir),
        total=total if isinstance(total, int) else None,
    )


def overview(
    loaded: LoadedRun, metrics: dict[str, Any] | None, *, live: bool = False, total: int | None = None
) -> dict[str, Any]:
    """The run's status, task counts, metrics (None: the run did not
    finalize) and paths.

    ``live``: a process still holds the run (else a run that never ended is
    ``interrupted``). ``total``: the run's selected tasks, so that tasks that
    never started count as unfinished too. ``final`` is true only for a run
    that ended with every selected task finished: the metrics of any other
    (running, interrupted, or cancelled or timed out with tasks left) count
    only what finished. ``resume`` is then the command that runs the rest;
    ``CONFIG`` stands for the config file it was launched with, which the
    run directory does not record."""
    info = loaded.run_info if isinstance(loaded.run_info, dict) else {}
    status = run_status(info, live)
    records = list(loaded.details.values())
    unfinished = len(loaded.checkpoints)
    if total is not None:
        unfinished = max(unfinished, total - len(records))
    final = status in TERMINAL_STATUSES and unfinished == 0
    counts = severity_counts(records)
    shown = display_path(loaded.run_dir)
    resume = None
    if not final and status != "running" and info.get("prepared"):
        resume = shlex.join(["compass", "launch", "CONFIG", "--reuse", str(shown)])
    request = info.get("request")
    return {
        "run_dir": str(shown),
        "request": request.get("name") if isinstance(request, dict) else None,
        "status": status,
        "final": final,
        "started_at": info.get("started_at"),
        "ended_at": info.get("ended_at"),
        "tasks": {
            "total": total,
            "finished": len(records),
            "unfinished": unfinished,
            "invalidated": counts["fatal"],
            "error": counts["error"],
            "normal": counts["normal"],
        },
        "metrics": metrics,
        "open_sessions": len(loaded.open_sessions),
        "resume": resume,
        "paths": {
            name: str(shown / RunLayout(loaded.run_dir).relative(path))
            for name, path in RunLayout(loaded.run_dir).shown().items()
            if os.path.exists(path)
        },
        "notes": list(loaded.notes),
    }


def render_run_table(
    loaded: LoadedRun, metrics: dict[str, Any] | None, *, live: bool = False, total: int | None = None
) -> str:
    """Status and task counts, metrics (if the run wrote ``metrics.json``),
    then one row per task. A run whose score is not final says so and how
    to resume it (arguments as for :func:`overview`)."""
    return render_overview(loaded, overview(loaded, metrics, live=live, total=total))


def render_overview(loaded: LoadedRun, view: dict[str, Any]) -> str:
    """The text of ``compass show`` for ``view`` (from :func:`overview`)."""
    records = list(loaded.details.values())
    status, tasks, metrics = view["status"], view["tasks"], view["metrics"]
    unfinished = tasks["unfinished"]
    out = [
        f"Run:    {loaded.run_dir}",
        f"Status: {status}" + (" (the process running it died before it ended)" if status == "interrupted" else ""),
        f"Tasks:  {len(records)} finished ({severity_phrase(records)}), {unfinished} unfinished",
    ]
    partial = not view["final"] and unfinished > 0
    if partial:
        of = f" of {tasks['total']}" if tasks["total"] is not None else ""
        out.append(f"Partial: {unfinished}{of} task(s) unfinished; not a final score")
    if view["resume"] is not None:
        out += [f"Resume: {view['resume']}", "        (CONFIG: the config file it was launched with; only what is left runs)"]
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
        # Unfinished tasks count as unavailable: the values are of what finished.
        header = ("series", "partial value" if partial else "value", "reference", *METRIC_COLUMNS)
        out += [text_table(header, rows) if rows else "Metrics: no series", ""]
        honest = headline_sentence(metrics)
        if honest:
            out += [f"Beside the score: {honest}"]
        cost = (metrics.get("usage") or {}).get("cost_usd", MISSING)
        if cost is not MISSING:
            out += [f"Cost:   {'unknown (no pricing)' if cost is None else f'${cost:.6f}'}"]
        if honest or cost is not MISSING:
            out.append("")

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
    for run_dir in sorted(p for p in request_dir.iterdir() if has_run_info(p)):
        layout = RunLayout(run_dir)
        info = read_json(Path(layout.run_info)) or {}
        metrics = read_json(Path(layout.metrics)) or {}
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
