"""The built-in rows of the agent table: ``mini-swe-agent``, ``aider``, ``claude-code`` and ``codex``."""

from __future__ import annotations

import json
import shlex
from typing import Any, ClassVar

from agentcompass import Issue

from ._agent_table import (
    AgentOutcome,
    AgentRun,
    InstalledAgent,
    clip,
    json_lines,
    load_json,
    node_platform,
    register_agent,
    step,
)

__all__ = ["Aider", "ClaudeCode", "Codex", "MiniSweAgent"]

#: How much of an agent's own error message an issue quotes.
_REASON_CHARS = 300


@register_agent
class MiniSweAgent(InstalledAgent):
    """mini-swe-agent (``mini``): chat completions with one ``bash`` tool,
    run with ``-y --exit-immediately``; its ``-o`` trajectory
    (``trajectory_format: mini-swe-agent-1.1``) is ``trajectory.json``.
    Model retries: ``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1`` and the OpenAI
    client's ``max_retries=0``; no cost limit
    (the gateway's ``max_model_calls`` and the run budget bound it); the
    cost map is read locally (``LITELLM_LOCAL_MODEL_COST_MAP``), so it
    never reaches for the internet."""

    id: ClassVar[str] = "mini-swe-agent"
    distribution: ClassVar[str] = "mini-swe-agent"
    version: ClassVar[str] = "2.4.6"
    log_files: ClassVar[tuple[str, ...]] = ("trajectory.json",)

    def command(self, run: AgentRun) -> str:
        env = {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        # max_retries: the OpenAI client's own retries under litellm (2 by default).
        settings = ["agent.cost_limit=0", "agent.mode=yolo", "model.model_kwargs.max_retries=0"]
        if run.max_turns is not None:
            settings.append(f"agent.step_limit={run.max_turns}")
        return " ".join(
            [
                *(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                f"MSWEA_GLOBAL_CONFIG_DIR={run.home}/mini-swe-agent",
                run.script("mini"),
                "-m", shlex.quote(f"openai/{run.model}"), "-y", "--exit-immediately",
                "-t", shlex.quote(run.instruction),
                "-c", "mini.yaml", *(f"-c {shlex.quote(s)}" for s in settings),
                f"-c model.model_kwargs.api_base={run.url}", f"-c model.model_kwargs.api_key={run.token}",
                "-o", f"{run.logs}/trajectory.json",
                *(shlex.quote(a) for a in run.args),
            ]
        )  # fmt: skip

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        data = load_json(logs.get("trajectory.json"))
        info = data.get("info") if isinstance(data, dict) else None
        if not isinstance(info, dict):
            return AgentOutcome()
        status = info.get("exit_status")
        output = info.get("submission")
        failure = None
        if isinstance(status, str) and status not in ("Submitted", ""):
            code = "harness_limit_reached" if status == "LimitsExceeded" else "agent_failed"
            failure = Issue("error", "run", code, f"mini-swe-agent stopped: {status[:200]}")
        messages = data.get("messages") if isinstance(data, dict) else None
        return AgentOutcome(
            output=output if isinstance(output, str) else None, trajectory=_chat_steps(messages), failure=failure
        )


def _chat_steps(messages: Any) -> list[dict[str, Any]]:
    """Chat-format messages (mini-swe-agent's own record) as trajectory steps;
    its closing ``exit`` entry and anything not a message are left out."""
    steps = []
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            continue
        calls = []
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                arguments = function.get("arguments")
                calls.append({
                    "id": str(call.get("id") or ""), "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                })  # fmt: skip
        steps.append(step(message["role"], message.get("content"), tool_calls=calls, tool_call_id=message.get("tool_call_id")))
    return steps


#: Runs aider with its retry window cut so a failing call is retried once
#: (aider retries while its doubling delay, from 0.125 s, stays under
#: ``RETRY_TIMEOUT``; it has no option for it).
_AIDER_MAIN = (
    "import sys, aider.models as m, aider.coders.base_coder as b; "
    "m.RETRY_TIMEOUT = b.RETRY_TIMEOUT = 0.3; "
    "from aider.main import main; sys.argv[0] = 'aider'; sys.exit(main())"
)


@register_agent
class Aider(InstalledAgent):
    """aider: plain-text chat completions, editing files in the working
    directory (``--edit-format whole``), no git, no shell; update checks,
    analytics and streaming off; its chat and LLM histories are
    ``chat.history.md`` and ``llm.history.txt``. It exits 0 even when every
    model call failed: the gateway's record decides the outcome."""

    id: ClassVar[str] = "aider"
    distribution: ClassVar[str] = "aider-chat"
    version: ClassVar[str] = "0.86.2"
    log_files: ClassVar[tuple[str, ...]] = ("chat.history.md",)

    def files(self, run: AgentRun) -> dict[str, str]:
        # Unknown to litellm's cost map: a context size so aider does not warn or guess.
        metadata: dict[str, Any] = {
            f"openai/{run.model}": {
                "max_input_tokens": 128000,
                "max_output_tokens": 8192,
                "input_cost_per_token": 0,
                "output_cost_per_token": 0,
                "litellm_provider": "openai",
                "mode": "chat",
            }
        }
        # The OpenAI client's own retries under litellm (2 by default) off:
        # aider's single retry (see _AIDER_MAIN) is the only one.
        settings = [{"name": f"openai/{run.model}", "extra_params": {"max_retries": 0}}]
        return {"model-metadata.json": json.dumps(metadata), "model-settings.json": json.dumps(settings)}

    def command(self, run: AgentRun) -> str:
        return " ".join(
            [
                f"HOME={run.home}", "LITELLM_LOCAL_MODEL_COST_MAP=True",
                shlex.quote(run.python), "-c", shlex.quote(_AIDER_MAIN),
                "--model", shlex.quote(f"openai/{run.model}"),
                "--openai-api-base", run.url, "--openai-api-key", run.token,
                "--no-stream", "--no-git", "--yes-always", "--edit-format", "whole", "--no-pretty",
                "--no-fancy-input", "--no-show-model-warnings", "--no-show-release-notes", "--no-check-update",
                "--no-analytics", "--analytics-disable", "--model-metadata-file", f"{run.home}/model-metadata.json",
                "--model-settings-file", f"{run.home}/model-settings.json",
                "--input-history-file", f"{run.home}/input.history",
                "--chat-history-file", f"{run.logs}/chat.history.md",
                "--llm-history-file", f"{run.logs}/llm.history.txt",
                *(shlex.quote(a) for a in run.args),
                "--message", shlex.quote(run.instruction),
            ]
        )  # fmt: skip


@register_agent
class ClaudeCode(InstalledAgent):
    """Claude Code (``claude -p``), from npm, run as its native executable.

    It speaks the Messages API to ``ANTHROPIC_BASE_URL`` (the gateway without
    ``/v1``: it posts ``/v1/messages``), with the attempt's token as
    ``ANTHROPIC_API_KEY``; every model alias it may pick (background and
    subagent calls) is the request's model. Nonessential traffic is off and
    its retries are cut to one (``CLAUDE_CODE_MAX_RETRIES=1``; it retries 10
    times by default). Tools run without prompts
    (``--dangerously-skip-permissions``, which as root needs
    ``IS_SANDBOX=1``). Its ``stream-json`` stdout is ``claude.jsonl`` (steps,
    then a ``result`` line); its session file
    (``CLAUDE_CONFIG_DIR/projects/.../SESSION.jsonl``) is copied to
    ``session.jsonl`` when it exits (the prompt is read from there)."""

    id: ClassVar[str] = "claude-code"
    distribution: ClassVar[str] = "@anthropic-ai/claude-code"
    version: ClassVar[str] = "2.1.197"
    api: ClassVar[str] = "anthropic-messages"
    installer: ClassVar[str] = "npm"
    log_files: ClassVar[tuple[str, ...]] = ("claude.jsonl", "session.jsonl")

    def binaries(self) -> dict[str, list[str]]:
        system, cpu, libc = node_platform()
        musl = "-musl" if libc == "musl" else ""
        return {"claude": [f"@anthropic-ai/claude-code-{system}-{cpu}{musl}/claude"]}

    def command(self, run: AgentRun) -> str:
        model = shlex.quote(run.model)
        env = [
            f"CLAUDE_CONFIG_DIR={run.home}/claude",
            f"ANTHROPIC_BASE_URL={run.origin}",
            f"ANTHROPIC_API_KEY={run.token}",
            *(f"{name}={model}" for name in _CLAUDE_MODELS),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
            "CLAUDE_CODE_MAX_RETRIES=1",
            "IS_SANDBOX=1",
        ]
        claude = [
            run.binary("claude"), "-p", "--output-format", "stream-json", "--verbose",
            "--allowedTools=Bash", "--dangerously-skip-permissions",
            *([] if run.max_turns is None else ["--max-turns", str(run.max_turns)]),
            *(shlex.quote(a) for a in run.args), "--", shlex.quote(run.instruction),
        ]  # fmt: skip
        return "\n".join(
            [
                " ".join([*env, *claude]) + f" > {run.logs}/claude.jsonl < /dev/null",
                "status=$?",
                f"for f in {run.home}/claude/projects/*/*.jsonl; do [ -f \"$f\" ] && cat \"$f\"; done"
                f" > {run.logs}/session.jsonl 2>/dev/null",
                'exit "$status"',
            ]
        )

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        trajectory: list[dict[str, Any]] = []
        message_id: Any = None
        output: Any = None
        failure = None
        for line in json_lines(logs.get("claude.jsonl")):
            kind = line.get("type")
            message = line.get("message")
            if kind == "assistant" and isinstance(message, dict):
                # One line per content block: the blocks of one reply share its id.
                if message_id is None or message.get("id") != message_id or not trajectory:
                    trajectory.append({"role": "assistant", "content": None})
                message_id = message.get("id")
                _claude_blocks(trajectory[-1], message.get("content"))
            elif kind == "user" and isinstance(message, dict):
                message_id = None
                trajectory += _claude_user(message.get("content"))
            elif kind == "result":
                text = line.get("result")
                if line.get("is_error") is True or str(line.get("subtype", "")).startswith("error"):
                    subtype = str(line.get("subtype") or "")
                    code = "harness_limit_reached" if subtype == "error_max_turns" else "agent_failed"
                    status = line.get("api_error_status")
                    reason = clip(text) or subtype or "error"
                    detail = f" (API status {status})" if isinstance(status, int) else ""
                    failure = Issue("error", "run", code, f"claude-code stopped{detail}: {reason[:_REASON_CHARS]}")
                elif isinstance(text, str):
                    output = text
        for entry in trajectory:
            if entry["role"] == "assistant" and entry.get("content") is not None:
                entry["content"] = clip(entry["content"])
        prompt = _claude_prompt(logs.get("session.jsonl"))
        if trajectory and prompt is not None:
            trajectory.insert(0, step("user", prompt))  # its stdout starts at the first reply
        return AgentOutcome(output=output, trajectory=trajectory, failure=failure)


#: Claude Code's model variables: each alias it may pick names the request's model.
_CLAUDE_MODELS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def _claude_blocks(entry: dict[str, Any], blocks: Any) -> None:
    """Add a Messages reply's content blocks (text, tool_use) to its assistant entry."""
    for block in blocks if isinstance(blocks, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            entry["content"] = (entry.get("content") or "") + block["text"]
        elif block.get("type") == "tool_use":
            arguments = block.get("input")
            entry.setdefault("tool_calls", []).append(
                {
                    "id": str(block.get("id") or ""),
                    "name": str(block.get("name") or ""),
                    "arguments": clip(json.dumps(arguments)) or "",
                }
            )


def _claude_prompt(session: bytes | None) -> str | None:
    """The prompt of a Claude Code session file: its first user message."""
    for line in json_lines(session):
        message = line.get("message")
        if line.get("type") == "user" and isinstance(message, dict):
            return clip(message.get("content"))
    return None


def _claude_user(content: Any) -> list[dict[str, Any]]:
    """A user message's steps: its text, and a ``tool`` entry per tool result."""
    if isinstance(content, str):
        return [step("user", content)]
    steps = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            steps.append(step("tool", block.get("content"), tool_call_id=block.get("tool_use_id") or ""))
        elif block.get("type") == "text":
            steps.append(step("user", block.get("text")))
    return steps


@register_agent
class Codex(InstalledAgent):
    """Codex (``codex exec``), from npm, run as its native (static) executable.

    A model provider ``local`` at the gateway speaks the Responses API
    (``wire_api = "responses"``; Codex refuses ``chat``), its key the
    attempt's token through ``CODEX_GATEWAY_KEY``; its request and stream
    retries are off (one request per turn; the runtime retries), plugins,
    analytics and update checks off; approvals and its own sandbox off (the
    session is the sandbox). ``CODEX_HOME`` is under the agent home and
    ``TMPDIR`` beside it, not above it: Codex makes its ``apply_patch``
    helpers only outside the temporary directory. Its ``--json`` events are
    ``codex.jsonl`` (ending in ``turn.completed`` or ``turn.failed``), its
    last message ``last.txt``, and its session file
    (``CODEX_HOME/sessions/.../rollout-*.jsonl``) is copied to
    ``rollout.jsonl`` when it exits; the trajectory is read from that."""

    id: ClassVar[str] = "codex"
    distribution: ClassVar[str] = "@openai/codex"
    version: ClassVar[str] = "0.171.0"
    api: ClassVar[str] = "openai-responses"
    installer: ClassVar[str] = "npm"
    log_files: ClassVar[tuple[str, ...]] = ("codex.jsonl", "rollout.jsonl", "last.txt")

    def binaries(self) -> dict[str, list[str]]:
        system, cpu, _ = node_platform()
        triple = {"x64": "x86_64", "arm64": "aarch64"}.get(cpu, cpu)
        # Codex's Linux executables are static (musl): one per CPU, whatever the libc.
        target = f"{triple}-unknown-linux-musl" if system == "linux" else f"{triple}-apple-darwin"
        return {"codex": [f"@openai/codex-{system}-{cpu}/vendor/{target}/bin/codex"]}

    def command(self, run: AgentRun) -> str:
        settings = {
            "model_provider": "local",
            "model_providers.local.name": "local",
            "model_providers.local.base_url": None,
            "model_providers.local.env_key": "CODEX_GATEWAY_KEY",
            "model_providers.local.wire_api": "responses",
            "model_providers.local.request_max_retries": "0",
            "model_providers.local.stream_max_retries": "0",
            "features.plugins": "false",
            "analytics.enabled": "false",
            "check_for_update_on_startup": "false",
        }
        options = " ".join(
            f"-c {key}={run.url}" if value is None else f"-c {shlex.quote(f'{key}={value}')}"
            for key, value in settings.items()
        )
        return "\n".join(
            [
                f'mkdir -p {run.home}/codex {run.home}/tmp || exit 96',
                " ".join(
                    [
                        f"CODEX_HOME={run.home}/codex", f"TMPDIR={run.home}/tmp", f"CODEX_GATEWAY_KEY={run.token}",
                        run.binary("codex"), "exec", "--skip-git-repo-check",
                        "--dangerously-bypass-approvals-and-sandbox", "--json",
                        "-m", shlex.quote(run.model), options, "-o", f"{run.logs}/last.txt",
                        *(shlex.quote(a) for a in run.args), "--", shlex.quote(run.instruction),
                        f"> {run.logs}/codex.jsonl < /dev/null",
                    ]
                ),  # fmt: skip
                "status=$?",
                f"for f in {run.home}/codex/sessions/*/*/*/rollout-*.jsonl; do [ -f \"$f\" ] && cat \"$f\"; done"
                f" > {run.logs}/rollout.jsonl 2>/dev/null",
                'exit "$status"',
            ]
        )

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        output: Any = None
        failure = None
        last_error: Any = None
        for event in json_lines(logs.get("codex.jsonl")):
            kind = event.get("type")
            item = event.get("item")
            if kind == "item.completed" and isinstance(item, dict) and item.get("type") == "agent_message":
                output = item.get("text") if isinstance(item.get("text"), str) else output
            elif kind == "error":
                last_error = event.get("message")
            elif kind == "turn.failed":
                error = event.get("error")
                reason = clip(error.get("message") if isinstance(error, dict) else None) or clip(last_error) or "turn failed"
                failure = Issue("error", "run", "agent_failed", f"codex stopped: {reason[:_REASON_CHARS]}")
        last = logs.get("last.txt")
        if last and last.strip():
            output = last.decode("utf-8", errors="replace").strip()
        return AgentOutcome(output=clip(output), trajectory=_codex_steps(logs.get("rollout.jsonl")), failure=failure)


def _codex_steps(data: bytes | None) -> list[dict[str, Any]]:
    """The conversation items of a Codex rollout as trajectory steps: user and
    assistant messages (not its developer instructions), each reply's tool
    calls on its assistant entry, and their outputs as ``tool`` entries."""
    steps: list[dict[str, Any]] = []
    for line in json_lines(data):
        item = line.get("payload") if line.get("type") == "response_item" else None
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message" and item.get("role") in ("user", "assistant"):
            steps.append(step(str(item["role"]), item.get("content")))
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            call = {
                "id": str(item.get("call_id") or ""),
                "name": str(item.get("name") or ""),
                "arguments": clip(arguments if isinstance(arguments, str) else json.dumps(arguments)) or "",
            }
            if not steps or steps[-1]["role"] != "assistant":
                steps.append(step("assistant", None))
            steps[-1].setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            result = item.get("output")
            if isinstance(result, dict):
                result = result.get("content")
            steps.append(step("tool", result, tool_call_id=item.get("call_id") or ""))
    return steps
