"""The ``react`` harness: a tool-calling agent loop on the request's model.

Each step sends the conversation to the model (through the orchestration's
shared client, :func:`agentcompass.models.chat_client`) with two tools:

- ``bash(command)`` runs ``command`` in the task Environment (``bash -c``,
  starting in the app directory), bounded by ``tool_timeout_seconds``. The
  tool result is stdout, then stderr, then the exit code when non-zero,
  cut to ``max_output_chars`` with a ``[output truncated: N more
  characters]`` marker. A timeout is reported to the model, not an issue.
- ``submit(answer)`` ends the episode; ``answer`` is the result's ``output``.

A reply with no tool call also ends the episode (its text is the output).
A malformed tool call (unknown tool, arguments that are not a JSON object)
is answered with an error message so the model can correct itself.

Config: ``max_steps`` (30, model calls per episode), ``system_prompt`` (a
built-in one when unset), ``tool_timeout_seconds`` (60), ``max_output_chars``
(10000).

Each command gets ``AGENTCOMPASS_DEADLINE`` (Unix seconds at which the run
budget ends) when the run has a timeout.

Outcomes: ``max_steps`` calls without a submission is ERROR
``harness_max_iterations``; the run budget (``RunBudget``) expiring is ERROR
``harness_timeout``; a call past ``execution.limits`` is refused by the
runtime's client, ERROR ``harness_limit_reached`` naming the limit; a failed model call is the client's classified issue
(``model_auth``, ``model_timeout``, ...; see ``agentcompass._models``). In
every case the partial trajectory is kept.

The trajectory (``RunResult.trajectory``) is the conversation, in order:
``system`` and ``user`` messages, then per step the ``assistant`` message
(``content``, ``tool_calls`` as ``{id, name, arguments}``, ``step``,
``usage``, ``duration_seconds``) and one ``tool`` message per call
(``tool_call_id``, ``name``, ``content``, ``step``, ``exit_code``,
``timed_out``, ``truncated``, ``duration_seconds``). ``usage`` sums the
episode's model calls (``prompt_tokens``, ``completion_tokens``, ``calls``).
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import attrs
import trio

from agentcompass import (
    BaseHarness,
    EnvironmentSession,
    ExecutionPlan,
    Issue,
    IssueError,
    ModelSpec,
    PreparedTask,
    RunBudget,
    RunResult,
    register,
)
from agentcompass.models import ChatClient, ModelError, ModelUsage, ToolCall, chat_client

__all__ = ["ReactHarness"]

DEFAULT_SYSTEM_PROMPT = """\
You are an autonomous agent solving a task in a Linux shell.
Use the `bash` tool to run commands; each call runs in a fresh shell that starts in the \
task's working directory, the app directory (paths written `/app/...` in the task refer to \
it; it is also in $APP_DIR). Inspect before you change things and check your work.
When the task is done, call `submit` with a short final answer (or a summary of what you did)."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the task's sandbox and return its output and exit code.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit the final answer and end the task.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The final answer."}},
                "required": ["answer"],
            },
        },
    },
]


@attrs.define(eq=False)
class ReactSession:
    """What ``start_session`` returns: the Environment and the model's client."""

    env: EnvironmentSession
    client: ChatClient


@attrs.define(eq=False)
class _Episode:
    """The state of one run: the conversation and its trajectory record."""

    messages: list[dict[str, Any]]
    trajectory: list[dict[str, Any]]
    usage: ModelUsage = attrs.Factory(ModelUsage)
    output: Any = None
    done: bool = False
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    #: What every command gets (``AGENTCOMPASS_DEADLINE``).
    environment: dict[str, str] | None = None


