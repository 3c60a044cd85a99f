"""The budgets of one attempt's run, enforced on the wire (SPEC 12 "Budgets and cost").

A :class:`Meter` counts one try's model calls, their tokens and their cost
against ``ExecutionSpec.limits``. The runtime opens one around each run
(:func:`metering`, in the try) and makes it the current one for that run's
tasks (a context variable, inherited by the tasks the run starts); the two
roads to the model consult it before every call: the runtime's own client
(``EndpointClient``, which ``react``, ``qa`` and plugin harnesses call)
raises ERROR ``harness_limit_reached`` instead of posting, and the model
gateway answers the agent with its API's 429 instead of forwarding. Either
way the call never reaches the upstream.

Semantics: a call is admitted while every budget has room, and counted when
admitted (so concurrent calls cannot slip past ``model_calls``); its tokens
and cost are added when its reply arrives. So ``tokens`` and ``cost_usd``
may end above their budget by what the calls in flight at the crossing used,
never by a call made after it. Don't confuse this with the run timeout: the
meter knows nothing of time.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import attrs

from ..runtime._results import Issue
from ..runtime._values import Limits

__all__ = ["Meter", "current_meter", "metering"]

_CURRENT: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("agentcompass_meter", default=None)


@attrs.define(eq=False)
class Meter:
    """One try's use of its budgets (see the module docstring)."""

    limits: Limits
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    #: The first limit a call was refused at, and how many were.
    reached: str | None = None
    refused: int = 0

    def tighten(self, model_calls: int | None) -> None:
        """Lower ``model_calls`` to an alias's value (``max_model_calls``)."""
        self.limits = self.limits.tightened(model_calls)

    def counts_usage(self) -> bool:
        """Whether a budget needs every call's tokens (``tokens``, ``cost_usd``)."""
        return self.limits.tokens is not None or self.limits.cost_usd is not None

    def exhausted(self) -> str | None:
        """The name of a budget with no room left, or None."""
        limits = self.limits
        if limits.model_calls is not None and self.calls >= limits.model_calls:
            return "model_calls"
        if limits.tokens is not None and self.tokens >= limits.tokens:
            return "tokens"
        if limits.cost_usd is not None and self.cost_usd >= limits.cost_usd:
            return "cost_usd"
        return None

    def admit(self) -> str | None:
        """Count a call about to be made; or, when a budget is used up, refuse
        it and return that budget's name."""
        limit = self.exhausted()
        if limit is None:
            self.calls += 1
            return None
        self.refused += 1
        if self.reached is None:
            self.reached = limit
        return limit

    def charge(self, usage: dict[str, Any]) -> None:
        """Add a reply's tokens and cost (a cost unknown adds nothing)."""
        self.tokens += usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        cost = usage.get("cost_usd")
        if isinstance(cost, (int, float)):
            self.cost_usd += cost

    def message(self, limit: str) -> str:
        used = {"model_calls": self.calls, "tokens": self.tokens, "cost_usd": round(self.cost_usd, 6)}[limit]
        return f"the attempt reached its limit limits.{limit}={getattr(self.limits, limit):g} ({used:g} used)"

    def issue(self) -> Issue | None:
        """ERROR ``harness_limit_reached`` naming the limit, once a call was refused."""
        if self.reached is None:
            return None
        return Issue("error", "run", "harness_limit_reached", self.message(self.reached))


def current_meter() -> Meter | None:
    """The meter of the run this task belongs to, or None outside a run."""
    return _CURRENT.get()


@contextlib.contextmanager
def metering(limits: Limits) -> Iterator[Meter]:
    """A new meter for ``limits``, current for the block (and the tasks started in it)."""
    meter = Meter(limits)
    token = _CURRENT.set(meter)
    try:
        yield meter
    finally:
        _CURRENT.reset(token)
