"""The run's task index (``RunLayout.index``): one line per record the store saved.

A line is the task table's summary of the record (:func:`task_row`) plus
``bytes``, the size of the record file it summarizes; its task key is the
task id's (not written: the word ``key`` would send every line through the
full credential scan of the store's masking). A reader that lists
``details/`` takes a line for a record only while that file still has that
size in that severity's directory, else it reads the record itself: a
record saved again appends a new line, and a line appended before a crash
undid its record is never believed. The viewer reads this one file instead
of opening every record of a 10,000-task run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["task_row", "valid_row"]

_ROW_TYPES: dict[str, type | tuple[type, ...]] = {
    "task_id": str, "severity": str, "statuses": list, "codes": list, "values": list,
    "usage": dict, "timings": dict, "seconds": (int, float), "retries": int, "attempts": int,
}  # fmt: skip


def task_row(record: dict[str, Any]) -> dict[str, Any]:
    """The task table's summary of one record in its JSON form (everything
    else stays on disk). Reads any shape: what is on disk may be of an older
    or newer format, or damaged; raises ``TypeError``/``KeyError``/
    ``AttributeError``/``ValueError`` where it cannot be read at all."""
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


def valid_row(line: Any) -> bool:
    """Whether an index line read back has a row's shape (a damaged or foreign one is ignored)."""
    if not isinstance(line, dict) or not isinstance(line.get("bytes"), int):
        return False
    for name, kind in _ROW_TYPES.items():
        if not isinstance(line.get(name), kind):
            return False
    category = line.get("category")
    return (
        (category is None or isinstance(category, str))
        and all(isinstance(v, dict) for v in line["values"])
        and all(type(n) in (int, float) for totals in (line["usage"], line["timings"]) for n in totals.values())
    )
