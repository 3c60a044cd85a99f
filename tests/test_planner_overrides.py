"""The user's execution overrides (SPEC section 9): ``evaluation_environment_mode``
and ``network: {baseline, run, evaluation}`` win over the benchmark and recipes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentcompass import (
    BaseBenchmark,
    ComponentRef,
    ExecutionSpec,
    NetworkOverrides,
    NetworkPolicy,
    Planner,
    RunRequest,
    TaskSpec,
)
from agentcompass._config import load_config
from agentcompass._preflight import preflight
from agentcompass.runtime import ConfigError
from agentcompass.testing import FakeRecipe

ALLOW = NetworkPolicy("allowlist", ("pypi.org:443",))


class _Bench(BaseBenchmark):
    id = "override-bench"

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        return {
            "evaluation_environment_mode": "fresh",
            "run_network_policy": ALLOW,
            "evaluation_network_policy": "none",
        }


def _request(execution: ExecutionSpec) -> RunRequest:
    return RunRequest(
        name="r",
        benchmark=ComponentRef("override-bench", {}),
        environment=ComponentRef("fake-env", {}),
        execution=execution,
    )


def test_user_values_win_over_benchmark_and_recipes() -> None:
    recipe = FakeRecipe({"set": {"baseline_network_policy": "none", "evaluation_environment_mode": "reuse"}})
    planner = Planner(_Bench({}), [recipe])
    task = TaskSpec("t")
    # Without overrides: the benchmark's plan, then the recipe.
    plain = planner.plan(task, _request(ExecutionSpec()), 0)
    assert plain.evaluation_environment_mode == "reuse"
    assert plain.baseline_network_policy == NetworkPolicy("none")
    assert plain.run_network_policy == ALLOW
    assert plain.evaluation_network_policy == NetworkPolicy("none")
    execution = ExecutionSpec(
        evaluation_environment_mode="none",
        network=NetworkOverrides(baseline=NetworkPolicy("full"), run=NetworkPolicy("none")),
    )
    plan = planner.plan(task, _request(execution), 0)
    assert plan.evaluation_environment_mode == "none"
    assert plan.baseline_network_policy == NetworkPolicy("full")
    assert plan.run_network_policy == NetworkPolicy("none")
    # A phase the user left alone keeps what the benchmark said.
    assert plan.evaluation_network_policy == NetworkPolicy("none")


def _config(tmp_path: Path, execution: str, environment: str = "local") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        "requests:\n"
        "  - name: r\n"
        "    benchmark: {id: fake-bench}\n"
        "    harness: {id: fake-harness}\n"
        f"    environment: {{id: {environment}}}\n"
        f"    execution: {execution}\n"
    )
    return path


def test_overrides_are_read_from_config(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "{evaluation_environment_mode: fresh, network: {run: none, evaluation: {mode: allowlist, allow: [a:1]}}}",
    )
    execution = load_config(config).requests[0].execution
    assert execution.evaluation_environment_mode == "fresh"
    assert execution.network == NetworkOverrides(
        run=NetworkPolicy("none"), evaluation=NetworkPolicy("allowlist", ("a:1",))
    )


@pytest.mark.parametrize(
    ("execution", "match"),
    [
        ("{network: {run: nothing}}", r"mode must be one of none, allowlist, full.*execution.network.run"),
        ("{network: {runn: none}}", r"runn"),
        ("{evaluation_environment_mode: later}", r"evaluation_environment_mode"),
    ],
)
def test_bad_overrides_name_the_key(tmp_path: Path, execution: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(_config(tmp_path, execution))


def test_a_provider_that_cannot_enforce_an_override_fails_preflight(tmp_path: Path) -> None:
    import agentcompass.testing  # noqa: F401 - registers fake-bench and fake-harness

    orchestration = load_config(_config(tmp_path, "{network: {run: none}}"))
    with pytest.raises(Exception, match=r"execution.network: environment 'local' cannot enforce network policy 'none'"):
        preflight(orchestration)
    preflight(load_config(_config(tmp_path, "{network: {run: full}}")))
