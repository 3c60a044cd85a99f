"""The real Claude Code and Codex under the ``installed`` harness in real
``sandbox`` sessions with run network ``none``, against the scripted model
server (Messages and Responses, streamed) that they reach only through the
attempt's gateway.

They run from the host's agent cache (``make agents`` builds it; a missing
entry is built by the first test, about 15 s each from npm)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from _installed_support import KEY, details, launch

from agentcompass import Limits, Pricing
from agentcompass._atif import validate
from agentcompass.testing.model_server import ModelServer, RecordedRequest, Reply, by_instruction, episode, error, text
from agentcompass.testing.model_server import tool_call as _tool_call

try:
    from agentcompass_sandbox import host_problem

    PROBLEM = host_problem()
except ImportError:
    PROBLEM = "the sandbox plugin is not installed"

pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

#: Scans every process environment and command line, and every file the agent can
#: read, for the real key; the key is split so the scan's own command line never holds it.
_PATTERN = f"printf %s%s {KEY[:10]!r} {KEY[10:]!r}"
SCAN = (
    f"echo SCAN-HITS:$({_PATTERN} | grep -ls -f - /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
    f":$({_PATTERN} | grep -rls -f - \"$HOME\" /logs /app /run/agentcompass 2>/dev/null | wc -l)"
)
WRITE = "echo 'Hello, world!' > /app/hello.txt && cat /app/hello.txt"
#: Each agent's shell tool and the name of its command argument.
SHELL = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}


def _shell(agent: str, command: str) -> Reply:
    name, key = SHELL[agent]
    return _tool_call(name, {key: command})


def _posts(server: ModelServer) -> list[RecordedRequest]:
    return [r for r in server.requests if r.method == "POST"]


def _turn(request: RecordedRequest) -> int:
    """How many replies of the model the request's conversation holds."""
    body = request.json if isinstance(request.json, dict) else {}
    if "input" in body:  # Responses: one function_call item per reply here
        return sum(1 for item in body["input"] if isinstance(item, dict) and item.get("type") == "function_call")
    return sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "assistant")


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for parent, _, files in os.walk(root):
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path) and needle in Path(path).read_bytes():
                hits.append(path)
    return hits


def _harness(agent: str) -> dict[str, Any]:
    return {"agent": agent, "max_model_calls": 10}


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
async def test_the_agent_solves_a_task_offline_through_the_gateway_only(tmp_path, agent):
    steps = [_shell(agent, f"{SCAN}; {WRITE}"), text("Done: /app/hello.txt holds the greeting.")]
    server = ModelServer(by_instruction([("/app/hello.txt", episode(steps))]))
    api = "anthropic-messages" if agent == "claude-code" else "openai-responses"
    result, run_dir = await launch(tmp_path, server, _harness(agent), tasks=["hello-file"], api=api)
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    assert attempt["issues"] == []
    run_result = attempt["run_result"]
    assert run_result["output"] == "Done: /app/hello.txt holds the greeting."
    # The agent's own steps: the task, its shell call, the call's output, its last message.
    trajectory = run_result["trajectory"]
    assert any(e["role"] == "user" and "containing exactly the line" in e["content"] for e in trajectory)
    calls = [c for e in trajectory if e["role"] == "assistant" for c in e.get("tool_calls", [])]
    assert [c["name"] for c in calls] == [SHELL[agent][0]]
    assert "/app/hello.txt" in json.loads(calls[0]["arguments"])[SHELL[agent][1]]
    (answer,) = [e for e in trajectory if e["role"] == "tool"]
    assert answer["tool_call_id"] == calls[0]["id"] and "Hello, world!" in answer["content"]
    # No process environment, command line or file the session can see held the key.
    assert "SCAN-HITS:0:0" in answer["content"]
    # Usage is the gateway's, summed over the two calls (10 + 5 tokens each, scripted).
    assert run_result["usage"] == {"prompt_tokens": 20, "completion_tokens": 10, "calls": 2, "cost_usd": None}
    assert len(_posts(server)) == 2
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["usage"]["calls"] == 2
    # The upstream got the real key; the agent only ever had its attempt's token.
    header = "x-api-key" if agent == "claude-code" else "authorization"
    assert all(KEY in r.headers[header] for r in _posts(server))
    # Its own logs are kept in the run directory, and hold no key either.
    kept = {p.name for p in run_dir.glob("tasks/*/attempt-0/logs/agent/*")}
    expected = {"claude.jsonl", "session.jsonl"} if agent == "claude-code" else {"codex.jsonl", "rollout.jsonl", "last.txt"}
    assert expected <= kept
    assert _files_holding(run_dir, KEY.encode()) == []
    # Its ATIF trajectory: valid, one agent step per call the gateway forwarded, with that call's usage.
    (atif,) = run_dir.glob("tasks/*/attempt-0/agent/trajectory.json")
    document = json.loads(atif.read_text())
    assert validate(document) == [] and document["agent"]["name"] == agent
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    assert len(agent_steps) == len(_posts(server)) == 2
    assert [s["metrics"] for s in agent_steps] == [{"prompt_tokens": 10, "completion_tokens": 5}] * 2
    (shell,) = agent_steps[0]["tool_calls"]
    assert shell["function_name"] == SHELL[agent][0]
    assert shell["tool_call_id"] in {r.get("source_call_id") for r in agent_steps[0]["observation"]["results"]}


