"""Cell formatting shared by ``summary.md`` and ``compass show``."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..runtime._results import SEVERITY_RANK, AttemptRecord, Issue, TaskRecord

__all__ = [
    "METRIC_COLUMNS",
    "attempt_counts",
    "attempt_values",
    "causes",
    "fmt_metric",
    "fmt_value",
    "headline_sentence",
    "issue_code",
    "issue_text",
    "metric_cells",
    "no_score_sentence",
    "primary_series",
    "severity_counts",
    "severity_phrase",
    "sorted_for_report",
    "text_table",
    "worst_issue",
]

#: Per-series count columns, in report order.
METRIC_COLUMNS = ("evaluated", "unavailable", "invalidated", "error", "total")
_TASK_ORDER = {"fatal": 0, "error": 1, "normal": 2}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
MISSING = "-"


def fmt_metric(value: Any) -> str:
    """A metric value: four decimals, ``-`` for null."""
    if value is None:
        return MISSING
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4f}"
    return str(value)


def fmt_value(value: Any) -> str:
    """One attempt's raw value: ``true``/``false``, a short number, ``-`` for null."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return one_line(str(value))


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` without control characters, cut to ``limit`` with an ellipsis."""
    text = _CONTROL.sub(" ", text).strip()
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def primary_series(metrics: dict[str, Any] | None, records: Sequence[TaskRecord]) -> str | None:
    """The first series of ``metrics``, else the first value any attempt reported."""
    if metrics and metrics.get("series"):
        return next(iter(metrics["series"]))
    for record in records:
        for attempt in record.attempts:
            for name in attempt.values:
                return name
    return None


def attempt_counts(attempts: Sequence[AttemptRecord], by_frequency: bool = True) -> str:
    """Attempt statuses as counts, ``2 completed, 1 run_error``: most
    frequent first, else in order of first appearance."""
    counts = Counter(a.status for a in attempts)
    items = counts.most_common() if by_frequency else counts.items()
    return ", ".join(f"{n} {status}" for status, n in items) or MISSING


def attempt_values(attempts: Sequence[AttemptRecord], series: str | None) -> str:
    """Each attempt's value of ``series``."""
    if series is None or not attempts:
        return MISSING
    return ", ".join(fmt_value(a.values.get(series)) for a in attempts)


def metric_cells(series: dict[str, Any]) -> list[str]:
    """One series of ``metrics.json`` as table cells: value, reference value, counts.

    The mean shown first carries its standard error, ``0.8333 ± 0.1124``: the
    value's, or the reference value's when there is no official value."""
    value, reference = series.get("value"), series.get("reference_value")
    with_error = f" ± {fmt_metric(series['stderr'])}" if series.get("stderr") is not None else ""
    cells = [fmt_metric(value) + (with_error if value is not None else ""), fmt_metric(reference)]
    if value is None and reference is not None:
        cells[1] += with_error
    return [*cells, *(str(series.get(column, "")) for column in METRIC_COLUMNS)]


def worst_issue(record: TaskRecord) -> Issue | None:
    """The first issue of the most severe kind, over all attempts."""
    issues = [issue for attempt in record.attempts for issue in attempt.issues]
    return max(issues, key=lambda issue: SEVERITY_RANK[issue.severity], default=None)


def issue_text(issue: Issue | None, limit: int | None = 120) -> str:
    if issue is None:
        return ""
    text = f"{issue.severity.upper()} {issue.code}"
    if issue.message:
        text += f": {issue.message}"
    return one_line(text, limit)


def issue_code(issue: Issue | None) -> str:
    """``FATAL model_unreachable``: an issue without its message."""
    return "" if issue is None else f"{issue.severity.upper()} {one_line(issue.code)}"


def causes(records: Sequence[TaskRecord]) -> list[tuple[str, int]]:
    """Each distinct worst issue of ``records`` as its whole one-line text
    (:func:`issue_text` uncut) and the number of tasks it is the worst issue
    of: most frequent first, then the most severe, then in report order.
    Texts that differ only in the task's own name (a pull of
    ``org/<task>:tag`` failing for every task) are one cause, the name
    shown as ``<task>``; a cause of one task keeps its text as it is."""
    counts: Counter[str] = Counter()
    rank: dict[str, int] = {}
    first: dict[str, str] = {}
    for record in sorted_for_report(records):
        issue = worst_issue(record)
        if issue is not None:
            text = issue_text(issue, limit=None)
            key = _without_task(text, record.task_id)
            counts[key] += 1
            rank.setdefault(key, SEVERITY_RANK[issue.severity])
            first.setdefault(key, text)
    order = {key: i for i, key in enumerate(counts)}
    found = sorted(counts.items(), key=lambda item: (-item[1], -rank[item[0]], order[item[0]]))
    return [(key if n > 1 else first[key], n) for key, n in found]


def _without_task(text: str, task_id: str) -> str:
    """``text`` with the task's id, as written and as an image or file name
    would spell it (lowercase, ``-`` for other characters), as ``<task>``."""
    spellings = {task_id, task_id.lower(), re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("._-")}
    for spelling in sorted(spellings, key=len, reverse=True):
        if len(spelling) >= 3:
            text = text.replace(spelling, "<task>")
    return text


def sorted_for_report(records: Sequence[TaskRecord]) -> list[TaskRecord]:
    """Fatal tasks first, then error, then normal; by task id within each
    (``summary.md`` and ``compass show`` list tasks in the same order)."""
    return sorted(records, key=lambda r: (_TASK_ORDER.get(r.severity, 3), r.task_id))


def severity_counts(records: Sequence[TaskRecord]) -> dict[str, int]:
    counts = {"fatal": 0, "error": 0, "normal": 0}
    for record in records:
        counts[record.severity] = counts.get(record.severity, 0) + 1
    return counts


def severity_phrase(records: Sequence[TaskRecord]) -> str:
    counts = severity_counts(records)
    return f"{counts['fatal']} invalidated, {counts['error']} with errors, {counts['normal']} normal"


def headline_sentence(metrics: dict[str, Any]) -> str | None:
    """What the official value rests on (``metrics.json`` ``headline``), or None for a run without it."""
    block = metrics.get("headline")
    if not isinstance(block, dict) or not block.get("attempts"):
        return None
    text = (
        f"of {block['attempts']} attempts, {block.get('invalidated', 0)} invalidated (FATAL, not counted), "
        f"{block.get('errored', 0)} errored (ERROR, scored as left), {block.get('limited', 0)} stopped at a limit"
    )
    share = block.get("score_share_errored")
    if isinstance(share, (int, float)) and block.get("series"):
        text += f"; {share:.0%} of the {block['series']} score rests on tasks with an errored attempt"
    return text


def no_score_sentence(metrics: dict[str, Any], records: Sequence[TaskRecord]) -> str:
    """Why there is no official score; the count comes from the records, else
    from the metrics' counts."""
    count = sum(1 for r in records if r.severity == "fatal")
    if not records:
        count = max((s.get("invalidated", 0) for s in metrics.get("series", {}).values()), default=0)
    return (
        f"No official score: {count} task(s) invalidated (a FATAL left: the infrastructure failed); "
        "reference values exclude them."
    )


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], max_width: int = 60) -> str:
    """A plain-text table with aligned columns; long cells are cut with an ellipsis."""
    cells = [[one_line(c, max_width) for c in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
