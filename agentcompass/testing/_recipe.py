"""``fake-recipe`` and ``fake-analyzer``: the two pure plugin kinds, configurable."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import trio

from agentcompass import register
from agentcompass.runtime import BaseAnalyzer, BaseRecipe, ExecutionPlan, RunRequest, TaskSpec

from ._policies import with_policies

__all__ = ["FakeAnalyzer", "FakeRecipe"]

_PLAN_FIELDS = {f.name for f in attrs.fields(ExecutionPlan)} - {"task_id", "attempt"}


def _check_set(_instance: Any, _attribute: Any, value: dict[str, Any]) -> None:
    for key in value:
        if key not in _PLAN_FIELDS:
            raise ValueError(
                f"set: {key!r} is not an ExecutionPlan field (fields: {', '.join(sorted(_PLAN_FIELDS))})"
            )
    with_policies(value, "set")


@attrs.frozen
class FakeRecipeConfig:
    """Config keys of ``fake-recipe``; see :class:`FakeRecipe`."""

    set: dict[str, Any] = attrs.field(factory=dict, validator=_check_set)


@register
class FakeRecipe(BaseRecipe):
    """``fake-recipe``: sets ExecutionPlan fields.

    Config key ``set`` (``{}``): ``{field: value}`` applied with
    ``attrs.evolve``; policies may be written ``{"mode": ..., "allow": [...]}``.
    It overwrites whatever the plan holds: a recipe cannot tell an explicit
    user value from a default, so keeping user values is the Planner's job
    (applying user values last), which this recipe lets tests check.
    """

    id: ClassVar[str] = "fake-recipe"
    Config: ClassVar[type | None] = FakeRecipeConfig
    options: FakeRecipeConfig

    def apply(self, plan: ExecutionPlan, task: TaskSpec, request: RunRequest) -> ExecutionPlan:
        return attrs.evolve(plan, **with_policies(self.options.set, "set"))


@attrs.frozen
class FakeAnalyzerConfig:
    """Config keys of ``fake-analyzer``; see :class:`FakeAnalyzer`."""

    fail: bool = False
    applies: bool = True


@register
class FakeAnalyzer(BaseAnalyzer):
    """``fake-analyzer``: reports the status of the attempt it saw.

    Config keys: ``applies`` (``true``): what ``applies_to`` answers; ``fail``
    (``false``): raise ``RuntimeError("fake analyzer failed")`` instead of
    returning ``{"seen_status": attempt_record.status}``.
    """

    id: ClassVar[str] = "fake-analyzer"
    Config: ClassVar[type | None] = FakeAnalyzerConfig
    options: FakeAnalyzerConfig

    def applies_to(self, request: RunRequest, task: TaskSpec) -> bool:
        return self.options.applies

    async def analyze(self, task: TaskSpec, attempt_record: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if self.options.fail:
            raise RuntimeError("fake analyzer failed")
        return {"seen_status": attempt_record.status}
