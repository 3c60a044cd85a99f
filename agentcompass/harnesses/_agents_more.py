"""More rows of the agent table: ``opencode``, ``qwen-code`` and ``gemini-cli``.

OpenCode ships a native executable per platform (run directly, as Claude
Code and Codex are); Qwen Code and Gemini CLI are JavaScript bundles, so
their cache entry also holds the official Node.js build for the host's
platform (npm ``node-<os>-<cpu>``, installed beside the agent), which runs
them in the session without a Node.js of the session's own.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, ClassVar

import attrs

from agentcompass import Issue

from ._agent_table import AgentOutcome, AgentRun, InstalledAgent, clip, json_lines, node_platform, register_agent, step
from ._agents import ClaudeCode

__all__ = ["GeminiCli", "NODE_VERSION", "OpenCode", "QwenCode"]

#: The Node.js the JavaScript agents run on (Qwen Code needs >= 22).
NODE_VERSION = "22.23.5"
#: How much of an agent's own error message an issue quotes.
_REASON_CHARS = 300


@register_agent
class OpenCode(InstalledAgent):
    """OpenCode (``opencode run --format json``), from npm, run as its native executable.

    Its config (``opencode.json``, named by ``OPENCODE_CONFIG``) defines a
    provider ``local`` at the gateway on OpenCode's bundled
    OpenAI-compatible client (the URL and token read from the gateway's
    variables); every tool is allowed (``OPENCODE_PERMISSION``); update
    checks, the models.dev fetch, default plugins, LSP downloads and sharing
    are off, and its state lives under the agent home. Its retries of a
    failing call cannot be turned off: it makes up to 5, honouring a
    ``Retry-After``. Its JSON events are ``opencode.jsonl``."""

    id: ClassVar[str] = "opencode"
    distribution: ClassVar[str] = "opencode-ai"
    version: ClassVar[str] = "1.18.33"
    installer: ClassVar[str] = "npm"
    log_files: ClassVar[tuple[str, ...]] = ("opencode.jsonl",)

    def binaries(self) -> dict[str, list[str]]:
        system, cpu, libc = node_platform()
        musl = "-musl" if libc == "musl" else ""
        name = {"win32": "windows"}.get(system, system)
        return {
            "opencode": [
                f"opencode-{name}-{cpu}{musl}/bin/opencode",
                f"opencode-{name}-{cpu}-baseline{musl}/bin/opencode",
            ]
        }

    def files(self, run: AgentRun) -> dict[str, str]:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "local": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "local",
                    "options": {
                        "baseURL": "{env:AGENTCOMPASS_GATEWAY_URL}",
                        "apiKey": "{env:AGENTCOMPASS_GATEWAY_TOKEN}",
                    },
                    "models": {run.model: {"name": run.model}},
                }
            },
            "model": f"local/{run.model}",
            "small_model": f"local/{run.model}",
            "autoupdate": False,
            "share": "disabled",
        }
        return {"opencode.json": json.dumps(config)}

    def command(self, run: AgentRun) -> str:
        env = [
            *(f"XDG_{name}_HOME={run.home}/{name.lower()}" for name in ("CONFIG", "DATA", "CACHE", "STATE")),
            f"OPENCODE_CONFIG={run.home}/opencode.json",
            "OPENCODE_PERMISSION=" + shlex.quote('{"*":"allow"}'),
            *(f"OPENCODE_{name}=1" for name in _OPENCODE_OFF),
        ]
        opencode = [
            run.binary("opencode"), "run", "--format", "json", "--print-logs", "-m", shlex.quote(f"local/{run.model}"),
            *(shlex.quote(a) for a in run.args), "--", shlex.quote(run.instruction),
        ]  # fmt: skip
        return " ".join([*env, *opencode]) + f" > {run.logs}/opencode.jsonl < /dev/null"

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        trajectory: list[dict[str, Any]] = []
        output: Any = None
        failure = None
        for event in json_lines(logs.get("opencode.jsonl")):
            kind = event.get("type")
            part = raw if isinstance(raw := event.get("part"), dict) else {}
            if kind == "step_start":
                trajectory.append({"role": "assistant", "content": None})
            elif kind == "text" and isinstance(part.get("text"), str):
                _assistant(trajectory)["content"] = (_assistant(trajectory).get("content") or "") + part["text"]
                output = part["text"]
            elif kind == "tool_use":
                state = raw if isinstance(raw := part.get("state"), dict) else {}
                call_id = str(part.get("callID") or "")
                arguments = clip(json.dumps(state.get("input"))) or ""
                _assistant(trajectory).setdefault("tool_calls", []).append(
                    {"id": call_id, "name": str(part.get("tool") or ""), "arguments": arguments}
                )
                trajectory.append(step("tool", state.get("output") or state.get("error"), tool_call_id=call_id))
            elif kind == "error":
                error = raw if isinstance(raw := event.get("error"), dict) else {}
                data = raw if isinstance(raw := error.get("data"), dict) else {}
                reason = clip(data.get("message")) or clip(error.get("name")) or "error"
                failure = Issue("error", "run", "agent_failed", f"opencode stopped: {reason[:_REASON_CHARS]}")
        for entry in trajectory:
            if entry["role"] == "assistant":
                entry["content"] = clip(entry.get("content"))
        # A step the agent began but that carried nothing (a failed call) is no message.
        trajectory = [e for e in trajectory if e["role"] != "assistant" or e.get("content") or e.get("tool_calls")]
        return AgentOutcome(output=clip(output), trajectory=trajectory, failure=failure)


#: OpenCode's switches turned on: no update check, no model list fetched, no
#: plugins or language servers installed, no sharing, no Claude Code files read.
_OPENCODE_OFF = (
    "DISABLE_AUTOUPDATE",
    "DISABLE_MODELS_FETCH",
    "DISABLE_DEFAULT_PLUGINS",
    "DISABLE_LSP_DOWNLOAD",
    "DISABLE_SHARE",
    "DISABLE_CLAUDE_CODE",
)


def _assistant(trajectory: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant entry being built (a new one when the last entry is not one)."""
    if not trajectory or trajectory[-1]["role"] != "assistant":
        trajectory.append({"role": "assistant", "content": None})
    return trajectory[-1]


