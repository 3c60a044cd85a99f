"""Reading Claude Code's and Codex's own logs into the attempt's output,
trajectory and failure. The fixtures under ``agent_logs/`` are lines the
real CLIs (claude-code 2.1.197, codex 0.171.0) wrote against a loopback
model server: a task solved with one shell call, and a model failure."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass.harnesses._agent_table import AgentRun
from agentcompass.harnesses._agents import ClaudeCode, Codex

LOGS = Path(__file__).with_name("agent_logs")


def _read(name: str) -> bytes:
    return (LOGS / name).read_bytes()


def _lines(*values: object) -> bytes:
    return b"\n".join(json.dumps(v).encode() for v in values)


def test_claude_codes_stream_gives_its_steps_tool_calls_and_result():
    logs = {"claude.jsonl": _read("claude-code.jsonl"), "session.jsonl": _read("claude-code-session.jsonl")}
    outcome = ClaudeCode().outcome(logs, 0)
    assert outcome.failure is None
    assert outcome.output == "Done: hello.txt written."
    # The prompt from its session file; the two content blocks of the first
    # reply (text, then tool_use) are one assistant step.
    assert outcome.trajectory == [
        {"role": "user", "content": "Write hello.txt"},
        {
            "role": "assistant",
            "content": "I will write the file.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "name": "Bash",
                    "arguments": json.dumps({"command": "echo 'Hello, world!' > hello.txt && cat hello.txt"}),
                }
            ],
        },
        {"role": "tool", "content": "Hello, world!", "tool_call_id": "toolu_01"},
        {"role": "assistant", "content": "Done: hello.txt written."},
    ]


def test_claude_codes_api_error_result_is_an_agent_failure_naming_the_status():
    outcome = ClaudeCode().outcome({"claude.jsonl": _read("claude-code-529.jsonl")}, 1)
    assert outcome.output is None
    assert outcome.failure is not None
    assert (outcome.failure.severity, outcome.failure.code) == ("error", "agent_failed")
    assert "API status 529" in outcome.failure.message and "API Error: 529" in outcome.failure.message
    # Its synthetic error reply is a step too.
    assert [s["role"] for s in outcome.trajectory] == ["assistant"]


def test_claude_code_stopped_by_its_turn_limit_is_harness_limit_reached():
    result = {"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 3}
    outcome = ClaudeCode().outcome({"claude.jsonl": _lines(result)}, 1)
    assert outcome.failure is not None and outcome.failure.code == "harness_limit_reached"
    assert "error_max_turns" in outcome.failure.message


def test_codexs_rollout_gives_its_steps_and_last_txt_its_output():
    logs = {"codex.jsonl": _read("codex.jsonl"), "rollout.jsonl": _read("codex-rollout.jsonl"), "last.txt": b"Done.\n"}
    outcome = Codex().outcome(logs, 0)
    assert outcome.failure is None
    assert outcome.output == "Done."
    roles = [s["role"] for s in outcome.trajectory]
    # Its developer instructions are not steps; the environment context and the task are.
    assert roles == ["user", "user", "assistant", "tool", "assistant"]
    assert outcome.trajectory[1]["content"] == "Write hello.txt"
    (call,) = outcome.trajectory[2]["tool_calls"]
    assert call["id"] == "call_1" and call["name"] == "exec_command"
    assert json.loads(call["arguments"]) == {"cmd": "echo 'Hello, world!' > hello.txt && cat hello.txt"}
    assert outcome.trajectory[3]["tool_call_id"] == "call_1" and "Hello, world!" in outcome.trajectory[3]["content"]
    assert outcome.trajectory[4]["content"] == "Done: hello.txt written."


def test_codex_without_last_txt_takes_its_last_agent_message():
    outcome = Codex().outcome({"codex.jsonl": _read("codex.jsonl")}, 0)
    assert outcome.output == "Done: hello.txt written."
    assert outcome.trajectory == []  # no rollout: the harness uses the gateway's record


def test_codexs_failed_turn_is_an_agent_failure_with_its_message():
    outcome = Codex().outcome({"codex.jsonl": _read("codex-failed.jsonl"), "last.txt": b""}, 1)
    assert outcome.failure is not None
    assert (outcome.failure.severity, outcome.failure.code) == ("error", "agent_failed")
    assert "high demand" in outcome.failure.message
    assert outcome.output is None


def test_hostile_logs_are_read_without_trusting_their_shape():
    junk = b"\n".join(
        [
            b"not json",
            b"[1, 2]",
            b'{"type": "assistant", "message": {"id": 5, "content": [7, {"type": "tool_use", "input": {"a": [1]}}]}}',
            b'{"type": "assistant", "message": "text"}',
            b'{"type": "user", "message": {"content": [{"type": "tool_result", "content": [{"text": 3}, "x"]}]}}',
            b'{"type": "result", "is_error": true, "result": {"nested": 1}, "api_error_status": "500"}',
            b"\xff\xfe",
            b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
        ]
    )
    outcome = ClaudeCode().outcome({"claude.jsonl": junk}, 1)
    assert outcome.trajectory == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "", "name": "", "arguments": '{"a": [1]}'}]},
        {"role": "tool", "content": "", "tool_call_id": ""},
    ]
    assert outcome.failure is not None and outcome.failure.message == "claude-code stopped: error"
    rollout = _lines(
        {"type": "response_item", "payload": {"type": "function_call_output", "output": {"content": 3}}},
        {"type": "response_item", "payload": {"type": "message", "role": "developer", "content": "secret rules"}},
        {"type": "response_item", "payload": {"type": "custom_tool_call", "call_id": 9, "input": "*** Begin Patch"}},
        {"type": "response_item", "payload": ["x"]},
        {"type": "turn.failed", "error": "not a dict"},
    )
    events = _lines({"type": "turn.failed", "error": 1}) + b"\n" + b'{"a":' * 100_000
    outcome = Codex().outcome({"rollout.jsonl": rollout, "codex.jsonl": events}, 1)
    assert outcome.trajectory == [
        {"role": "tool", "content": None, "tool_call_id": ""},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "9", "name": "", "arguments": "*** Begin Patch"}]},
    ]
    assert outcome.failure is not None and outcome.failure.message == "codex stopped: turn failed"


def test_a_huge_message_is_cut_in_the_trajectory():
    big = "x" * 100_000
    line = {"type": "assistant", "message": {"id": "m", "content": [{"type": "text", "text": big}]}}
    (entry,) = ClaudeCode().outcome({"claude.jsonl": _lines(line)}, 0).trajectory
    assert len(entry["content"]) < 20_100 and entry["content"].endswith("[80000 more characters]")


_KEYS = st.sampled_from(
    ["type", "message", "content", "id", "name", "input", "text", "payload", "role", "result", "is_error", "error",
     "item", "call_id", "output", "arguments", "tool_use_id", "subtype"]
)  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(_KEYS, children, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_JSON, max_size=6))
def test_any_json_lines_give_a_well_shaped_outcome(values):
    data = _lines(*values)
    for agent, logs in ((ClaudeCode(), {"claude.jsonl": data}), (Codex(), {"codex.jsonl": data, "rollout.jsonl": data})):
        outcome = agent.outcome(logs, 1)
        for entry in outcome.trajectory:
            assert entry["role"] in ("user", "assistant", "tool")
            assert entry["content"] is None or isinstance(entry["content"], str)
            for call in entry.get("tool_calls", []):
                assert all(isinstance(call[k], str) for k in ("id", "name", "arguments"))
        json.dumps(outcome.trajectory)
        assert outcome.output is None or isinstance(outcome.output, str)


def test_the_commands_reach_the_gateway_with_the_token_and_keep_their_logs():
    run = AgentRun(venv="/e/venv", python="/e/venv/bin/python", root="/e", instruction="-v do it 'now'", model="m x")
    claude = ClaudeCode().command(run)
    assert 'ANTHROPIC_BASE_URL="${AGENTCOMPASS_GATEWAY_URL%/v1}"' in claude
    assert 'ANTHROPIC_API_KEY="$AGENTCOMPASS_GATEWAY_TOKEN"' in claude and "ANTHROPIC_MODEL='m x'" in claude
    assert "CLAUDE_CODE_MAX_RETRIES=1" in claude and "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1" in claude
    assert "/e/bin/claude -p --output-format stream-json --verbose --allowedTools=Bash" in claude
    assert claude.split("\n")[0].endswith("-- '-v do it '\"'\"'now'\"'\"'' > \"$AGENT_LOGS\"/claude.jsonl < /dev/null")
    assert '> "$AGENT_LOGS"/session.jsonl' in claude and claude.endswith('exit "$status"')
    codex = Codex().command(run)
    assert '-c model_providers.local.base_url="$AGENTCOMPASS_GATEWAY_URL"' in codex
    assert 'CODEX_GATEWAY_KEY="$AGENTCOMPASS_GATEWAY_TOKEN"' in codex
    assert "-c model_providers.local.env_key=CODEX_GATEWAY_KEY" in codex
    for setting in ("wire_api=responses", "request_max_retries=0", "stream_max_retries=0"):
        assert f"-c model_providers.local.{setting}" in codex
    assert 'CODEX_HOME="$AGENT_HOME"/codex TMPDIR="$AGENT_HOME"/tmp' in codex
    assert '-o "$AGENT_LOGS"/last.txt' in codex and '> "$AGENT_LOGS"/rollout.jsonl' in codex
