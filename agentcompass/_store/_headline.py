"""What the official value rests on (SPEC 12): the ``headline`` block of ``metrics.json``.

A mean over tasks reads the same whether every attempt ran clean or half of
them stopped at a budget or an agent error, so the readers (``summary.md``,
``compass show``, the viewer) print beside the value how many attempts were
invalidated (a FATAL: not counted), errored (an ERROR: counted, scored on
what the agent left) and limited (stopped at ``execution.limits``, a kind
of errored), and which share of the primary series' score comes from tasks
with an errored attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._observations import reduce_values
from ..runtime._results import TaskRecord

__all__ = ["headline"]


def headline(records: Sequence[TaskRecord], primary: str | None, strategy: Any) -> dict[str, Any]:
    """``{"series", "attempts", "invalidated", "errored", "limited", "score_share_errored"}``.

    ``score_share_errored``: the primary series' summed task values of the
    counted (not FATAL) tasks that have an errored attempt, over the summed
    values of all counted tasks; ``None`` when that sum is 0.
    """
    attempts = invalidated = errored = limited = 0
    total = flawed_total = 0.0
    for record in records:
        flawed = False
        for attempt in record.attempts:
            attempts += 1
            severities = {issue.severity for issue in attempt.issues}
            if "fatal" in severities:
                invalidated += 1
            elif "error" in severities:
                errored += 1
                flawed = True
            if any(issue.code == "harness_limit_reached" for issue in attempt.issues):
                limited += 1
        if primary is None or record.severity == "fatal":
            continue
        value = reduce_values((a.values.get(primary) for a in record.attempts), strategy)
        if value is None:
            continue
        total += value
        if flawed:
            flawed_total += value
    return {
        "series": primary,
        "attempts": attempts,
        "invalidated": invalidated,
        "errored": errored,
        "limited": limited,
        "score_share_errored": round(flawed_total / total, 4) if total else None,
    }
