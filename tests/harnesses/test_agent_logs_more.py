"""Reading OpenCode's, Gemini CLI's and Qwen Code's own logs into the
attempt's output, trajectory and failure. The fixtures under
``agent_logs/`` are lines the real CLIs (opencode 1.18.33, gemini-cli
0.61.0, qwen-code 0.24.4) wrote against the scripted model server: a task
solved with one shell call, and an upstream 500 after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass.harnesses._agents_more import GeminiCli, OpenCode, QwenCode

LOGS = Path(__file__).with_name("agent_logs")
WRITE = "echo 'Hello, world!' > hello.txt && cat hello.txt"
AGENTS = {"opencode": OpenCode, "gemini-cli": GeminiCli, "qwen-code": QwenCode}


def _outcome(agent: str, suffix: str = ""):
    cls = AGENTS[agent]
    return cls().outcome({cls.log_files[0]: (LOGS / f"{agent}{suffix}.jsonl").read_bytes()}, 0)


@pytest.mark.parametrize(
    ("agent", "tool", "call_id", "extra", "result"),
    [
        ("opencode", "bash", "call_1", {"description": "write the file"}, "Hello, world!\n"),
        ("gemini-cli", "run_shell_command", "run_shell_command__call_1", {}, "Hello, world!"),
        ("qwen-code", "run_shell_command", "call_1", {}, None),
    ],
)
def test_a_solved_task_gives_the_shell_call_its_result_and_the_last_message(agent, tool, call_id, extra, result):
    outcome = _outcome(agent)
    assert outcome.failure is None and outcome.output == "Done."
    steps = [s for s in outcome.trajectory if s["role"] != "user"]
    assert [s["role"] for s in steps] == ["assistant", "tool", "assistant"]
    (call,) = steps[0]["tool_calls"]
    assert (call["id"], call["name"], json.loads(call["arguments"])) == (call_id, tool, {"command": WRITE, **extra})
    assert steps[1]["tool_call_id"] == call_id
    if result is not None:
        assert steps[1]["content"] == result
    assert steps[2]["content"] == "Done."


@pytest.mark.parametrize("agent", AGENTS)
def test_an_upstream_500_is_an_agent_failure_quoting_the_error(agent):
    outcome = _outcome(agent, "-500")
    assert outcome.failure is not None
    assert (outcome.failure.severity, outcome.failure.code) == ("error", "agent_failed")
    assert outcome.failure.message.startswith(f"{agent} stopped: ") and "500" in outcome.failure.message
    calls = [c for s in outcome.trajectory for c in s.get("tool_calls", [])]
    assert [json.loads(c["arguments"])["command"] for c in calls] == ["ls"]


#: The keys and type names the readers look at, so generated lines reach their branches.
_KEYS = st.sampled_from(
    [
        "type",
        "part",
        "state",
        "role",
        "content",
        "message",
        "error",
        "data",
        "input",
        "output",
        "text",
        "tool",
        "callID",
        "tool_id",
        "tool_name",
        "parameters",
        "status",
        "result",
    ]
)
_KINDS = st.sampled_from(
    [
        "step_start",
        "text",
        "tool_use",
        "tool_result",
        "error",
        "message",
        "result",
        "assistant",
        "user",
        "tool_use",
        "tool_result",
        "text",
    ]
)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | _KINDS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=100) | st.dictionaries(_KEYS, _VALUES, max_size=6), max_size=8),
       st.sampled_from(sorted(AGENTS)))  # fmt: skip
def test_any_log_is_read_without_raising(lines, agent):
    cls = AGENTS[agent]
    data = b"\n".join(line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines)
    outcome = cls().outcome({cls.log_files[0]: data}, 1)
    assert isinstance(outcome.trajectory, list)
