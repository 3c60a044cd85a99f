"""What ``compass launch`` prints when a run ends.

A compact report per request that fits 80 columns: status and task counts,
the metrics table, the causes of the tasks that did not pass (each worst
issue's whole one-line message, wrapped, most frequent first), those tasks
(a few), and where the run directory and its full ``summary.md`` are. On a TTY it is a ``rich`` table;
elsewhere plain aligned text, so logs and CI output stay readable.
"""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path
from typing import Any

from .._observations import is_success
from .._store import load_run
from .._store._layout import RunLayout
from ._format import (
    causes,
    fmt_metric,
    fmt_value,
    issue_code,
    severity_counts,
    sorted_for_report,
    text_table,
    worst_issue,
)

__all__ = ["display_path", "read_json", "render_request_report"]

WIDTH = 80
#: Runs with more tasks than this report counts only (reading every record costs time).
_LIST_TASKS_UP_TO = 500
_SHOWN_TASKS = 8
_SHOWN_CAUSES = 5


def display_path(path: str | Path) -> Path:
    """``path`` relative to the current directory when it is under it (shorter to read and paste)."""
    path = Path(path)
    if path.is_absolute():
        try:
            return path.relative_to(Path.cwd())
        except ValueError:
            return path
    return path


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def render_request_report(name: str, status: str, run_dir: str, metrics: dict[str, Any] | None, tty: bool) -> str:
    """The end-of-run report of one request (``tty``: a rich table)."""
    directory = Path(run_dir)
    metrics = metrics if metrics and "series" in metrics else read_json(Path(RunLayout(directory).metrics))
    series: dict[str, Any] = (metrics or {}).get("series", {})
    primary = next(iter(series), None)
    records: list[Any] = []
    total = next((s.get("total", 0) for s in series.values()), 0)
    if directory.is_dir() and total <= _LIST_TASKS_UP_TO:
        records = list(load_run(directory).details.values())

    counts = severity_counts(records)
    head = f"{name}: {status}"
    if records:
        head += f", {len(records)} tasks ({counts['fatal']} invalidated, {counts['error']} with errors)"
    lines = [head]
    metric_rows = [
        [
            series_name,
            fmt_metric(s.get("value")),
            fmt_metric(s.get("reference_value")),
            str(s.get("evaluated", "")),
            str(s.get("invalidated", "")),
            str(s.get("error", "")),
            str(s.get("total", "")),
        ]
        for series_name, s in series.items()
    ]
    metric_header = ["series", "value", "reference", "evaluated", "invalidated", "errors", "total"]
    failing = [
        r
        for r in sorted_for_report(records)
        if r.severity != "normal"
        or worst_issue(r) is not None
        or (primary is not None and not any(is_success(a.values.get(primary)) for a in r.attempts))
    ]
    task_rows = [
        [
            r.task_id,
            ", ".join(fmt_value(a.values.get(primary)) for a in r.attempts) if primary else "-",
            issue_code(worst_issue(r)),
        ]
        for r in failing[:_SHOWN_TASKS]
    ]
    task_header = ["task", primary or "value", "worst issue"]
    more = len(failing) - len(task_rows)
    found = causes(failing)
    cause_rows = [[f"{n} task{'s' if n != 1 else ''}", text] for text, n in found[:_SHOWN_CAUSES]]
    more_causes = len(found) - len(cause_rows)
    footer = [f"run directory: {display_path(directory)}", "full summary:  summary.md in the run directory (or compass show)"]
    if metrics is not None and metrics.get("evaluation_failed"):
        footer.insert(0, "no official score: a task was invalidated (see reference)")

    if tty:
        return _rich(
            lines[0], metric_header, metric_rows, cause_rows, more_causes, task_header, task_rows, len(failing), more,
            footer,
        )
    out = lines
    if metric_rows:
        out += ["", _indent(text_table(metric_header, metric_rows, max_width=20))]
    if cause_rows:
        out += ["", f"  {_CAUSES_TITLE}:", *_cause_lines(cause_rows)]
        if more_causes:
            out.append(f"    ... and {more_causes} more (see the full summary)")
    if task_rows:
        out += ["", f"  not passing ({len(failing)} of {len(records)}):", _indent(text_table(task_header, task_rows))]
        if more:
            out.append(f"  ... and {more} more (see the full summary)")
    out += ["", *(f"  {line}" for line in footer)]
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


_CAUSES_TITLE = "causes, most frequent first"


def _cause_lines(rows: list[list[str]]) -> list[str]:
    """Each cause in full, wrapped under its text beside its task count."""
    count_width = max(len(count) for count, _ in rows)
    lead = " " * (4 + count_width + 2)
    out = []
    for count, text in rows:
        wrapped = textwrap.wrap(text, WIDTH - len(lead), break_on_hyphens=False) or [""]
        out.append(f"    {count.ljust(count_width)}  {wrapped[0]}")
        out.extend(lead + line for line in wrapped[1:])
    return out


def _rich(
    title: str,
    metric_header: list[str],
    metric_rows: list[list[str]],
    cause_rows: list[list[str]],
    more_causes: int,
    task_header: list[str],
    task_rows: list[list[str]],
    failing: int,
    more: int,
    footer: list[str],
) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=WIDTH, record=True, file=io.StringIO(), force_terminal=True)
    console.print(title, style="bold", markup=False, highlight=False)
    if metric_rows:
        table = Table(*metric_header, box=None, pad_edge=False, header_style="bold")
        for row in metric_rows:
            table.add_row(*row)
        console.print()
        console.print(table)
    if cause_rows:
        console.print()
        table = Table(box=None, pad_edge=False, show_header=False, title=_CAUSES_TITLE, title_justify="left")
        table.add_column(no_wrap=True)
        table.add_column(overflow="fold")  # the whole message, wrapped: never cut
        for row in cause_rows:
            table.add_row(*row)
        console.print(table)
        if more_causes:
            console.print(f"... and {more_causes} more (see the full summary)", markup=False, highlight=False)
    if task_rows:
        console.print()
        table = Table(*task_header, box=None, pad_edge=False, header_style="bold", title=f"not passing ({failing})",
                      title_justify="left")
        for row in task_rows:
            table.add_row(*row)
        console.print(table)
        if more:
            console.print(f"... and {more} more (see the full summary)", markup=False, highlight=False)
    console.print()
    for line in footer:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return console.export_text(styles=True).rstrip("\n")
