"""Token usage of one attempt, summed over its model calls."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["ModelUsage"]


@attrs.define
class ModelUsage:
    """Running totals of one attempt's model calls.

    ``calls`` counts the calls that returned a usable reply (a call that
    failed returned no usage to count). :meth:`to_dict` is the attempt's
    ``RunResult.usage`` (``prompt_tokens``, ``completion_tokens``, ``calls``),
    which the request's ``metrics.json`` ``usage`` sums.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def add(self, usage: dict[str, int]) -> None:
        self.prompt_tokens += usage.get("prompt_tokens", 0)
        self.completion_tokens += usage.get("completion_tokens", 0)
        self.calls += 1

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "calls": self.calls}
