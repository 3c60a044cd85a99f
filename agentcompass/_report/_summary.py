"""``summary.md``: the human summary of one request run.

Sections: title and status; a plain statement when there is no official
score; the metrics table (overall, then per category); summed usage; one row
per task, fatal tasks first, then error, then normal. Built with one join so
that a few thousand tasks stay cheap.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..runtime._results import TaskRecord
from ._format import (
    METRIC_COLUMNS,
    MISSING,
    attempt_values,
    headline_sentence,
    issue_text,
    metric_cells,
    no_score_sentence,
    one_line,
    primary_series,
    severity_phrase,
    sorted_for_report,
    worst_issue,
)

__all__ = ["render_summary"]

_METRIC_HEADER = ("series", "value", "reference value", *METRIC_COLUMNS)


def render_summary(
    request_name: str,
    run_dir: Path,
    metrics: dict[str, Any],
    records: Sequence[TaskRecord],
    status: str,
) -> str:
    """The Markdown of ``summary.md`` for ``metrics`` (see ``compute_metrics``)."""
    out = [
        f"# {md(request_name)}",
        "",
        f"- **Status:** {md(status)}",
        f"- **Run directory:** {code(str(run_dir))}",
        f"- **Tasks:** {len(records)} ({severity_phrase(records)})",
        "",
    ]
    if metrics.get("evaluation_failed"):
        out += [no_score_sentence(metrics, records), ""]
    honest = headline_sentence(metrics)
    if honest:
        out += [f"- **Beside the score:** {md(honest)}", ""]

    out += ["## Metrics", ""]
    series = metrics.get("series", {})
    if series:
        out += _table(_METRIC_HEADER, [[md(name), *metric_cells(s)] for name, s in series.items()])
    else:
        out.append("No metric series.")
    out.append("")
    categories = metrics.get("categories", {})
    if categories:
        out += ["### By category", ""]
        rows = [
            [md(category), md(name), *metric_cells(s)]
            for category, block in categories.items()
            for name, s in block.get("series", {}).items()
        ]
        out += [*_table(("category", *_METRIC_HEADER), rows), ""]

    usage = metrics.get("usage")
    if usage:
        out += ["## Usage", ""]
        out += [*_table(("usage", "total"), list(_usage_rows(usage))), ""]

    primary = primary_series(metrics, records)
    out += ["## Tasks", ""]
    if records:
        header = ("task", "category", "severity", "attempts", primary or "value", "issue")
        rows = [
            [
                code(r.task_id),
                md(r.category) if r.category is not None else "",
                r.severity,
                ", ".join(a.status for a in r.attempts) or MISSING,
                attempt_values(r.attempts, primary),
                md(issue_text(worst_issue(r))),
            ]
            for r in sorted_for_report(records)
        ]
        out += _table(header, rows)
    else:
        out.append("No task finished.")
    out.append("")
    return "\n".join(out)


def _usage_rows(usage: dict[str, Any], prefix: str = "") -> Iterator[list[str]]:
    for key, value in usage.items():
        if isinstance(value, dict):
            yield from _usage_rows(value, f"{prefix}{key}.")
        elif key == "cost_usd":
            yield [md(f"{prefix}{key}"), "unknown (no pricing)" if value is None else f"${value:.6f}"]
        elif isinstance(value, (int, float)):
            yield [md(f"{prefix}{key}"), f"{value:,}" if isinstance(value, int) else f"{value:g}"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def md(text: str) -> str:
    """Plain text safe inside a Markdown table cell."""
    return (
        one_line(text)
        .replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace("*", "\\*")
        .replace("`", "\\`")
    )


def code(text: str) -> str:
    """``text`` as a code span: shown verbatim, whatever characters it has."""
    text = one_line(text).replace("|", "\\|")
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
