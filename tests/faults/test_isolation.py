"""Failure isolation (SPEC section 7): an error no row of section 6
classifies fails its own request - status ``failed``, the error in
``run_info.json`` and on the console as one line - and never another
request or the process."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

import agentcompass
from agentcompass import ExecutionSpec, Orchestration
from agentcompass.testing import call_log, fake_request

BENCH = {
    "tasks": 2,
    "plan": {"evaluation_environment_mode": "fresh", "evaluation_network_policy": {"mode": "none"}},
    "script": {"t000": {"evaluate": ["fatal"]}},
}


def _run_info(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "run_info.json").read_text())


async def test_a_provider_rejecting_a_resumed_attempts_plan_fails_only_its_request(
    tmp_path: Path
) -> None:
    a = fake_request("a", log="a", benchmark=BENCH, output_root=tmp_path)
    first = await agentcompass.launch(Orchestration([a]))
    assert first.requests[0].status == "failed"  # t000's evaluation: FATAL
    # Resumed with a retry: only t000's evaluation runs again, in a fresh
    # Environment, but the provider now rejects the plan's evaluation policy.
    resumed = attrs.evolve(
        a,
        environment=attrs.evolve(a.environment, config={"log": "a", "policies": ["full"]}),
        execution=ExecutionSpec(max_retries=1),
        reuse=True,
    )
    b = fake_request("b", log="b", benchmark={"tasks": 3}, output_root=tmp_path)

    result = await agentcompass.launch(Orchestration([resumed, b], task_concurrency=2))

    statuses = {r.name: r.status for r in result.requests}
    assert statuses == {"a": "failed", "b": "succeeded"}
    assert result.status == "partial_failure" and result.exit_code == 1
    info = _run_info(result.requests[0].run_dir)
    assert info["status"] == "failed"
    assert "ComponentError" in info["error"] and "cannot enforce network policy 'none'" in info["error"]
    assert "\n" not in info["error"]
    assert any("ComponentError" in note for note in info["notes"])
    assert call_log("b").count("run") == 3
    assert not call_log("a").live_sessions() and not call_log("b").live_sessions()
