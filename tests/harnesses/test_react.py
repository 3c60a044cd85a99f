"""The ``react`` harness end to end: ``terminal-smoke`` tasks in ``local``,
real ``bash`` tool calls, a scripted model on a loopback server."""

from __future__ import annotations

import json
import sys

import attrs
import pytest
from _common import serving
from _model_support import details, launch, react_request, retries

from agentcompass import ExecutionSpec
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import episode, error, text, tool_call

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash tasks")

HELLO_EPISODE = [
    tool_call("bash", {"command": "pwd && ls -A"}),
    tool_call("bash", {"command": "echo 'Hello, world!' > hello.txt"}),
    tool_call("bash", {"command": "cat hello.txt; echo oops >&2; exit 3"}),
    tool_call("submit", {"answer": "wrote hello.txt"}, prompt_tokens=20, completion_tokens=7),
]


async def test_a_multi_step_episode_solves_a_task_through_real_bash_calls(tmp_path):
    async with serving(episode(HELLO_EPISODE)) as server:
        result, run_dir = await launch(react_request(server, tmp_path, ["hello-file"]))
        # Every call of the episode went over one keep-alive connection (closing it
        # with the pool: test_client.py).
        assert server.connections == 1
    assert result.status == "succeeded"
    record = details(run_dir)["hello-file"]
    attempt = record["attempts"][0]
    assert record["_dir"] == "normal" and attempt["issues"] == []
    assert attempt["values"] == {"reward": 1.0, "passed": True}  # the verifier saw the file bash wrote
    run = attempt["run_result"]
    assert run["output"] == "wrote hello.txt"
    assert run["usage"] == {"prompt_tokens": 50, "completion_tokens": 22, "calls": 4, "cost_usd": None}

    trajectory = run["trajectory"]
    assert [m["role"] for m in trajectory] == ["system", "user"] + ["assistant", "tool"] * 4
    assert "/app/hello.txt" in trajectory[1]["content"]  # the task's instruction
    assistants = [m for m in trajectory if m["role"] == "assistant"]
    tools = [m for m in trajectory if m["role"] == "tool"]
    assert [a["step"] for a in assistants] == [1, 2, 3, 4] == [t["step"] for t in tools]
    for a, t in zip(assistants, tools, strict=True):
        assert set(a) == {"role", "content", "tool_calls", "step", "usage", "duration_seconds"}
        assert set(t) == {
            "role",
            "tool_call_id",
            "name",
            "content",
            "step",
            "exit_code",
            "timed_out",
            "truncated",
            "duration_seconds",
        }
        assert t["tool_call_id"] == a["tool_calls"][0]["id"] and t["name"] == a["tool_calls"][0]["name"]
        assert set(a["tool_calls"][0]) == {"id", "name", "arguments"}
    assert assistants[3]["usage"] == {"prompt_tokens": 20, "completion_tokens": 7}
    # Real command output came back to the model: the sandbox's app directory, the file, stderr, the exit code.
    assert tools[0]["exit_code"] == 0 and "app" in tools[0]["content"]
    assert tools[2]["exit_code"] == 3
    assert tools[2]["content"] == "Hello, world!\n\n[stderr]\noops\n\n[exit code 3]"
    assert tools[3] | {"duration_seconds": 0} == {
        "role": "tool", "tool_call_id": assistants[3]["tool_calls"][0]["id"], "name": "submit", "content": "submitted",
        "step": 4, "exit_code": None, "timed_out": False, "truncated": False, "duration_seconds": 0,
    }  # fmt: skip

    # The conversation the server saw grew by each reply and each tool result.
    requests = [r.json for r in server.requests]
    assert [len(r["messages"]) for r in requests] == [2, 4, 6, 8]
    assert [t["function"]["name"] for t in requests[0]["tools"]] == ["bash", "submit"]
    assert requests[3]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": tools[2]["tool_call_id"],
        "content": tools[2]["content"],
    }

    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["usage"] == {"prompt_tokens": 50, "completion_tokens": 22, "calls": 4, "cost_usd": None}


async def test_usage_totals_of_the_request_sum_every_attempt(tmp_path):
    script = episode([tool_call("bash", {"command": "true"}), text("done", prompt_tokens=3, completion_tokens=1)])
    async with serving(script) as server:
        request = react_request(server, tmp_path, ["hello-file", "word-count", "csv-total"])
        _, run_dir = await launch(request, task_concurrency=3)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["usage"] == {"prompt_tokens": 3 * 13, "completion_tokens": 3 * 6, "calls": 6, "cost_usd": None}
    assert len(server.requests) == 6
    for record in details(run_dir).values():
        assert record["attempts"][0]["run_result"]["output"] == "done"


async def test_max_steps_is_error_harness_max_iterations_with_the_trajectory(tmp_path):
    async with serving(episode([tool_call("bash", {"command": "echo again"})])) as server:
        request = react_request(server, tmp_path, ["hello-file"], harness={"max_steps": 3})
        _, run_dir = await launch(request)
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("error", "harness_max_iterations")]
    assert "max_steps=3" in attempt["issues"][0]["message"]
    trajectory = attempt["run_result"]["trajectory"]
    assert [m["role"] for m in trajectory].count("assistant") == 3 and len(server.requests) == 3
    assert attempt["run_result"]["usage"]["calls"] == 3
    assert attempt["values"] == {"reward": 0.0, "passed": False}  # still scored: an ERROR may be