class _NodeAgent(InstalledAgent):
    """An npm agent that is a JavaScript bundle: Node.js is installed with it
    and ``bin/node`` runs ``script`` (a path under ``node_modules``)."""

    installer: ClassVar[str] = "npm"
    script: ClassVar[str]
    #: The settings directory under HOME, and the settings written into it.
    settings_dir: ClassVar[str]

    def requirements(self, version: str) -> list[str]:
        system, cpu, _ = node_platform()
        return [f"{self.distribution}@{version}", f"node-{system}-{cpu}@{NODE_VERSION}"]

    def binaries(self) -> dict[str, list[str]]:
        system, cpu, _ = node_platform()
        return {"node": [f"node-{system}-{cpu}/bin/node"]}

    def settings(self, run: AgentRun) -> dict[str, Any]:
        raise NotImplementedError

    def files(self, run: AgentRun) -> dict[str, str]:
        return {"settings.json": json.dumps(self.settings(run))}

    def node(self, run: AgentRun) -> str:
        """Shell text running the bundle on the entry's Node.js, with HOME the agent home."""
        script = shlex.quote(f"{run.root}/npm/node_modules/{self.script}")
        return (
            f"mkdir -p {run.home}/{self.settings_dir} && cp {run.home}/settings.json {run.home}/{self.settings_dir}/"
            f" || exit 96\nHOME={run.home} NO_COLOR=1 {run.binary('node')} {script}"
        )


