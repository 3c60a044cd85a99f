"""ATIF (Harbor's RFC 0001, v1.7): the shipped JSON Schema accepts the RFC's
own example and refuses what the RFC forbids; a ``react`` episode's
``agent/trajectory.json`` validates and has one agent step per model call,
with that call's tokens and cost."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import attrs
import pytest
from _common import serving
from _model_support import launch, react_request

from agentcompass import ExecutionSpec, Limits, Pricing
from agentcompass._atif import SCHEMA_VERSION, validate
from agentcompass.testing.model_server import episode, tool_call

EXAMPLE = json.loads((Path(__file__).with_name("rfc_0001_example.json")).read_text())


def test_the_rfcs_own_example_validates_against_the_shipped_schema():
    assert validate(EXAMPLE) == []
    assert SCHEMA_VERSION == "ATIF-v1.7"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d.pop("agent"), "'agent' is a required property"),
        (lambda d: d["steps"][0].update(tool_calls=[]), "$.steps[0].tool_calls"),  # agent-only field on a user step
        (
            lambda d: d["steps"][1]["tool_calls"][0].update(arguments="ticker=GOOGL"),
            "$.steps[1].tool_calls[0].arguments",
        ),
        (lambda d: d["steps"][1].update(source="tool"), "$.steps[1].source"),
        (lambda d: d["steps"][2].update(step_id=7), "$.steps[2].step_id: 7, expected 3"),
        (lambda d: d["steps"][1]["observation"]["results"][0].update(source_call_id="call_x"), "names no tool call"),
        (lambda d: d.update(schema_version="ATIF-v2.0"), "$.schema_version"),
        (lambda d: d["steps"][0].update(message=[{"type": "image", "text": "x"}]), "$.steps[0].message"),
    ],
)
def test_the_schema_refuses_what_the_rfc_forbids(change, where):
    document = copy.deepcopy(EXAMPLE)
    change(document)
    problems = validate(document)
    assert problems and any(where in p for p in problems), problems


async def test_a_react_episode_writes_valid_atif_one_agent_step_per_model_call(tmp_path):
    steps = [
        tool_call("bash", {"command": "echo 'Hello, world!' > hello.txt"}, prompt_tokens=100, completion_tokens=20),
        tool_call("bash", {"command": "cat hello.txt"}, prompt_tokens=130, completion_tokens=10),
        tool_call("submit", {"answer": "done"}, prompt_tokens=150, completion_tokens=5),
    ]
    async with serving(episode(steps)) as server:
        request = react_request(
            server, tmp_path, ["hello-file"], execution=ExecutionSpec(limits=Limits(model_calls=10))
        )
        request = attrs.evolve(request, model=attrs.evolve(request.model, pricing=Pricing(input=2.0, output=10.0)))
        _, run_dir = await launch(request)
        calls = [r.json for r in server.requests]
    (path,) = run_dir.glob("tasks/*/attempt-0/agent/trajectory.json")
    document = json.loads(path.read_text())
    assert validate(document) == []
    assert document["schema_version"] == "ATIF-v1.7" and document["agent"]["name"] == "react"
    assert document["agent"]["model_name"] == "scripted-model"
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    assert [s["source"] for s in document["steps"][:2]] == ["system", "user"]
    # One agent step per call the model server answered, in order, with that call's usage.
    assert len(agent_steps) == len(calls) == 3
    assert [s["metrics"]["prompt_tokens"] for s in agent_steps] == [100, 130, 150]
    assert [s["metrics"]["cost_usd"] for s in agent_steps] == [
        pytest.approx((100 * 2 + 20 * 10) / 1e6),
        pytest.approx((130 * 2 + 10 * 10) / 1e6),
        pytest.approx((150 * 2 + 5 * 10) / 1e6),
    ]
    assert agent_steps[0]["tool_calls"][0]["arguments"] == {"command": "echo 'Hello, world!' > hello.txt"}
    # Each tool result is the observation of the step whose call it answers, as the next request sent it back.
    for step, next_call in zip(agent_steps[:2], calls[1:], strict=True):
        (result,) = step["observation"]["results"]
        assert result["source_call_id"] == step["tool_calls"][0]["tool_call_id"]
        assert next_call["messages"][-1] == {
            "role": "tool",
            "tool_call_id": result["source_call_id"],
            "content": result["content"],
        }
    final = document["final_metrics"]
    assert final["total_prompt_tokens"] == 380 and final["total_completion_tokens"] == 35
    assert final["total_cost_usd"] == pytest.approx((380 * 2 + 35 * 10) / 1e6)
    assert final["total_steps"] == len(document["steps"])
    assert document["extra"]["status"] == "completed"


async def test_a_limited_attempts_atif_has_the_calls_made_and_names_the_limit(tmp_path):
    async with serving(episode([tool_call("bash", {"command": "ls"})])) as server:
        request = react_request(server, tmp_path, ["hello-file"], execution=ExecutionSpec(limits=Limits(model_calls=2)))
        _, run_dir = await launch(request)
    (path,) = run_dir.glob("tasks/*/attempt-0/agent/trajectory.json")
    document = json.loads(path.read_text())
    assert validate(document) == []
    assert [s["source"] for s in document["steps"]].count("agent") == 2
    assert document["extra"]["issues"] == [{"severity": "error", "code": "harness_limit_reached"}]
