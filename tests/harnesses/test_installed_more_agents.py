"""The real OpenCode, Qwen Code and Gemini CLI under the ``installed`` harness
in real ``sandbox`` sessions with run network ``none``, against the scripted
model server (chat completions and Gemini, streamed) that they reach only
through the attempt's gateway.

They run from the host's agent cache (``make agents`` builds it; a missing
entry is built by the first test, about 20 s each from npm)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _installed_support import KEY, details, launch
from test_installed_claude_codex import WRITE, _files_holding

from agentcompass.testing.model_server import ModelServer, RecordedRequest, Reply, by_instruction, episode, error, text
from agentcompass.testing.model_server import tool_call as _tool_call

try:
    from agentcompass_sandbox import host_problem

    PROBLEM = host_problem()
except ImportError:
    PROBLEM = "the sandbox plugin is not installed"

pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

AGENTS = ["opencode", "qwen-code", "gemini-cli"]
#: The key scan of ``test_installed_claude_codex`` without command substitution
#: (which Gemini CLI's shell tool refuses): every process environment and command
#: line, and every file the agent can read.
_PATTERN = f"printf %s%s {KEY[:10]!r} {KEY[10:]!r}"
SCAN = (
    f"{_PATTERN} | grep -ls -f - /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | wc -l | sed s/^/SCAN-PROC:/; "
    f'{_PATTERN} | grep -rls -f - "$HOME" /logs /app /run/agentcompass 2>/dev/null | wc -l | sed s/^/SCAN-FILES:/'
)
#: Each agent's shell tool, the arguments it needs besides the command, and its model API.
SHELL = {
    "opencode": ("bash", {"description": "run it"}),
    "qwen-code": ("run_shell_command", {}),
    "gemini-cli": ("run_shell_command", {}),
}
API = {"opencode": "openai-chat", "qwen-code": "openai-chat", "gemini-cli": "google-generate-content"}
#: Each agent's own log files, kept in the run directory.
LOGS = {"opencode": {"opencode.jsonl"}, "qwen-code": {"qwen.jsonl"}, "gemini-cli": {"gemini.jsonl"}}


def shell(agent: str, command: str) -> Reply:
    name, extra = SHELL[agent]
    return _tool_call(name, {"command": command, **extra})


def posts(server: ModelServer) -> list[RecordedRequest]:
    return [r for r in server.requests if r.method == "POST"]


def turn(request: RecordedRequest) -> int:
    """How many replies of the model the request's conversation holds."""
    body = request.json if isinstance(request.json, dict) else {}
    if "contents" in body:  # Gemini
        return sum(1 for c in body["contents"] if isinstance(c, dict) and c.get("role") == "model")
    return sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "assistant")


def harness(agent: str) -> dict[str, Any]:
    return {"agent": agent, "max_model_calls": 10}


@pytest.mark.parametrize("agent", AGENTS)
async def test_the_agent_solves_a_task_offline_through_the_gateway_only(tmp_path, agent):
    steps = [shell(agent, f"{SCAN}; {WRITE}"), text("Done: /app/hello.txt holds the greeting.")]
    server = ModelServer(by_instruction([("/app/hello.txt", episode(steps))]))
    result, run_dir = await launch(tmp_path, server, harness(agent), tasks=["hello-file"], api=API[agent])
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    assert attempt["issues"] == []
    run_result = attempt["run_result"]
    assert run_result["output"] == "Done: /app/hello.txt holds the greeting."
    # The agent's own steps: its shell call, the call's output, its last message.
    trajectory = run_result["trajectory"]
    calls = [c for e in trajectory if e["role"] == "assistant" for c in e.get("tool_calls", [])]
    assert [c["name"] for c in calls] == [SHELL[agent][0]]
    assert "/app/hello.txt" in json.loads(calls[0]["arguments"])["command"]
    (answer,) = [e for e in trajectory if e["role"] == "tool"]
    assert answer["tool_call_id"] == calls[0]["id"]
    # No process environment, command line or file the session can see held the key.
    assert "SCAN-PROC:0" in answer["content"] and "SCAN-FILES:0" in answer["content"]
    # Usage is the gateway's: every call it relayed (10 + 5 tokens each, scripted).
    count = len(posts(server))
    assert count >= 2 and run_result["usage"] == {
        "prompt_tokens": 10 * count,
        "completion_tokens": 5 * count,
        "calls": count,
        "cost_usd": None,  # no pricing: unknown, never 0
    }
    # The upstream got the real key; the agent only ever had its attempt's token.
    header = "x-goog-api-key" if API[agent] == "google-generate-content" else "authorization"
    assert all(KEY in r.headers[header] for r in posts(server))
    # Its own logs are kept in the run directory, and hold no key either.
    kept = {p.name for p in run_dir.glob("tasks/*/attempt-0/logs/agent/*")}
    assert LOGS[agent] <= kept
    assert _files_holding(run_dir, KEY.encode()) == []


@pytest.mark.parametrize("agent", AGENTS)
async def test_an_upstream_500_is_fatal_and_retried_with_a_fresh_agent(tmp_path, agent):
    """One good reply, then the upstream fails (asking for no delay, which
    OpenCode's and Qwen Code's own retries, which cannot be turned off,
    honour): the attempt is FATAL ``model_server_error`` and its retry
    starts a fresh agent, back at the conversation's first turn."""
    failing = error(500, headers={"Retry-After": "0"})
    server = ModelServer(by_instruction([("/app/hello.txt", episode([shell(agent, "ls /app"), failing]))]))
    result, run_dir = await launch(
        tmp_path, server, harness(agent), tasks=["hello-file"], api=API[agent], max_retries=1
    )
    record = details(run_dir)["hello-file"]
    attempt = record["attempts"][0]
    assert record["severity"] == "fatal"
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("fatal", "model_server_error")]
    assert "500" in attempt["issues"][0]["message"]
    assert attempt["retries"] == 1
    turns = [turn(r) for r in posts(server) if "/app/hello.txt" in r.body.decode(errors="replace")]
    # Try 1 reaches turn 1 (and fails there); try 2 starts over at turn 0.
    first_failure = turns.index(1)
    assert turns[0] == 0 and 0 in turns[first_failure:], turns