@register_agent
class GeminiCli(_NodeAgent):
    """Gemini CLI (``gemini -p --output-format stream-json --yolo``), from
    npm, on the entry's Node.js.

    It speaks Gemini's API (``google-generate-content``) to
    ``GOOGLE_GEMINI_BASE_URL`` (the gateway without ``/v1``: it posts
    ``/v1beta/models/...``) with the attempt's token as ``GEMINI_API_KEY``;
    its settings turn off update checks, usage statistics, telemetry, the IDE
    integration and folder trust, and its retries (``general.maxAttempts``
    1). Its ``stream-json`` events are ``gemini.jsonl`` (ending in a
    ``result`` line)."""

    id: ClassVar[str] = "gemini-cli"
    distribution: ClassVar[str] = "@google/gemini-cli"
    version: ClassVar[str] = "0.61.0"
    api: ClassVar[str] = "google-generate-content"
    script: ClassVar[str] = "@google/gemini-cli/bundle/gemini.js"
    settings_dir: ClassVar[str] = ".gemini"
    log_files: ClassVar[tuple[str, ...]] = ("gemini.jsonl",)

    def settings(self, run: AgentRun) -> dict[str, Any]:
        return {
            "general": {
                "disableAutoUpdate": True,
                "disableUpdateNag": True,
                "enableAutoUpdate": False,
                "enableAutoUpdateNotification": False,
                "maxAttempts": 1,
                "retryFetchErrors": False,
            },
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "ide": {"enabled": False},
        }

    def command(self, run: AgentRun) -> str:
        env = [
            f"GEMINI_API_KEY={run.token}",
            f"GOOGLE_GEMINI_BASE_URL={run.origin}",
            "GEMINI_CLI_NO_RELAUNCH=true",
            "GEMINI_CLI_TRUST_WORKSPACE=true",
        ]
        gemini = [
            "-p", shlex.quote(run.instruction), "-m", shlex.quote(run.model), "--yolo", "--output-format", "stream-json",
            *(shlex.quote(a) for a in run.args),
        ]  # fmt: skip
        setup, node = self.node(run).rsplit("\n", 1)
        return setup + "\n" + " ".join([*env, node, *gemini]) + f" > {run.logs}/gemini.jsonl < /dev/null"

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        trajectory: list[dict[str, Any]] = []
        output: Any = None
        failure = None
        for event in json_lines(logs.get("gemini.jsonl")):
            kind = event.get("type")
            if kind == "message" and event.get("role") == "user":
                trajectory.append(step("user", event.get("content")))
            elif kind == "message" and event.get("role") == "assistant" and isinstance(event.get("content"), str):
                entry = _assistant(trajectory)
                entry["content"] = (entry.get("content") or "") + event["content"]
            elif kind == "tool_use":
                arguments = clip(json.dumps(event.get("parameters"))) or ""
                _assistant(trajectory).setdefault("tool_calls", []).append(
                    {
                        "id": str(event.get("tool_id") or ""),
                        "name": str(event.get("tool_name") or ""),
                        "arguments": arguments,
                    }
                )
            elif kind == "tool_result":
                content = event.get("output")
                if content is None and isinstance(event.get("error"), dict):
                    content = event["error"].get("message")
                trajectory.append(step("tool", content, tool_call_id=event.get("tool_id") or ""))
            elif kind == "result" and event.get("status") not in (None, "success"):
                error = raw if isinstance(raw := event.get("error"), dict) else {}
                reason = clip(error.get("message")) or str(event.get("status"))
                failure = Issue("error", "run", "agent_failed", f"gemini-cli stopped: {reason[:_REASON_CHARS]}")
        for entry in trajectory:
            if entry["role"] == "assistant":
                entry["content"] = clip(entry.get("content"))
                if entry["content"]:
                    output = entry["content"]
        return AgentOutcome(output=output, trajectory=trajectory, failure=failure)


@register_agent
class QwenCode(_NodeAgent):
    """Qwen Code (``qwen -p --output-format stream-json --yolo``), from npm,
    on the entry's Node.js.

    It speaks chat completions to ``OPENAI_BASE_URL`` (the gateway) with the
    attempt's token as ``OPENAI_API_KEY``; its settings turn off update
    checks, usage statistics, telemetry, the IDE integration and folder trust,
    and its client's retries (``model.generationConfig.maxRetries`` 0); its
    own retry of a failed turn cannot be turned off (up to 6, honouring a
    ``Retry-After``). Its ``stream-json`` output has Claude Code's shape and
    is ``qwen.jsonl``."""

    id: ClassVar[str] = "qwen-code"
    distribution: ClassVar[str] = "@qwen-code/qwen-code"
    version: ClassVar[str] = "0.24.4"
    script: ClassVar[str] = "@qwen-code/qwen-code/cli.js"
    settings_dir: ClassVar[str] = ".qwen"
    log_files: ClassVar[tuple[str, ...]] = ("qwen.jsonl",)

    def settings(self, run: AgentRun) -> dict[str, Any]:
        return {
            "general": {
                "disableAutoUpdate": True,
                "disableUpdateNag": True,
                "enableAutoUpdate": False,
                "maxAttempts": 1,
            },
            "model": {"name": run.model, "generationConfig": {"maxRetries": 0}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
            "ide": {"enabled": False},
        }

    def command(self, run: AgentRun) -> str:
        env = [
            f"OPENAI_API_KEY={run.token}",
            f"OPENAI_BASE_URL={run.url}",
            f"OPENAI_MODEL={shlex.quote(run.model)}",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING=1",
        ]
        qwen = [
            "-p", shlex.quote(run.instruction), "-m", shlex.quote(run.model), "--yolo", "--output-format", "stream-json",
            *(shlex.quote(a) for a in run.args),
        ]  # fmt: skip
        setup, node = self.node(run).rsplit("\n", 1)
        return setup + "\n" + " ".join([*env, node, *qwen]) + f" > {run.logs}/qwen.jsonl < /dev/null"

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        data = logs.get("qwen.jsonl", b"")
        read = ClaudeCode().outcome({"claude.jsonl": data}, exit_code)
        failure = read.failure
        if failure is not None:
            # Its result line names the error where Claude Code's quotes it as the result.
            errors = [e.get("error") for e in json_lines(data) if e.get("type") == "result"]
            reason = clip(errors[-1].get("message")) if errors and isinstance(errors[-1], dict) else None
            message = failure.message.replace("claude-code", "qwen-code", 1)
            if reason:
                message = f"qwen-code stopped: {reason[:_REASON_CHARS]}"
            failure = attrs.evolve(failure, message=message)
        return AgentOutcome(output=read.output, trajectory=read.trajectory, failure=failure)
