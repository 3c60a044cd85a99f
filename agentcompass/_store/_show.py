"""``compass show RUN_DIR``: a run directory as plain text.

Shows what is on disk even for a run that never finalized: finished tasks
from ``details/``, unfinished ones from their checkpoints, sessions still
open, and what the loader had to skip.
"""

from __future__ import annotations

from typing import Any

from ._format import (
    METRIC_COLUMNS,
    attempt_counts,
    attempt_values,
    issue_text,
    metric_cells,
    no_score_sentence,
    primary_series,
    severity_phrase,
    sorted_for_report,
    text_table,
    worst_issue,
)
from ._load import LoadedRun

__all__ = ["TERMINAL_STATUSES", "render_run_table", "run_status"]


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
