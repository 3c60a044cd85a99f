"""What counts as an observation and as a success (SPEC 6): the one definition.

An attempt's ``values`` hold whatever its benchmark returned, so anything
JSON can carry (and more) reaches the attempt strategy, the metrics, the
reports and the viewer. They all ask here:

- a *valid* value is a boolean (counted 0/1) or a finite int or float;
  ``None``, NaN, infinities, ints too large for a float, strings, lists and
  anything else are not valid (the observation is missing, never an error);
- a *success* is a valid value >= 1: ``True``, or a number >= 1.

Non-goal: coercion. ``"1"`` and ``[1]`` are not numbers here, and a
benchmark that means a number must return one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["is_success", "mean", "reduce_values", "valid_value"]


def valid_value(value: object) -> float | None:
    """``value`` as a float if it is a valid observation, else ``None``."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        return None
    return number if math.isfinite(number) else None


def is_success(value: object) -> bool:
    """True for a valid successful observation: ``True``, or a number >= 1."""
    number = valid_value(value)
    return number is not None and number >= 1


def reduce_values(values: Iterable[object], strategy: str) -> float | None:
    """One task's value for a series from its attempts' observations.

    ``avg``: the mean of the valid ones. ``pass``: 1.0 if any is a success,
    else 0.0. ``None`` when none is valid. Raises ``ValueError`` for another
    strategy.
    """
    if strategy not in ("avg", "pass"):
        raise ValueError(f"unknown attempt strategy {strategy!r}")
    values = list(values)
    numbers = [n for n in map(valid_value, values) if n is not None]
    if not numbers:
        return None
    if strategy == "pass":
        return 1.0 if any(map(is_success, values)) else 0.0
    return mean(numbers)


def mean(numbers: Sequence[float]) -> float:
    """The mean of finite ``numbers`` (not empty), itself finite: a sum
    beyond the float range is taken term by term instead."""
    try:
        return math.fsum(numbers) / len(numbers)
    except OverflowError:
        return math.fsum(n / len(numbers) for n in numbers)
