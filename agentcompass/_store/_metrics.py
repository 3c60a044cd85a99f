"""Metrics of a request (SPEC 6 and 8): per series, per category, usage.

Counting rules, per series over the request's task records:

- ``invalidated``: tasks whose severity is ``fatal`` (their values never count);
- ``evaluated``: the other tasks with at least one valid value for the series;
- ``unavailable``: the rest, so ``evaluated + unavailable + invalidated == total``;
- ``error``: tasks whose severity is ``error`` (they may still be evaluated);
- ``reference_value``: mean of the evaluated tasks' reduced values (``None`` if
  none is evaluated);
- ``value``: the same mean, the official score, but ``None`` for every series
  and category as soon as any task of the request ended fatal
  (``evaluation_failed``): an infrastructure failure means the run did not
  measure the agent, and silently dropping those tasks would flatter it.

A valid value is a boolean (counted 0/1) or a finite number; ``None``, a
missing key, NaN, infinities and anything else are not valid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from ..runtime._results import TaskRecord

__all__ = ["compute_metrics", "reduce_task", "valid_value"]

Strategy = Literal["avg", "pass"]
_STRATEGIES = ("avg", "pass")


def valid_value(value: object) -> float | None:
    """``value`` as a float if it is a valid observation, else ``None``."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def reduce_task(record: TaskRecord, series: str, strategy: Strategy) -> float | None:
    """One task's value for ``series``, from its attempts' valid values.

    ``avg``: their mean. ``pass``: 1.0 if any is a success (``True`` or a
    number >= 1), else 0.0. ``None`` when no attempt has a valid value.
    """
    if strategy not in _STRATEGIES:
        raise ValueError(f"unknown attempt strategy {strategy!r}")
    values = []
    for attempt in record.attempts:
        value = valid_value(attempt.values.get(series))
        if value is not None:
            values.append(value)
    if not values:
        return None
    if strategy == "avg":
        return math.fsum(values) / len(values)
    return 1.0 if any(v >= 1 for v in values) else 0.0


def compute_metrics(
    metric_names: tuple[str, ...], records: Sequence[TaskRecord], strategy: str
) -> dict[str, Any]:
    """The content of ``metrics.json``::

        {"evaluation_failed": bool,
         "series": {name: {"value", "reference_value", "evaluated", "unavailable",
                           "invalidated", "error", "total"}},
         "categories": {category: {"series": {name: {...}}}},
         "usage": {key: sum over all attempts' run_result.usage}}

    ``metric_names`` orders the series (the first is the primary one); when
    empty, every series seen in any attempt is reported, sorted. Tasks
    without a category count only in the overall series; categories are sorted.
    ``usage`` sums numeric entries (nested dicts recursively) of every
    attempt, fatal ones included: they cost tokens too.
    """
    if strategy not in _STRATEGIES:
        raise ValueError(f"unknown attempt strategy {strategy!r}")
    names = tuple(metric_names) or _seen_series(records)
    evaluation_failed = any(r.severity == "fatal" for r in records)
    rows: list[tuple[str, dict[str, float | None]]] = [
        (r.severity, {n: reduce_task(r, n, strategy) for n in names})  # type: ignore[arg-type]
        for r in records
    ]
    by_category: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        if record.category is not None:
            by_category.setdefault(record.category, []).append(index)
    return {
        "evaluation_failed": evaluation_failed,
        "series": _series_block(names, rows, evaluation_failed),
        "categories": {
            category: {
                "series": _series_block(
                    names, [rows[i] for i in by_category[category]], evaluation_failed
                )
            }
            for category in sorted(by_category)
        },
        "usage": _sum_usage(records),
    }


def _seen_series(records: Sequence[TaskRecord]) -> tuple[str, ...]:
    return tuple(sorted({name for r in records for a in r.attempts for name in a.values}))


def _series_block(
    names: tuple[str, ...],
    rows: Sequence[tuple[str, dict[str, float | None]]],
    evaluation_failed: bool,
) -> dict[str, dict[str, Any]]:
    block = {}
    for name in names:
        evaluated = unavailable = invalidated = error = 0
        values = []
        for severity, reduced in rows:
            if severity == "fatal":
                invalidated += 1
                continue
            if severity == "error":
                error += 1
            value = reduced[name]
            if value is None:
                unavailable += 1
            else:
                evaluated += 1
                values.append(value)
        mean = math.fsum(values) / len(values) if values else None
        block[name] = {
            "value": None if evaluation_failed else mean,
            "reference_value": mean,
            "evaluated": evaluated,
            "unavailable": unavailable,
            "invalidated": invalidated,
            "error": error,
            "total": len(rows),
        }
    return block


def _sum_usage(records: Sequence[TaskRecord]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for record in records:
        for attempt in record.attempts:
            if attempt.run_result is not None:
                _add_usage(total, attempt.run_result.usage)
    return total


def _add_usage(total: dict[str, Any], usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                previous = total.get(key, 0)
                if isinstance(previous, (int, float)):
                    total[key] = previous + value
        elif isinstance(value, dict):
            nested = total.setdefault(key, {})
            if isinstance(nested, dict):
                _add_usage(nested, value)
