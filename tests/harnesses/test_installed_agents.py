"""The real third-party agents (mini-swe-agent, aider) under the ``installed``
harness in real ``sandbox`` sessions with run network ``none``, against a
scripted model server they reach only through the attempt's gateway.

They install through the host's agent cache (``make agents`` builds it; a
missing entry is built by the first test, which takes minutes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _installed_support import KEY, assistant_turns, details, launch, message_texts

from agentcompass import Limits, Pricing
from agentcompass._atif import validate
from agentcompass.testing.model_server import (
    ModelServer,
    RecordedRequest,
    Reply,
    by_instruction,
    episode,
    text,
    tool_call,
)

try:
    from agentcompass_sandbox import host_problem

    PROBLEM = host_problem()
except ImportError:
    PROBLEM = "the sandbox plugin is not installed"

pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

SUBMIT = tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})


def _bash(command: str) -> Reply:
    return tool_call("bash", {"command": command})


def _attempt(run_dir: Path, task: str) -> dict:
    return details(run_dir)[task]["attempts"][0]


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for parent, _, files in os.walk(root):
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path) and needle in Path(path).read_bytes():
                hits.append(path)
    return hits


async def test_mini_swe_agent_solves_a_task_offline_through_the_gateway_only(tmp_path):
    probe = (
        "python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\" "
        "{port} 2>/dev/null && echo DIRECT-REACHED || echo DIRECT-REFUSED; "
        "curl -s -m 3 http://127.0.0.1:{port}/v1/models >/dev/null && echo CURL-REACHED || echo CURL-REFUSED"
    )
    # The key is split in the command, so the scan's own command line never holds it whole.
    pattern = f"printf %s%s {KEY[:10]!r} {KEY[10:]!r}"
    scan = (
        f"echo SCAN-HITS:$({pattern} | grep -ls -f - /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
        f":$({pattern} | grep -rls --exclude-dir=venv -f - \"$HOME\" /logs /app /run/agentcompass 2>/dev/null | wc -l)"
    )
    steps = [
        lambda: _bash(probe.format(port=server.base_url.rsplit(':', 1)[1].split('/')[0])),
        lambda: _bash(scan),
        lambda: _bash("echo 'Hello, world!' > /app/hello.txt && cat /app/hello.txt"),
        lambda: SUBMIT,
    ]

    def script(request: RecordedRequest) -> Reply:
        return steps[min(assistant_turns(request), len(steps) - 1)]()

    server = ModelServer(script)
    result, run_dir = await launch(tmp_path, server, {"agent": "mini-swe-agent"}, tasks=["hello-file"])
    attempt = _attempt(run_dir, "hello-file")
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    assert attempt["issues"] == []
    texts = "\n".join(message_texts(server))
    # From inside, the scripted server's port is the session's own loopback: nothing there.
    assert "DIRECT-REFUSED" in texts and "CURL-REFUSED" in texts
    assert "DIRECT-REACHED" not in texts and "CURL-REACHED" not in texts
    # No process environment, command line or file the session can see holds the key.
    assert "SCAN-HITS:0:0" in texts
    run_result = attempt["run_result"]
    calls = [e for e in run_result["trajectory"] if e["role"] == "assistant" and "call" in e]
    assert [c["call"] for c in calls] == [1, 2, 3, 4]
    assert calls[2]["tool_calls"][0]["name"] == "bash" and "hello.txt" in calls[2]["tool_calls"][0]["arguments"]
    assert run_result["usage"] == {"prompt_tokens": 40, "completion_tokens": 20, "calls": 4, "cost_usd": None}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["usage"]["prompt_tokens"] == 40 and metrics["usage"]["calls"] == 4
    assert run_result["artifacts"]["agent"]["id"] == "mini-swe-agent"
    assert run_result["timings"]["agent_prepare"] >= run_result["timings"]["agent_install"] >= 0
    # The upstream got the real key; the agent only ever had its attempt's token.
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    # The agent's own logs are kept in the run directory, and hold no key either.
    (kept,) = run_dir.glob("tasks/*/attempt-0/logs/agent/trajectory.json")
    assert json.loads(kept.read_text())["info"]["exit_status"] == "Submitted"
    assert list(kept.parent.glob("agent.log"))
    assert _files_holding(run_dir, KEY.encode()) == []
    # Its ATIF trajectory: valid, one agent step per call the gateway forwarded, with that call's usage.
    (atif,) = run_dir.glob("tasks/*/attempt-0/agent/trajectory.json")
    document = json.loads(atif.read_text())
    assert validate(document) == []
    assert document["agent"]["name"] == "mini-swe-agent" and document["agent"]["version"] == "2.4.6"
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    assert len(agent_steps) == len(server.requests) == 4
    assert [s["extra"]["call"] for s in agent_steps] == [1, 2, 3, 4]
    assert all(s["metrics"] == {"prompt_tokens": 10, "completion_tokens": 5} for s in agent_steps)
    assert "hello.txt" in agent_steps[2]["tool_calls"][0]["arguments"]["command"]
    assert document["final_metrics"]["total_prompt_tokens"] == 40


def _aider_edit(path: str, content: str) -> Reply:
    return text(f"{path}\n```\n{content}\n```\n")


async def test_aider_edits_a_file_to_solve_a_task(tmp_path):
    script = by_instruction([("/app/hello.txt", episode([_aider_edit("hello.txt", "Hello, world!")]))])
    server = ModelServer(script)
    result, run_dir = await launch(tmp_path, server, {"agent": "aider"}, tasks=["hello-file"])
    attempt = _attempt(run_dir, "hello-file")
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    assert attempt["run_result"]["usage"]["calls"] >= 1
    assert attempt["run_result"]["artifacts"]["agent_exit_code"] == 0
    assert _files_holding(run_dir, KEY.encode()) == []
    (atif,) = run_dir.glob("tasks/*/attempt-0/agent/trajectory.json")
    document = json.loads(atif.read_text())
    assert validate(document) == [] and document["agent"]["name"] == "aider"
    # aider's prompt holds example turns of its own: copied context, not calls.
    calls = [s for s in document["steps"] if s["source"] == "agent" and not s.get("is_copied_context")]
    assert len(calls) == len(server.requests) and all(s["llm_call_count"] == 1 for s in calls)


async def test_aider_whose_every_call_failed_is_fatal_model_server_error_though_it_exited_0(tmp_path):
    server = ModelServer(episode([text("never sent")]), fail_after=0)
    result, run_dir = await launch(tmp_path, server, {"agent": "aider"}, tasks=["hello-file"], max_retries=1)
    record = details(run_dir)["hello-file"]
    attempt = record["attempts"][0]
    assert record["severity"] == "fatal"
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("fatal", "model_server_error")]
    assert attempt["retries"] == 1
    assert attempt["run_result"]["artifacts"]["agent_exit_code"] == 0
    # Its own retries are turned down: at most two calls per try.
    assert 2 <= len(server.requests) <= 4


async def test_a_500_after_two_good_replies_is_fatal_and_the_retry_starts_a_fresh_agent(tmp_path):
    steps = [_bash("ls /app"), _bash("cat /etc/hostname"), SUBMIT]
    server = ModelServer(episode(steps), fail_after=2)
    result, run_dir = await launch(tmp_path, server, {"agent": "mini-swe-agent"}, tasks=["hello-file"], max_retries=1)
    record = details(run_dir)["hello-file"]
    attempt = record["attempts"][0]
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("fatal", "model_server_error")]
    assert attempt["retries"] == 1 and record["severity"] == "fatal"
    turns = [assistant_turns(r) for r in server.requests]
    # Try 1: turns 0, 1, then the failing turn 2; the retry's agent starts over at turn 0.
    assert turns[:3] == [0, 1, 2] and turns.count(0) == 2
    assert turns[turns.index(0, 1):][:1] == [0]


async def test_max_model_calls_reached_is_error_harness_limit_reached(tmp_path):
    server = ModelServer(episode([_bash("ls /app")]))
    harness = {"agent": "mini-swe-agent", "max_model_calls": 2}
    result, run_dir = await launch(tmp_path, server, harness, tasks=["hello-file"])
    attempt = _attempt(run_dir, "hello-file")
    codes = [(i["severity"], i["code"]) for i in attempt["issues"]]
    assert codes == [("error", "harness_limit_reached")]
    assert len(server.requests) == 2
    assert attempt["run_result"]["usage"]["calls"] == 2


@pytest.mark.parametrize(
    ("limits", "named"), [(Limits(tokens=40), "limits.tokens=40"), (Limits(cost_usd=5e-05), "limits.cost_usd=5e-05")]
)
async def test_a_token_or_cost_budget_stops_mini_swe_agent_at_the_gateway_and_its_work_is_scored(tmp_path, limits, named):
    # The first step solves the task; then the agent keeps looking. 15 tokens
    # (2e-05 USD) a call: the third call crosses the budget, the fourth is refused.
    steps = [_bash("echo 'Hello, world!' > /app/hello.txt"), _bash("ls /app")]
    server = ModelServer(lambda request: steps[min(assistant_turns(request), 1)])
    pricing = Pricing(input=1.0, output=2.0)
    result, run_dir = await launch(
        tmp_path, server, {"agent": "mini-swe-agent"}, tasks=["hello-file"], limits=limits, pricing=pricing
    )
    attempt = _attempt(run_dir, "hello-file")
    assert len(server.requests) == 3  # no call past the budget reached the upstream
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("error", "harness_limit_reached")]
    assert named in attempt["issues"][0]["message"]
    assert attempt["values"]["reward"] == 1.0  # what the agent did before the budget ran out is scored
    usage = attempt["run_result"]["usage"]
    assert usage["calls"] == 3 and usage["cost_usd"] == pytest.approx(3 * 2e-05)
