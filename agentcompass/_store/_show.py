"""``compass show RUN_DIR``: a run directory as plain text.

Shows what is on disk even for a run that never finalized: finished tasks
from ``details/``, unfinished ones from their checkpoints, sessions still
open, and what the loader had to skip.
"""

from __future__ import annotations

from typing import Any

from ._format import (
    METRIC_COLUMNS,
    MISSING,
    attempt_counts,
    attempt_values,
    fatal_count,
    fmt_metric,
    fmt_value,
    issue_text,
    no_score_sentence,
    primary_series,
    severity_counts,
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
    counts = severity_counts(records)
    info = loaded.run_info
    status = run_status(info, live)
    unfinished = len(loaded.checkpoints)
    if total is not None and status in ("interrupted", "running"):
        unfinished = max(unfinished, total - len(records))
    out = [
        f"Run:    {loaded.run_dir}",
        f"Status: {status}",
        (
            f"Tasks:  {len(records)} finished ({counts['fatal']} invalidated, {counts['error']} with errors,"
            f" {counts['normal']} normal), {unfinished} unfinished"
        ),
    ]
    if status == "interrupted":
        out.append(
            "The process running it died before it ended: `compass launch CONFIG --reuse` "
            "runs the unfinished tasks (and reaps what it left open)"
        )
    if loaded.open_sessions:
        out.append(
            f"Open sessions: {len(loaded.open_sessions)} (never closed; `compass reap` cleans them up)"
        )
    out.append("")

    if metrics is None:
        out += ["Metrics: none (the run did not finalize)", ""]
    else:
        if metrics.get("evaluation_failed"):
            out += [no_score_sentence(fatal_count(metrics, records)), ""]
        header = ("series", "value", "reference", *METRIC_COLUMNS)
        rows = [
            [name, fmt_metric(s.get("value")), fmt_metric(s.get("reference_value"))]
            + [str(s.get(c, "")) for c in METRIC_COLUMNS]
            for name, s in metrics.get("series", {}).items()
        ]
        for category, block in metrics.get("categories", {}).items():
            rows += [
                [f"{category} / {name}", fmt_metric(s.get("value")), fmt_metric(s.get("reference_value"))]
                + [str(s.get(c, "")) for c in METRIC_COLUMNS]
                for name, s in block.get("series", {}).items()
            ]
        out += [text_table(header, rows) if rows else "Metrics: no series", ""]

    primary = primary_series(metrics, records)
    rows = [
        [
            r.task_id,
            r.category or "",
            r.severity,
            attempt_counts(r),
            attempt_values(r, primary),
            issue_text(worst_issue(r), 80),
        ]
        for r in sorted_for_report(records)
    ]
    for task_id, attempts in sorted(loaded.checkpoints.items()):
        ordered = [attempts[n] for n in sorted(attempts)]
        by_status: dict[str, int] = {}
        for a in ordered:
            by_status[a.status] = by_status.get(a.status, 0) + 1
        rows.append(
            [
                task_id,
                "",
                "unfinished",
                ", ".join(f"{n} {status}" for status, n in by_status.items()) or MISSING,
                ", ".join(fmt_value(a.values.get(primary)) for a in ordered) if primary else MISSING,
                "",
            ]
        )
    task_header = ("task", "category", "severity", "attempts", primary or "value", "issue")
    out.append(text_table(task_header, rows) if rows else "No tasks.")

    if loaded.notes:
        out += ["", "Notes:"] + [f"- {note}" for note in loaded.notes]
    return "\n".join(out) + "\n"
