"""Token counts and cost of model calls, whatever the API (SPEC 12 "Budgets and cost").

:func:`call_usage` reads one reply's ``usage`` object in any API's shape
into the runtime's: ``prompt_tokens`` (OpenAI's ``prompt_tokens`` or
``input_tokens``; Anthropic's ``input_tokens`` plus its cache reads and
writes, which it counts apart), ``completion_tokens``, ``cached_tokens``
(the prompt tokens read from the upstream's cache, when it says so) and
``cost_usd`` when the upstream reports a cost (OpenRouter's ``usage.cost``).

:func:`priced` gives a call its cost: from ``ModelSpec.pricing`` when the
user set one (the user's table wins, so a run reads the same on every
provider), else the cost the upstream reported, else none: an unknown cost
is absent on a call and ``null`` in a total, never 0. :func:`total_cost`
sums attempts' costs so: one attempt of unknown cost makes the total unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..runtime._values import Pricing

__all__ = ["call_usage", "cost_of", "priced", "total_cost"]

#: Digits kept of a cost: far below a cent, far above float noise.
_DIGITS = 10


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def call_usage(raw: Any) -> dict[str, Any]:
    """One call's usage from the reply's ``usage`` object (anything else: zeros)."""
    raw = raw if isinstance(raw, dict) else {}
    if "prompt_tokens" in raw or "completion_tokens" in raw:
        prompt, completion = _count(raw.get("prompt_tokens")), _count(raw.get("completion_tokens"))
        details = raw.get("prompt_tokens_details")
    else:
        prompt, completion = _count(raw.get("input_tokens")), _count(raw.get("output_tokens"))
        details = raw.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    if "cache_read_input_tokens" in raw or "cache_creation_input_tokens" in raw:
        # Anthropic counts cache reads and writes beside input_tokens, not in it.
        read = _count(raw.get("cache_read_input_tokens"))
        prompt += read + _count(raw.get("cache_creation_input_tokens"))
        cached = read
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached:
        usage["cached_tokens"] = min(cached, prompt)
    cost = raw.get("cost")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost >= 0:
        usage["cost_usd"] = round(float(cost), _DIGITS)
    return usage


def cost_of(usage: dict[str, Any], pricing: Pricing) -> float:
    """The USD cost of a call's ``usage`` at ``pricing`` (per million tokens)."""
    prompt = usage.get("prompt_tokens", 0)
    cached = min(usage.get("cached_tokens", 0), prompt)
    cached_rate = pricing.input if pricing.cached_input is None else pricing.cached_input
    dollars = (
        (prompt - cached) * pricing.input + cached * cached_rate + usage.get("completion_tokens", 0) * pricing.output
    )
    return round(dollars / 1_000_000, _DIGITS)


def priced(usage: dict[str, Any], pricing: Pricing | None) -> dict[str, Any]:
    """``usage`` with its ``cost_usd``: at ``pricing`` when given, else as the upstream reported it (or absent)."""
    if pricing is None:
        return usage
    return {**usage, "cost_usd": cost_of(usage, pricing)}


def total_cost(costs: Iterable[Any]) -> float | None:
    """The sum of ``costs``; ``None`` when there is none or one is not a number."""
    values = []
    for cost in costs:
        if not isinstance(cost, (int, float)) or isinstance(cost, bool) or not math.isfinite(cost):
            return None
        values.append(cost)
    return round(math.fsum(values), _DIGITS) if values else None