@pytest.mark.parametrize(
    ("agent", "statuses", "per_try"),
    [("claude-code", (500, 529), 2), ("codex", (500,), 1)],
)
async def test_an_upstream_failure_is_fatal_and_retried_with_a_fresh_agent(tmp_path, agent, statuses, per_try):
    """One good reply, then the upstream fails: each try's agent makes its
    call and at most one retry of the failing one (``per_try``), the attempt
    is FATAL ``model_server_error`` and its retry starts a fresh agent."""
    tasks = {500: ("hello-file", "/app/hello.txt"), 529: ("word-count", "/app/essay.txt")}
    episodes = [(tasks[s][1], episode([_shell(agent, "ls /app"), error(s)])) for s in statuses]
    server = ModelServer(by_instruction(episodes))
    api = "anthropic-messages" if agent == "claude-code" else "openai-responses"
    result, run_dir = await launch(
        tmp_path, server, _harness(agent), tasks=[tasks[s][0] for s in statuses], api=api, max_retries=1
    )
    found = details(run_dir)
    for status in statuses:
        task, needle = tasks[status]
        record = found[task]
        attempt = record["attempts"][0]
        assert record["severity"] == "fatal"
        assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("fatal", "model_server_error")]
        assert str(status) in attempt["issues"][0]["message"]
        assert attempt["retries"] == 1
        turns = [_turn(r) for r in _posts(server) if needle in r.body.decode(errors="replace")]
        # Try 1: turn 0, then turn 1 failing (and its one retry); try 2 starts over at turn 0.
        assert turns == [0, *[1] * per_try] * 2, turns


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
@pytest.mark.parametrize(
    ("limits", "named"), [(Limits(tokens=25), "limits.tokens=25"), (Limits(cost_usd=3e-05), "limits.cost_usd=3e-05")]
)
async def test_a_token_or_cost_budget_stops_the_agent_at_the_gateway_in_its_apis_shape(tmp_path, agent, limits, named):
    # The first call solves the task, then the agent keeps looking: 15 tokens
    # (2e-05 USD) a call, so the second crosses the budget and a third is refused.
    steps = [_shell(agent, WRITE), _shell(agent, "ls /app"), _shell(agent, "ls /")]
    server = ModelServer(lambda request: steps[min(_turn(request), 2)])
    api = "anthropic-messages" if agent == "claude-code" else "openai-responses"
    result, run_dir = await launch(
        tmp_path, server, {"agent": agent}, tasks=["hello-file"], api=api, limits=limits, pricing=Pricing(1.0, 2.0)
    )
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert len(_posts(server)) == 2  # nothing past the budget reached the upstream
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("error", "harness_limit_reached")]
    assert named in attempt["issues"][0]["message"]
    assert attempt["values"]["reward"] == 1.0  # what the agent did before is scored
    assert attempt["run_result"]["usage"]["cost_usd"] == pytest.approx(2 * 2e-05)
