"""The plan's SandboxSpec (SPEC 3): the benchmark's, then the user's
``execution.sandbox`` field by field; a provider lacking a feature the plan
needs refuses it before opening anything (SPEC 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcompass import (
    BaseBenchmark,
    BaseEnvironment,
    ComponentRef,
    ExecutionSpec,
    IssueError,
    Planner,
    RunRequest,
    SandboxSpec,
    TaskSpec,
)
from agentcompass._orchestration._try import build_config


class _Bench(BaseBenchmark):
    id = "sandbox-plan-bench"

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        return {"sandbox": {"build_context": "/tasks/t/environment", "workdir": "/app", "env": {"A": "1", "B": "2"}}}


def _request(sandbox: SandboxSpec | None = None) -> RunRequest:
    return RunRequest(
        name="r",
        benchmark=ComponentRef("sandbox-plan-bench"),
        environment=ComponentRef("fake-env"),
        execution=ExecutionSpec(sandbox=sandbox or SandboxSpec()),
    )


def test_the_benchmark_fills_the_sandbox_and_the_user_overrides_field_by_field() -> None:
    planner = Planner(_Bench({}))
    plain = planner.plan(TaskSpec("t"), _request(), 0)
    assert plain.sandbox == SandboxSpec(build_context=Path("/tasks/t/environment"), workdir="/app", env={"A": "1", "B": "2"})
    assert plain.sandbox.features() == {"images"}
    user = SandboxSpec(image="registry.example/x:1", memory_mb=512, env={"B": "3"})
    plan = planner.plan(TaskSpec("t"), _request(user), 0)
    assert plan.sandbox.image == "registry.example/x:1"
    assert plan.sandbox.build_context == Path("/tasks/t/environment")
    assert plan.sandbox.workdir == "/app"
    assert plan.sandbox.memory_mb == 512
    assert plan.sandbox.env == {"A": "1", "B": "3"}
    assert plan.sandbox.features() == {"images", "limits"}


class _Lacking(BaseEnvironment):
    id = "lacking"
    features = frozenset({"literal_paths"})

    def build_config(self, plan: Any) -> Any:
        return "built"


@pytest.mark.parametrize(
    ("sandbox", "required", "code"),
    [
        (SandboxSpec(image="x"), (), "image_required"),
        (SandboxSpec(memory_mb=1), (), "environment_unsupported"),
        (SandboxSpec(user="root"), (), "environment_unsupported"),
        (SandboxSpec(), ("root",), "environment_unsupported"),
        (SandboxSpec(), ("literal_paths",), None),
        (SandboxSpec(user="nobody", workdir="/w", env={"A": "1"}), (), None),
    ],
)
def test_a_plan_needing_a_missing_feature_is_refused_before_build_config(
    sandbox: SandboxSpec, required: tuple[str, ...], code: str | None
) -> None:
    plan = Planner(_Bench({})).plan(TaskSpec("t"), _request(), 0)
    plan = attrs.evolve(plan, sandbox=sandbox, benchmark_plan={"required_features": list(required)})
    env = _Lacking({})
    if code is None:
        assert build_config(env, plan) == "built"
        return
    with pytest.raises(IssueError) as caught:
        build_config(env, plan)
    assert (caught.value.severity, caught.value.code) == ("fatal", code)
    assert "'lacking'" in caught.value.message