@register
class ReactHarness(BaseHarness):
    """A tool-calling agent on the request's model: ``bash`` in the task Environment, then ``submit``.

    See the module docstring for the loop, its outcomes and the trajectory.
    """

    id: ClassVar[str] = "react"

    @attrs.frozen
    class Config:
        max_steps: int = attrs.field(
            default=30, validator=attrs.validators.ge(1), metadata={"doc": "model calls per episode before giving up"}
        )
        system_prompt: str | None = attrs.field(
            default=None, metadata={"doc": "the system message (a built-in one if unset)"}
        )
        tool_timeout_seconds: float = attrs.field(
            default=60, validator=attrs.validators.gt(0), metadata={"doc": "bound of one bash call"}
        )
        max_output_chars: int = attrs.field(
            default=10000,
            validator=attrs.validators.ge(1),
            metadata={"doc": "a tool result is cut to this, with a marker"},
        )

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> Any:
        if model is None or model.api != "openai-chat":
            raise IssueError("fatal", "setup_failed", "harness 'react' needs a request model with api 'openai-chat'")
        return ReactSession(env, chat_client(model))

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        options = self.options
        system = options.system_prompt or DEFAULT_SYSTEM_PROMPT
        instruction = _instruction(prepared)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
        episode = _Episode(messages, [dict(m) for m in messages], environment=budget.environment() or None)
        issues: list[Issue] = []
        deadline = math.inf if budget.timeout_seconds is None else trio.current_time() + budget.timeout_seconds
        with trio.move_on_at(deadline) as scope:
            try:
                await self._loop(session, episode)
            except ModelError as exc:
                issues.append(exc.to_issue("run"))
        if scope.cancelled_caught:
            issues.append(
                Issue("error", "run", "harness_timeout", f"the agent did not finish within {budget.timeout_seconds:g}s")
            )
        elif not episode.done and not issues:
            issues.append(
                Issue("error", "run", "harness_max_iterations", f"no submission within max_steps={options.max_steps}")
            )
        return RunResult(
            output=episode.output,
            trajectory=episode.trajectory,
            usage=episode.usage.to_dict(),
            issues=issues,
            timings={"model": round(episode.model_seconds, 6), "tools": round(episode.tool_seconds, 6)},
        )

    async def _loop(self, session: ReactSession, episode: _Episode) -> None:
        now = trio.current_time
        for step in range(1, self.options.max_steps + 1):
            start = now()
            reply = await session.client.chat(episode.messages, tools=TOOLS)
            took = now() - start
            episode.model_seconds += took
            episode.usage.add(reply.usage)
            episode.messages.append(reply.message)
            episode.trajectory.append(
                {
                    "role": "assistant",
                    "content": reply.content,
                    "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
                    "step": step,
                    "usage": reply.usage,
                    "duration_seconds": round(took, 6),
                }
            )
            if not reply.tool_calls:
                episode.output = reply.content
                episode.done = True
                return
            for call in reply.tool_calls:
                await self._tool(session, episode, call, step)
            if episode.done:
                return

    async def _tool(self, session: ReactSession, episode: _Episode, call: ToolCall, step: int) -> None:
        start = trio.current_time()
        exit_code: int | None = None
        timed_out = truncated = False
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            content = f"error: the arguments of {call.name!r} must be a JSON object"
        elif call.name == "submit":
            episode.output = arguments.get("answer", "")
            episode.done = True
            content = "submitted"
        elif call.name == "bash" and isinstance(arguments.get("command"), str):
            timeout = self.options.tool_timeout_seconds
            result = await session.env.exec(arguments["command"], timeout=timeout, env=episode.environment)
            exit_code, timed_out = result.exit_code, result.timed_out
            content, truncated = _tool_output(
                result.stdout, result.stderr, exit_code, timed_out, timeout, self.options.max_output_chars
            )
        elif call.name == "bash":
            content = "error: bash needs a string argument 'command'"
        else:
            content = f"error: unknown tool {call.name!r} (tools: bash, submit)"
        took = trio.current_time() - start
        episode.tool_seconds += took
        episode.messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        episode.trajectory.append(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "name": call.name,
                "content": content,
                "step": step,
                "exit_code": exit_code,
                "timed_out": timed_out,
                "truncated": truncated,
                "duration_seconds": round(took, 6),
            }
        )


def _instruction(prepared: PreparedTask) -> str:
    for key in ("instruction", "question", "prompt"):
        value = prepared.input.get(key)
        if isinstance(value, str):
            return value
    return json.dumps(prepared.input, default=str)


def _tool_output(
    stdout: str, stderr: str, exit_code: int, timed_out: bool, timeout: float, limit: int
) -> tuple[str, bool]:
    """The tool message for one command, and whether it was cut to ``limit``."""
    parts = [stdout] if stdout else []
    if stderr:
        parts.append(f"[stderr]\n{stderr}")
    if timed_out:
        parts.append(f"[timed out after {timeout:g}s]")
    elif exit_code != 0:
        parts.append(f"[exit code {exit_code}]")
    content = "\n".join(parts) if parts else "[no output]"
    if len(content) <= limit:
        return content, False
    return f"{content[:limit]}\n[output truncated: {len(content) - limit} more characters]", True
