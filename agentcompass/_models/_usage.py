"""Token usage and cost of one attempt, summed over its model calls."""

from __future__ import annotations

from typing import Any

import attrs

from ._cost import total_cost

__all__ = ["ModelUsage"]


@attrs.define
class ModelUsage:
    """Running totals of one attempt's model calls.

    ``calls`` counts the calls that returned a usable reply (a call that
    failed returned no usage to count). :meth:`to_dict` is the attempt's
    ``RunResult.usage`` (``prompt_tokens``, ``completion_tokens``, ``calls``,
    ``cost_usd``), which the request's ``metrics.json`` ``usage`` sums.
    ``cost_usd`` is the sum of the calls' costs, ``None`` when a call's cost
    is unknown (no ``ModelSpec.pricing`` and no cost from the upstream) or
    there was no call: never a 0 that was not measured.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    costs: list[Any] = attrs.Factory(list)

    def add(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens += usage.get("prompt_tokens", 0)
        self.completion_tokens += usage.get("completion_tokens", 0)
        self.calls += 1
        self.costs.append(usage.get("cost_usd"))

    @property
    def cost_usd(self) -> float | None:
        return total_cost(self.costs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "calls": self.calls,
            "cost_usd": self.cost_usd,
        }
