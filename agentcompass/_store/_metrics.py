"""Metrics of a request (SPEC 6 and 8): per series, per category, usage.

Counting rules, per series over the request's task records:

- ``invalidated``: tasks whose severity is ``fatal`` (their values never count);
- ``evaluated``: the other tasks with at least one valid value for the series;
- ``unavailable``: the rest, so ``evaluated + unavailable + invalidated == total``;
- ``error``: tasks whose severity is ``error`` (they may still be evaluated);
- ``reference_value``: mean of the evaluated tasks' reduced values (``None`` if
  none is evaluated);
- ``stderr``: the standard error of that mean, the sample standard deviation
  of the evaluated tasks' values over the square root of their number
  (``None`` with fewer than two), reported beside every value as Inspect AI
  does;
- ``value``: the same mean, the official score, but ``None`` for every series
  and category as soon as any task of the request ended fatal
  (``evaluation_failed``): an infrastructure failure means the run did not
  measure the agent, and silently dropping those tasks would flatter it.

A valid value and a success are as ``agentcompass._observations`` defines
them (a boolean counted 0/1 or a finite number; a success is >= 1); a
missing key counts as ``None``, not valid.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from .._models._cost import total_cost
from .._observations import mean, reduce_values
from ..runtime._results import TaskRecord
from ._headline import headline

__all__ = ["compute_metrics", "reduce_attempt_values", "reduce_task", "standard_error"]

Strategy = Literal["avg", "pass"]
_STRATEGIES = ("avg", "pass")


def reduce_task(record: TaskRecord, series: str, strategy: Strategy) -> float | None:
    """One task's value for ``series``, from its attempts' valid values.

    ``avg``: their mean. ``pass``: 1.0 if any is a success (``True`` or a
    number >= 1), else 0.0. ``None`` when no attempt has a valid value.
    """
    return reduce_attempt_values((a.values for a in record.attempts), series, strategy)


def reduce_attempt_values(values: Iterable[Mapping[str, Any]], series: str, strategy: Strategy) -> float | None:
    """:func:`reduce_task` over attempts' ``values`` mappings (one per
    attempt, as written in a record), for readers of records as plain JSON."""
    return reduce_values((v.get(series) if isinstance(v, Mapping) else None for v in values), strategy)


def compute_metrics(metric_names: tuple[str, ...], records: Sequence[TaskRecord], strategy: str) -> dict[str, Any]:
    """The content of ``metrics.json``::

        {"evaluation_failed": bool,
         "series": {name: {"value", "reference_value", "stderr", "evaluated",
                           "unavailable", "invalidated", "error", "total"}},
         "categories": {category: {"series": {name: {...}}}},
         "usage": {key: sum over all attempts' run_result.usage}}

    ``metric_names`` orders the series (the first is the primary one); a
    series seen in an attempt beyond them follows, sorted (``terminal``: each
    numeric key of a ``reward.json``). Tasks
    without a category count only in the overall series; categories are sorted.
    ``usage`` sums numeric entries (nested dicts recursively) of every
    attempt, fatal ones included: they cost tokens too; its ``cost_usd`` is
    the sum of the attempts' that made a call, ``null`` when one of them is
    (a cost unknown is never counted as 0).
    """
    if strategy not in _STRATEGIES:
        raise ValueError(f"unknown attempt strategy {strategy!r}")
    seen = {name for r in records for a in r.attempts for name in a.values}
    names = tuple(metric_names) + tuple(sorted(seen - set(metric_names)))
    failed = any(r.severity == "fatal" for r in records)
    # Each task reduced once: (severity, series -> value), for the overall and its category's block.
    rows = [(r.severity, {n: reduce_task(r, n, strategy) for n in names}) for r in records]  # type: ignore[arg-type]
    by_category: dict[str, list[tuple[str, dict[str, float | None]]]] = {}
    usage: dict[str, Any] = {}
    costs = []
    for record, row in zip(records, rows, strict=True):
        if record.category is not None:
            by_category.setdefault(record.category, []).append(row)
        for attempt in record.attempts:
            if attempt.run_result is not None:
                _add_usage(usage, attempt.run_result.usage)
                if _called(attempt.run_result.usage):
                    costs.append(attempt.run_result.usage.get("cost_usd"))
    if "calls" in usage:
        usage["cost_usd"] = total_cost(costs)
    return {
        "evaluation_failed": failed,
        "series": _series(names, rows, failed),
        "categories": {c: {"series": _series(names, by_category[c], failed)} for c in sorted(by_category)},
        "usage": usage,
        "headline": headline(records, names[0] if names else None, strategy),
    }


def _series(
    names: tuple[str, ...], rows: Sequence[tuple[str, dict[str, float | None]]], failed: bool
) -> dict[str, dict[str, Any]]:
    block = {}
    for name in names:
        counted = [(severity, reduced[name]) for severity, reduced in rows if severity != "fatal"]
        values = [value for _, value in counted if value is not None]
        average = mean(values) if values else None
        block[name] = {
            "value": None if failed else average,
            "reference_value": average,
            "stderr": standard_error(values, average),
            "evaluated": len(values),
            "unavailable": len(counted) - len(values),
            "invalidated": len(rows) - len(counted),
            "error": sum(1 for severity, _ in counted if severity == "error"),
            "total": len(rows),
        }
    return block


def standard_error(values: Sequence[float], average: float | None) -> float | None:
    """The standard error of ``average``, the mean of finite ``values``:
    ``sqrt(sum((v - average)**2) / (n - 1) / n)``; ``None`` for fewer than
    two values or where it is beyond the float range."""
    n = len(values)
    if n < 2 or average is None:
        return None
    # Deviations scaled by the largest, so that their squares cannot overflow.
    deviations = [v - average for v in values]
    scale = max(abs(d) for d in deviations)
    if scale == 0:
        return 0.0
    if not math.isfinite(scale):
        return None
    spread = math.sqrt(math.fsum((d / scale) ** 2 for d in deviations) / (n - 1) / n) * scale
    return spread if math.isfinite(spread) else None


def _called(usage: Any) -> bool:
    return isinstance(usage, dict) and isinstance(usage.get("calls"), int) and usage["calls"] > 0


def _add_usage(total: dict[str, Any], usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    for key, value in usage.items():
        if isinstance(value, dict):
            nested = total.setdefault(key, {})
            if isinstance(nested, dict):  # else a number under this key already
                _add_usage(nested, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            previous = total.get(key, 0)
            if isinstance(previous, (int, float)):
                total[key] = previous + value