async def test_the_run_budget_is_error_harness_timeout_keeping_the_partial_trajectory(tmp_path):
    # Each model reply takes 0.4 s; the budget of 1 s ends the episode in its
    # third call (or, on a slow host, in a tool call just before it).
    async with serving(episode([tool_call("bash", {"command": "true"})], delay=0.4)) as server:
        request = react_request(server, tmp_path, ["hello-file"], execution=ExecutionSpec(run_timeout_seconds=1))
        _, run_dir = await launch(request)
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("error", "harness_timeout")]
    roles = [m["role"] for m in attempt["run_result"]["trajectory"]]
    steps = roles.count("assistant")
    assert 1 <= steps <= 2 and roles[:4] == ["system", "user", "assistant", "tool"]
    assert attempt["run_result"]["usage"]["calls"] == steps
    # Every call the server saw is in the trajectory, but one cut off in flight.
    assert len(server.requests) == steps + server.aborted and server.aborted <= 1
    assert attempt["values"] == {"reward": 0.0, "passed": False}


async def test_tool_output_is_truncated_with_a_marker_and_tool_timeouts_reach_the_model(tmp_path):
    steps = [
        tool_call("bash", {"command": "printf 'x%.0s' $(seq 1 100)"}),
        tool_call("bash", {"command": "sleep 5"}),
        tool_call("bash", {"cmd": "oops"}),
        tool_call("nope", {}),
        tool_call("bash", "not json"),
        text("giving up"),
    ]
    async with serving(episode(steps)) as server:
        request = react_request(
            server, tmp_path, ["hello-file"], harness={"max_output_chars": 40, "tool_timeout_seconds": 0.5}
        )
        _, run_dir = await launch(request)
    tools = [
        m for m in details(run_dir)["hello-file"]["attempts"][0]["run_result"]["trajectory"] if m["role"] == "tool"
    ]
    assert tools[0]["content"] == "x" * 40 + "\n[output truncated: 60 more characters]" and tools[0]["truncated"]
    assert tools[1]["timed_out"] and "[timed out after 0.5s]" in tools[1]["content"]
    assert tools[2]["content"] == "error: bash needs a string argument 'command'"
    assert tools[3]["content"].startswith("error: unknown tool 'nope'")
    assert tools[4]["content"] == "error: the arguments of 'bash' must be a JSON object"


async def test_a_failed_model_call_is_its_classified_issue_and_fatal_is_retried(tmp_path):
    # The first try's second call is refused (401); the retry runs the episode again from the start.
    replies = [tool_call("bash", {"command": "true"}), error(401), text("done")]
    async with serving(replies) as server:
        request = react_request(
            server,
            tmp_path,
            ["hello-file"],
            execution=ExecutionSpec(max_retries=1, retry_min_delay_seconds=0.01, retry_max_delay_seconds=0.02),
        )
        _, run_dir = await launch(request)
    record = details(run_dir)["hello-file"]
    attempt = record["attempts"][0]
    assert record["_dir"] == "normal" and attempt["retries"] == 1 and attempt["run_result"]["output"] == "done"
    (discarded,) = retries(run_dir)
    assert [(i["severity"], i["code"]) for i in discarded["issues"]] == [("fatal", "model_auth")]
    assert len(server.requests) == 3


async def test_retry_after_raises_the_backoff_within_the_maximum(tmp_path):
    replies = [
        error(429, headers={"Retry-After": "0.3"}),
        text("done"),
        error(429, headers={"Retry-After": "60"}),
        text("done"),
    ]
    execution = ExecutionSpec(max_retries=1, retry_min_delay_seconds=0.01, retry_max_delay_seconds=0.5)
    async with serving(replies) as server:
        _, first = await launch(react_request(server, tmp_path, ["hello-file"], execution=execution, name="a"))
        _, second = await launch(react_request(server, tmp_path, ["hello-file"], execution=execution, name="b"))
    (asked,) = retries(first)
    (capped,) = retries(second)
    assert asked["issues"][0]["code"] == "model_rate_limited"
    assert asked["retry_delay_seconds"] == pytest.approx(0.3)  # the backoff alone would be at most 0.01
    assert capped["retry_delay_seconds"] == pytest.approx(0.5)  # 60 s asked, retry_max_delay_seconds allowed
    assert details(first)["hello-file"]["_dir"] == details(second)["hello-file"]["_dir"] == "normal"


async def test_react_without_a_model_is_a_setup_failure(tmp_path):
    async with serving([]) as server:
        request = react_request(server, tmp_path, ["hello-file"])
        _, run_dir = await launch(attrs.evolve(request, model=None))
    issues = details(run_dir)["hello-file"]["attempts"][0]["issues"]
    assert [(i["severity"], i["code"]) for i in issues] == [("fatal", "setup_failed")]


async def test_the_orchestration_deadline_cancels_an_in_flight_model_call(tmp_path):
    async with serving(episode([text("too late").after(30)])) as server:
        result, run_dir = await launch(react_request(server, tmp_path, ["hello-file"]), timeout_seconds=1)
        # The call was cut off mid-request and its connection closed, within the run's grace.
        with hang_guard(10):
            await server.wait_until(lambda s: s.aborted == 1 and s.connections == 1)
    assert result.status == "timed_out" and len(server.requests) == 1
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "timed_out"
