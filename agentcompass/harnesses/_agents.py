"""The built-in rows of the agent table: ``mini-swe-agent`` and ``aider``."""

from __future__ import annotations

import json
import shlex
from typing import Any, ClassVar

from agentcompass import Issue

from ._agent_table import AgentOutcome, AgentRun, InstalledAgent, load_json, register_agent

__all__ = ["Aider", "MiniSweAgent"]


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
        return AgentOutcome(output=output if isinstance(output, str) else None, failure=failure)


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
